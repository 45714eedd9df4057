"""Freeze and full tuning with LLaMA-Factory's keys: which of the model's own parameters train.

Freeze trains the last `freeze_trainable_layers` decoder layers (the first ones when negative),
within them only `freeze_trainable_modules` ('all', or names such as mlp, self_attn), plus the
`freeze_extra_modules` outside the layers (embed_tokens, norm, lm_head). The names must be modules
the model has, and match as LLaMA-Factory 0.9.5 matches them: a layer module is the start of a
parameter's name within a chosen layer (`<layers>.<i>.mlp`), an extra module is anywhere in a
parameter's name, so `norm` trains the final norm and every layer's input_layernorm and
post_attention_layernorm too. One difference: a layer pattern reads only the decoder layers' list,
where LLaMA-Factory's `.<i>.` also catches other numbered lists (such as a mixture of experts'
`experts.<i>.` in every layer).

With `use_llama_pro` the trainable layers are instead the blocks that `expand_blocks` added: the
model's layers fall into `freeze_trainable_layers` equal groups, and the last layer of each trains
(LLaMA-Factory's rule, which is where the expansion puts its copies).

A multimodal model's layers are its language model's; its vision tower, projector and language
model train or stay frozen as the freeze_* keys say (`core.models.composite`), under full tuning too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tuneline.core.config import FinetuningConfig
from tuneline.core.errors import ConfigError, nearest
from tuneline.core.models.composite import freeze_parts, in_part, trainable_projector, vision_keys

if TYPE_CHECKING:
    from transformers import PreTrainedModel


def apply_full(model: PreTrainedModel, finetuning: FinetuningConfig) -> PreTrainedModel:
    """Every parameter trains, but a multimodal model's frozen parts (`core.models.composite`)."""
    model.requires_grad_(True)
    freeze_parts(model, finetuning)
    return model


def apply_freeze(model: PreTrainedModel, finetuning: FinetuningConfig) -> PreTrainedModel:
    """Only the chosen layers' chosen modules, and the chosen extra modules, train."""
    prefix, count = decoder_layers(model)
    places = {name: parameter_place(name, prefix) for name, _ in model.named_parameters(remove_duplicate=False)}
    inner = sorted({module for index, module in places.values() if index is not None})
    outer = sorted({module for index, module in places.values() if index is None})
    modules = _names(finetuning.freeze_trainable_modules)
    extras = _names(finetuning.freeze_extra_modules)
    problems = [*_unknown("freeze_trainable_modules", modules, inner, allow_all=True),
                *_unknown("freeze_extra_modules", extras, outer, allow_all=False)]
    if problems:
        raise ConfigError(problems)
    n = finetuning.freeze_trainable_layers
    layers = expanded_layer_ids(n, count) if finetuning.use_llama_pro else trainable_layer_ids(n, count)
    starts = tuple(f"{prefix}.{index}.{'' if module == 'all' else module}" for module in modules for index in layers)
    extras = [*extras, *trainable_projector(model, finetuning)]
    model.requires_grad_(False)
    for name, parameter in model.named_parameters(remove_duplicate=False):
        if name.startswith(starts) or any(extra in name for extra in extras):
            parameter.requires_grad_(True)  # a tied weight trains when either of its names is chosen
    freeze_parts(model, finetuning)
    return model


def trainable_layer_ids(trainable_layers: int, count: int) -> range:
    """The last n layers for n > 0, the first -n for n < 0 (LLaMA-Factory's convention)."""
    if trainable_layers > 0:
        return range(max(0, count - trainable_layers), count)
    return range(min(-trainable_layers, count))


def expanded_layer_ids(expanded_blocks: int, count: int) -> range:
    """LLaMA Pro: the last layer of each of `expanded_blocks` equal groups of the `count` layers."""
    if expanded_blocks <= 0 or count % expanded_blocks:
        raise ConfigError(f"'use_llama_pro: true' trains the blocks added by expansion, one at the end of each of "
                          f"'freeze_trainable_layers: {expanded_blocks}' equal groups, and the model's {count} layers do "
                          "not split that way; set freeze_trainable_layers to the number of blocks the model was expanded "
                          f"by (a divisor of {count}).")
    stride = count // expanded_blocks
    return range(stride - 1, count, stride)


def expanded_layer_modules(model: PreTrainedModel, targets: list[str], *, expanded_blocks: int) -> list[str]:
    """LLaMA Pro with an adapter: qualified names of the `targets` modules inside the expanded layers."""
    prefix, count = decoder_layers(model)
    layers = set(expanded_layer_ids(expanded_blocks, count))
    chosen = []
    for name, _ in model.named_modules():
        inner = name.removeprefix(prefix + ".")
        if inner != name and int(inner.split(".")[0]) in layers and name.rsplit(".", 1)[-1] in targets:
            chosen.append(name)
    return chosen


def decoder_layers(model: PreTrainedModel) -> tuple[str, int]:
    """Qualified name of the module list holding the decoder layers, and how many there are."""
    import torch

    count = model.config.get_text_config().num_hidden_layers
    vision = vision_keys(model.config)
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) == count and not in_part(name, vision):
            return name, count
    raise ConfigError(
        f"'finetuning_type: freeze' needs the model's {count} decoder layers in one numbered list, which "
        f"{type(model).__name__} does not have; use 'finetuning_type: lora' or 'full'."
    )


def parameter_place(name: str, layers_prefix: str) -> tuple[int | None, str]:
    """(layer index, module name within the layer) for a parameter of a decoder layer; otherwise
    (None, the short name of the module holding it)."""
    if name.startswith(layers_prefix + "."):
        index, module = name[len(layers_prefix) + 1:].split(".")[:2]
        return int(index), module
    parts = name.split(".")
    return None, parts[-2] if len(parts) > 1 else parts[0]


def _names(value: str | None) -> list[str]:
    return [name.strip() for name in (value or "").split(",") if name.strip()]


def _unknown(key: str, names: list[str], available: list[str], *, allow_all: bool) -> list[str]:
    problems = []
    for name in names:
        if name in available or (allow_all and name == "all"):
            continue
        guess = nearest(name, available)
        hint = f" (did you mean '{guess}'?)" if guess else ""
        choices = ", ".join(available) + (", or 'all'" if allow_all else "")
        problems.append(f"'{key}' names '{name}', which the model does not have{hint}; modules available: {choices}.")
    return problems
