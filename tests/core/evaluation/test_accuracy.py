"""`compute_accuracy`'s token accuracy: next-token predictions against the trained labels, per row then averaged."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import EvalPrediction

from tuneline.core.evaluation.accuracy import likeliest_tokens, token_accuracy, token_accuracy_metrics


def test_position_t_predicts_label_t_plus_1_on_trained_positions_only():
    labels = np.array([[-100, 7, 8, 9], [-100, -100, 5, -100]])
    predictions = np.array([[7, 8, 0, 3], [1, 5, 2, 2]])  # row 0: 2 of 3 right; row 1: 1 of 1; the last position is unused
    assert token_accuracy(predictions, labels) == pytest.approx((2 / 3 + 1) / 2)  # rows weigh alike, as in LLaMA-Factory


def test_rows_without_trained_tokens_and_padding_are_left_out():
    labels = np.array([[-100, -100, -100], [-100, 4, -100]])
    predictions = np.array([[-100, -100, -100], [4, -100, -100]])
    assert token_accuracy(predictions, labels) == 1.0
    assert token_accuracy_metrics(EvalPrediction(predictions=predictions, label_ids=labels)) == {"accuracy": 1.0}


def test_only_the_likeliest_token_of_each_position_is_kept():
    logits = torch.tensor([[[0.1, 2.0, -1.0], [3.0, 0.0, 0.0]]])
    assert likeliest_tokens(logits, torch.zeros(1, 2)).tolist() == [[1, 0]]
    assert likeliest_tokens((logits, torch.zeros(1)), torch.zeros(1, 2)).tolist() == [[1, 0]]
