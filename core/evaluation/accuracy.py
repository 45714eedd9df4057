"""`compute_accuracy`: the share of trained tokens a causal LM predicts right, as `eval_accuracy`.

The trainer keeps only each position's likeliest token (`likeliest_tokens`, so no logits pile up
over the evaluation), and `TokenAccuracy` compares position t's prediction with label t + 1 on
the trained positions. As in LLaMA-Factory, each row's accuracy is taken first and the rows
averaged (a short reply weighs as much as a long one).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from tuneline.core.data.processors import IGNORE_INDEX

if TYPE_CHECKING:
    import torch
    from transformers import EvalPrediction


def likeliest_tokens(logits: torch.Tensor | tuple[torch.Tensor, ...], labels: torch.Tensor) -> torch.Tensor:
    """The argmax token of every position (`preprocess_logits_for_metrics`); a tuple's first item is the logits."""
    if isinstance(logits, (tuple, list)):
        logits = logits[0]
    return logits.argmax(dim=-1)


def token_accuracy(predictions: np.ndarray, labels: np.ndarray) -> float:
    """Mean over rows of the share of trained next tokens predicted right; rows without one are left out."""
    per_row = []
    for predicted, label in zip(predictions, labels):
        predicted, target = predicted[:-1], label[1:]
        trained = target != IGNORE_INDEX
        if trained.any():
            per_row.append(float(np.mean(predicted[trained] == target[trained])))
    return float(np.mean(per_row)) if per_row else 0.0


def token_accuracy_metrics(prediction: EvalPrediction) -> dict[str, Any]:
    """`compute_metrics` for transformers' Trainer: {'accuracy': ...}, logged as `eval_accuracy`."""
    return {"accuracy": token_accuracy(np.asarray(prediction.predictions), np.asarray(prediction.label_ids))}
