"""Changes to a model's config before its weights load: RoPE scaling, the router loss of
mixture-of-experts models, and the KV cache, with LLaMA-Factory's meaning of their keys.

`model_max_length` is the longest sequence a training stage feeds (its `cutoff_len`); None means
the model is loaded for inference.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from tuneline.core.config import ModelConfig
from tuneline.core.errors import ConfigError

if TYPE_CHECKING:
    from transformers import PretrainedConfig

# RoPE is stretched by this factor when no training length says by how much (LLaMA-Factory's choice).
INFERENCE_ROPE_FACTOR = 2.0
# llama3 scaling's band edges, as LLaMA-Factory sets them.
LLAMA3_FREQ_FACTORS = {"low_freq_factor": 1.0, "high_freq_factor": 4.0}

# Mixture-of-experts model types whose config takes the router's load-balancing loss, by the attribute
# that holds its weight (LLaMA-Factory 0.9.5's lists; DBRX and GLM-4.5V, whose routers LLaMA-Factory
# turns on at their own weight, take the key's weight here too), and those whose forward adds it to the
# loss only when asked to return the router logits.
ROUTER_LOSS_ATTRIBUTE = {
    **dict.fromkeys(("ernie4_5_moe", "granitemoe", "jamba", "llama4", "mixtral", "olmoe", "phimoe", "qwen2_moe",
                     "qwen3_moe"), "router_aux_loss_coef"),
    "dbrx": "ffn_config.moe_loss_weight",
    "deepseek": "aux_loss_alpha",
    "jetmoe": "aux_loss_coef",
}
ROUTER_LOGITS_TYPES = frozenset(("dbrx", "ernie4_5_moe", "granitemoe", "jamba", "jetmoe", "llama4", "mixtral", "olmoe",
                                 "phimoe", "qwen2_moe", "qwen3_moe"))
# Multimodal configs whose text model is one of those (the loss is set on their text_config).
TEXT_ROUTER_LOGITS_TYPES = frozenset(("glm4v_moe_text", "qwen3_moe"))
TEXT_ROUTER_LOSS_TYPES = TEXT_ROUTER_LOGITS_TYPES


def patch_config(config: PretrainedConfig, model: ModelConfig, *, model_max_length: int | None, trainable: bool,
                 use_kv_cache: bool = True) -> None:
    """Apply `rope_scaling`, `moe_aux_loss_coef` (trainable models) and the KV cache (`use_kv_cache`,
    always off for training) to `config`."""
    scale_rope(config, model.rope_scaling, model_max_length=model_max_length)
    if trainable and model.moe_aux_loss_coef:
        set_router_loss(config, model.moe_aux_loss_coef)
    set_kv_cache(config, enabled=use_kv_cache and not trainable)


def scale_rope(config: PretrainedConfig, rope_type: str | None, *, model_max_length: int | None) -> None:
    """Stretch RoPE so the model takes `model_max_length` tokens: the factor is how many times the
    model's own length fits in it, rounded up (2 for inference); a length the model already takes
    leaves RoPE as it is, with a printed note."""
    if rope_type is None:
        return
    if not hasattr(config, "rope_scaling"):
        raise ConfigError(f"'rope_scaling: {rope_type}' needs a model with rotary position embeddings, and this "
                          f"'{config.model_type}' model has none; remove rope_scaling.")
    # transformers 5 keeps the rotary settings in `rope_parameters` (rope_scaling is its old name)
    field = "rope_parameters" if hasattr(config, "rope_parameters") else "rope_scaling"
    current = dict(getattr(config, field) or {})
    # measured from the positions the model takes now, as LLaMA-Factory does: a model already scaled
    # for long inputs (Llama 3.1's llama3 RoPE) keeps its scaling for a length within them
    old_length = getattr(config, "max_position_embeddings", None)
    if old_length is None:
        raise ConfigError(f"'rope_scaling: {rope_type}': the model's config.json names no max_position_embeddings to "
                          "scale from; remove rope_scaling.")
    if model_max_length is not None and model_max_length <= old_length:
        print(f"rope_scaling: the training length {model_max_length} ('cutoff_len') fits the model's {old_length} "
              "positions, so RoPE is left unscaled.", flush=True)
        return
    factor = float(math.ceil(model_max_length / old_length)) if model_max_length is not None else INFERENCE_ROPE_FACTOR
    scaling: dict[str, Any] = {"rope_type": rope_type, "factor": factor}
    if rope_type in ("dynamic", "yarn", "llama3"):
        scaling["original_max_position_embeddings"] = old_length
    if rope_type == "llama3":
        scaling.update(LLAMA3_FREQ_FACTORS)
    theta = {"rope_theta": current["rope_theta"]} if "rope_theta" in current else {}  # the base frequency stays
    config.max_position_embeddings = int(old_length * factor)
    setattr(config, field, {**theta, **scaling})
    print(f"rope_scaling: {rope_type} with factor {factor}, positions {old_length} -> {config.max_position_embeddings}.",
          flush=True)


def set_router_loss(config: PretrainedConfig, coefficient: float) -> None:
    """Weigh the router's load-balancing loss by `coefficient` and return the router logits, which
    is what makes the model add that loss while training."""
    model_type = config.model_type
    text_config = getattr(config, "text_config", None)
    text_type = getattr(text_config, "model_type", None)
    if model_type not in ROUTER_LOSS_ATTRIBUTE and text_type not in TEXT_ROUTER_LOSS_TYPES:
        known = ", ".join(sorted(ROUTER_LOSS_ATTRIBUTE))
        raise ConfigError(f"'moe_aux_loss_coef: {coefficient}' weighs the router loss of a mixture-of-experts model, and "
                          f"this is a '{model_type}' model, which has none tuneline can set (model types: {known}); "
                          "remove moe_aux_loss_coef.")
    if model_type in ROUTER_LOGITS_TYPES:
        config.output_router_logits = True
    if text_type in TEXT_ROUTER_LOGITS_TYPES:
        text_config.output_router_logits = True
    if model_type in ROUTER_LOSS_ATTRIBUTE:
        *parents, name = ROUTER_LOSS_ATTRIBUTE[model_type].split(".")
        holder = config
        for parent in parents:
            holder = getattr(holder, parent)
        setattr(holder, name, coefficient)
    else:
        text_config.router_aux_loss_coef = coefficient


def set_kv_cache(config: PretrainedConfig, *, enabled: bool) -> None:
    config.use_cache = enabled
    text_config = getattr(config, "text_config", None)
    if text_config is not None:
        text_config.use_cache = enabled
