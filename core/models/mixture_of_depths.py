"""Mixture-of-Depths (Raposo et al. 2024): routed decoder layers process only a few tokens of each sequence.

Every other decoder layer (the odd-numbered ones, 1, 3, ...) gets a router, a linear score of each
token's hidden state. Of each sequence of T tokens the layer processes only the top
`max(1, int(capacity * T))` by score (capacity 12.5%, the paper's setting); the others pass the
layer unchanged on the residual stream. A processed token's update from the layer is multiplied by
its router score (x + r * f(x)), so the loss reaches the router and teaches it which tokens to send.

The routed tokens keep their order, so a causal mask over them is the original mask's rows and
columns of those tokens; they keep their own rotary position embeddings and position ids. A router
starts with a bias of 1 and small weights: the scores start near 1, so a routed token first gets
about the layer's whole update, as it did before the conversion.

Routing by top-k looks at the whole sequence, which a KV cache cannot follow token by token: a
routed model generates without a cache, each step a forward pass over the whole text so far, which
routes exactly as in training. Asked to continue from a cache, a routed layer refuses.

A routed model saves as the model's own class with the routers' weights added under
`...layers.N.mod_router.*` and the routing recorded in config.json (`mixture_of_depths`);
`restore_routing` puts the routers back when such a folder loads, and refuses a folder whose router
weights are missing.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from tuneline.core.errors import ConfigError

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedModel

CAPACITY = 0.125  # share of a sequence's tokens that a routed layer processes
RECORD = "mixture_of_depths"  # the config.json entry of a routed model: its capacity and routed layers
ROUTER = "mod_router"  # the router's name inside a decoder layer, and so in the weights' names
# Families whose transformers decoder layers take the position embeddings and masks of every token
# as arguments, which routing cuts to the chosen tokens.
ROUTED_FAMILIES = ("llama", "mistral", "qwen2")


class TokenRouter(torch.nn.Module):
    """One score per token: a linear function of its hidden state, computed in float32."""

    def __init__(self, width: int, *, init_std: float) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(width) * init_std)
        self.bias = torch.nn.Parameter(torch.ones(1))

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return hidden_states.float() @ self.weight.float() + self.bias.float()


class RoutedLayer(torch.nn.Module):
    """Put before a decoder layer's class: its forward runs the layer on the routed tokens only."""

    mod_router: TokenRouter
    mod_capacity: float

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None, cache: Any = None, use_cache: bool | None = False,
                position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None, **kwargs: Any) -> torch.Tensor:
        # earlier transformers 5 releases name the cache `past_key_values` (renamed `cache`, the old name goes in 5.40)
        _refuse_cached_decoding(cache if cache is not None else kwargs.get("past_key_values"), self.self_attn.layer_idx)
        batch, length, width = hidden_states.shape
        scores = self.mod_router(hidden_states)
        present = _present_tokens(attention_mask, length)
        ranked = scores if present is None else scores.masked_fill(~present, float("-inf"))
        chosen = ranked.topk(routed_count(length, self.mod_capacity), dim=1).indices.sort(dim=1).values
        selected = _take(hidden_states, chosen)
        processed = super().forward(
            selected,
            attention_mask=_select_mask(attention_mask, chosen, length),
            position_ids=None if position_ids is None else position_ids.expand(batch, -1).gather(1, chosen),
            cache=cache,
            use_cache=use_cache,
            position_embeddings=None if position_embeddings is None else tuple(_take(e, chosen) for e in position_embeddings),
            **kwargs,
        )
        weight = scores.gather(1, chosen).to(hidden_states.dtype).unsqueeze(-1)
        updated = selected + weight * (processed - selected)
        return hidden_states.scatter(1, chosen.unsqueeze(-1).expand(-1, -1, width), updated)


_ROUTED_CLASSES: dict[type, type] = {}


def routed_count(length: int, capacity: float) -> int:
    """How many of a sequence's `length` tokens a routed layer processes."""
    return max(1, int(capacity * length))


def routing_record(config: PretrainedConfig) -> Mapping[str, Any] | None:
    """The routing a model's config records (capacity, routed layers), None for an ordinary model."""
    return config.to_dict().get(RECORD)


def convert_to_mixture_of_depths(model: PreTrainedModel, *, capacity: float = CAPACITY) -> PreTrainedModel:
    """Give every other decoder layer (1, 3, ...) a new router, and record the routing in the config."""
    from tuneline.core.models.freeze import decoder_layers

    family = model.config.get_text_config().model_type
    if family not in ROUTED_FAMILIES:
        raise ConfigError(f"'mixture_of_depths: convert' routes the decoder layers of the {', '.join(ROUTED_FAMILIES)} "
                          f"model families, and this model is '{family}'; remove mixture_of_depths.")
    if routing_record(model.config) is not None:
        raise ConfigError("'mixture_of_depths: convert' was given a model that is already a Mixture-of-Depths model; "
                          "set 'mixture_of_depths: load' to train it further.")
    prefix, count = decoder_layers(model)
    layers = list(range(1, count, 2))
    _route(model, prefix=prefix, layers=layers, capacity=capacity)
    setattr(model.config, RECORD, {"capacity": capacity, "routed_layers": layers})
    return model


def restore_routing(model: PreTrainedModel, folder: Path) -> PreTrainedModel:
    """The routers that `folder`'s config records, with the weights saved in its safetensors files."""
    from safetensors import safe_open

    from tuneline.core.models.freeze import decoder_layers

    record = routing_record(model.config)
    prefix, count = decoder_layers(model)
    layers = [int(index) for index in record["routed_layers"]]
    if not folder.is_dir():
        raise ConfigError(f"'{folder}' is a Mixture-of-Depths model, whose routers load from a local folder; download "
                          "the model and point model_name_or_path at its folder.")
    if any(index >= count for index in layers):
        raise ConfigError(f"'{folder}' records Mixture-of-Depths routing of layers {layers} (config.json '{RECORD}'), and "
                          f"the model has {count} layers; the entry does not belong to this model: remove it.")
    _route(model, prefix=prefix, layers=layers, capacity=float(record["capacity"]))
    wanted = {name for name, _ in model.named_parameters() if f".{ROUTER}." in name}
    saved = {}
    for file in sorted(folder.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as weights:
            saved.update({name: weights.get_tensor(name) for name in weights.keys() if name in wanted})
    missing = sorted(wanted - set(saved))
    if missing:
        raise ConfigError(f"'{folder}' records Mixture-of-Depths routing (config.json '{RECORD}'), and its weights lack "
                          f"{len(missing)} router tensor(s), {missing[0]} the first; save the model again with its "
                          "routers, or remove the config entry to load it as an ordinary model.")
    model.load_state_dict(saved, strict=False)
    return model


@contextlib.contextmanager
def quiet_router_report() -> Iterator[None]:
    """While a routed model loads into its ordinary class: transformers' load report of unexpected
    weights is dropped when the routers are all it lists (`restore_routing` loads them next)."""
    from transformers.utils import logging as transformers_logging

    logger, only_routers = transformers_logging.get_logger("transformers.modeling_utils"), _OnlyRoutersUnexpected()
    logger.addFilter(only_routers)
    try:
        yield
    finally:
        logger.removeFilter(only_routers)


class _OnlyRoutersUnexpected(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if "LOAD REPORT" not in message:
            return True
        rows = [line for line in message.splitlines() if "|" in line and not set(line) <= set("-+| ")][1:]  # past the header
        return not (rows and all(ROUTER in row.split("|")[0] for row in rows))


def routes_tokens(model: PreTrainedModel) -> bool:
    return routing_record(model.config) is not None


def _present_tokens(attention_mask: torch.Tensor | None, length: int) -> torch.Tensor | None:
    """(batch, length) booleans: the tokens that are not padding (they may attend to themselves);
    None where the mask says nothing is padding."""
    if attention_mask is None:
        return None
    _check_mask(attention_mask)
    offset = attention_mask.shape[-1] - length
    steps = torch.arange(length, device=attention_mask.device)
    diagonal = attention_mask[:, 0, steps, steps + offset]
    return diagonal if diagonal.dtype == torch.bool else diagonal == 0


def _route(model: PreTrainedModel, *, prefix: str, layers: list[int], capacity: float) -> None:
    text_config = model.config.get_text_config()
    decoder = model.get_submodule(prefix)
    for index in layers:
        layer = decoder[index]
        router = TokenRouter(text_config.hidden_size, init_std=text_config.initializer_range)
        layer.add_module(ROUTER, router.to(next(layer.parameters()).device))
        layer.mod_capacity = capacity
        layer.__class__ = _routed_class(type(layer))
    # a KV cache cannot follow top-k routing token by token (see the module's docstring)
    model.config.use_cache = False
    if model.can_generate():  # a scoring model (reward models) has no generation config
        model.generation_config.use_cache = False


def _routed_class(layer_class: type) -> type:
    if layer_class not in _ROUTED_CLASSES:
        _ROUTED_CLASSES[layer_class] = type(f"Routed{layer_class.__name__}", (RoutedLayer, layer_class),
                                            {"__module__": __name__})
    return _ROUTED_CLASSES[layer_class]


def _take(values: torch.Tensor, chosen: torch.Tensor) -> torch.Tensor:
    """values[b, chosen[b, i]] for (batch or 1, length, width) values."""
    expanded = values.expand(chosen.shape[0], -1, -1)
    return expanded.gather(1, chosen.unsqueeze(-1).expand(-1, -1, values.shape[-1]))


def _select_mask(attention_mask: torch.Tensor | None, chosen: torch.Tensor, length: int) -> torch.Tensor | None:
    """The rows and key columns of the chosen tokens (a chosen padding token, in a sequence shorter
    than the tokens routed, keeps its row of the mask, as padding does in every layer)."""
    if attention_mask is None:
        return None  # causal over every token, so causal over the chosen ones, which keep their order
    batch, count = chosen.shape
    mask = attention_mask.expand(batch, -1, -1, -1)
    heads, keys = mask.shape[1], mask.shape[-1]
    rows = mask.gather(2, chosen[:, None, :, None].expand(-1, heads, -1, keys))
    columns = (chosen + keys - length)[:, None, None, :].expand(-1, heads, count, -1)
    return rows.gather(3, columns)


def _check_mask(attention_mask: Any) -> None:
    if not isinstance(attention_mask, torch.Tensor) or attention_mask.dim() != 4:
        raise ConfigError("Mixture-of-Depths routes tokens through the (batch, heads, queries, keys) masks of SDPA and "
                          "eager attention, and this model's attention takes another kind; set 'flash_attn: sdpa' or "
                          "'disabled'.")


def _refuse_cached_decoding(cache: Any, layer_index: int) -> None:
    if cache is not None and cache.get_seq_length(layer_index) > 0:
        raise ConfigError("a Mixture-of-Depths model routes the top tokens of the whole sequence, which a KV cache "
                          "cannot follow; generate with 'use_cache=False' (its generation config says so).")
