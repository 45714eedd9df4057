"""Readying a loaded model for training: gradient checkpointing, float32 norms and logits, and the
parameter listing of `print_param_status`, with LLaMA-Factory's meaning of their keys."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from tuneline.core.config import ModelConfig
from tuneline.core.models.config_patches import set_kv_cache

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel

# Parts of a parameter's name that mark a normalisation layer's weight (LLaMA-Factory's).
NORM_NAME_PARTS = ("norm", "ln")


def prepare_for_training(model: PreTrainedModel, model_config: ModelConfig, training: Mapping[str, Any]) -> None:
    """Norms upcast, checkpointing readied, the KV cache off, the logits upcast, as the keys ask."""
    if model_config.upcast_layernorm:
        upcast_norms(model)
    prepare_checkpointing(model, training)
    set_kv_cache(model.config, enabled=False)  # a cache only serves generation; training recomputes every position
    if model_config.upcast_lmhead_output:
        upcast_logits(model)


def upcast_norms(model: PreTrainedModel) -> int:
    """The normalisation layers' weights in float32 (half-precision norms lose precision in the
    variance); returns how many were upcast.

    Each such layer hands its output back in its input's dtype: under autocast the next layer
    would cast it so anyway, and without autocast (generation) a float32 output would meet
    half-precision weights."""
    import torch

    upcast = 0
    for name, module in model.named_modules():
        norms = [p for short, p in module.named_parameters(recurse=False)
                 if p.ndim == 1 and any(part in f"{name}.{short}" for part in NORM_NAME_PARTS)]
        for parameter in norms:
            parameter.data = parameter.data.to(torch.float32)
        if norms:
            module.register_forward_hook(_in_input_dtype)
        upcast += len(norms)
    return upcast


def _in_input_dtype(module: torch.nn.Module, args: tuple[Any, ...], output: Any) -> Any:
    import torch

    if args and torch.is_tensor(args[0]) and torch.is_tensor(output) and output.dtype != args[0].dtype:
        return output.to(args[0].dtype)
    return output


def upcast_logits(model: PreTrainedModel) -> bool:
    """The output layer's logits in float32, through a forward hook, when the layer computes in a
    half precision (a float32 head's logits are float32 already); True when the hook was added."""
    import torch

    head = model.get_output_embeddings()
    if not isinstance(head, torch.nn.Linear) or head.weight.dtype == torch.float32:
        return False
    head.register_forward_hook(_to_float32)
    return True


def _to_float32(module: torch.nn.Module, args: tuple[Any, ...], output: torch.Tensor) -> torch.Tensor:
    import torch

    return output.to(torch.float32)


def prepare_checkpointing(model: PreTrainedModel, training: Mapping[str, Any]) -> None:
    """With gradient checkpointing asked for, make the embeddings' output require grad: with frozen
    embeddings, reentrant checkpointing would otherwise drop the gradients of every trainable
    parameter inside the checkpointed layers. The trainer itself switches checkpointing on from
    the same key, with `use_reentrant_gc` (see `core.training.arguments`)."""
    if training.get("gradient_checkpointing") or training.get("activation_checkpointing"):
        model.enable_input_require_grads()


def print_parameter_status(model: PreTrainedModel) -> None:
    """Each parameter's name, dtype, device and whether it trains, on the first process of a node."""
    if int(os.environ.get("LOCAL_RANK", "0")) != 0:
        return
    for name, parameter in model.named_parameters():
        print(f"name: {name}, dtype: {parameter.dtype}, device: {parameter.device}, trainable: {parameter.requires_grad}",
              flush=True)
