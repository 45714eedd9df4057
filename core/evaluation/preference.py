"""How strongly a policy prefers the chosen reply of tokenized pairs, measured by log-probability.

Both measures read tuneline's pairwise columns (stages rm and dpo) and count reply tokens only
(label != -100); accuracies compare strictly, so a tie counts as a miss.

- Likelihood preference needs no reference, so it scores any causal LM, the SFT model a DPO run
  starts from included: `logp_accuracy` is the share of pairs with log p(chosen | prompt) >
  log p(rejected | prompt), log-probabilities summed over the reply, and `logp_margin` the mean
  difference of those sums; `mean_logp_accuracy` compares per-token means instead (the
  length-normalised quantity that SimPO and ORPO train).
- Implicit reward preference is what DPO and KTO optimise: r(y) = beta * (log p(y | x) -
  log p_ref(y | x)). `reward_accuracy` is the share of pairs with r(chosen) > r(rejected),
  `reward_margin` the mean r(chosen) - r(rejected), `reward_chosen` and `reward_rejected` the
  mean rewards. A policy equal to its reference has every reward 0, so accuracy 0: score a
  starting model with the likelihood measures, which `evaluate_preference` also reports for the
  reference (`reference_logp_accuracy`, ...), so a DPO run shows its starting model's numbers beside its own.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tuneline.core.data.preference_columns import IGNORE_INDEX, check_columns

if TYPE_CHECKING:
    import torch
    from datasets import Dataset
    from transformers import PreTrainedModel

    from tuneline.core.data.media.batching import RowMedia


@dataclass(frozen=True)
class PairLogps:
    """Summed reply log-probabilities and reply token counts of each pair's two replies."""

    chosen: torch.Tensor
    rejected: torch.Tensor
    chosen_tokens: torch.Tensor
    rejected_tokens: torch.Tensor


def pair_logps(
    model: PreTrainedModel, pairs: Dataset, *, batch_size: int = 16, adapter_off: bool = False, media: RowMedia | None = None
) -> PairLogps:
    """Reply log-probabilities of `model` for every pair; `adapter_off` switches a LoRA model's adapter off.
    Pairs of media rows are read with their media (`media`), fed for both replies."""
    check_columns(pairs, examples="pairwise")
    context = model.disable_adapter() if adapter_off else contextlib.nullcontext()
    rows = media.files_of(pairs) if media is not None else None
    with context:
        chosen, chosen_tokens = sequence_logps(model, pairs["chosen_input_ids"], pairs["chosen_labels"],
                                               batch_size=batch_size, media=media, rows=rows)
        rejected, rejected_tokens = sequence_logps(model, pairs["rejected_input_ids"], pairs["rejected_labels"],
                                                   batch_size=batch_size, media=media, rows=rows)
    return PairLogps(chosen, rejected, chosen_tokens, rejected_tokens)


def sequence_logps(
    model: PreTrainedModel, input_ids: Sequence[Sequence[int]], labels: Sequence[Sequence[int]], *, batch_size: int = 16,
    media: RowMedia | None = None, rows: Sequence[dict] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per sequence: the summed log-probability of its labelled tokens, and how many there are; with
    `media`, each sequence reads the media of its row in `rows`."""
    import torch

    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    sums, counts = [], []
    with torch.no_grad():
        for start in range(0, len(input_ids), batch_size):
            rows_of = slice(start, start + batch_size)
            ids, label_ids, mask = _right_padded(input_ids[rows_of], labels[rows_of])
            ids, mask = ids.to(device), mask.to(device)
            pixels = media.inputs(ids, rows[rows_of], attention_mask=mask) if media is not None and rows is not None else {}
            logits = model(input_ids=ids, attention_mask=mask, **pixels).logits.float()
            targets = label_ids[:, 1:].to(device)
            valid = targets != IGNORE_INDEX
            log_probs = torch.log_softmax(logits[:, :-1], dim=-1)
            token_logps = log_probs.gather(-1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1)
            sums.append((token_logps * valid).sum(-1).cpu())
            counts.append(valid.sum(-1).cpu())
    model.train(was_training)
    return torch.cat(sums), torch.cat(counts)


def _right_padded(
    input_ids: Sequence[Sequence[int]], labels: Sequence[Sequence[int]]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Input ids (padded with 0, never attended to), labels (padded with -100) and the attention mask."""
    import torch

    width = max(len(ids) for ids in input_ids)
    padding = [width - len(ids) for ids in input_ids]
    ids = torch.tensor([list(row) + [0] * pad for row, pad in zip(input_ids, padding)])
    label_ids = torch.tensor([list(row) + [IGNORE_INDEX] * pad for row, pad in zip(labels, padding)])
    mask = torch.tensor([[1] * len(row) + [0] * pad for row, pad in zip(input_ids, padding)])
    return ids, label_ids, mask


def likelihood_metrics(policy: PairLogps) -> dict[str, float]:
    """`logp_accuracy`, `logp_margin` and `mean_logp_accuracy` (see the module docstring)."""
    chosen_mean = policy.chosen / policy.chosen_tokens.clamp(min=1)
    rejected_mean = policy.rejected / policy.rejected_tokens.clamp(min=1)
    return {
        "logp_accuracy": (policy.chosen > policy.rejected).float().mean().item(),
        "logp_margin": (policy.chosen - policy.rejected).mean().item(),
        "mean_logp_accuracy": (chosen_mean > rejected_mean).float().mean().item(),
    }


def implicit_reward_metrics(policy: PairLogps, reference: PairLogps, *, beta: float) -> dict[str, float]:
    """`reward_accuracy`, `reward_margin`, `reward_chosen` and `reward_rejected` (see the module docstring)."""
    chosen = beta * (policy.chosen - reference.chosen)
    rejected = beta * (policy.rejected - reference.rejected)
    return {
        "reward_accuracy": (chosen > rejected).float().mean().item(),
        "reward_margin": (chosen - rejected).mean().item(),
        "reward_chosen": chosen.mean().item(),
        "reward_rejected": rejected.mean().item(),
    }


def evaluate_preference(
    policy: PreTrainedModel,
    pairs: Dataset,
    *,
    beta: float = 0.1,
    reference: PreTrainedModel | None = None,
    batch_size: int = 16,
    media: RowMedia | None = None,
) -> dict[str, float]:
    """Likelihood metrics of `policy` on `pairs`, plus implicit reward metrics against `reference`,
    or, with no `reference`, against a LoRA policy's adapter switched off (the reference of a new
    adapter in training); a policy that is neither gets the likelihood metrics alone."""
    from peft import PeftModel

    own = pair_logps(policy, pairs, batch_size=batch_size, media=media)
    metrics = {**likelihood_metrics(own), "pairs": float(len(own.chosen))}
    if reference is not None:
        base = pair_logps(reference, pairs, batch_size=batch_size, media=media)
    elif isinstance(policy, PeftModel):
        base = pair_logps(policy, pairs, batch_size=batch_size, adapter_off=True, media=media)
    else:
        return metrics
    metrics.update(implicit_reward_metrics(own, base, beta=beta))
    metrics.update({f"reference_{key}": value for key, value in likelihood_metrics(base).items()})
    return metrics
