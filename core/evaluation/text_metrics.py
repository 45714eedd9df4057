"""BLEU-4 and ROUGE-1/2/L of generated answers, as LLaMA-Factory scores `predict_with_generate`,
computed by the libraries it uses (the `metrics` extra):

- words are cut by jieba (Chinese into jieba's words, other text at spaces and punctuation);
- ROUGE-1/2/L are rouge-chinese's F-scores of the prediction's words against the label's, 0 when
  either side has no word;
- BLEU-4 is NLTK's `sentence_bleu` of the prediction's characters against the label's, with
  smoothing "method3".

Each score is x 100 and rounded to 4 decimals per example, then averaged over the examples.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from functools import cache
from typing import Any

from tuneline.core.errors import TunelineError

METRIC_KEYS = ("bleu-4", "rouge-1", "rouge-2", "rouge-l")
ROUGE_KEYS = ("rouge-1", "rouge-2", "rouge-l")


@cache
def _libraries() -> tuple[Any, Any, Any, Any]:
    """jieba, rouge-chinese's Rouge, NLTK's sentence_bleu and its smoothing method3."""
    try:
        import jieba
        from nltk.translate.bleu_score import SmoothingFunction, sentence_bleu
        from rouge_chinese import Rouge
    except ImportError as e:
        raise TunelineError(f"BLEU and ROUGE of predictions are computed with nltk, rouge-chinese and jieba, and {e.name} "
                            "is not installed; install them with: pip install -e \".[metrics]\"") from e
    jieba.setLogLevel(logging.WARNING)  # its dictionary-loading notes would interleave with the progress lines
    return jieba, Rouge, sentence_bleu, SmoothingFunction().method3


def words(text: str) -> list[str]:
    """`text` cut into words by jieba, as the ROUGE scores read it."""
    jieba = _libraries()[0]
    return list(jieba.cut(text))


def similarity(prediction: str, label: str) -> dict[str, float]:
    """BLEU-4 and ROUGE-1/2/L (x 100, 4 decimals) of one prediction against its label."""
    _, rouge, sentence_bleu, method3 = _libraries()
    hypothesis, reference = " ".join(words(prediction)), " ".join(words(label))
    if not hypothesis.split() or not reference.split():
        scores = dict.fromkeys(ROUGE_KEYS, 0.0)
    else:
        found = rouge().get_scores(hypothesis, reference)[0]
        scores = {key: found[key]["f"] for key in ROUGE_KEYS}
    scores["bleu-4"] = sentence_bleu([list(label)], list(prediction), smoothing_function=method3)
    return {key: round(scores[key] * 100, 4) for key in METRIC_KEYS}


def mean_similarity(predictions: Sequence[str], labels: Sequence[str]) -> dict[str, float]:
    """Each metric of `similarity` averaged over the examples (0 for none), with numpy's mean as
    LLaMA-Factory takes it (its pairwise sums can differ from a plain sum in the last digit)."""
    import numpy as np

    per_example = [similarity(prediction, label) for prediction, label in zip(predictions, labels, strict=True)]
    return {key: float(np.mean([s[key] for s in per_example])) if per_example else 0.0 for key in METRIC_KEYS}
