"""LLaMA-Factory's memory-saving optimizers for the Trainer-based stages (pt, sft, rm, dpo, kto):
GaLore, APOLLO, BAdam, Adam-mini and Muon, chosen by their `use_*` keys (`OptimizerConfig`).

`stage_optimizer` builds the one asked for from the model the trainer holds; `use_stage_optimizer`
gives it to a built trainer, which then builds its learning-rate scheduler on it (the layer-wise
variants read their rate from there). The rules of what goes together are `rules.py`'s.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tuneline.core.config import OptimizerConfig
from tuneline.core.training.optimizers.rules import optimizer_problems, parallel_problems

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, Trainer, TrainingArguments

__all__ = ["optimizer_problems", "parallel_problems", "stage_optimizer", "use_stage_optimizer"]


def stage_optimizer(model: PreTrainedModel, *, optimizer: OptimizerConfig, args: TrainingArguments) -> torch.optim.Optimizer | None:
    """The optimizer the `use_*` keys ask for over `model`'s trainable parameters; None: the trainer's own."""
    if optimizer.use_galore or optimizer.use_apollo:
        from tuneline.core.training.optimizers.projected import apollo_optimizer, galore_optimizer

        build = galore_optimizer if optimizer.use_galore else apollo_optimizer
        return build(model, optimizer=optimizer, args=args)
    if optimizer.use_badam:
        from tuneline.core.training.optimizers.blockwise import badam_optimizer

        return badam_optimizer(model, optimizer=optimizer, args=args)
    if optimizer.use_adam_mini or optimizer.use_muon:
        from tuneline.core.training.optimizers.adaptive import adam_mini_optimizer, muon_optimizer

        return adam_mini_optimizer(model, args=args) if optimizer.use_adam_mini else muon_optimizer(model, args=args)
    return None


def use_stage_optimizer(trainer: Trainer, optimizer: OptimizerConfig) -> Trainer:
    """`trainer` training with the optimizer `optimizer` asks for, built over the model as the
    trainer placed it (BlockOptimizer copies weights when built, so it must see them on their
    device); unchanged when no `use_*` key is set."""
    built = stage_optimizer(trainer.model, optimizer=optimizer, args=trainer.args)
    if built is None:
        return trainer
    trainer.optimizer = built
    if optimizer.use_badam:
        from tuneline.core.training.optimizers.blockwise import prepare_badam_trainer

        prepare_badam_trainer(trainer)
    return trainer
