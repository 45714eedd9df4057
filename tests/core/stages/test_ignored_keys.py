"""Keys a stage kind does not read: for every kind and every stage-dependent key set away from its
default, the kind reads it (no warning), warns that it ignores it (one line naming key, stage and
why), or refuses the config as before. The tables below say which, kind by kind."""

from __future__ import annotations

import pytest

from tuneline.core.config import read_stage_config
from tuneline.core.errors import ConfigError
from tuneline.core.stages.ignored_keys import MEDIA_KEYS, STAGE_KEYS, datasets_map_media, ignored_keys, tag_value
from tuneline.core.stages.registry import KINDS, build_stage_config

EVALUATING = {"eval_strategy": "steps", "eval_steps": 5, "val_size": 0.1, "dataset": "demo_alpaca",
              "metric_for_best_model": "eval_loss"}
PREDICTING = {"do_predict": True, "predict_with_generate": True, "val_size": 0.1, "dataset": "demo_alpaca"}
# each key away from its default, with the keys it needs beside it
SAMPLES: dict[str, dict] = {
    "packing": {"packing": True}, "neat_packing": {"neat_packing": True}, "train_on_prompt": {"train_on_prompt": True},
    "mask_history": {"mask_history": True}, "ignore_pad_token_for_loss": {"ignore_pad_token_for_loss": False},
    "disable_shuffling": {"disable_shuffling": True},
    "include_effective_tokens_per_second": {"include_effective_tokens_per_second": True},
    "early_stopping_steps": {**EVALUATING, "early_stopping_steps": 2},
    "eval_on_each_dataset": {"eval_dataset": "demo_alpaca,demo_pretrain", "eval_on_each_dataset": True},
    "compute_accuracy": {"compute_accuracy": True}, "use_dft_loss": {"use_dft_loss": True},
    "use_eaft_loss": {"use_eaft_loss": True}, "use_asft_loss": {"use_asft_loss": True}, "asft_alpha": {"asft_alpha": 0.2},
    "eaft_alpha": {"eaft_alpha": 2.0}, "pref_beta": {"pref_beta": 0.2}, "pref_ftx": {"pref_ftx": 0.5},
    "pref_bco_weight": {"pref_bco_weight": 0.5}, "pref_loss": {"pref_loss": "hinge"}, "dpo_label_smoothing": {"dpo_label_smoothing": 0.1},
    "simpo_gamma": {"simpo_gamma": 1.0}, "ld_alpha": {"ld_alpha": 0.5}, "kto_chosen_weight": {"kto_chosen_weight": 2.0},
    "kto_rejected_weight": {"kto_rejected_weight": 2.0}, "ppo_buffer_size": {"ppo_buffer_size": 2}, "ppo_epochs": {"ppo_epochs": 2},
    "ppo_score_norm": {"ppo_score_norm": True}, "ppo_target": {"ppo_target": 3.0}, "ppo_whiten_rewards": {"ppo_whiten_rewards": True},
    "ref_model": {"ref_model": "reference"}, "ref_model_adapters": {"ref_model": "reference", "ref_model_adapters": "adapter"},
    "ref_model_quantization_bit": {"ref_model": "reference", "ref_model_quantization_bit": 4},
    "reward_model": {"reward_model": "scorer"}, "reward_model_adapters": {"reward_model": "scorer", "reward_model_adapters": "adapter"},
    "reward_model_quantization_bit": {"reward_model": "scorer", "reward_model_quantization_bit": 4},
    "reward_model_type": {"reward_model": "scorer", "reward_model_type": "full"},
    "num_generations": {"num_generations": 4}, "beta": {"beta": 0.04}, "epsilon": {"epsilon": 0.1}, "epsilon_high": {"epsilon_high": 0.3},
    "loss_type": {"loss_type": "grpo"}, "importance_sampling_level": {"importance_sampling_level": "sequence"},
    "scale_rewards": {"scale_rewards": "batch"}, "num_iterations": {"num_iterations": 2},
    "max_completion_length": {"max_completion_length": 64}, "mask_truncated_completions": {"mask_truncated_completions": True},
    "reward_funcs": {"reward_funcs": "answer_match,think_answer_format"}, "reward_weights": {"reward_weights": "1.0"},
    "use_vllm": {"use_vllm": True}, "vllm_mode": {"vllm_mode": "server"},
    "do_sample": {"do_sample": False}, "temperature": {"temperature": 0.7}, "top_p": {"top_p": 0.9}, "top_k": {"top_k": 10},
    "repetition_penalty": {"repetition_penalty": 1.1}, "max_new_tokens": {"max_new_tokens": 16}, "max_length": {"max_length": 256},
    "num_beams": {"num_beams": 2}, "length_penalty": {"length_penalty": 0.8}, "skip_special_tokens": {"skip_special_tokens": False},
    "eval_num_beams": {"eval_num_beams": 2},
    # the Trainer's arguments
    "optim": {"optim": "adamw_torch"}, "optim_args": {"optim_args": "amsgrad=True"},
    "optim_target_modules": {"optim_target_modules": "all"}, "lr_scheduler_kwargs": {"lr_scheduler_kwargs": {"min_lr": 1e-6}},
    "eval_strategy": EVALUATING, "eval_steps": {**EVALUATING, "eval_steps": 3}, "eval_delay": {**EVALUATING, "eval_delay": 2},
    "eval_accumulation_steps": {"eval_accumulation_steps": 2}, "logging_strategy": {"logging_strategy": "epoch"},
    "logging_first_step": {"logging_first_step": True}, "save_strategy": {"save_strategy": "epoch"},
    "save_only_model": {"save_only_model": True}, "metric_for_best_model": EVALUATING,
    "dataloader_num_workers": {"dataloader_num_workers": 4}, "dataloader_drop_last": {"dataloader_drop_last": True},
    "dataloader_persistent_workers": {"dataloader_num_workers": 2, "dataloader_persistent_workers": True},
    "dataloader_prefetch_factor": {"dataloader_num_workers": 2, "dataloader_prefetch_factor": 4},
    "dataloader_pin_memory": {"dataloader_pin_memory": False}, "train_sampling_strategy": {"train_sampling_strategy": "sequential"},
    "data_seed": {"data_seed": 3}, "torch_compile": {"torch_compile": True}, "neftune_noise_alpha": {"neftune_noise_alpha": 5.0},
    "full_determinism": {"full_determinism": True}, "auto_find_batch_size": {"auto_find_batch_size": True},
    "average_tokens_across_devices": {"average_tokens_across_devices": False},
    "torch_empty_cache_steps": {"torch_empty_cache_steps": 4}, "push_to_hub": {"push_to_hub": True},
    "hub_model_id": {"hub_model_id": "someone/model"}, "report_to": {"report_to": "tensorboard"},
    "ddp_find_unused_parameters": {"ddp_find_unused_parameters": True}, "loraplus_lr_ratio": {"loraplus_lr_ratio": 16.0},
    "loraplus_lr_embedding": {"loraplus_lr_ratio": 16.0, "loraplus_lr_embedding": 1e-5},
    "label_smoothing_factor": {"label_smoothing_factor": 0.1},
    "generation_max_length": {"generation_max_length": 64}, "generation_num_beams": {"generation_num_beams": 2},
    # the inference engine's and the export's
    "infer_backend": {"infer_backend": "sglang"}, "vllm_maxlen": {"vllm_maxlen": 2048}, "vllm_gpu_util": {"vllm_gpu_util": 0.5},
    "vllm_enforce_eager": {"vllm_enforce_eager": True}, "vllm_max_lora_rank": {"vllm_max_lora_rank": 64},
    "vllm_config": {"vllm_config": {"max_num_seqs": 8}}, "sglang_maxlen": {"sglang_maxlen": 2048},
    "sglang_mem_fraction": {"sglang_mem_fraction": 0.5}, "sglang_tp_size": {"sglang_tp_size": 2},
    "sglang_config": {"sglang_config": {"chunked_prefill_size": 512}}, "sglang_lora_backend": {"sglang_lora_backend": "flashinfer"},
    "export_dir": {"export_dir": "merged"}, "export_size": {"export_size": 2}, "export_device": {"export_device": "auto"},
    "export_quantization_bit": {"export_quantization_bit": 4, "export_quantization_dataset": "data/c4_demo.jsonl"},
    "export_quantization_dataset": {"export_quantization_dataset": "data/c4_demo.jsonl"},
    "export_quantization_nsamples": {"export_quantization_nsamples": 64},
    "export_quantization_maxlen": {"export_quantization_maxlen": 512}, "export_hub_model_id": {"export_hub_model_id": "someone/model"},
}
# what each kind needs to be a valid config at all
BASES = {"ppo": {"reward_model": "scorer"}, "grpo": {"reward_funcs": "answer_match"}, "rloo": {"reward_funcs": "answer_match"}}

PREFERENCE = {"pref_beta", "pref_ftx", "pref_bco_weight", "pref_loss", "dpo_label_smoothing", "simpo_gamma", "ld_alpha"}
KTO = {"kto_chosen_weight", "kto_rejected_weight"}
PPO = {"ppo_buffer_size", "ppo_epochs", "ppo_score_norm", "ppo_target", "ppo_whiten_rewards"}
REFERENCE = {"ref_model", "ref_model_adapters", "ref_model_quantization_bit"}
REWARD = {"reward_model", "reward_model_adapters", "reward_model_quantization_bit", "reward_model_type"}
GRPO_ONLY = {"loss_type", "importance_sampling_level", "scale_rewards"}
ONLINE = {"num_generations", "beta", "epsilon", "epsilon_high", *GRPO_ONLY, "num_iterations", "max_completion_length",
          "mask_truncated_completions", "reward_funcs", "reward_weights", "use_vllm", "vllm_mode"}
SAMPLING = {"do_sample", "temperature", "top_p", "top_k", "repetition_penalty"}
GENERATION = {*SAMPLING, "max_new_tokens", "max_length", "num_beams", "length_penalty", "skip_special_tokens", "eval_num_beams"}
SFT_LABELS = {"neat_packing", "train_on_prompt", "mask_history", "ignore_pad_token_for_loss"}
SFT_LOSSES = {"use_dft_loss", "use_eaft_loss", "use_asft_loss"}
TRAINER = {"disable_shuffling", "include_effective_tokens_per_second", "early_stopping_steps"}
NOT_SAMPLED = {"max_new_tokens", "max_length", "num_beams", "length_penalty", "skip_special_tokens", "eval_num_beams"}
TRAINER_LOOP = {"optim", "optim_args", "optim_target_modules", "lr_scheduler_kwargs", "eval_strategy", "eval_steps", "eval_delay",
                "eval_accumulation_steps", "logging_strategy", "logging_first_step", "save_only_model", "metric_for_best_model",
                "dataloader_num_workers", "dataloader_drop_last", "dataloader_persistent_workers", "dataloader_prefetch_factor",
                "dataloader_pin_memory", "data_seed", "torch_compile", "neftune_noise_alpha", "full_determinism",
                "auto_find_batch_size", "average_tokens_across_devices", "torch_empty_cache_steps", "push_to_hub", "hub_model_id",
                "report_to", "ddp_find_unused_parameters", "loraplus_lr_ratio", "loraplus_lr_embedding"}
SERVING = {"infer_backend", "vllm_maxlen", "vllm_gpu_util", "vllm_enforce_eager", "vllm_max_lora_rank", "vllm_config",
           "sglang_maxlen", "sglang_mem_fraction", "sglang_tp_size", "sglang_config", "sglang_lora_backend"}
EXPORT = {"export_dir", "export_size", "export_device", "export_quantization_bit",
          "export_quantization_dataset", "export_quantization_nsamples", "export_quantization_maxlen", "export_hub_model_id"}
NO_KIND = {"generation_max_length", "generation_num_beams"} | SERVING | EXPORT

WARNED = {
    "pt": {"asft_alpha", "eaft_alpha"} | PREFERENCE | KTO | PPO | REFERENCE | REWARD | GENERATION | NO_KIND,
    "sft": PREFERENCE | KTO | PPO | REWARD | NO_KIND,
    "rm": {"packing", "asft_alpha", "eaft_alpha", "label_smoothing_factor"} | PREFERENCE | KTO | PPO | REFERENCE | REWARD
          | GENERATION | NO_KIND,
    "dpo": {"packing", "asft_alpha", "eaft_alpha", "label_smoothing_factor"} | KTO | PPO | REWARD | GENERATION | NO_KIND,
    "kto": {"packing", "asft_alpha", "eaft_alpha", "pref_loss", "simpo_gamma", "label_smoothing_factor"} | PPO | REWARD
           | GENERATION | NO_KIND,
    "ppo": {"packing", "asft_alpha", "eaft_alpha", "do_sample", "skip_special_tokens", "eval_num_beams", "save_strategy",
            "train_sampling_strategy", "label_smoothing_factor"} | PREFERENCE | KTO | TRAINER_LOOP | NO_KIND,
    "grpo": {"packing", "asft_alpha", "eaft_alpha", "reward_model_type", "train_sampling_strategy", "label_smoothing_factor"}
            | PREFERENCE | KTO | PPO | NOT_SAMPLED | NO_KIND,
    "rloo": {"packing", "asft_alpha", "eaft_alpha", "reward_model_type", "train_sampling_strategy", "label_smoothing_factor"}
            | PREFERENCE | KTO | PPO | NOT_SAMPLED | NO_KIND,
}
"""The keys each kind trains with and warns of."""
REFUSED = {
    "pt": SFT_LABELS | SFT_LOSSES | ONLINE,
    "sft": ONLINE,
    "rm": SFT_LABELS | SFT_LOSSES | {"compute_accuracy"} | ONLINE,
    "dpo": SFT_LABELS | SFT_LOSSES | {"compute_accuracy"} | ONLINE,
    "kto": SFT_LABELS | SFT_LOSSES | {"compute_accuracy", "pref_ftx", "pref_bco_weight", "dpo_label_smoothing", "ld_alpha"} | ONLINE,
    "ppo": SFT_LABELS | SFT_LOSSES | TRAINER | {"eval_on_each_dataset", "compute_accuracy", "reward_model_adapters"} | ONLINE,
    "grpo": SFT_LABELS | SFT_LOSSES | {"eval_on_each_dataset", "compute_accuracy", "reward_model_adapters", "do_sample"},
    "rloo": SFT_LABELS | SFT_LOSSES | {"eval_on_each_dataset", "compute_accuracy", "reward_model_adapters", "do_sample"} | GRPO_ONLY,
}
"""The keys each kind refuses (as before this warning existed: LLaMA-Factory refuses them too, or they cannot train)."""
READ_WHEN = {
    ("sft", "asft_alpha"): {"use_asft_loss": True}, ("sft", "eaft_alpha"): {"use_eaft_loss": True},
    **{("sft", key): {"use_asft_loss": True} for key in REFERENCE},
    **{("sft", key): PREDICTING for key in GENERATION},
    ("dpo", "simpo_gamma"): {"pref_loss": "simpo"},
    **{(kind, key): {"beta": 0.04} for kind in ("grpo", "rloo") for key in REFERENCE},
}
"""The settings under which a kind reads a key it reads only sometimes (each also warned without them, below)."""
NEEDS_THE_MACHINE = {"use_vllm", "infer_backend"}  # refused where vLLM or SGLang cannot run (no CUDA here)


def raw_config(kind: str, key: str) -> dict:
    return {"stage": kind, **BASES.get(kind, {}), **READ_WHEN.get((kind, key), {}), **SAMPLES[key]}


def test_the_tables_cover_every_stage_key_and_the_kinds_declare_no_other():
    assert set(SAMPLES) == set(STAGE_KEYS)
    for name, kind in KINDS.items():
        assert WARNED[name].isdisjoint(REFUSED[name]), name
        assert kind.reads <= set(STAGE_KEYS), sorted(kind.reads - set(STAGE_KEYS))
        config, _ = read_stage_config({"stage": name})
        assert set(kind.unread_keys(config)) <= set(STAGE_KEYS), name


@pytest.mark.parametrize("kind", list(KINDS))
def test_each_ignored_key_gets_one_line_naming_key_stage_and_why(kind: str):
    for key in sorted(WARNED[kind]):
        if key in NEEDS_THE_MACHINE:
            config, _ = read_stage_config(raw_config(kind, key))
        else:
            config = build_stage_config(raw_config(kind, key))  # it trains: a warning, not a refusal
        ignored = ignored_keys(config)
        lines = [item.line for item in ignored if item.key == key]
        assert len(lines) == 1, (key, lines)
        assert key in tag_value(ignored).split(","), (key, tag_value(ignored))  # what the stage's MLflow run records
        assert lines[0].startswith(f"'{key}: ") and f"has no effect in stage '{kind}' and is ignored: " in lines[0], lines[0]
        assert "What it does: " in lines[0] and "\n" not in lines[0]


@pytest.mark.parametrize("kind", list(KINDS))
def test_no_warning_for_the_keys_a_kind_reads(kind: str):
    read = set(STAGE_KEYS) - WARNED[kind] - REFUSED[kind]
    assert read, kind
    for key in sorted(read):
        if key in NEEDS_THE_MACHINE:
            config, _ = read_stage_config(raw_config(kind, key))
        else:
            config = build_stage_config(raw_config(kind, key))
        assert key not in {item.key for item in ignored_keys(config)}, (kind, key)


@pytest.mark.parametrize("kind", list(KINDS))
def test_keys_refused_before_stay_refused_naming_the_key(kind: str):
    for key in sorted(REFUSED[kind]):
        with pytest.raises(ConfigError) as error:
            build_stage_config(raw_config(kind, key))
        assert any(key in problem for problem in error.value.problems), (key, error.value.problems)


@pytest.mark.parametrize(("raw", "key", "why"), [
    ({"stage": "sft", "temperature": 0.5}, "temperature",
     "stage sft generates only to predict ('do_predict: true' with 'predict_with_generate: true'), which this run does "
     "not ask for"),
    ({"stage": "dpo", "simpo_gamma": 1.0}, "simpo_gamma", "stage dpo reads it only with 'pref_loss: simpo', not 'sigmoid'"),
    ({"stage": "grpo", "reward_funcs": "answer_match", "ref_model": "reference"}, "ref_model",
     "stage grpo loads a reference model only for the KL penalty, and 'beta' is 0 (set beta > 0 to use it)"),
    ({"stage": "rloo", "reward_funcs": "answer_match", "max_new_tokens": 64}, "max_new_tokens",
     "stage rloo bounds its completions with 'max_completion_length' instead"),
    ({"stage": "ppo", "reward_model": "scorer", "do_sample": False}, "do_sample", "stage ppo always samples its rollouts"),
    ({"stage": "kto", "pref_loss": "orpo"}, "pref_loss", "only stage dpo reads it"),
    ({"stage": "sft", "reward_model_adapters": "adapter", "reward_model": "scorer"}, "reward_model_adapters",
     "no stage kind reads it"),
    ({"stage": "ppo", "reward_model": "scorer", "optim": "adafactor"}, "optim",
     "stage ppo trains in its own loop, which does not use it"),
    ({"stage": "ppo", "reward_model": "scorer", "save_strategy": "epoch"}, "save_strategy",
     "stage ppo trains in its own loop, which saves checkpoints by steps only ('save_steps') or not at all ('no')"),
    ({"stage": "sft", "use_dft_loss": True, "label_smoothing_factor": 0.1}, "label_smoothing_factor",
     "'use_dft_loss: true' computes its own loss, which does not smooth the labels"),
    ({"stage": "rloo", "reward_funcs": "answer_match", "train_sampling_strategy": "sequential"}, "train_sampling_strategy",
     "stage rloo draws its prompts with TRL's sampler, which repeats each prompt for its group and orders them by "
     "'disable_shuffling'"),
    ({"stage": "sft", "do_predict": True, "predict_with_generate": True, "val_size": 0.1, "dataset": "demo_alpaca",
      "generation_num_beams": 4}, "generation_num_beams",
     "predictions take their length from 'max_new_tokens' (or 'max_length') and their beams from 'num_beams' (or "
     "'eval_num_beams'), which always override it, as in LLaMA-Factory"),
    ({"stage": "sft", "export_dir": "merged"}, "export_dir",
     "a training stage exports no model; `tuneline export` reads it (a pipeline exports with its 'export' section)"),
    ({"stage": "dpo", "vllm_gpu_util": 0.5}, "vllm_gpu_util",
     "a training stage serves no model; `tuneline chat`, `tuneline api` and `tuneline webchat` read it from an "
     "inference config"),
])
def test_a_key_a_kind_reads_only_sometimes_says_when(raw: dict, key: str, why: str):
    [ignored] = [item for item in ignored_keys(build_stage_config(raw)) if item.key == key]
    assert ignored.why == why


def test_the_line_and_the_tag_of_a_reward_model_with_packing_and_sampling_keys():
    ignored = ignored_keys(build_stage_config({"stage": "rm", "packing": True, "top_p": 0.9, "pref_beta": 0.1}))
    assert [item.line for item in ignored] == [
        "'packing: true' has no effect in stage 'rm' and is ignored: only stages pt and sft read it. What it does: Pack "
        "examples into full-length sequences (default: on for pt).",
        "'top_p: 0.9' has no effect in stage 'rm' and is ignored: only stages sft, ppo, grpo and rloo read it. What it "
        "does: Nucleus sampling mass.",
    ]  # pref_beta at its default asks for nothing
    assert tag_value(ignored) == "packing,top_p"


def test_a_config_that_sets_nothing_stage_specific_gets_no_warning():
    for name in KINDS:
        assert ignored_keys(build_stage_config({"stage": name, **BASES.get(name, {})})) == [], name


def test_packing_reaches_only_the_encoders_of_single_sequences():
    from tuneline.core.data.encoding import EncodingSpec
    from tuneline.core.templates.conversation import get_template

    config = build_stage_config({"stage": "rm", "packing": True})
    packing = {shape: EncodingSpec.from_config(config, template=get_template("default"), examples=shape).packing
               for shape in ("pretrain", "supervised", "pairwise", "feedback", "unsupervised")}
    assert packing == {"pretrain": True, "supervised": True, "pairwise": None, "feedback": None, "unsupervised": None}


def test_grpo_with_vllm_says_its_vllm_takes_trl_settings():
    config, _ = read_stage_config({"stage": "grpo", "reward_funcs": "answer_match", "use_vllm": True, "vllm_gpu_util": 0.5})
    [ignored] = [item for item in ignored_keys(config) if item.key == "vllm_gpu_util"]
    assert ignored.why == ("stage grpo runs vLLM with TRL's settings of 'use_vllm' and 'vllm_mode', not with the inference "
                           "engine's")


def test_the_trainer_arguments_defaults_are_transformers_own():
    """Read from transformers' source (importing its trainer arguments costs seconds of torch)."""
    import ast
    import importlib.util
    from importlib import metadata
    from pathlib import Path

    from tuneline.core.stages.stage_keys import TRAINER_ARGUMENTS

    package = Path(importlib.util.find_spec("transformers").origin).parent
    torch_version = tuple(int(part) for part in metadata.version("torch").split(".")[:2])
    defaults = {}
    for module in ("training_args.py", "training_args_seq2seq.py"):
        for node in ast.walk(ast.parse((package / module).read_text(encoding="utf-8"))):
            if isinstance(node, ast.AnnAssign) and isinstance(node.value, ast.Call):
                default = next((k.value for k in node.value.keywords if k.arg == "default"), None)
                if default is not None and node.target.id in TRAINER_ARGUMENTS:
                    if isinstance(default, ast.Name) and default.id == "default_optim":  # fused AdamW from torch 2.8
                        defaults[node.target.id] = "adamw_torch_fused" if torch_version >= (2, 8) else "adamw_torch"
                    else:
                        defaults[node.target.id] = ast.literal_eval(default)
    assert {key: default for key, (default, _) in TRAINER_ARGUMENTS.items()} == {key: defaults[key] for key in TRAINER_ARGUMENTS}


def test_ppo_loop_reads_none_of_the_trainer_arguments_it_is_said_to_ignore():
    """The warning's claim, checked against the loop's source: every argument it reads off the
    TrainingArguments (`args.<name>`) is one the kind does not warn of."""
    import importlib.util
    import re
    from pathlib import Path

    loop = importlib.util.find_spec("tuneline.core.stages.ppo.trainer").origin  # its source only: importing it loads torch
    source = Path(loop).read_text(encoding="utf-8")
    read = set(re.findall(r"\bargs\.(\w+)", source)) | set(re.findall(r"job\.training\.get\(\"(\w+)\"", source))
    assert {"learning_rate", "lr_scheduler_type", "max_grad_norm", "weight_decay", "save_steps", "logging_steps"} <= read
    config = build_stage_config({"stage": "ppo", **BASES["ppo"]})
    assert read.isdisjoint(KINDS["ppo"].unread_keys(config)), sorted(read & set(KINDS["ppo"].unread_keys(config)))


MEDIA_SAMPLES = {"image_max_pixels": 512 * 512, "image_min_pixels": 64 * 64, "image_do_pan_and_scan": True,
                 "crop_to_patches": True, "video_max_pixels": 128 * 128, "video_min_pixels": 32 * 32, "video_fps": 1.0,
                 "video_maxlen": 16, "use_audio_in_video": True, "audio_sampling_rate": 8000}
"""Each media key away from its default."""
TEXT_DATASETS = "alpaca_en_demo,identity"
MEDIA_DATASETS = ["mllm_demo", "mllm_video_demo", "mllm_audio_demo", "alpaca_en_demo,mllm_demo"]


def test_the_media_table_covers_every_media_key():
    assert set(MEDIA_SAMPLES) == set(MEDIA_KEYS)


@pytest.mark.parametrize("kind", ["sft", "dpo", "kto"])
def test_each_media_key_of_a_text_only_run_gets_one_line(kind: str, shared_dir):
    data = str(shared_dir / "llamafactory" / "data")
    config = build_stage_config({"stage": kind, "dataset": TEXT_DATASETS, "dataset_dir": data, **MEDIA_SAMPLES})
    assert datasets_map_media(config) is False
    ignored = ignored_keys(config, maps_media=False)
    assert [item.key for item in ignored] == list(MEDIA_KEYS)  # in MediaConfig's order
    assert {item.why for item in ignored} == {"no dataset of this stage maps images, videos or audio, so no media "
                                              "processor runs"}
    assert ignored[0].line == (f"'image_max_pixels: 262144' has no effect in stage '{kind}' and is ignored: no dataset of "
                               "this stage maps images, videos or audio, so no media processor runs. What it does: Images "
                               "larger than this many pixels are scaled down.")
    assert tag_value(ignored) == ",".join(MEDIA_KEYS)


@pytest.mark.parametrize("datasets", MEDIA_DATASETS)
def test_no_media_line_when_a_dataset_maps_media(datasets: str, shared_dir):
    data = str(shared_dir / "llamafactory" / "data")
    config = build_stage_config({"stage": "sft", "dataset": TEXT_DATASETS, "eval_dataset": datasets, "dataset_dir": data,
                                 **MEDIA_SAMPLES})  # an evaluation dataset with media counts too
    assert datasets_map_media(config) is True
    assert ignored_keys(config, maps_media=True) == []


def test_without_a_media_key_set_no_dataset_is_read(tmp_path):
    config = build_stage_config({"stage": "sft", "dataset": "anything", "dataset_dir": str(tmp_path / "absent")})
    assert datasets_map_media(config) is None
    assert ignored_keys(config, maps_media=datasets_map_media(config)) == []
