"""Stages grpo and rloo: online reinforcement learning with rewards a program computes, on TRL's
GRPOTrainer and RLOOTrainer.

Each step samples `num_generations` completions per prompt (the prompts rendered by the stage's
template, `temperature`/`top_p`/`top_k` as for every generation here), scores them with the rewards
`reward_funcs` names (built-in verifiable rewards or `module:function`) and `reward_model` (an rm
stage's output), weighted by `reward_weights`, and moves the policy towards the completions that beat
their group: GRPO's advantage is the reward minus the group's mean (divided by its spread unless
`scale_rewards` says otherwise), RLOO's the reward minus the mean of the group's other completions.
`beta` > 0 adds a KL penalty against the reference (the policy's start, or `ref_model`).

After training, each held-out prompt gets a greedy completion from the starting policy and from
the trained one: `eval_mean_reward(_before)` and `eval_pass_rate(_before)` (`core.evaluation.pass_rate`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tuneline.core.config import FinetuningConfig, StageConfig, trains
from tuneline.core.errors import ConfigError
from tuneline.core.stages.causal_lm import load_policy
from tuneline.core.stages.kind import StageKind, TrainerRequest
from tuneline.core.stages.rm import reward_model_key_problems
from tuneline.core.stages.stage_keys import (
    CHECKPOINT_KEYS,
    REFERENCE_KEYS,
    SAMPLING_KEYS,
    SERVING_KEYS,
    TRAINER_KEYS,
    TRAINER_LOOP_KEYS,
    TRAINER_SAMPLER_KEYS,
)

if TYPE_CHECKING:
    from datasets import Dataset
    from transformers import PreTrainedTokenizerBase, Trainer

ONLINE_KEYS = ("num_generations", "beta", "epsilon", "epsilon_high", "loss_type", "importance_sampling_level", "scale_rewards",
               "num_iterations", "max_completion_length", "mask_truncated_completions", "reward_funcs", "reward_weights",
               "use_vllm", "vllm_mode")
"""The keys of the online RL stages, in TRL's names (LLaMA-Factory has none for them)."""
GRPO_ONLY_KEYS = ("loss_type", "importance_sampling_level", "scale_rewards")
GRPO_LOSSES = ("grpo", "dr_grpo", "dapo", "bnpo", "cispo", "sapo", "luspo", "vespo")  # TRL 1.16's loss_type values
LOG_KEYS = ("reward_std", "frac_reward_zero_std", "kl", "entropy", "rewards/", "completions/", "clip_ratio/")
"""What TRL's online trainers log per step besides the reward: each reward's mean and spread, the KL,
the clip ratios, the completion lengths."""


def online_problems(config: StageConfig) -> list[str]:
    """Settings an online RL stage could not train with, one line each (checked when the config is read)."""
    from tuneline.core.evaluation.reward_functions import names_of
    from tuneline.core.stages.preference import pissa_problems

    ft, stage = config.finetuning, config.finetuning.stage
    problems = []
    if not names_of(ft.reward_funcs) and not ft.reward_model:
        problems.append(f"'stage: {stage}' needs rewards: 'reward_funcs' (built-in rewards such as answer_match, "
                        "think_answer_format, or module:function) and/or 'reward_model' (an rm stage's output).")
    problems.extend(_reward_problems(ft))
    if ft.num_generations < 2:
        problems.append(f"'num_generations' must be at least 2 (each completion is compared with its group), got {ft.num_generations}.")
    if ft.max_completion_length < 1:
        problems.append(f"'max_completion_length' must be at least 1, got {ft.max_completion_length}.")
    if ft.beta < 0:
        problems.append(f"'beta' must be 0 or more, got {ft.beta}.")
    if ft.epsilon <= 0 or (ft.epsilon_high is not None and ft.epsilon_high < ft.epsilon):
        problems.append(f"'epsilon' must be positive and 'epsilon_high' (when set) at least epsilon, got {ft.epsilon} and "
                        f"{ft.epsilon_high}.")
    if ft.num_iterations < 1:
        problems.append(f"'num_iterations' must be at least 1, got {ft.num_iterations}.")
    if ft.use_vllm:
        problems.extend(_vllm_problems())
    if not config.generating.do_sample:
        problems.append(f"'do_sample: false' cannot train stage '{stage}', which samples a group of different completions "
                        "per prompt; remove it.")
    if config.model.shift_attn:
        problems.append(f"'shift_attn: true' cannot train stage '{stage}': the policy generates and trains in one loop, "
                        "which S^2-Attn's training-only grouping was not made for; remove shift_attn.")
    problems.extend(reward_model_key_problems(ft))
    if not trains(config.training):
        problems.append(f"'do_train: false' leaves stage {stage} nothing to do; remove it.")
    if config.data.eval_on_each_dataset:
        problems.append(f"'eval_on_each_dataset: true' is not supported by stage '{stage}', which scores all held-out "
                        "prompts together (eval_pass_rate, eval_mean_reward); remove the key.")
    batch = int(config.training.get("per_device_train_batch_size", 8)) * int(config.training.get("gradient_accumulation_steps", 1))
    if ft.num_generations >= 2 and batch % ft.num_generations:
        problems.append(f"per_device_train_batch_size x gradient_accumulation_steps ({batch}) must be a multiple of "
                        f"'num_generations' ({ft.num_generations}): each batch holds whole groups of completions.")
    problems.extend(pissa_problems(ft, uses_reference=ft.beta > 0))
    return problems


def _reward_problems(finetuning: FinetuningConfig) -> list[str]:
    from tuneline.core.evaluation.reward_functions import names_of, reward_functions, reward_weights

    names = names_of(finetuning.reward_funcs)
    problems = []
    try:
        if names:
            reward_functions(names, max_completion_length=max(finetuning.max_completion_length, 1))
    except ConfigError as e:
        problems.extend(e.problems)
    try:
        reward_weights(finetuning.reward_weights, count=len(names) + bool(finetuning.reward_model))
    except ConfigError as e:
        problems.extend(e.problems)
    return problems


def _vllm_problems() -> list[str]:
    import importlib.util

    import torch

    missing = [what for what, absent in (("the vllm package", importlib.util.find_spec("vllm") is None),
                                         ("a CUDA GPU", not torch.cuda.is_available())) if absent]
    if not missing:
        return []
    return [f"'use_vllm: true' generates with vLLM, which needs {' and '.join(missing)}; this machine has no "
            f"{' and no '.join(m.removeprefix('the ').removeprefix('a ') for m in missing)}. Remove use_vllm to generate "
            "with transformers (slower), or run on a CUDA machine with `pip install vllm`."]


def _rewards(request: TrainerRequest) -> tuple[list[Any], list[float]]:
    """The checked reward functions and their weights: `reward_funcs`, then `reward_model`."""
    from tuneline.core.evaluation.reward_functions import CheckedReward, RewardModelScore, names_of, reward_functions, reward_weights

    ft = request.finetuning
    rewards = reward_functions(ft.reward_funcs, max_completion_length=ft.max_completion_length) if names_of(ft.reward_funcs) else []
    if ft.reward_model:
        from tuneline.core.config import ModelConfig
        from tuneline.core.models.loading import load_reward_model

        model_config = request.model_config
        reward_model, reward_tokenizer = load_reward_model(ft.reward_model, model=ModelConfig(
            trust_remote_code=model_config.trust_remote_code, hf_hub_token=model_config.hf_hub_token,
            cache_dir=model_config.cache_dir, allow_pickle_weights=model_config.allow_pickle_weights,
            quantization_bit=ft.reward_model_quantization_bit))
        if reward_tokenizer.get_vocab() != request.tokenizer.get_vocab():
            raise ConfigError(f"'reward_model: {ft.reward_model}' uses another tokenizer than the policy; train the reward "
                              "model from the same base (or its fine-tuned descendant) so it reads the policy's tokens.")
        if getattr(reward_model, "hf_quantizer", None) is None:
            reward_model.to(request.args.device)
        reward_model.requires_grad_(False)
        scorer = RewardModelScore(reward_model, reward_tokenizer, batch_size=request.args.per_device_train_batch_size)
        rewards.append(CheckedReward("reward_model", scorer))
    return rewards, reward_weights(ft.reward_weights, count=len(rewards))


def build_online_trainer(request: TrainerRequest) -> Trainer:
    """TRL's GRPO or RLOO trainer on the stage's tokenized prompts, with its rewards and reference."""
    from tuneline.core.evaluation.predict import stop_token_ids
    from tuneline.core.stages.online_rl_trainers import TokenizedGRPOTrainer, TokenizedRLOOTrainer, prompt_rows
    from tuneline.core.stages.preference import dtype_keys, reference_model
    from tuneline.core.stages.trl_trainers import trl_trainer
    from tuneline.core.training.trl_args import trl_config

    ft, generating = request.finetuning, request.generating
    if ft.use_vllm and _vllm_problems():
        raise ConfigError(_vllm_problems())
    rewards, weights = _rewards(request)
    shared: dict[str, Any] = dict(
        num_generations=ft.num_generations, beta=ft.beta, epsilon=ft.epsilon, epsilon_high=ft.epsilon_high,
        num_iterations=ft.num_iterations, max_completion_length=ft.max_completion_length,
        mask_truncated_completions=ft.mask_truncated_completions, reward_weights=weights,
        temperature=generating.temperature, top_p=generating.top_p, top_k=generating.top_k,
        repetition_penalty=generating.repetition_penalty, use_vllm=ft.use_vllm, vllm_mode=ft.vllm_mode,
        shuffle_dataset=not ft.disable_shuffling,
        disable_dropout=True,  # log-probabilities of the same tokens must agree between sampling and update
        remove_unused_columns=False,  # the reward columns (answer, prompt_ids) travel with each prompt
        log_completions=False,  # tuneline writes its own sample (completions.jsonl, the MLflow table)
    )
    if ft.stage == "grpo":
        from trl import GRPOConfig

        scale = {True: "group", False: "none"}.get(ft.scale_rewards, ft.scale_rewards)
        config: Any = trl_config(GRPOConfig, request.args, loss_type=ft.loss_type, scale_rewards=scale,
                                 importance_sampling_level=ft.importance_sampling_level, **shared)
        trainer_class: Any = TokenizedGRPOTrainer
    else:
        from trl import RLOOConfig

        config = trl_config(RLOOConfig, request.args, **shared)
        trainer_class = TokenizedRLOOTrainer
    # every stop word of the template ends a completion, as in sft's labels
    request.model.generation_config.eos_token_id = stop_token_ids(request.tokenizer, request.model)
    reference = None
    if ft.beta > 0:
        reference = reference_model(request.model, ft, model_config=request.model_config, vocab_size=len(request.tokenizer),
                                    training=dtype_keys(config), model_max_length=request.model_max_length)
    validation = request.eval_dataset
    held_out = None
    if validation is not None and not isinstance(validation, dict):
        held_out = _held_out_scorer(prompt_rows(validation, request.tokenizer), request.tokenizer, rewards, weights, ft)
    convert = lambda dataset: prompt_rows(dataset, request.tokenizer)  # noqa: E731
    trainer = trl_trainer(trainer_class, request, config=config, convert=convert, reward_funcs=rewards, reference=reference,
                          held_out=held_out)
    from tuneline.core.stages.preference import drop_unneeded_ref_adapter

    drop_unneeded_ref_adapter(trainer.model)
    return trainer


def _held_out_scorer(rows: Dataset, tokenizer: PreTrainedTokenizerBase, rewards: list[Any], weights: list[float],
                     finetuning: FinetuningConfig):
    from tuneline.core.evaluation.pass_rate import held_out_rewards

    def held_out(trainer: Trainer) -> dict[str, float]:
        model = trainer.accelerator.unwrap_model(trainer.model)
        return held_out_rewards(model, tokenizer, rows, rewards=rewards, weights=weights,
                                max_new_tokens=finetuning.max_completion_length,
                                batch_size=trainer.args.per_device_eval_batch_size)

    return held_out


def online_metrics(trainer: Trainer, tokenizer: PreTrainedTokenizerBase, validation: Dataset, finetuning: FinetuningConfig,
                   *, prefix: str = "eval") -> dict[str, float]:
    """The held-out scores of the trained policy and (`_before`) of the starting one."""
    if trainer.held_out is None:
        return {}
    after = trainer.held_out(trainer)
    metrics = {f"{prefix}_{name}": value for name, value in after.items()}
    metrics.update({f"{prefix}_{name}_before": value for name, value in trainer.start_scores.items()})
    for name in ("mean_reward", "pass_rate"):
        if name in after and name in trainer.start_scores:
            metrics[f"{prefix}_{name}_gain"] = after[name] - trainer.start_scores[name]
    return metrics


def _unread_keys(config: StageConfig) -> dict[str, str]:
    """The generation keys that sampling groups does not take, and the reference model when 'beta: 0'
    (the default) leaves out the KL penalty, the reference's only use."""
    stage = config.finetuning.stage
    unread = {**dict.fromkeys(("max_new_tokens", "max_length"), f"stage {stage} bounds its completions with "
                                                                 "'max_completion_length' instead"),
              **dict.fromkeys(("num_beams", "length_penalty"), f"stage {stage} samples its completions without beam search"),
              "skip_special_tokens": f"stage {stage} always decodes the completions it rewards without special tokens",
              **dict.fromkeys(TRAINER_SAMPLER_KEYS, f"stage {stage} draws its prompts with TRL's sampler, which repeats "
                                                    "each prompt for its group and orders them by 'disable_shuffling'")}
    if config.finetuning.use_vllm:
        unread.update(dict.fromkeys((key for key in SERVING_KEYS if key.startswith("vllm_")),
                                    f"stage {stage} runs vLLM with TRL's settings of 'use_vllm' and 'vllm_mode', not with "
                                    "the inference engine's"))
    if config.finetuning.beta == 0:
        unread.update(dict.fromkeys(REFERENCE_KEYS, f"stage {stage} loads a reference model only for the KL penalty, "
                                                    "and 'beta' is 0 (set beta > 0 to use it)"))
    return unread


# reward_model_adapters is refused (reward_model_key_problems); an rm output loads whatever its type
REWARD_KEYS = ("reward_model", "reward_model_quantization_bit")


def grpo_problems(config: StageConfig) -> list[str]:
    """Those of `online_problems`, and a `loss_type` that is not one of GRPO's."""
    loss = config.finetuning.loss_type
    wrong_loss = [] if loss in GRPO_LOSSES else [f"'loss_type: {loss}' is not a GRPO loss; choose one of {', '.join(GRPO_LOSSES)}."]
    return [*online_problems(config), *wrong_loss]


def _kind(name: str, summary: str, *, keys: tuple[str, ...], config_problems: Callable[[StageConfig], list[str]]) -> StageKind:
    return StageKind(
        name=name,
        summary=summary,
        examples="unsupervised",
        references=frozenset({"ref_model", "reward_model"}),
        config_problems=config_problems,
        reads=frozenset({*ONLINE_READS, *keys}),
        own_keys=keys,
        exclusive_keys=frozenset(keys),  # tuneline's own keys: no LLaMA-Factory config sets them for another kind
        unread_keys=_unread_keys,
        load_model=load_policy,
        build_trainer=build_online_trainer,
        held_out_metrics=online_metrics,
        log_keys=LOG_KEYS,
        trainer_modules=("trl", "tuneline.core.stages.online_rl_trainers"),
    )


# eval_on_each_dataset is refused (online_problems): the held-out prompts are scored together
ONLINE_READS = frozenset({*TRAINER_KEYS, *TRAINER_LOOP_KEYS, *CHECKPOINT_KEYS, *REFERENCE_KEYS, *REWARD_KEYS, *SAMPLING_KEYS})
GRPO = _kind("grpo", "group relative policy optimisation: groups of sampled completions scored by verifiable rewards "
                     "or a reward model (GRPO, Dr. GRPO, DAPO, GSPO)", keys=ONLINE_KEYS, config_problems=grpo_problems)
RLOO = _kind("rloo", "REINFORCE leave-one-out: sampled completions scored by verifiable rewards or a reward model, "
                     "each against its group's other completions",
             keys=tuple(key for key in ONLINE_KEYS if key not in GRPO_ONLY_KEYS), config_problems=online_problems)
