"""GaLore (galore-torch) and APOLLO (apollo-torch): the gradients of chosen weight matrices
projected to a low rank inside the optimizer, AdamW for every other trainable parameter.

As LLaMA-Factory builds them: the projected parameters are the matrices of the linear layers whose
names contain a `*_target` entry ('all': every linear layer but the output head); three parameter
groups (no decay, decay, projected with decay). Layer-wise, each parameter gets an optimizer of its
own, stepped by a hook as soon as its gradient is accumulated, so no full set of gradients is ever
held; the Trainer holds a `LayerwiseOptimizer` whose learning rate its scheduler sets.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch  # this module is imported only to build an optimizer, never to read a config

from tuneline.core.config import OptimizerConfig
from tuneline.core.errors import ConfigError

if TYPE_CHECKING:
    from transformers import PreTrainedModel, TrainingArguments

# Parameter names transformers' Trainer keeps out of weight decay (Trainer.get_decay_parameter_names).
NO_DECAY_PATTERNS = (r"bias", r"layernorm", r"rmsnorm", r"(?:^|\.)norm(?:$|\.)", r"_norm(?:$|\.)")


def decay_parameter_names(model: PreTrainedModel) -> set[str]:
    """Names of the parameters weight decay applies to: not biases, not normalisation weights."""
    from torch import nn
    from transformers.trainer_pt_utils import get_parameter_names

    return set(get_parameter_names(model, [nn.LayerNorm], list(NO_DECAY_PATTERNS)))


def projected_parameters(model: PreTrainedModel, target: str, *, key: str) -> list[torch.nn.Parameter]:
    """The trainable matrices of the linear layers `target` (the value of `key`) names: comma-separated
    substrings of module names, or 'all' for every linear layer but the output head."""
    from tuneline.core.models.adapters import linear_module_names

    targets = linear_module_names(model) if target.strip() == "all" else [t.strip() for t in target.split(",") if t.strip()]
    chosen: dict[int, torch.nn.Parameter] = {}
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and any(t in name for t in targets):
            chosen.update({id(p): p for p in module.parameters() if p.requires_grad and p.ndim > 1})
    if not chosen:
        raise ConfigError(f"'{key}: {target}' names no trainable linear layer of the model; name some of "
                          f"{', '.join(linear_module_names(model))} (or 'all'), or train them (freeze settings).")
    return list(chosen.values())


def galore_optimizer(model: PreTrainedModel, *, optimizer: OptimizerConfig, args: TrainingArguments) -> torch.optim.Optimizer:
    import galore_torch
    from galore_torch.galore_projector import GaLoreProjector
    from transformers.training_args import OptimizerNames

    allow_in_checkpoints(GaLoreProjector)

    classes = {"adafactor": galore_torch.GaLoreAdafactor, "adamw_torch": galore_torch.GaLoreAdamW,
               "adamw_torch_fused": galore_torch.GaLoreAdamW}
    # the rules allow only these `optim` values: the three above and the 8-bit AdamWs
    optimizer_class = classes.get(OptimizerNames(args.optim).value, galore_torch.GaLoreAdamW8bit)
    projection = {"rank": optimizer.galore_rank, "update_proj_gap": optimizer.galore_update_interval,
                  "scale": optimizer.galore_scale, "proj_type": optimizer.galore_proj_type}
    return _projected(model, args=args, optimizer_class=optimizer_class, projection=projection,
                      projected=projected_parameters(model, optimizer.galore_target, key="galore_target"),
                      layerwise=optimizer.galore_layerwise)


def apollo_optimizer(model: PreTrainedModel, *, optimizer: OptimizerConfig, args: TrainingArguments) -> torch.optim.Optimizer:
    from apollo_torch import APOLLOAdamW
    from apollo_torch.random_projector import GradientProjector
    from apollo_torch.svd_projector import GaLoreProjector

    allow_in_checkpoints(GradientProjector, GaLoreProjector)

    projection = {"rank": optimizer.apollo_rank, "proj": optimizer.apollo_proj, "proj_type": optimizer.apollo_proj_type,
                  "update_proj_gap": optimizer.apollo_update_interval, "scale": optimizer.apollo_scale,
                  "scale_type": optimizer.apollo_scale_type, "scale_front": optimizer.apollo_scale_front}
    return _projected(model, args=args, optimizer_class=APOLLOAdamW, projection=projection,
                      projected=projected_parameters(model, optimizer.apollo_target, key="apollo_target"),
                      layerwise=optimizer.apollo_layerwise)


def allow_in_checkpoints(*projectors: type) -> None:
    """Let a resumed run read the projectors kept in the optimizer's state: transformers loads
    `optimizer.pt` with `weights_only=True`, which refuses any class not allowed by name. These
    hold only numbers, strings and tensors."""
    torch.serialization.add_safe_globals(list(projectors))


def _projected(model: PreTrainedModel, *, args: TrainingArguments, optimizer_class: type, projection: dict[str, Any],
               projected: list[torch.nn.Parameter], layerwise: bool) -> torch.optim.Optimizer:
    projected_ids = {id(p) for p in projected}
    decay_names = decay_parameter_names(model)
    decay: list[torch.nn.Parameter] = []
    no_decay: list[torch.nn.Parameter] = []
    for name, parameter in model.named_parameters():
        if parameter.requires_grad and id(parameter) not in projected_ids:
            (decay if name in decay_names else no_decay).append(parameter)
    groups = [{"params": no_decay, "weight_decay": 0.0}, {"params": decay, "weight_decay": args.weight_decay},
              {"params": projected, "weight_decay": args.weight_decay, **projection}]
    kwargs = optimizer_arguments(args)
    if not layerwise:
        return optimizer_class([group for group in groups if group["params"]], **kwargs)
    return LayerwiseOptimizer({p: optimizer_class([{**group, "params": [p]}], **kwargs)
                               for group in groups for p in group["params"]}, lr=args.learning_rate)


def optimizer_arguments(args: TrainingArguments) -> dict[str, Any]:
    """The learning rate, betas and epsilon the trainer arguments give (the projected optimizers
    take no `fused` flag)."""
    from transformers import Trainer

    _, kwargs = Trainer.get_optimizer_cls_and_kwargs(args)
    return {key: value for key, value in kwargs.items() if key not in ("fused", "foreach")}


class LayerwiseOptimizer(torch.optim.Optimizer):
    """What the Trainer holds for a layer-wise optimizer: its own step does nothing, while each
    parameter's optimizer steps (and frees the gradient) in a hook once that parameter's gradient is
    accumulated, at the learning rate the Trainer's scheduler has set on this optimizer.

    transformers' own `LayerWiseDummyOptimizer` expects the scheduler builder to find it unwrapped
    and give every parameter a scheduler; transformers 5 builds the scheduler after accelerate has
    wrapped the optimizer, so that never happens, and the one schedule is read from here instead.
    """

    def __init__(self, per_parameter: dict[torch.nn.Parameter, torch.optim.Optimizer], *, lr: float) -> None:
        self.per_parameter = per_parameter
        super().__init__([torch.zeros(1)], {"lr": lr})  # a placeholder: the group the scheduler sets
        for parameter in per_parameter:
            parameter.register_post_accumulate_grad_hook(self._step_parameter)

    def _step_parameter(self, parameter: torch.nn.Parameter) -> None:
        if parameter.grad is None:
            return
        optimizer = self.per_parameter[parameter]
        for group in optimizer.param_groups:
            group["lr"] = self.param_groups[0]["lr"]
        optimizer.step()
        optimizer.zero_grad()

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        return closure() if closure is not None else None

    def zero_grad(self, set_to_none: bool = True) -> None:
        pass  # each parameter's gradient is freed as soon as it is used

    def state_dict(self) -> dict[str, Any]:
        return {"per_parameter": [optimizer.state_dict() for optimizer in self.per_parameter.values()]}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        for optimizer, saved in zip(self.per_parameter.values(), state_dict["per_parameter"], strict=True):
            optimizer.load_state_dict(saved)
