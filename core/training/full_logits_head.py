"""Per-token log-probabilities from whole logits of the scored tokens, where TRL's chunked LM head is slower.

TRL 1.16's DPO and KTO trainers score tokens through `trl.trainer.utils.add_fused_lm_head`, which
never holds a batch's (rows, length, vocabulary) logits. On CUDA its Triton kernels make that both
fast and small, and score only the tokens with a label. Without Triton (the CPU) it folds the
vocabulary tiles in plain torch ops, scores every position (the prompts' too) and computes the
logits again in the backward pass: a DPO step of the project's tiny model takes about 1.3x as long
as one that takes the logits whole, as LLaMA-Factory does, and 1.5x as long as this head.

`prefer_full_logits` wraps a model that TRL has already patched: a call with `fused_lm_head=True`
on a device without Triton, whose scored tokens' logits fit in `FULL_LOGITS_ELEMENTS`, runs the
backbone, applies the LM head to the positions with a label only and scores them from those
logits, returning the fields TRL's head returns. Every other call (CUDA, long batches, MoE router
losses, pre-shifted labels, models whose logits are scaled or soft-capped) goes on to TRL's head.
The extra fields (entropy, mean logit, top-1) are the trainers' metrics, so they are computed
without gradient, as the trainers detach them. Remove this when TRL's head is as fast without Triton.
"""

from __future__ import annotations

import functools
import types
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel

# 2^26 float32 logits are 256 MiB; the backward pass holds about three such tensors.
FULL_LOGITS_ELEMENTS = 1 << 26
METRIC_OUTPUTS = frozenset({"entropy", "mean_logits", "is_top1"})
TRITON_DEVICES = ("cuda", "xpu")
# Config fields of models whose logits are scaled or soft-capped after the LM head (TRL's head applies them).
LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "output_multiplier", "lm_head_multiplier", "logits_scaling")


def prefer_full_logits(model: PreTrainedModel, *, outputs: tuple[str, ...]) -> None:
    """Answer `model`'s fused-head calls from its whole logits where they are small and Triton is absent.

    `model` is the causal LM that `add_fused_lm_head` patched (under PEFT, its base model); `outputs`
    are the per-token fields that patch was asked for, of which this head computes `log_probs` and
    the `METRIC_OUTPUTS`. With any other field requested, the model is left as TRL patched it.
    """
    if not set(outputs) <= METRIC_OUTPUTS | {"log_probs"}:
        return
    fused_forward = model.forward
    wanted = frozenset(outputs)

    @functools.wraps(type(model).forward)  # `generate` checks its keyword arguments against this signature
    def forward(self: Any, *args: Any, fused_lm_head: bool = False, labels: torch.Tensor | None = None,
                shift_labels: torch.Tensor | None = None, num_items_in_batch: Any = None, **kwargs: Any) -> Any:
        if not fused_lm_head or not _full_logits_fit(self, labels, shift_labels, kwargs):
            return fused_forward(*args, fused_lm_head=fused_lm_head, labels=labels, shift_labels=shift_labels,
                                 num_items_in_batch=num_items_in_batch, **kwargs)
        kwargs["use_cache"] = False
        hidden = self.base_model(*args, **kwargs).last_hidden_state  # the backbone: no LM head yet
        return scored_tokens(hidden, labels, self.get_output_embeddings(), wanted=wanted,
                             num_items_in_batch=num_items_in_batch)

    model.forward = types.MethodType(forward, model)


def _full_logits_fit(model: PreTrainedModel, labels: torch.Tensor | None, shift_labels: torch.Tensor | None,
                     kwargs: dict[str, Any]) -> bool:
    if labels is None or shift_labels is not None or labels.device.type in TRITON_DEVICES:
        return False
    config = model.config.get_text_config()
    if kwargs.get("output_router_logits") or getattr(config, "output_router_logits", False):
        return False  # TRL's head adds the MoE load-balancing loss
    if any(getattr(config, name, None) is not None for name in LOGIT_TRANSFORMS):
        return False
    vocabulary = model.get_output_embeddings().weight.shape[0]
    return int((labels[:, 1:] != -100).sum()) * vocabulary <= FULL_LOGITS_ELEMENTS


def scored_tokens(hidden: torch.Tensor, labels: torch.Tensor, lm_head: torch.nn.Module, *, wanted: frozenset[str],
                  num_items_in_batch: Any = None) -> Any:
    """TRL's `FusedCausalLMOutput` for next-token `labels` (-100: not scored) after the backbone's `hidden` states.

    Per-token fields are zero where the label is -100; `loss` is the summed negative log-likelihood
    over the scored tokens divided by `num_items_in_batch` (their count when not given), as TRL's.
    """
    import torch
    from trl.trainer.utils import FusedCausalLMOutput

    targets = labels[:, 1:].to(hidden.device)
    mask = targets != -100
    logits = lm_head(hidden[:, :-1][mask]).float()  # (scored tokens, vocabulary)
    chosen = targets[mask]
    log_z = logits.logsumexp(-1)
    log_probs = logits.gather(-1, chosen.unsqueeze(-1)).squeeze(-1) - log_z
    fields: dict[str, torch.Tensor | None] = dict.fromkeys(METRIC_OUTPUTS)
    with torch.no_grad():
        if "entropy" in wanted:  # H = log Z - E_p[z]
            fields["entropy"] = log_z - (torch.softmax(logits, dim=-1) * logits).sum(-1)
        if "mean_logits" in wanted:
            fields["mean_logits"] = logits.mean(-1)
        if "is_top1" in wanted:  # argmax takes the first maximum, as TRL's tie rule does
            fields["is_top1"] = logits.argmax(-1) == chosen
    count = mask.sum().clamp(min=1) if num_items_in_batch is None else num_items_in_batch
    per_token = {name: _spread(values, mask) for name, values in fields.items() if values is not None}
    log_probs = _spread(log_probs, mask)
    return FusedCausalLMOutput(loss=-log_probs.sum() / count, log_probs=log_probs, label_mask=mask, **per_token)


def _spread(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The scored tokens' values back at their positions, zero elsewhere; gradients flow through."""
    return values.new_zeros(mask.shape).masked_scatter(mask, values)
