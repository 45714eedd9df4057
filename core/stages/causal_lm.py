"""What the language-modelling kinds (pt, sft) share: a causal LM with its method applied,
transformers' Trainer on it, and perplexity on the validation split."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tuneline.core.config import FinetuningConfig
from tuneline.core.evaluation.heldout import perplexity
from tuneline.core.stages.kind import ModelRequest, TrainerRequest

if TYPE_CHECKING:
    from datasets import Dataset
    from transformers import PreTrainedModel, PreTrainedTokenizerBase, Trainer


def load_policy(request: ModelRequest) -> PreTrainedModel:
    """The causal LM at `model_path` with the method (LoRA, freeze, full, QLoRA) applied."""
    from tuneline.core.models.loading import apply_finetuning, load_model

    model = load_model(request.model_path, model=request.model_config, vocab_size=len(request.tokenizer),
                       training=request.training)
    return apply_finetuning(model, request.finetuning, model_config=request.model_config, training=request.training,
                            upcast=not request.optimizer.use_badam)


def build_language_model_trainer(request: TrainerRequest) -> Trainer:
    from transformers import Trainer

    from tuneline.core.models.loading import loraplus_optimizer
    from tuneline.core.training.collators import build_collator
    from tuneline.core.training.optimizers import use_stage_optimizer

    trainer = Trainer(
        model=request.model, args=request.args, train_dataset=request.train_dataset, eval_dataset=request.eval_dataset,
        data_collator=build_collator(request.train_dataset, tokenizer=request.tokenizer, model=request.model),
        processing_class=request.tokenizer, callbacks=list(request.callbacks),
        optimizers=(loraplus_optimizer(request.model, finetuning=request.finetuning, args=request.args), None),
    )
    return use_stage_optimizer(trainer, request.optimizer)


def perplexity_metrics(trainer: Trainer, tokenizer: PreTrainedTokenizerBase, validation: Dataset,
                       finetuning: FinetuningConfig) -> dict[str, float]:
    """The trainer's evaluation of the validation split, with the perplexity of its loss."""
    metrics = dict(trainer.evaluate())
    metrics["eval_perplexity"] = perplexity(metrics["eval_loss"])
    return metrics
