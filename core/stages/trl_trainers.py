"""One way to build a TRL trainer on tuneline's tokenized rows, for every kind that trains with TRL."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tuneline.core.stages.kind import TrainerRequest

if TYPE_CHECKING:
    from datasets import Dataset
    from transformers import Trainer, TrainingArguments


def trl_trainer(trainer_class: Any, request: TrainerRequest, *, config: TrainingArguments,
                convert: Callable[[Dataset], Dataset], **extra: Any) -> Trainer:
    """`trainer_class` (a TRL trainer) with `config` (its TRL config), on the request's splits in
    the columns `convert` gives, with the LoRA+ or memory-saving optimizer when asked; `extra` is the
    trainer's own arguments (a reference model)."""
    from tuneline.core.models.loading import loraplus_optimizer
    from tuneline.core.training.optimizers import use_stage_optimizer

    eval_dataset = request.eval_dataset
    if isinstance(eval_dataset, dict):  # eval_on_each_dataset
        eval_dataset = {name: convert(dataset) for name, dataset in eval_dataset.items()}
    elif eval_dataset is not None:
        eval_dataset = convert(eval_dataset)
    trainer = trainer_class(
        model=request.model,
        args=config,
        train_dataset=convert(request.train_dataset),
        eval_dataset=eval_dataset,
        processing_class=request.tokenizer,
        callbacks=list(request.callbacks),
        optimizers=(loraplus_optimizer(request.model, finetuning=request.finetuning, args=config), None),
        **extra,
    )
    return use_stage_optimizer(trainer, request.optimizer)
