"""LongLoRA's shifted sparse attention (S^2-Attn, Chen et al. 2024) as a transformers attention function.

In training, each sequence is cut into groups of a quarter of its length, and tokens attend only
within their group; half of the heads see groups shifted by half a group, so information still
flows between neighbouring groups. Outside training (evaluation, generation) attention is the
ordinary full causal attention, as LongLoRA intends: a model trained this way runs unchanged.

It is registered with transformers' `AttentionInterface` under `S2_ATTENTION` and chosen with
`set_attn_implementation`, so the model's own attention modules call it in place of SDPA. Within
a group the causal mask of the original positions applies (with padding masked), so a shifted
group that wraps round the end of the sequence never lets a token see later ones, and a sequence
whose length does not divide into four is padded inside the function, not refused.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tuneline.core.errors import ConfigError

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel

S2_ATTENTION = "s2_sdpa"
GROUPS = 4  # LongLoRA's group size ratio of 1/4
SUPPORTED_FAMILIES = ("llama",)  # LLaMA-Factory's families for S^2-Attn


def use_shifted_sparse_attention(model: PreTrainedModel) -> None:
    """Switch `model`'s attention to S^2-Attn (shifted only while `model.training`)."""
    family = model.config.get_text_config().model_type
    if family not in SUPPORTED_FAMILIES:
        raise ConfigError(f"'shift_attn: true' (LongLoRA's shifted sparse attention) applies to the {', '.join(SUPPORTED_FAMILIES)} "
                          f"model family, and this model is '{family}'; remove shift_attn.")
    _register()
    model.set_attn_implementation(S2_ATTENTION)


def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(S2_ATTENTION, shifted_sparse_attention)
    AttentionMaskInterface.register(S2_ATTENTION, _full_boolean_mask)


def _full_boolean_mask(*args, **kwargs) -> torch.Tensor | None:
    """SDPA's boolean mask, always built: the groups are cut out of it, so the causal shortcut
    (no mask at all) would leave nothing to cut."""
    from transformers.masking_utils import sdpa_mask

    return sdpa_mask(*args, **{**kwargs, "allow_is_causal_skip": False})


def shifted_sparse_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature: query (batch, heads, length, dim), key and value
    (batch, kv heads, length, dim); returns (batch, length, heads, dim)."""
    import torch
    import torch.nn.functional as F
    from transformers.integrations.sdpa_attention import repeat_kv, sdpa_attention_forward

    batch, heads, length, dim = query.shape
    if not module.training or key.shape[2] != length:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    key, value = repeat_kv(key, heads // key.shape[1]), repeat_kv(value, heads // value.shape[1])
    allowed = _allowed(attention_mask, batch, length, query.device)
    padded = -(-length // GROUPS) * GROUPS
    if padded != length:  # pad to whole groups; padded keys are masked out, padded queries dropped
        query, key, value = (F.pad(t, (0, 0, 0, padded - length)) for t in (query, key, value))
        allowed = F.pad(allowed, (0, padded - length, 0, padded - length))
    size = padded // GROUPS
    order = _token_order(heads, padded, size, query.device)  # (heads, padded): head h's sequence, grouped
    gather = order[None, :, :, None].expand(batch, heads, padded, dim)
    q, k, v = (torch.gather(t, 2, gather).reshape(batch, heads * GROUPS, size, dim) for t in (query, key, value))
    in_group = order.view(heads, GROUPS, size)
    mask = allowed[:, in_group[..., :, None], in_group[..., None, :]]  # (batch, heads, groups, size, size)
    mask = mask | torch.eye(size, dtype=torch.bool, device=query.device)  # padding rows attend to themselves, not to nothing
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask.reshape(batch, heads * GROUPS, size, size),
                                         dropout_p=dropout if module.training else 0.0, scale=scaling)
    restored = torch.empty_like(query).scatter_(2, gather, out.reshape(batch, heads, padded, dim))
    return restored[:, :, :length].transpose(1, 2).contiguous(), None


def _token_order(heads: int, length: int, size: int, device: torch.device) -> torch.Tensor:
    """Positions in the order the heads see them: the first half in place, the second half rolled
    back by half a group (LongLoRA's shift)."""
    import torch

    positions = torch.arange(length, device=device)
    shifted = positions.roll(-(size // 2))
    return torch.stack([positions if head < heads // 2 else shifted for head in range(heads)])


def _allowed(attention_mask: torch.Tensor | None, batch: int, length: int, device: torch.device) -> torch.Tensor:
    """(batch, length, length) booleans: may query i attend to key j."""
    import torch

    if attention_mask is None:
        return torch.ones(length, length, dtype=torch.bool, device=device).tril().expand(batch, length, length)
    mask = attention_mask[:, 0, :, -length:]
    return mask if mask.dtype == torch.bool else mask == 0
