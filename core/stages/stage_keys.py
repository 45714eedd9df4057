"""The keys that some stage kinds read and others do not, in groups the kinds declare their reads with.

A kind lists the groups (or single keys) it reads in `StageKind.reads`; `core.stages.ignored_keys`
reports every key of `STAGE_KEYS` that a config sets away from its default and its kind does not
read. Keys every kind reads (the model, the method, the datasets, the trainer's arguments) are not
listed: only a key whose meaning depends on the stage belongs here. The template's keys
(`default_system`, `tool_format`, `enable_thinking`, ...) are read by every kind, pt included: they
shape the chat template saved with the stage's tokenizer, which its exports and servers render.
"""

from __future__ import annotations

PACKING_KEYS = ("packing",)
"""Several single sequences packed into one row: the kinds that train on single sequences."""
SUPERVISED_LABEL_KEYS = ("neat_packing", "train_on_prompt", "mask_history", "ignore_pad_token_for_loss")
"""How the labels of supervised conversations are made and packed (stage sft)."""
TRAINER_KEYS = ("disable_shuffling", "include_effective_tokens_per_second", "early_stopping_steps")
"""Settings of the transformers Trainer that tuneline adds: the kinds that train through one."""
PER_DATASET_EVALUATION_KEYS = ("eval_on_each_dataset",)
"""The trainer's evaluation metrics named per dataset: the kinds whose trainer evaluates by loss."""
LANGUAGE_MODEL_KEYS = ("compute_accuracy",)
"""Next-token accuracy: the kinds whose loss is next-token prediction (pt, sft)."""
SFT_LOSS_KEYS = ("use_dft_loss", "use_eaft_loss", "use_asft_loss", "asft_alpha", "eaft_alpha")
PREFERENCE_KEYS = ("pref_beta", "pref_ftx", "pref_bco_weight", "pref_loss", "dpo_label_smoothing", "simpo_gamma", "ld_alpha")
KTO_KEYS = ("kto_chosen_weight", "kto_rejected_weight")
PPO_KEYS = ("ppo_buffer_size", "ppo_epochs", "ppo_score_norm", "ppo_target", "ppo_whiten_rewards")
REFERENCE_KEYS = ("ref_model", "ref_model_adapters", "ref_model_quantization_bit")
REWARD_MODEL_KEYS = ("reward_model", "reward_model_adapters", "reward_model_quantization_bit", "reward_model_type")
ONLINE_KEYS = ("num_generations", "beta", "epsilon", "epsilon_high", "loss_type", "importance_sampling_level", "scale_rewards",
               "num_iterations", "max_completion_length", "mask_truncated_completions", "reward_funcs", "reward_weights",
               "use_vllm", "vllm_mode")
"""The keys of the online RL stages (grpo, rloo), in TRL's names."""
GRPO_ONLY_KEYS = ("loss_type", "importance_sampling_level", "scale_rewards")
SAMPLING_KEYS = ("do_sample", "temperature", "top_p", "top_k", "repetition_penalty")
"""How a sampled completion is drawn."""
GENERATION_KEYS = (*SAMPLING_KEYS, "max_new_tokens", "max_length", "num_beams", "length_penalty", "skip_special_tokens")
"""Every key of generation (`GeneratingConfig`): what do_predict answers with."""
PREDICTION_KEYS = (*GENERATION_KEYS, "eval_num_beams")
"""What `do_predict` with `predict_with_generate` reads."""

STAGE_KEYS: tuple[str, ...] = tuple(dict.fromkeys((
    *PACKING_KEYS, *SUPERVISED_LABEL_KEYS, *TRAINER_KEYS, *PER_DATASET_EVALUATION_KEYS,
    *LANGUAGE_MODEL_KEYS, *SFT_LOSS_KEYS, *PREFERENCE_KEYS, *KTO_KEYS, *PPO_KEYS, *REFERENCE_KEYS, *REWARD_MODEL_KEYS,
    *ONLINE_KEYS, *PREDICTION_KEYS,
)))
"""Every key whose reading depends on the stage kind, in the order warnings name them."""
