"""The keys that several stage kinds read and others do not, in groups the kinds declare their reads with.

A kind lists the groups (or single keys) it reads in `StageKind.reads`; the keys that are one kind's
own (its loss, its rollouts: `StageKind.own_keys`) are declared in its module instead.
`core.stages.ignored_keys` reports every key whose reading depends on the kind (`STAGE_KEYS` there)
that a config sets away from its default and its kind does not read. Keys every kind reads (the
model, the method, the datasets, the trainer's batch, step and learning-rate arguments) are not
listed: only a key whose meaning depends on the stage belongs here. The template's keys
(`default_system`, `tool_format`, `enable_thinking`, ...) are read by every kind, pt included: they
shape the chat template saved with the stage's tokenizer, which its exports and servers render.
"""

from __future__ import annotations

from typing import Any

PACKING_KEYS = ("packing",)
"""Several single sequences packed into one row: the kinds that train on single sequences."""
SUPERVISED_LABEL_KEYS = ("neat_packing", "train_on_prompt", "mask_history", "ignore_pad_token_for_loss")
"""How the labels of supervised conversations are made and packed (stage sft)."""
TRAINER_KEYS = ("disable_shuffling", "include_effective_tokens_per_second", "early_stopping_steps")
"""Settings of the transformers Trainer that tuneline adds: the kinds that train through one."""
TRAINER_ARGUMENTS: dict[str, tuple[Any, str]] = {
    "optim": ("adamw_torch_fused", "The optimizer transformers' Trainer builds."),  # 'adamw_torch' before torch 2.8
    "optim_args": (None, "Further arguments of the Trainer's optimizer."),
    "optim_target_modules": (None, "The modules a GaLore/APOLLO optimizer of transformers projects."),
    "lr_scheduler_kwargs": (None, "Further arguments of the learning-rate schedule."),
    "eval_strategy": ("no", "When the Trainer evaluates during training."),
    "eval_steps": (None, "Steps between the Trainer's evaluations."),
    "eval_delay": (0, "Steps or epochs before the Trainer's first evaluation."),
    "eval_accumulation_steps": (None, "Evaluation steps whose outputs the Trainer gathers before moving them to the CPU."),
    "logging_strategy": ("steps", "When the Trainer logs."),
    "logging_first_step": (False, "Log the Trainer's first step too."),
    "save_strategy": ("steps", "When checkpoints are saved."),
    "save_only_model": (False, "Checkpoints hold the model only, without optimizer, schedule and random states."),
    "metric_for_best_model": (None, "The metric that picks the best checkpoint (and early stopping watches)."),
    "dataloader_num_workers": (0, "Processes that load the Trainer's batches."),
    "dataloader_drop_last": (False, "Drop the last incomplete batch."),
    "dataloader_persistent_workers": (False, "Keep the Trainer's loader processes between epochs."),
    "dataloader_prefetch_factor": (None, "Batches each loader process prepares ahead."),
    "dataloader_pin_memory": (True, "Pin the Trainer's batches in page-locked memory."),
    "train_sampling_strategy": ("random", "The order the Trainer draws training rows in."),
    "data_seed": (None, "Seed of the Trainer's data sampler (default: seed)."),
    "torch_compile": (False, "Compile the model with torch.compile."),
    "neftune_noise_alpha": (None, "NEFTune: noise added to the input embeddings while training."),
    "full_determinism": (False, "Deterministic algorithms throughout (slower)."),
    "auto_find_batch_size": (False, "Halve the batch until it fits in memory."),
    "average_tokens_across_devices": (True, "Normalise the loss by the tokens of all processes."),
    "torch_empty_cache_steps": (None, "Steps between emptying the accelerator's memory cache."),
    "push_to_hub": (False, "Push the model to the Hub at each save."),
    "hub_model_id": (None, "Hub repository that push_to_hub pushes to."),
    "report_to": ("none", "Experiment trackers the Trainer reports to."),
    "ddp_find_unused_parameters": (None, "DistributedDataParallel's find_unused_parameters."),
    "label_smoothing_factor": (0.0, "Label smoothing of the next-token cross-entropy."),
    "generation_max_length": (None, "transformers' Seq2SeqTrainer: the length of predictions when the generation "
                                    "keys do not give one."),
    "generation_num_beams": (None, "transformers' Seq2SeqTrainer: the beams of predictions when the generation "
                                   "keys do not give them."),
}
"""Arguments of transformers' Trainer (a stage's `training`) whose reading depends on the kind, with
transformers' default (a key is compared with it) and what it does; the names are transformers'."""
TRAINER_LOOP_KEYS = ("optim", "optim_args", "optim_target_modules", "lr_scheduler_kwargs", "eval_strategy", "eval_steps",
                     "eval_delay", "eval_accumulation_steps", "logging_strategy", "logging_first_step", "save_only_model",
                     "metric_for_best_model", "dataloader_num_workers", "dataloader_drop_last",
                     "dataloader_persistent_workers", "dataloader_prefetch_factor", "dataloader_pin_memory", "data_seed",
                     "torch_compile", "neftune_noise_alpha", "full_determinism", "auto_find_batch_size",
                     "average_tokens_across_devices", "torch_empty_cache_steps", "push_to_hub", "hub_model_id", "report_to",
                     "ddp_find_unused_parameters", "loraplus_lr_ratio", "loraplus_lr_embedding")
"""What transformers' Trainer reads (and the LoRA+ optimizer tuneline gives it): the kinds that train
through one. Stage ppo trains in its own loop (its optimizer AdamW, its schedule, checkpoints and
logs by step), which reads the Trainer's batch, step, learning-rate, schedule, warmup, AdamW,
clipping, precision, checkpointing and seed arguments and no others."""
CHECKPOINT_KEYS = ("save_strategy",)
"""When checkpoints are saved: every kind, stage ppo by steps only."""
TRAINER_SAMPLER_KEYS = ("train_sampling_strategy",)
"""The order of the rows of the Trainer's own sampler: the kinds that keep it (TRL's online trainers replace it)."""
LABEL_SMOOTHING_KEYS = ("label_smoothing_factor",)
"""transformers' label smoothing, which only its own next-token loss applies (the kinds of TRL and
tuneline's loss variants compute theirs)."""
PER_DATASET_EVALUATION_KEYS = ("eval_on_each_dataset",)
"""The trainer's evaluation metrics named per dataset: the kinds whose trainer evaluates by loss."""
LANGUAGE_MODEL_KEYS = ("compute_accuracy",)
"""Next-token accuracy: the kinds whose loss is next-token prediction."""
REFERENCE_KEYS = ("ref_model", "ref_model_adapters", "ref_model_quantization_bit")
REWARD_MODEL_KEYS = ("reward_model", "reward_model_adapters", "reward_model_quantization_bit", "reward_model_type")
SAMPLING_KEYS = ("do_sample", "temperature", "top_p", "top_k", "repetition_penalty")
"""How a sampled completion is drawn."""
GENERATION_KEYS = (*SAMPLING_KEYS, "max_new_tokens", "max_length", "num_beams", "length_penalty", "skip_special_tokens")
"""Every key of generation (`GeneratingConfig`): what do_predict answers with."""
PREDICTION_KEYS = (*GENERATION_KEYS, "eval_num_beams")
"""What `do_predict` with `predict_with_generate` reads."""
SERVING_KEYS = ("infer_backend", "vllm_maxlen", "vllm_gpu_util", "vllm_enforce_eager", "vllm_max_lora_rank", "vllm_config",
                "sglang_maxlen", "sglang_mem_fraction", "sglang_tp_size", "sglang_config", "sglang_lora_backend")
"""The inference engine's keys: `tuneline chat`, `tuneline api` and `tuneline webchat` read them."""
EXPORT_KEYS = ("export_dir", "export_size", "export_device", "export_quantization_bit",
               "export_quantization_dataset", "export_quantization_nsamples", "export_quantization_maxlen",
               "export_hub_model_id")
"""`tuneline export`'s keys (a pipeline exports with its own 'export' section)."""
READ_BY_NO_KIND: dict[str, str] = {
    **dict.fromkeys(("generation_max_length", "generation_num_beams"),
                    "predictions take their length from 'max_new_tokens' (or 'max_length') and their beams from "
                    "'num_beams' (or 'eval_num_beams'), which always override it, as in LLaMA-Factory"),
    **dict.fromkeys(SERVING_KEYS, "a training stage serves no model; `tuneline chat`, `tuneline api` and "
                                  "`tuneline webchat` read it from an inference config"),
    **dict.fromkeys(EXPORT_KEYS, "a training stage exports no model; `tuneline export` reads it (a pipeline "
                                 "exports with its 'export' section)"),
}
"""Keys no stage kind reads, with why."""
