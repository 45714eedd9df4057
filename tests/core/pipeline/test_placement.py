"""Where each stage runs: `work_pool`, `job_variables` and `retries` from the YAML and the command line."""

from __future__ import annotations

import pytest

from tuneline.core.config import parse_overrides
from tuneline.core.errors import ConfigError
from tuneline.core.pipeline.spec import Placement, build_pipeline

STAGES = [
    {"name": "base", "stage": "build_base", "corpus": "c"},
    {"name": "sft", "stage": "sft", "from": "base", "work_pool": "gpu", "job_variables": {"env": {"CUDA_VISIBLE_DEVICES": "0"}}},
    {"name": "rm", "stage": "rm", "from": "sft", "retries": 3},
]


def build(overrides: list[str], **top):
    return build_pipeline({"name": "p", "stages": STAGES, **top}, overrides=parse_overrides(overrides))


def test_top_level_pool_places_every_stage_and_a_stage_or_override_wins():
    pipeline = build([], work_pool="cpu")
    assert pipeline.stage("base").placement == Placement(work_pool="cpu")
    assert pipeline.stage("sft").placement == Placement(work_pool="gpu", job_variables={"env": {"CUDA_VISIBLE_DEVICES": "0"}})
    assert pipeline.stage("rm").placement == Placement(work_pool="cpu", retries=3)
    pipeline = build(["work_pool=big", "sft.job_variables={env: {CUDA_VISIBLE_DEVICES: '1'}}", "rm.work_pool=small",
                      "parallel_training=2"], work_pool="cpu")
    assert [pipeline.stage(name).placement.work_pool for name in ("base", "sft", "rm")] == ["big", "gpu", "small"]
    assert pipeline.stage("sft").placement.job_variables == {"env": {"CUDA_VISIBLE_DEVICES": "1"}}
    assert pipeline.parallel_training == 2


def test_without_a_pool_every_stage_runs_in_the_pipelines_process():
    pipeline = build_pipeline({"name": "p", "stages": [STAGES[0], {"name": "sft", "stage": "sft", "from": "base"}]}, overrides={})
    assert {stage.placement.work_pool for stage in pipeline.stages} == {None}
    assert pipeline.parallel_training == 1


@pytest.mark.parametrize(("overrides", "message"), [
    (["work_pool=3"], r"'work_pool: 3' must name a Prefect work pool"),
    (["sft.job_variables=5"], r"stage 'sft': 'job_variables: 5' must be a mapping"),
    (["rm.retries=-1"], r"stage 'rm': 'retries: -1' must be a whole number of 0 or more"),
    (["parallel_training=0"], r"'parallel_training: 0' must be a whole number of at least 1"),
    (["sft.work_pool=", "rm.job_variables={env: {}}"], r"stage 'rm': 'job_variables' are a work pool's settings, but the stage names no 'work_pool'"),
])
def test_bad_placement_is_refused_by_key(overrides, message):
    with pytest.raises(ConfigError, match=message):
        build(overrides)
