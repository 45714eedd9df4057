"""BAdam (the `badam` package): block-coordinate Adam, as LLaMA-Factory builds it.

`badam_mode: layer` trains one decoder layer at a time (embeddings and output head stay frozen),
switching to the next every `badam_switch_interval` steps in `badam_switch_mode` order, with Adam
state only for the active block; `-1` never switches (LLaMA-Factory's meaning). `badam_mode: ratio`
updates a `badam_update_ratio` share of the entries of every layer matrix through sparse gradients.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from tuneline.core.config import OptimizerConfig
from tuneline.core.training.optimizers.projected import decay_parameter_names
from tuneline.core.training.optimizers.rules import NEVER_SWITCH

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, Trainer, TrainingArguments


def badam_optimizer(model: PreTrainedModel, *, optimizer: OptimizerConfig, args: TrainingArguments) -> torch.optim.Optimizer:
    from transformers import Trainer

    decay_names = decay_parameter_names(model)
    trainable = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    # The decay group comes first: BAdam's block optimizer takes the weight decay of its first group
    # for every block it activates (LLaMA-Factory's no-decay-first order loses `weight_decay`).
    groups = [{"params": [p for name, p in trainable if name in decay_names], "weight_decay": args.weight_decay},
              {"params": [p for name, p in trainable if name not in decay_names], "weight_decay": 0.0}]
    groups = [group for group in groups if group["params"]]
    optimizer_class, kwargs = Trainer.get_optimizer_cls_and_kwargs(args)
    named = list(model.named_parameters())
    if optimizer.badam_mode == "layer":
        from badam import BlockOptimizer

        return BlockOptimizer(base_optimizer=optimizer_class(groups, **kwargs), named_parameters_list=named,
                              block_prefix_list=None, switch_block_every=_switch_every(optimizer.badam_switch_interval),
                              start_block=optimizer.badam_start_block, switch_mode=optimizer.badam_switch_mode,
                              verbose=optimizer.badam_verbose)
    from badam import BlockOptimizerRatio

    # A head tied to the embedding is no parameter of its own, and BAdam would fail looking for it;
    # freezing the embedding (include_embedding=False) freezes that head too.
    tied_head = not any("lm_head" in name for name, _ in named)
    return BlockOptimizerRatio(param_groups=groups, named_parameters_list=named, update_ratio=optimizer.badam_update_ratio,
                               mask_mode=optimizer.badam_mask_mode, verbose=optimizer.badam_verbose, include_embedding=False,
                               include_lm_head=tied_head, lr=kwargs["lr"], betas=kwargs["betas"], eps=kwargs["eps"])


def _switch_every(interval: int | None) -> int | None:
    """The step count the block optimizer switches on. It switches when `(step + 1) % every == 0`,
    which -1 makes true at every step; an interval no run reaches keeps the first block (and its
    Adam state) throughout, as LLaMA-Factory documents -1."""
    return sys.maxsize if interval == NEVER_SWITCH else interval


def prepare_badam_trainer(trainer: Trainer) -> None:
    """BAdam's own trainer callback (gradient checkpointing and DeepSpeed ZeRO-3 for blocks), and
    its gradient clipping, which handles the sparse gradients of ratio mode (torch's fused norm does
    not), in place of accelerate's, as the badam package instructs."""
    from types import MethodType

    from badam import BAdamCallback, clip_grad_norm_old_version

    trainer.accelerator.clip_grad_norm_ = MethodType(clip_grad_norm_old_version, trainer.accelerator)
    trainer.add_callback(BAdamCallback)
