"""The model and trainer of each training stage, and its held-out metrics: one entry per stage.

`run_training` loads the tokenizer and the tokenized splits, then asks this module for the stage's
model (a causal LM, or a sequence-classification model for rm), its ready trainer (transformers'
for pt and sft, TRL's for rm, dpo and kto) and, after training, the metrics that say how good the
result is on the validation split.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from tuneline.core.config import FinetuningConfig, ModelConfig
from tuneline.core.errors import ConfigError

if TYPE_CHECKING:
    from datasets import DatasetDict
    from transformers import PreTrainedModel, PreTrainedTokenizerBase, Trainer, TrainerCallback, TrainingArguments

TRAINABLE_STAGES = ("pt", "sft", "rm", "dpo", "kto", "ppo")  # ppo trains in `core.ppo`, not a trainer


def load_stage_model(
    stage: str, model_path: str, *, tokenizer: PreTrainedTokenizerBase, finetuning: FinetuningConfig,
    model_config: ModelConfig, training: Mapping[str, Any],
) -> PreTrainedModel:
    """The model the stage trains, with its method (LoRA, freeze, full, QLoRA) applied."""
    if stage == "rm":
        from tuneline.core.stages.reward import load_reward_base, prepare_reward_model

        model = load_reward_base(model_path, model=model_config, vocab_size=len(tokenizer), training=training)
        return prepare_reward_model(model, finetuning, model_config=model_config, training=training)
    from tuneline.core.models.loading import apply_finetuning, load_model

    model = load_model(model_path, model=model_config, vocab_size=len(tokenizer), training=training)
    return apply_finetuning(model, finetuning, model_config=model_config, training=training)


def build_stage_trainer(
    stage: str, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, datasets: DatasetDict, *,
    finetuning: FinetuningConfig, model_config: ModelConfig, args: TrainingArguments, callbacks: Sequence[TrainerCallback],
) -> Trainer:
    if stage not in _BUILDERS:
        raise ConfigError(f"stage '{stage}' cannot be trained by this version; choose one of {', '.join(TRAINABLE_STAGES)}.")
    return _BUILDERS[stage](model, tokenizer, train_dataset=datasets["train"],
                            eval_dataset=datasets["validation"] if "validation" in datasets else None,
                            finetuning=finetuning, model_config=model_config, args=args, callbacks=callbacks)


def held_out_metrics(
    stage: str, trainer: Trainer, tokenizer: PreTrainedTokenizerBase, validation, *, finetuning: FinetuningConfig
) -> dict[str, float]:
    """The trainer's evaluation of the `validation` split (tuneline's columns), plus what judges the
    stage's result: perplexity (pt, sft), reward accuracy and margin (rm), preference accuracy and
    margins (dpo)."""
    metrics = dict(trainer.evaluate())
    if stage in ("pt", "sft"):
        metrics["eval_perplexity"] = math.exp(min(metrics["eval_loss"], 50.0))
    elif stage == "rm":
        from tuneline.core.stages.reward import evaluate_reward_model

        metrics.update({f"eval_rm_{k}": v for k, v in evaluate_reward_model(trainer.model, tokenizer, validation).items()})
    elif stage == "dpo":
        from tuneline.core.evaluation.preference import evaluate_preference

        found = evaluate_preference(trainer.model, validation, beta=finetuning.pref_beta, reference=getattr(trainer, "ref_model", None))
        metrics.update({f"eval_pref_{k}": v for k, v in found.items()})
    return metrics


def _language_model_trainer(model, tokenizer, *, train_dataset, eval_dataset, finetuning, model_config, args, callbacks):
    from transformers import Trainer

    from tuneline.core.models.loading import loraplus_optimizer
    from tuneline.core.training.job import build_collator

    return Trainer(
        model=model, args=args, train_dataset=train_dataset, eval_dataset=eval_dataset,
        data_collator=build_collator(train_dataset, tokenizer=tokenizer, model=model), processing_class=tokenizer,
        optimizers=(loraplus_optimizer(model, finetuning=finetuning, args=args), None), callbacks=list(callbacks),
    )


def _reward_trainer(model, tokenizer, *, train_dataset, eval_dataset, finetuning, model_config, args, callbacks):
    from tuneline.core.stages.reward import build_reward_trainer

    return build_reward_trainer(model, tokenizer, train_dataset=train_dataset, eval_dataset=eval_dataset,
                                finetuning=finetuning, args=args, callbacks=callbacks)


def _dpo_trainer(model, tokenizer, *, train_dataset, eval_dataset, finetuning, model_config, args, callbacks):
    from tuneline.core.stages.preference import build_dpo_trainer

    return build_dpo_trainer(model, tokenizer, train_dataset=train_dataset, eval_dataset=eval_dataset,
                             finetuning=finetuning, args=args, callbacks=callbacks, model_config=model_config)


def _kto_trainer(model, tokenizer, *, train_dataset, eval_dataset, finetuning, model_config, args, callbacks):
    from tuneline.core.stages.preference import build_kto_trainer

    return build_kto_trainer(model, tokenizer, train_dataset=train_dataset, eval_dataset=eval_dataset,
                             finetuning=finetuning, args=args, callbacks=callbacks, model_config=model_config)


_BUILDERS: dict[str, Callable[..., Trainer]] = {
    "pt": _language_model_trainer,
    "sft": _language_model_trainer,
    "rm": _reward_trainer,
    "dpo": _dpo_trainer,
    "kto": _kto_trainer,
}
