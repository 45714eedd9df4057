from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tuneline.core.config import parse_overrides
from tuneline.core.errors import ConfigError
from tuneline.core.stages.registry import build_stage_config, load_stage_config


def test_misspelled_key_names_the_nearest_valid_key():
    with pytest.raises(ConfigError) as caught:
        build_stage_config({"learning_rat": 1e-4, "stage": "sft"})
    assert "unknown key 'learning_rat'; did you mean 'learning_rate'?" in str(caught.value)


def test_all_problems_are_reported_at_once():
    with pytest.raises(ConfigError) as caught:
        build_stage_config({"lora_rnk": 8, "cutoff_len": "long", "finetuning_type": "qlora"})
    problems = caught.value.problems
    assert len(problems) == 3
    assert any("lora_rank" in p for p in problems)
    assert any("cutoff_len" in p and "number" in p for p in problems)
    assert any("finetuning_type" in p and "lora, oft, freeze, full" in p for p in problems)


def test_values_are_coerced_to_the_field_types():
    config = build_stage_config({"learning_rate": "1e-4", "cutoff_len": "512", "train_on_prompt": "true"})
    assert config.training["learning_rate"] == pytest.approx(1e-4)
    assert config.data.cutoff_len == 512
    assert config.data.train_on_prompt is True


def test_renamed_trainer_keys_keep_their_meaning():
    config = build_stage_config({"warmup_ratio": 0.1, "ddp_timeout": 180000000})
    assert config.training == {"warmup_steps": 0.1}


def test_fsdp_keys_of_transformers_4_move_into_fsdp_config():
    """LLaMA-Factory's FSDP example sets `fsdp` as a list and the layer class as its own key."""
    config = build_stage_config({"fsdp": ["full_shard", "auto_wrap"], "fsdp_transformer_layer_cls_to_wrap": "LlamaDecoderLayer",
                                 "fsdp_config": {"activation_checkpointing": True}})
    assert config.training == {"fsdp": "full_shard auto_wrap",
                               "fsdp_config": {"transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"], "activation_checkpointing": True}}
    with pytest.raises(ConfigError) as caught:
        build_stage_config({"fsdp": "full_shard", "fsdp_min_num_params": 100, "fsdp_config": {"min_num_params": 200}})
    assert caught.value.problems == ["'fsdp_min_num_params' set both as a key and inside 'fsdp_config'; keep the one in fsdp_config."]


def test_overrides_are_yaml_scalars_and_win_over_the_file(tmp_path: Path):
    path = tmp_path / "stage.yaml"
    path.write_text(yaml.safe_dump({"learning_rate": 1e-4, "stage": "sft"}))
    config = load_stage_config(path, ["learning_rate=3e-4", "lora_rank=4"])
    assert config.training["learning_rate"] == pytest.approx(3e-4)
    assert config.finetuning.lora_rank == 4
    with pytest.raises(ConfigError, match="key=value"):
        parse_overrides(["learning_rate"])


def test_llamafactory_sft_example_loads_unchanged(shared_dir: Path):
    config = load_stage_config(shared_dir / "llamafactory/examples/train_lora/llama3_lora_sft.yaml")
    assert config.data.dataset == "identity,alpaca_en_demo"
    assert config.data.template == "llama3"
    assert config.finetuning.lora_target == "all"
    assert config.training["gradient_accumulation_steps"] == 8
    assert config.output.overwrite_output_dir is True


def test_shipped_demo_pipeline_loads():
    from tuneline.core.pipeline.spec import TrainingStage, load_pipeline

    root = Path(__file__).resolve().parents[3]
    pipeline = load_pipeline(root / "data/demo_pipeline.yaml", [f"dataset_dir={root / 'data'}"])
    assert [s.name for s in pipeline.stages] == ["base", "pt", "sft", "rm", "dpo", "ppo"]
    sft = pipeline.stage("sft")
    assert isinstance(sft, TrainingStage) and sft.parent == "pt"
    assert pipeline.root("sft").name == "base"


def test_llamafactory_lora_examples_parse_or_name_each_key_that_cannot_run(shared_dir: Path):
    from tuneline.core.config.llamafactory import PENDING, REFUSED_KEYS

    pending = {key for table in PENDING for key in table.keys}
    examples = sorted((shared_dir / "llamafactory/examples/train_lora").glob("*.yaml"))
    assert len(examples) >= 10
    parsed = []
    for path in examples:
        raw = yaml.safe_load(path.read_text())
        raw["model_name_or_path"] = "tiny-model"
        try:
            build_stage_config(raw, source=str(path))
            parsed.append(path.stem)
        except ConfigError as e:
            assert "unknown key" not in str(e), f"{path.name}: {e}"
            refused = [k for k in raw if k in REFUSED_KEYS and raw[k] != REFUSED_KEYS[k].defaults[k]]
            not_yet = [k for k in raw if k in pending and f"'{k}: {raw[k]}' " in str(e) and "does not implement yet" in str(e)]
            assert refused + not_yet and all(f"'{k}: " in str(e) for k in refused), f"{path.name}: {e}"
    assert {"llama3_lora_sft", "llama3_lora_dpo", "llama3_lora_kto", "llama3_lora_ppo", "llama3_lora_reward",
            "llama3_lora_pretrain"} <= set(parsed)


def test_keys_this_version_reads_but_cannot_run_are_named_when_asked_for():
    with pytest.raises(ConfigError) as error:
        build_stage_config({"stage": "sft", "use_unsloth": True})
    assert len(error.value.problems) == 1 and "use_unsloth" in error.value.problems[0]
    for stage in ("pt", "sft", "rm", "dpo", "kto"):
        build_stage_config({"stage": stage})
    build_stage_config({"stage": "ppo", "reward_model": "saves/rm"})
    for methods in ({"finetuning_type": "freeze"}, {"quantization_bit": 4, "loraplus_lr_ratio": 16, "adapter_name_or_path": "saves/lora"},
                    {"pissa_init": True, "adapter_name_or_path": "saves/lora", "create_new_adapter": True},
                    {"use_galore": False, "galore_rank": 16, "use_swanlab": False}):  # at LLaMA-Factory's defaults
        build_stage_config({"stage": "sft", **methods})


def test_methods_that_cannot_train_together_fail_when_the_config_is_read():
    with pytest.raises(ConfigError) as error:
        build_stage_config({"finetuning_type": "freeze", "quantization_bit": 4, "loraplus_lr_ratio": 16})
    assert len(error.value.problems) == 2
    assert "'quantization_bit: 4' trains LoRA or OFT adapters only" in str(error.value) and "loraplus_lr_ratio" in str(error.value)


def test_strict_template_and_allow_template_mismatch_contradict():
    assert build_stage_config({"stage": "sft", "strict_template": True}).data.strict_template is True
    with pytest.raises(ConfigError, match="'strict_template: true' refuses .* keep one"):
        build_stage_config({"stage": "sft", "strict_template": True, "allow_template_mismatch": True})
