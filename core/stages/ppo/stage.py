"""Stage ppo: proximal policy optimisation against a reward model from an rm stage.

Its own training loop (`trainer.py`: rollouts, scores, advantages, clipped updates) on accelerate;
its arithmetic in `arithmetic.py`; its checkpoints and outputs in `checkpoint.py`.
"""

from __future__ import annotations

from tuneline.core.config import StageConfig, trains
from tuneline.core.stages.kind import LoopRequest, StageKind
from tuneline.core.stages.rm import reward_model_key_problems
from tuneline.core.stages.stage_keys import (
    CHECKPOINT_KEYS,
    GENERATION_KEYS,
    LABEL_SMOOTHING_KEYS,
    REFERENCE_KEYS,
    TRAINER_LOOP_KEYS,
    TRAINER_SAMPLER_KEYS,
)

PPO_KEYS = ("ppo_buffer_size", "ppo_epochs", "ppo_score_norm", "ppo_target", "ppo_whiten_rewards")

# ppo always samples its rollouts, and scores their token ids (never decoded text)
ROLLOUT_KEYS = tuple(key for key in GENERATION_KEYS if key not in ("do_sample", "skip_special_tokens"))


def ppo_problems(config: StageConfig) -> list[str]:
    """PPO settings that could not train, one line each (checked when the config is read)."""
    finetuning = config.finetuning
    problems = []
    if not finetuning.reward_model:
        problems.append("'stage: ppo' needs 'reward_model': the output folder of an rm stage (or, in a pipeline, "
                        "the name of an rm stage).")
    problems.extend(reward_model_key_problems(finetuning))
    if finetuning.ppo_epochs < 1 or finetuning.ppo_buffer_size < 1:
        problems.append(f"'ppo_epochs' and 'ppo_buffer_size' must be at least 1, got {finetuning.ppo_epochs} and "
                        f"{finetuning.ppo_buffer_size}.")
    if config.model.shift_attn:
        problems.append("'shift_attn: true' cannot train with 'stage: ppo': the policy generates its rollouts and trains "
                        "on them in one loop, which S^2-Attn's training-only grouping was not made for (LLaMA-Factory "
                        "refuses it too); remove shift_attn.")
    if finetuning.ppo_target <= 0:
        problems.append(f"'ppo_target' must be positive, got {finetuning.ppo_target}.")
    if finetuning.reward_model_type == "lora" and finetuning.finetuning_type != "lora":
        problems.append(f"'reward_model_type: lora' needs 'finetuning_type: lora' (the reward adapter rides on the policy's "
                        f"base), not '{finetuning.finetuning_type}'; set 'reward_model_type: full' or train with LoRA.")
    if finetuning.pissa_init:
        problems.append("'pissa_init: true' cannot train stage 'ppo' against its reference (PiSSA rewrites the base the "
                        "reference is read from); remove pissa_init.")
    if not trains(config.training):
        problems.append("'do_train: false' leaves stage ppo nothing to do (it cannot only evaluate); evaluate with an sft "
                        "stage's config instead.")
    return problems


def _unread_keys(config: StageConfig) -> dict[str, str]:
    """Besides the generation keys its rollouts do not take, the Trainer's arguments that its own loop
    (`trainer.py`) does not use, and a checkpoint schedule other than by steps."""
    unread = {"do_sample": "stage ppo always samples its rollouts",
              "skip_special_tokens": "stage ppo scores the token ids of its rollouts and decodes no text",
              **dict.fromkeys((*TRAINER_LOOP_KEYS, *TRAINER_SAMPLER_KEYS, *LABEL_SMOOTHING_KEYS),
                              "stage ppo trains in its own loop, which does not use it")}
    strategy = config.training.get("save_strategy")
    if strategy in ("epoch", "best"):
        unread["save_strategy"] = ("stage ppo trains in its own loop, which saves checkpoints by steps only "
                                   "('save_steps') or not at all ('no')")
    return unread


def _train(request: LoopRequest) -> dict[str, float]:
    from tuneline.core.stages.ppo.trainer import train_ppo  # torch and accelerate load only when ppo trains

    return train_ppo(request)


PPO = StageKind(
    name="ppo",
    summary="proximal policy optimisation: sampled replies scored by a reward model, KL-penalised against a reference",
    examples="unsupervised",
    references=frozenset({"ref_model", "reward_model"}),
    config_problems=ppo_problems,
    # reward_model_adapters is refused (reward_model_key_problems)
    reads=frozenset({*PPO_KEYS, *REFERENCE_KEYS, "reward_model", "reward_model_quantization_bit",
                     "reward_model_type", *ROLLOUT_KEYS, *CHECKPOINT_KEYS}),
    unread_keys=_unread_keys,
    own_keys=PPO_KEYS,
    owns_optimizer=True,  # AdamW in its own loop
    train_loop=_train,
    trainer_modules=("accelerate", "trl.trainer.utils", "tuneline.core.stages.ppo.trainer"),
)
