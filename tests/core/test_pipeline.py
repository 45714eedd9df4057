from __future__ import annotations

import pytest

from tuneline.core.errors import ConfigError
from tuneline.core.pipeline import build_pipeline


def _pipeline(stages, **extra):
    return {"name": "p", "stages": stages, **extra}


def test_dangling_reference_names_the_stage():
    raw = _pipeline([{"name": "sft", "stage": "sft", "from": "pt"}])
    with pytest.raises(ConfigError, match="stage 'sft' has 'from: pt', which names no stage"):
        build_pipeline(raw, overrides={})


def test_cycle_names_the_stages_involved():
    raw = _pipeline([{"name": "a", "stage": "sft", "from": "b"}, {"name": "b", "stage": "sft", "from": "a"}])
    with pytest.raises(ConfigError, match="a -> b -> a form a cycle"):
        build_pipeline(raw, overrides={})


def test_stage_overrides_reach_only_their_stage():
    raw = _pipeline([
        {"name": "a", "stage": "sft", "model_name_or_path": "m"},
        {"name": "b", "stage": "sft", "from": "a"},
    ])
    pipeline = build_pipeline(raw, overrides={"b.learning_rate": 0.5, "cutoff_len": 64})
    assert pipeline.stage("b").config.training["learning_rate"] == 0.5
    assert "learning_rate" not in pipeline.stage("a").config.training
    assert pipeline.stage("a").config.data.cutoff_len == 64


def test_unknown_keys_in_a_stage_are_reported_with_the_stage_name():
    raw = _pipeline([{"name": "a", "stage": "sft", "model_name_or_path": "m", "learning_rat": 1}])
    with pytest.raises(ConfigError, match="stage 'a': unknown key 'learning_rat'; did you mean 'learning_rate'"):
        build_pipeline(raw, overrides={})


def test_bare_overrides_win_over_values_written_in_a_stage():
    raw = _pipeline(
        [{"name": "base", "stage": "build_base", "corpus": "c"},
         {"name": "a", "stage": "sft", "from": "base", "learning_rate": 0.1}],
        defaults={"learning_rate": 0.2},
    )
    assert build_pipeline(raw, overrides={}).stage("a").config.training["learning_rate"] == 0.1
    pipeline = build_pipeline(raw, overrides={"learning_rate": 0.3, "hidden_size": 32})
    assert pipeline.stage("a").config.training["learning_rate"] == 0.3
    assert pipeline.stage("base").build.hidden_size == 32
