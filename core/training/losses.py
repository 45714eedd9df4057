"""The SFT loss variants LLaMA-Factory offers, as functions of a causal LM's logits and labels.

Each compares position t's logits with label t + 1 (labels -100 are not trained), as the causal
LM loss does, in float32:

- DFT (`use_dft_loss`): each token's cross-entropy times its probability under the model, the
  probability detached, so confident tokens weigh more.
- EAFT (`use_eaft_loss`): each token's cross-entropy times (H / 3) ** alpha, H the entropy of the
  model's distribution renormalised over its 20 likeliest tokens, detached.
- ASFT (`use_asft_loss`): the DFT loss plus alpha times the mean KL(reference || policy) over the
  trained positions, the full vocabulary each.

DFT and EAFT sum over the trained tokens and divide by `num_items_in_batch` when given (the
trained tokens of the whole accumulated batch, which transformers counts), else take the mean;
ASFT takes the mean of one batch, as LLaMA-Factory does.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F

from tuneline.core.data.processors import IGNORE_INDEX

EAFT_TOP_K = 20  # tokens the entropy of EAFT is estimated over
EAFT_ENTROPY_SCALE = 3.0  # the entropy is divided by this before the exponent


def trained_positions(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The float32 logits of the positions that predict a trained label, `[n, vocab]`, and those labels, `[n]`."""
    targets = labels[..., 1:].to(logits.device)
    predicting = logits[..., :-1, :].float()
    keep = targets != IGNORE_INDEX
    return predicting[keep], targets[keep]


def dft_loss(logits: torch.Tensor, labels: torch.Tensor, *,
             num_items_in_batch: torch.Tensor | int | None = None) -> torch.Tensor:
    """Dynamic fine-tuning: cross-entropy weighted by the detached probability of each target token."""
    scores, targets = trained_positions(logits, labels)
    per_token = F.cross_entropy(scores, targets, reduction="none")
    return _reduce(per_token * torch.exp(-per_token.detach()), num_items_in_batch, logits)


def eaft_loss(logits: torch.Tensor, labels: torch.Tensor, *, alpha: float,
              num_items_in_batch: torch.Tensor | int | None = None) -> torch.Tensor:
    """Entropy-adaptive fine-tuning: cross-entropy weighted by the scaled top-k entropy to the power alpha."""
    scores, targets = trained_positions(logits, labels)
    per_token = F.cross_entropy(scores, targets, reduction="none")
    with torch.no_grad():
        top = torch.topk(scores, k=min(EAFT_TOP_K, scores.size(-1)), dim=-1).values
        log_probs = top.log_softmax(dim=-1)
        entropy = -(log_probs.exp() * log_probs).sum(dim=-1)
        weight = (entropy / EAFT_ENTROPY_SCALE).pow(alpha)
    return _reduce(per_token * weight, num_items_in_batch, logits)


def asft_loss(logits: torch.Tensor, labels: torch.Tensor, reference_logits: torch.Tensor, *, alpha: float) -> torch.Tensor:
    """Anchored SFT: the mean DFT loss plus alpha times the mean KL(reference || policy) per trained position."""
    scores, targets = trained_positions(logits, labels)
    reference, _ = trained_positions(reference_logits, labels)
    if targets.numel() == 0:
        return logits.sum() * 0.0
    per_token = F.cross_entropy(scores, targets, reduction="none")
    dft = (per_token * torch.exp(-per_token.detach())).mean()
    kl = F.kl_div(scores.log_softmax(dim=-1), reference.log_softmax(dim=-1), reduction="none", log_target=True).sum(dim=-1)
    return dft + alpha * kl.mean()


def _reduce(weighted: torch.Tensor, num_items_in_batch: torch.Tensor | int | None, logits: torch.Tensor) -> torch.Tensor:
    if weighted.numel() == 0:
        return logits.sum() * 0.0  # no trained token: zero, still attached to the graph so backward runs
    if num_items_in_batch is None:
        return weighted.mean()
    if torch.is_tensor(num_items_in_batch):
        num_items_in_batch = num_items_in_batch.to(weighted.device)
    return weighted.sum() / num_items_in_batch


@dataclass(frozen=True)
class LogitsLoss:
    """`dft_loss` or `eaft_loss` (with its keywords, through `functools.partial`) as transformers'
    `compute_loss_func`, which passes the model's outputs; printed, it names the function the run
    trains with."""

    loss: Callable[..., torch.Tensor]

    def __call__(self, outputs: Mapping[str, Any], labels: torch.Tensor,
                 num_items_in_batch: torch.Tensor | int | None = None) -> torch.Tensor:
        return self.loss(outputs["logits"], labels, num_items_in_batch=num_items_in_batch)

    def __str__(self) -> str:
        function, keywords = (self.loss.func, self.loss.keywords) if isinstance(self.loss, partial) else (self.loss, {})
        arguments = ", ".join(f"{key}={value!r}" for key, value in keywords.items())
        return f"{function.__module__}.{function.__qualname__}" + (f"({arguments})" if arguments else "")
