"""LLaMA-Factory 0.9.5's argument checks (its hparams/parser.py and argument classes), made when a
stage config is read: each combination it refuses is refused here, naming every key involved, and
all problems of a config come at once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from conftest import run_cli_here
from tuneline.core.errors import ConfigError
from tuneline.core.stages.registry import build_stage_config

# (the config, the keys its one problem must name)
RULES: dict[str, tuple[dict[str, Any], tuple[str, ...]]] = {
    "mask_history with train_on_prompt": ({"mask_history": True, "train_on_prompt": True}, ("mask_history", "train_on_prompt")),
    "train_on_prompt outside sft": ({"stage": "rm", "train_on_prompt": True}, ("train_on_prompt",)),
    "mask_history outside sft": ({"stage": "dpo", "mask_history": True}, ("mask_history",)),
    "neat_packing outside sft": ({"stage": "pt", "neat_packing": True}, ("neat_packing",)),
    "predict_with_generate outside sft": ({"stage": "rm", "predict_with_generate": True, "val_size": 0.1, "dataset": "d"},
                                          ("predict_with_generate",)),
    "do_predict without predict_with_generate": ({"do_predict": True, "val_size": 0.1, "dataset": "d"}, ("do_predict",)),
    "load_best_model_at_end with rm": ({"stage": "rm", "load_best_model_at_end": True}, ("load_best_model_at_end",)),
    "load_best_model_at_end with ppo": ({"stage": "ppo", "reward_model": "saves/rm", "load_best_model_at_end": True},
                                        ("load_best_model_at_end",)),
    "ppo without do_train": ({"stage": "ppo", "reward_model": "saves/rm", "do_train": False}, ("do_train",)),
    "ppo without a reward model": ({"stage": "ppo"}, ("reward_model",)),
    "ppo with a lora reward model and full fine-tuning": ({"stage": "ppo", "reward_model": "saves/rm", "finetuning_type": "full"},
                                                          ("reward_model_type", "finetuning_type")),
    "streaming without max_steps": ({"streaming": True}, ("streaming", "max_steps")),
    "streaming with a share as val_size": ({"streaming": True, "max_steps": 10, "dataset": "d", "val_size": 0.1},
                                           ("streaming", "val_size")),
    "streaming with max_samples": ({"streaming": True, "max_steps": 10, "max_samples": 100}, ("streaming", "max_samples")),
    "do_eval without evaluation rows": ({"do_eval": True}, ("do_eval", "eval_dataset", "val_size")),
    "val_size without dataset": ({"val_size": 0.1}, ("val_size", "dataset")),
    "val_size with eval_dataset": ({"val_size": 0.1, "dataset": "a", "eval_dataset": "b"}, ("val_size", "eval_dataset")),
    "interleave_probs with concat": ({"dataset": "a,b", "interleave_probs": "0.5,0.5"}, ("interleave_probs", "mix_strategy")),
    "interleave_probs not one per dataset": ({"dataset": "a,b", "mix_strategy": "interleave_under", "interleave_probs": "1"},
                                             ("interleave_probs",)),
    "interleave_probs not one per eval dataset": ({"dataset": "a", "eval_dataset": "b,c", "mix_strategy": "interleave_under",
                                                   "interleave_probs": "1"}, ("interleave_probs", "eval_dataset")),
    "adapter without lora": ({"finetuning_type": "full", "adapter_name_or_path": "saves/lora"},
                             ("adapter_name_or_path", "finetuning_type")),
    "quantization without lora": ({"finetuning_type": "freeze", "quantization_bit": 4}, ("quantization_bit", "finetuning_type")),
    "quantization with pissa_init": ({"quantization_bit": 4, "pissa_init": True}, ("pissa_init", "quantization_bit")),
    "quantization with resize_vocab": ({"quantization_bit": 4, "resize_vocab": True}, ("resize_vocab", "quantization_bit")),
    "quantization with create_new_adapter": ({"quantization_bit": 4, "adapter_name_or_path": "a", "create_new_adapter": True},
                                             ("create_new_adapter", "quantization_bit")),
    "quantization with several adapters": ({"quantization_bit": 4, "adapter_name_or_path": "a,b"},
                                           ("adapter_name_or_path",)),
    "quantization_bit other than 4 or 8": ({"quantization_bit": 3}, ("quantization_bit",)),
    "reference quantization other than 4 or 8": ({"ref_model_quantization_bit": 2}, ("ref_model_quantization_bit",)),
    "fp8 with quantization": ({"fp8": True, "quantization_bit": 4}, ("fp8", "quantization_bit")),
    "pure_bf16 with fp16": ({"pure_bf16": True, "fp16": True}, ("pure_bf16", "fp16")),
    "use_rslora without lora": ({"finetuning_type": "freeze", "use_rslora": True}, ("use_rslora", "finetuning_type")),
    "use_dora without lora": ({"finetuning_type": "full", "use_dora": True}, ("use_dora", "finetuning_type")),
    "pissa_init without lora": ({"finetuning_type": "full", "pissa_init": True}, ("pissa_init", "finetuning_type")),
    "loraplus without lora": ({"finetuning_type": "freeze", "loraplus_lr_ratio": 16}, ("loraplus_lr_ratio", "finetuning_type")),
    "pissa_init with kto": ({"stage": "kto", "pissa_init": True}, ("pissa_init",)),
    "pissa_init with dpo against a reference": ({"stage": "dpo", "pissa_init": True}, ("pissa_init",)),
    "pissa_init with ppo": ({"stage": "ppo", "reward_model": "saves/rm", "pissa_init": True}, ("pissa_init",)),
    "dpo_label_smoothing with hinge": ({"stage": "dpo", "pref_loss": "hinge", "dpo_label_smoothing": 0.1},
                                       ("dpo_label_smoothing", "pref_loss")),
    "export quantization without calibration data": ({"export_quantization_bit": 4}, ("export_quantization_bit",
                                                                                      "export_quantization_dataset")),
    "quantization_device_map in training": ({"quantization_device_map": "auto"}, ("quantization_device_map",)),
    "adapter_folder without an adapter": ({"adapter_folder": "best"}, ("adapter_folder", "adapter_name_or_path")),
    "train_from_scratch with quantization": ({"train_from_scratch": True, "quantization_bit": 4},
                                             ("train_from_scratch", "quantization_bit")),
    "gradient checkpointing both disabled and asked for": ({"disable_gradient_checkpointing": True,
                                                            "gradient_checkpointing": True},
                                                           ("disable_gradient_checkpointing", "gradient_checkpointing")),
    "use_reentrant_gc against gradient_checkpointing_kwargs": ({"use_reentrant_gc": False, "gradient_checkpointing_kwargs":
                                                                {"use_reentrant": True}},
                                                               ("use_reentrant_gc", "gradient_checkpointing_kwargs")),
    "pissa_iter below -1": ({"pissa_init": True, "pissa_iter": -2}, ("pissa_iter",)),
    "pissa_convert without pissa_init": ({"pissa_convert": True}, ("pissa_convert", "pissa_init")),
    "pissa_convert with dora": ({"pissa_init": True, "pissa_convert": True, "use_dora": True}, ("pissa_convert", "use_dora")),
    "pissa_convert with a reward head": ({"stage": "rm", "pissa_init": True, "pissa_convert": True},
                                         ("pissa_convert", "stage: rm")),
    "loraplus_lr_embedding without loraplus_lr_ratio": ({"loraplus_lr_embedding": 1e-5},
                                                        ("loraplus_lr_embedding", "loraplus_lr_ratio")),
    "ref_model_quantization_bit without ref_model": ({"stage": "dpo", "ref_model_quantization_bit": 4},
                                                     ("ref_model_quantization_bit", "ref_model")),
    "quantized reference with several adapters": ({"stage": "dpo", "ref_model": "m", "ref_model_quantization_bit": 4,
                                                   "ref_model_adapters": "a,b"},
                                                  ("ref_model_adapters", "ref_model_quantization_bit")),
    "reward_model_quantization_bit without reward_model": ({"reward_model_quantization_bit": 4},
                                                           ("reward_model_quantization_bit", "reward_model")),
    "image_max_pixels below image_min_pixels": ({"image_max_pixels": 100, "image_min_pixels": 1000},
                                                ("image_max_pixels", "image_min_pixels")),
    "video_max_pixels below video_min_pixels": ({"video_max_pixels": 100, "video_min_pixels": 1000},
                                                ("video_max_pixels", "video_min_pixels")),
    "export quantization to 5 bits": ({"export_quantization_bit": 5, "export_quantization_dataset": "c.json"},
                                      ("export_quantization_bit",)),
    "export quantization with an adapter merge": ({"export_quantization_bit": 4, "export_quantization_dataset": "c.json",
                                                   "adapter_name_or_path": "saves/lora"},
                                                  ("export_quantization_bit", "adapter_name_or_path")),
    "do_train false without do_predict": ({"do_train": False}, ("do_train", "do_predict")),
    "profiler recording no step": ({"enable_torch_profiler": True, "profiler_active_steps": 0}, ("profiler_active_steps",)),
    "profiler with a negative wait": ({"enable_torch_profiler": True, "profiler_wait_steps": -1}, ("profiler_wait_steps",)),
    "profiler with ppo": ({"stage": "ppo", "reward_model": "saves/rm", "enable_torch_profiler": True},
                          ("enable_torch_profiler",)),
    "profiler while only predicting": ({"do_predict": True, "predict_with_generate": True, "eval_dataset": "a",
                                        "enable_torch_profiler": True}, ("enable_torch_profiler",)),
    "profile_modules with ppo": ({"stage": "ppo", "reward_model": "saves/rm", "profile_modules": "*.mlp"}, ("profile_modules",)),
}


@pytest.mark.parametrize("case", sorted(RULES))
def test_each_refused_combination_names_every_key_involved(case: str):
    raw, keys = RULES[case]
    with pytest.raises(ConfigError) as caught:
        build_stage_config(raw)
    involved = [p for p in caught.value.problems if all(f"'{key}" in p for key in keys)]
    assert involved, (case, caught.value.problems)


def test_the_allowed_counterparts_pass():
    for raw in ({"stage": "dpo", "pref_loss": "simpo", "pissa_init": True}, {"stage": "sft", "neat_packing": True},
                {"do_eval": True, "dataset": "a", "val_size": 0.1}, {"streaming": True, "max_steps": 10},
                {"stage": "ppo", "reward_model": "saves/rm", "finetuning_type": "full", "reward_model_type": "full"},
                {"stage": "dpo", "ref_model": "m", "ref_model_quantization_bit": 4, "ref_model_adapters": "a"},
                {"stage": "ppo", "reward_model": "saves/rm", "reward_model_quantization_bit": 4},
                {"pissa_init": True, "pissa_iter": -1, "pissa_convert": True},
                {"loraplus_lr_ratio": 16, "loraplus_lr_embedding": 1e-5, "lora_target": "q_proj,embed_tokens"},
                {"rope_scaling": "yarn", "upcast_layernorm": True, "upcast_lmhead_output": True, "train_from_scratch": True,
                 "use_reentrant_gc": False, "gradient_checkpointing": True, "print_param_status": True},
                {"do_predict": True, "predict_with_generate": True, "eval_dataset": "a", "adapter_name_or_path": "saves/lora"},
                {"enable_torch_profiler": True, "profiler_wait_steps": 0, "profiler_repeat": 0, "profile_modules": "*.mlp"}):
        flat = build_stage_config(raw).flat()  # refused, it would raise
        assert {key: flat[key] for key in raw} == raw  # and each value is kept as written, none dropped or rewritten


def test_the_cli_reports_every_problem_at_once_and_exits_2(tmp_path: Path):
    config = tmp_path / "train.yaml"
    config.write_text(yaml.safe_dump({"stage": "rm", "train_on_prompt": True, "streaming": True, "val_size": 0.1,
                                      "finetuning_type": "freeze", "use_dora": True}))
    result = run_cli_here("train", str(config), cwd=tmp_path)  # the command's main, in this process
    assert result.returncode == 2, result.stderr
    for key in ("train_on_prompt", "streaming", "max_steps", "val_size", "use_dora"):
        assert f"'{key}" in result.stderr, key
    assert "Traceback" not in result.stderr
