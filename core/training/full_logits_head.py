"""Per-token log-probabilities from the whole logits, where TRL's chunked LM head is the slower one.

TRL 1.16's DPO and KTO trainers score tokens through `trl.trainer.utils.add_fused_lm_head`, which
never holds a batch's (rows, length, vocabulary) logits. On CUDA its Triton kernels make that both
fast and small. Without Triton (the CPU) it folds the vocabulary tiles in plain torch ops, scores every
position, and computes the logits again in the backward pass: a DPO step of the project's tiny model
takes about 1.3x as long as one that takes the logits whole, as LLaMA-Factory does.

`prefer_full_logits` wraps a model that TRL has already patched: a call with `fused_lm_head=True`
whose logits fit in `FULL_LOGITS_ELEMENTS` on a device without Triton is answered from the model's
own logits, with the same fields TRL's head returns; every other call (CUDA, long batches, MoE router
losses, pre-shifted labels) goes on to TRL's head. The extra fields (entropy, mean logit, top-1) are
the trainers' metrics, so they are computed without gradient, as the trainers detach them.
Remove this when TRL's head is as fast without Triton.
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
        logits = fused_forward(*args, **kwargs).logits  # the model's own forward: no labels, so no loss
        return scored_tokens(logits, labels, wanted=wanted, num_items_in_batch=num_items_in_batch)

    model.forward = types.MethodType(forward, model)


def _full_logits_fit(model: PreTrainedModel, labels: torch.Tensor | None, shift_labels: torch.Tensor | None,
                     kwargs: dict[str, Any]) -> bool:
    if labels is None or shift_labels is not None or labels.device.type in TRITON_DEVICES:
        return False
    if kwargs.get("output_router_logits") or getattr(model.config.get_text_config(), "output_router_logits", False):
        return False  # TRL's head adds the MoE load-balancing loss
    vocabulary = model.get_output_embeddings().weight.shape[0]
    return labels.numel() * vocabulary <= FULL_LOGITS_ELEMENTS


def scored_tokens(logits: torch.Tensor, labels: torch.Tensor, *, wanted: frozenset[str],
                  num_items_in_batch: Any = None) -> Any:
    """TRL's `FusedCausalLMOutput` for next-token `labels` (-100: not scored) under `logits`.

    Per-token fields are zero where the label is -100; `loss` is the summed negative log-likelihood
    over the scored tokens divided by `num_items_in_batch` (their count when not given), as TRL's.
    """
    import torch
    from trl.trainer.utils import FusedCausalLMOutput

    logits, targets = logits[:, :-1].float(), labels[:, 1:].to(logits.device)
    mask = targets != -100
    log_z = logits.logsumexp(-1)
    target_logits = logits.gather(-1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    log_probs = (target_logits - log_z).masked_fill(~mask, 0.0)
    fields: dict[str, torch.Tensor | None] = dict.fromkeys(METRIC_OUTPUTS)
    with torch.no_grad():
        if "entropy" in wanted:  # H = log Z - E_p[z]
            expected = (torch.softmax(logits, dim=-1) * logits).sum(-1)
            fields["entropy"] = (log_z - expected).masked_fill(~mask, 0.0)
        if "mean_logits" in wanted:
            fields["mean_logits"] = logits.mean(-1).masked_fill(~mask, 0.0)
        if "is_top1" in wanted:  # argmax takes the first maximum, as TRL's tie rule does
            fields["is_top1"] = (logits.argmax(-1) == targets) & mask
    count = mask.sum().clamp(min=1) if num_items_in_batch is None else num_items_in_batch
    return FusedCausalLMOutput(loss=-log_probs.sum() / count, log_probs=log_probs, label_mask=mask, **fields)
