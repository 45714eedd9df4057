from __future__ import annotations

from pathlib import Path

import pytest

from tuneline.core.config import read_yaml
from tuneline.core.errors import ConfigError
from tuneline.core.pipeline.spec import build_pipeline


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


def test_seed_in_defaults_or_overrides_seeds_the_training_stages_too():
    raw = _pipeline(
        [{"name": "base", "stage": "build_base", "corpus": "c", "seed": 3},
         {"name": "a", "stage": "sft", "from": "base"}],
        defaults={"seed": 5},
    )
    pipeline = build_pipeline(raw, overrides={})
    assert pipeline.stage("a").config.training["seed"] == 5
    assert pipeline.stage("base").build.seed == 3
    overridden = build_pipeline(raw, overrides={"seed": 11})
    assert overridden.stage("a").config.training["seed"] == 11 and overridden.stage("base").build.seed == 11


def _chain(*extra):
    """A policy chain (base -> sft) plus `extra` stages; pure config, nothing is built."""
    return _pipeline([
        {"name": "base", "stage": "build_base", "corpus": "demo_pretrain"},
        {"name": "sft", "stage": "sft", "from": "base", "dataset": "demo_alpaca"},
        *extra,
    ])


def _problems(raw) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        build_pipeline(raw, overrides={})
    return caught.value.problems


def test_alignment_stages_resolve_stage_references_and_sort_topologically():
    raw = _chain(
        {"name": "dpo", "stage": "dpo", "from": "sft", "ref_model": "sft", "reward_model": "rm", "dataset": "demo_preference"},
        {"name": "rm", "stage": "rm", "from": "sft", "dataset": "demo_preference"},
        {"name": "kto", "stage": "kto", "from": "dpo", "ref_model": "org/some-model", "dataset": "demo_kto"},
    )
    pipeline = build_pipeline(raw, overrides={})
    assert [s.name for s in pipeline.stages] == ["base", "sft", "rm", "dpo", "kto"]  # rm moved before dpo
    assert pipeline.stage("dpo").references == {"ref_model": "sft", "reward_model": "rm"}
    assert pipeline.stage("kto").references == {}  # a hub id is a model, not a stage
    assert pipeline.stage("kto").config.finetuning.ref_model == "org/some-model"


def test_dangling_references_are_all_reported_with_their_stage():
    problems = _problems(_chain(
        {"name": "dpo", "stage": "dpo", "from": "sft", "ref_model": "sfft", "dataset": "demo_preference"},
        {"name": "rm", "stage": "rm", "from": "sft", "dataset": "demo_preference"},
        {"name": "kto", "stage": "kto", "from": "sft", "reward_model": "reward", "dataset": "demo_kto"},
    ))
    assert "stage 'dpo' has 'ref_model: sfft', which names no stage; stages: base, sft, dpo, rm, kto; did you mean 'sft'?" in problems
    assert any(p.startswith("stage 'kto' has 'reward_model: reward', which names no stage") for p in problems)
    assert len(problems) == 2


def test_cycle_through_ref_model_names_the_stages():
    problems = _problems(_chain(
        {"name": "a", "stage": "dpo", "from": "sft", "ref_model": "b", "dataset": "demo_preference"},
        {"name": "b", "stage": "dpo", "from": "a", "dataset": "demo_preference"},
    ))
    assert len(problems) == 1 and "stages a -> b -> a form a cycle" in problems[0]


def test_references_of_the_wrong_kind_are_refused():
    problems = _problems(_chain(
        {"name": "rm", "stage": "rm", "from": "sft", "dataset": "demo_preference"},
        {"name": "dpo", "stage": "dpo", "from": "rm", "ref_model": "rm", "reward_model": "sft", "dataset": "demo_preference"},
    ))
    assert len(problems) == 3
    assert any(p.startswith("stage 'dpo' has 'from: rm', but stage 'rm' is an rm stage") for p in problems)
    assert any(p.startswith("stage 'dpo' has 'ref_model: rm', but stage 'rm' is an rm stage") for p in problems)
    assert any(p.startswith("stage 'dpo' has 'reward_model: sft', but stage 'sft' is a sft stage; 'reward_model' must name an rm stage")
               for p in problems)


def test_all_three_error_kinds_exit_2_from_the_cli_naming_the_stages(tmp_path):
    import subprocess
    import sys

    import yaml

    raw = _chain(
        {"name": "rm", "stage": "rm", "from": "sft", "dataset": "demo_preference"},
        {"name": "dpo", "stage": "dpo", "from": "rm", "ref_model": "gone", "dataset": "demo_preference"},
        {"name": "a", "stage": "kto", "from": "b", "dataset": "demo_kto"},
        {"name": "b", "stage": "kto", "from": "a", "dataset": "demo_kto"},
    )
    raw["defaults"] = {"dataset_dir": str(Path(__file__).resolve().parents[3] / "data")}
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(raw))
    result = subprocess.run([sys.executable, "-m", "tuneline.flows.cli", "run", str(path), "--workspace", str(tmp_path / "ws")],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    out = result.stdout + result.stderr
    assert "(3 problems)" in out
    for expected in ("'from: rm', but stage 'rm' is an rm stage", "'ref_model: gone', which names no stage", "a -> b -> a form a cycle"):
        assert expected in out
    assert not (tmp_path / "ws").exists()  # refused before any work


def test_evaluate_and_export_of_a_reward_model_are_refused():
    raw = _chain({"name": "rm", "stage": "rm", "from": "sft", "dataset": "demo_preference"})
    raw["export"] = {"stage": "rm"}
    problems = _problems(raw)
    assert problems == ["'export.stage: rm' names an rm stage, whose reward model is not a causal LM; "
                        "name a pt, sft, dpo, kto, ppo, grpo or rloo stage."]


def test_train_key_follows_the_referenced_stage_key():
    from tuneline.core.pipeline.keys import train_key

    raw = _chain({"name": "dpo", "stage": "dpo", "from": "sft", "ref_model": "sft", "dataset": "demo_preference"})
    dpo = build_pipeline(raw, overrides={}).stage("dpo")
    keys = {ref: train_key(dpo, tokenized_key="t", parent_key="p", reference_keys={"ref_model": ref}) for ref in ("m1", "m2")}
    assert keys["m1"] != keys["m2"]
    assert keys["m1"] == train_key(dpo, tokenized_key="t", parent_key="p", reference_keys={"ref_model": "m1"})
    with pytest.raises(ValueError, match="no key given for ref_model"):
        train_key(dpo, tokenized_key="t", parent_key="p")


def test_train_key_follows_the_optimizer_keys_only_when_an_optimizer_is_chosen():
    from tuneline.core.pipeline.keys import train_key

    def key(**keys) -> str:
        stage = {"name": "full", "stage": "sft", "from": "sft", "dataset": "demo_alpaca", "finetuning_type": "full", **keys}
        return train_key(build_pipeline(_chain(stage), overrides={}).stage("full"), tokenized_key="t", parent_key="p")

    assert key() == key(galore_rank=8)  # GaLore is off: its rank changes nothing
    assert key(use_galore=True) != key(use_galore=True, galore_rank=8) != key()
    assert key() == key(hf_hub_token="hf_a") == key(hf_hub_token="hf_b")  # a credential, not a setting


def test_prediction_prompts_are_tokenized_under_a_key_of_their_own():
    from tuneline.core.pipeline.keys import tokenize_key

    def key(**keys) -> str:
        stage = {"name": "s", "stage": "sft", "from": "sft", "eval_dataset": "demo_alpaca", "dataset": "demo_alpaca",
                 "do_predict": True, "predict_with_generate": True, **keys}
        return tokenize_key(build_pipeline(_chain(stage), overrides={}).stage("s"), tokenizer_key="t", fingerprints={})[0]

    assert key() != key(do_train=True) == key(do_train=True, hf_hub_token="hf_a")


def test_shipped_chain_pipeline_loads_with_its_stage_reference():
    root = Path(__file__).resolve().parents[3]
    pipeline = build_pipeline(read_yaml(root / "data/chain_pipeline.yaml"), overrides={"dataset_dir": str(root / "data")})
    assert [(s.name, getattr(s, "parent", None)) for s in pipeline.stages] == [
        ("base", None), ("pt", "base"), ("sft", "pt"), ("rm", "sft"), ("dpo", "sft"), ("ppo", "sft")]
    assert pipeline.stage("dpo").references == {"ref_model": "sft"}
    assert pipeline.stage("ppo").references == {"reward_model": "rm"}
    assert pipeline.stage("rm").kind == "rm"


def test_ppo_stage_needs_an_rm_stage_as_its_reward_model():
    problems = _problems(_chain(
        {"name": "ppo", "stage": "ppo", "from": "sft", "dataset": "demo_preference"},
        {"name": "ppo2", "stage": "ppo", "from": "sft", "reward_model": "sft", "dataset": "demo_preference"},
    ))
    assert any(p.startswith("stage 'ppo': 'stage: ppo' needs 'reward_model'") for p in problems), problems
    assert any(p.startswith("stage 'ppo2' has 'reward_model: sft', but stage 'sft' is a sft stage") for p in problems), problems


def test_export_keys_of_tuneline_export_are_refused_in_a_pipeline_stage():
    raw = _pipeline([{"name": "a", "stage": "sft", "model_name_or_path": "m", "export_hub_model_id": "me/model",
                      "export_quantization_bit": 4, "export_quantization_dataset": "c.json"}])
    with pytest.raises(ConfigError) as caught:
        build_pipeline(raw, overrides={})
    problems = [p for p in caught.value.problems if "is a key of `tuneline export`" in p]
    assert [p.split("'")[3] for p in problems] == ["export_hub_model_id: me/model", "export_quantization_bit: 4"]


def test_tokenized_path_of_tuneline_train_is_refused_in_a_pipeline_stage():
    raw = _pipeline([{"name": "a", "stage": "sft", "model_name_or_path": "m", "tokenized_path": "saves/data"}])
    with pytest.raises(ConfigError) as caught:
        build_pipeline(raw, overrides={})
    assert [p for p in caught.value.problems if "'tokenized_path: saves/data' is a key of `tuneline train`" in p]


def test_shipped_reasoning_pipeline_loads_and_a_grpo_stage_may_read_an_rm_stage():
    root = Path(__file__).resolve().parents[3]
    pipeline = build_pipeline(read_yaml(root / "data/reasoning_pipeline.yaml"),
                              overrides={"dataset_dir": str(root / "data/reasoning_demo")})
    assert [(s.name, getattr(s, "parent", None)) for s in pipeline.stages] == [
        ("base", None), ("pt", "base"), ("sft", "pt"), ("grpo", "sft")]
    assert pipeline.stage("grpo").kind == "grpo"
    chain = _chain({"name": "rm", "stage": "rm", "from": "sft", "dataset": "demo_preference"},
                   {"name": "grpo", "stage": "grpo", "from": "sft", "ref_model": "sft", "reward_model": "rm",
                    "dataset": "demo_alpaca", "num_generations": 4})
    assert build_pipeline(chain, overrides={}).stage("grpo").references == {"ref_model": "sft", "reward_model": "rm"}
    problems = _problems(_chain({"name": "grpo", "stage": "grpo", "from": "sft", "reward_model": "sft",
                                 "dataset": "demo_alpaca", "num_generations": 4}))
    assert any(p.startswith("stage 'grpo' has 'reward_model: sft', but stage 'sft' is a sft stage") for p in problems), problems
