"""Reward modelling (stage rm): the chosen base with a one-output scoring head, trained on pairs.

LLaMA-Factory puts a value head on the causal LM (TRL's `AutoModelForCausalLMWithValueHead`, which
TRL 1.x no longer ships) and reads the value at the last non-padding token. tuneline loads the
base as transformers' `AutoModelForSequenceClassification` with `num_labels=1`, whose `score` head
reads the same position, and trains it with TRL's `RewardTrainer` on the pairwise loss
-log sigmoid(r_chosen - r_rejected). With LoRA the head trains in full and is saved inside the
adapter (`modules_to_save`), so base plus adapter folder is the whole reward model, which
`core.models.loading.load_reward_model` loads back for a later stage (PPO) to score texts with
(`core.evaluation.reward.score`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tuneline.core.config import FinetuningConfig
from tuneline.core.errors import ConfigError
from tuneline.core.stages.kind import ModelRequest, StageKind, TrainerRequest
from tuneline.core.stages.stage_keys import (
    CHECKPOINT_KEYS,
    PER_DATASET_EVALUATION_KEYS,
    TRAINER_KEYS,
    TRAINER_LOOP_KEYS,
    TRAINER_SAMPLER_KEYS,
)
from tuneline.core.stages.trl_trainers import trl_trainer

if TYPE_CHECKING:
    from datasets import Dataset
    from transformers import PreTrainedModel, PreTrainedTokenizerBase, Trainer
    from trl import RewardTrainer

# Names transformers gives the head of a sequence-classification model.
HEAD_NAMES = ("score", "classifier")


def head_name(model: PreTrainedModel) -> str:
    """The attribute holding the scoring head."""
    children = dict(model.named_children())
    for name in HEAD_NAMES:
        if name in children:
            return name
    raise ConfigError(f"{type(model).__name__} has no scoring head named {' or '.join(HEAD_NAMES)}; "
                      "stage rm needs a model family that transformers loads for sequence classification.")


def build_reward_trainer(request: TrainerRequest) -> RewardTrainer:
    """TRL's RewardTrainer, ready to train on tuneline's tokenized pairs (stage rm).

    Dropout stays as configured (LLaMA-Factory's reward trainer keeps it); sequences are not cut
    again, tokenization already applied `cutoff_len`.
    """
    from trl import RewardConfig, RewardTrainer

    from tuneline.core.data.preference_columns import reward_pairs
    from tuneline.core.training.trl_args import trl_config

    config = trl_config(RewardConfig, request.args, max_length=None, disable_dropout=False)
    trainer = trl_trainer(RewardTrainer, request, config=config, convert=reward_pairs)
    _head_in_hidden_dtype(trainer.model)
    media = request.media_rows
    if media is not None:  # pairs of media rows: each pair's pixels fed for its chosen and its rejected sequence
        from tuneline.core.data.media.batching import PairedMediaCollator

        trainer.data_collator = PairedMediaCollator(trainer.data_collator, media, token_ids=media.token_ids(request.tokenizer))
    return trainer


def _head_in_hidden_dtype(model: PreTrainedModel) -> None:
    """The scoring head's weights in the dtype of the hidden states it reads. On a quantized model TRL's
    RewardTrainer puts every trainable parameter in bfloat16 for QLoRA's adapters, which cast their
    input themselves; the head is a plain linear layer, which would fail on float32 hidden states."""
    hidden = model.get_input_embeddings().weight.dtype
    name = head_name(model.get_base_model() if hasattr(model, "get_base_model") else model)
    for parameter_name, parameter in model.named_parameters():
        if parameter.requires_grad and f"{name}." in parameter_name and ".lora_" not in parameter_name:
            parameter.data = parameter.data.to(hidden)


def load_reward_base(request: ModelRequest) -> PreTrainedModel:
    """The starting model with a one-output scoring head and the method applied, the head trained in
    full (with LoRA: merged adapters, a new adapter that saves the head)."""
    from tuneline.core.models.loading import apply_finetuning, load_model
    from tuneline.core.models.vocabulary import grow_vocabulary, rows_that_train

    model = load_model(request.model_path, model=request.model_config, training=request.training, head="score",
                       trainable=True, model_max_length=request.model_max_length, pure_bf16=request.finetuning.pure_bf16)
    rows = grow_vocabulary(model, vocab_size=len(request.tokenizer), new_tokens=request.new_tokens,
                           init=request.model_config.init_special_tokens)
    return apply_finetuning(model, request.finetuning, model_config=request.model_config, training=request.training,
                            head=head_name(model), upcast=request.upcasts_trainable,
                            new_token_rows=rows_that_train(rows, request.model_config))


def reward_metrics(trainer: Trainer, tokenizer: PreTrainedTokenizerBase, validation: Dataset,
                   finetuning: FinetuningConfig, *, prefix: str = "eval") -> dict[str, float]:
    """The trainer's evaluation plus pair accuracy and margin on the validation pairs (`eval_rm_*`)."""
    from tuneline.core.data.media.batching import PairedMediaCollator
    from tuneline.core.evaluation.reward import evaluate_reward_model

    metrics = dict(trainer.evaluate(metric_key_prefix=prefix))
    collator = trainer.data_collator if isinstance(trainer.data_collator, PairedMediaCollator) else None
    found = evaluate_reward_model(trainer.model, tokenizer, validation, media_collator=collator)
    metrics.update({f"{prefix}_rm_{k}": v for k, v in found.items()})
    return metrics


def reward_model_key_problems(finetuning: FinetuningConfig) -> list[str]:
    """The `reward_model_*` keys a stage scored by an rm stage's output (ppo, grpo, rloo) cannot take."""
    problems = []
    if finetuning.reward_model_type == "api":
        problems.append("'reward_model_type: api' is not supported; train a reward model with 'stage: rm' and name its "
                        "output in 'reward_model'.")
    if finetuning.reward_model_adapters:
        problems.append("'reward_model_adapters' is not supported: 'reward_model' names an rm stage's output, which "
                        "holds its adapter; remove the key.")
    return problems


RM = StageKind(
    name="rm",
    summary="reward modelling: a scoring head trained to rank the chosen reply of each pair above the rejected",
    examples="pairwise",
    plotted_keys=("eval_loss", "eval_accuracy"),
    output="reward_model",
    reads=frozenset({*TRAINER_KEYS, *TRAINER_LOOP_KEYS, *CHECKPOINT_KEYS, *TRAINER_SAMPLER_KEYS, *PER_DATASET_EVALUATION_KEYS}),
    load_model=load_reward_base,
    build_trainer=build_reward_trainer,
    held_out_metrics=reward_metrics,
    trains_images=True,
    trainer_modules=("trl",),
)
