"""How a reward model scores texts, and how well it ranks held-out pairs.

A reward model (a stage rm output, loaded by `core.models.loading.load_reward_model`) reads each
tokenized text's last non-padding token with its one-output head: `score` gives one float per
text, which PPO's rollouts use as their reward and `evaluate_reward_model` compares per pair.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from datasets import Dataset
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


def score(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    input_ids: Sequence[Sequence[int]] | torch.Tensor,
    *,
    batch_size: int = 32,
) -> torch.Tensor:
    """One reward per tokenized text (prompt and reply rendered with the stage's template), as floats.

    Texts are padded on the right; the head reads each text's last non-padding token.
    """
    import torch

    rows = input_ids.tolist() if isinstance(input_ids, torch.Tensor) else [list(ids) for ids in input_ids]
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    rewards = []
    with torch.no_grad():
        for start in range(0, len(rows), batch_size):
            batch = rows[start : start + batch_size]
            width = max(len(row) for row in batch)
            ids = [row + [tokenizer.pad_token_id] * (width - len(row)) for row in batch]
            mask = [[1] * len(row) + [0] * (width - len(row)) for row in batch]
            output = model(input_ids=torch.tensor(ids, device=device), attention_mask=torch.tensor(mask, device=device))
            rewards.append(output.logits[:, 0].float().cpu())
    model.train(was_training)
    return torch.cat(rewards) if rewards else torch.empty(0)


def score_media_pairs(model: PreTrainedModel, pairs: Dataset, *, media_collator: Callable[[list[dict[str, Any]]], dict[str, Any]],
                      batch_size: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    """The rewards of tokenized pairs of media rows, chosen and rejected, each pair's pixels cut by
    `media_collator` (rm's `PairedMediaCollator`, whose batch is the chosen sequences, then the rejected)."""
    import torch

    from tuneline.core.data.preference_columns import reward_pairs

    rows = reward_pairs(pairs)
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    chosen, rejected = [], []
    with torch.no_grad():
        for start in range(0, len(rows), batch_size):
            batch = media_collator([rows[i] for i in range(start, min(start + batch_size, len(rows)))])
            inputs = {key: value.to(device) if isinstance(value, torch.Tensor) else value for key, value in batch.items()}
            rewards = model(**inputs).logits[:, 0].float().cpu()
            half = len(rewards) // 2
            chosen.append(rewards[:half])
            rejected.append(rewards[half:])
    model.train(was_training)
    return torch.cat(chosen), torch.cat(rejected)


def evaluate_reward_model(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, pairs: Dataset, *, batch_size: int = 32,
    media_collator: Callable[[list[dict[str, Any]]], dict[str, Any]] | None = None,
) -> dict[str, float]:
    """On tokenized pairs: `accuracy` (share of pairs whose chosen reply scores strictly higher),
    `margin` (mean r_chosen - r_rejected), the mean rewards of each side, and the pair count. Pairs of
    media rows are scored with their pixels, cut by `media_collator`."""
    from tuneline.core.data.preference_columns import check_columns

    check_columns(pairs, examples="pairwise")
    if media_collator is not None:
        chosen, rejected = score_media_pairs(model, pairs, media_collator=media_collator)
    else:
        chosen = score(model, tokenizer, pairs["chosen_input_ids"], batch_size=batch_size)
        rejected = score(model, tokenizer, pairs["rejected_input_ids"], batch_size=batch_size)
    return {
        "accuracy": (chosen > rejected).float().mean().item(),
        "margin": (chosen - rejected).mean().item(),
        "chosen_reward": chosen.mean().item(),
        "rejected_reward": rejected.mean().item(),
        "pairs": float(len(chosen)),
    }
