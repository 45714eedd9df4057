"""BLEU-4 and ROUGE-1/2/L of generated answers, as LLaMA-Factory scores `predict_with_generate`.

Per example, with scores x 100 rounded to 4 decimals, then averaged over the examples:

- BLEU-4: NLTK's `sentence_bleu` of the prediction's characters against the label's characters
  (one reference, weights 0.25 each for 1- to 4-grams) with smoothing "method3" (the NIST
  geometric sequence: the k-th n-gram order without a match counts 1 / (2^k * its n-gram count)),
  0 when no character matches, times the brevity penalty exp(1 - label/prediction length) when
  the prediction is the shorter.
- ROUGE-1/2/L F-scores as the `rouge_chinese` package computes them on word-segmented text:
  ROUGE-N compares the *sets* of distinct n-grams, ROUGE-L the longest common subsequence of the
  word lists, both with F = 2PR / (P + R + 1e-8); 0 when either side has no word.

LLaMA-Factory segments words with jieba, which needs a dictionary that tuneline does not ship.
Here CJK characters (ideographs and kana) are words one by one, runs of other letters and digits
are words, other punctuation marks are words by themselves, and whitespace separates. For text
with spaces between words this is what jieba does; for Chinese it scores characters rather than
jieba's words, so ROUGE on Chinese text reads higher than LLaMA-Factory's. BLEU is unaffected.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence

_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0002ffff"
_WORD = re.compile(rf"[{_CJK}]|[^\W{_CJK}]+|\n|[^\s]")
METRIC_KEYS = ("bleu-4", "rouge-1", "rouge-2", "rouge-l")


def segment(text: str) -> list[str]:
    """Words of `text`: CJK characters one by one, letter/digit runs, single punctuation marks, newlines."""
    return _WORD.findall(text)


def sentence_bleu4(prediction: Sequence[str], reference: Sequence[str]) -> float:
    """NLTK's `sentence_bleu([reference], prediction, smoothing_function=method3)` in [0, 1]."""
    if not prediction:
        return 0.0
    log_sum, unmatched_orders = 0.0, 0
    for n in range(1, 5):
        predicted = Counter(tuple(prediction[i : i + n]) for i in range(len(prediction) - n + 1))
        expected = Counter(tuple(reference[i : i + n]) for i in range(len(reference) - n + 1))
        matches = sum((predicted & expected).values())
        total = max(1, sum(predicted.values()))
        if matches == 0:
            if n == 1:
                return 0.0
            unmatched_orders += 1
            precision = 1 / (2**unmatched_orders * total)
        else:
            precision = matches / total
        log_sum += 0.25 * math.log(precision)
    return _brevity_penalty(len(reference), len(prediction)) * math.exp(log_sum)


def _brevity_penalty(reference_length: int, prediction_length: int) -> float:
    if prediction_length > reference_length:
        return 1.0
    return math.exp(1 - reference_length / prediction_length)


def rouge_words(text: str) -> list[str]:
    """The word list `rouge_chinese` scores for a text: segmented, joined with spaces, cut into
    sentences after 。！？? (its `cut_sent`), each sentence's whitespace collapsed, then split on
    single spaces (so a sentence of only whitespace contributes one empty word, as it does there)."""
    joined = " ".join(segment(text))
    joined = re.sub(r"([。！？?])([^”’])", r"\1\n\2", joined)
    joined = re.sub(r"(\.{6})([^”’])", r"\1\n\2", joined)
    joined = re.sub(r"(…{2})([^”’])", r"\1\n\2", joined)
    joined = re.sub(r"([。！？?][”’])([^，。！？?])", r"\1\n\2", joined)
    sentences = [" ".join(part.split()) for part in joined.rstrip().split("\n") if part]
    return [word for sentence in sentences for word in sentence.split(" ")]


def rouge_n(prediction: Sequence[str], reference: Sequence[str], n: int) -> float:
    """ROUGE-N F-score over the sets of distinct n-grams."""
    predicted = {tuple(prediction[i : i + n]) for i in range(len(prediction) - n + 1)}
    expected = {tuple(reference[i : i + n]) for i in range(len(reference) - n + 1)}
    overlap = len(predicted & expected)
    precision = overlap / len(predicted) if predicted else 0.0
    recall = overlap / len(expected) if expected else 0.0
    return _f_score(precision, recall)


def rouge_l(prediction: Sequence[str], reference: Sequence[str]) -> float:
    """ROUGE-L F-score from the longest common subsequence of the two word lists."""
    common = _lcs_length(prediction, reference)
    return _f_score(common / len(prediction), common / len(reference))


def _f_score(precision: float, recall: float) -> float:
    return 2.0 * ((precision * recall) / (precision + recall + 1e-8))


def _lcs_length(a: Sequence[str], b: Sequence[str]) -> int:
    previous = [0] * (len(b) + 1)
    for item in a:
        current = [0]
        for j, other in enumerate(b):
            current.append(previous[j] + 1 if item == other else max(previous[j + 1], current[j]))
        previous = current
    return previous[-1]


def similarity(prediction: str, label: str) -> dict[str, float]:
    """BLEU-4 and ROUGE-1/2/L (x 100, 4 decimals) of one prediction against its label."""
    if not prediction.strip() or not label.strip():
        scores = {"rouge-1": 0.0, "rouge-2": 0.0, "rouge-l": 0.0}
    else:
        predicted, expected = rouge_words(prediction), rouge_words(label)
        scores = {"rouge-1": rouge_n(predicted, expected, 1), "rouge-2": rouge_n(predicted, expected, 2),
                  "rouge-l": rouge_l(predicted, expected)}
    scores["bleu-4"] = sentence_bleu4(list(prediction), list(label))
    return {key: round(scores[key] * 100, 4) for key in METRIC_KEYS}


def mean_similarity(predictions: Sequence[str], labels: Sequence[str]) -> dict[str, float]:
    """Each metric of `similarity` averaged over the examples (0 for none)."""
    per_example = [similarity(p, l) for p, l in zip(predictions, labels, strict=True)]
    return {key: sum(s[key] for s in per_example) / len(per_example) if per_example else 0.0 for key in METRIC_KEYS}
