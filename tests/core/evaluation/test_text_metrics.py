"""BLEU-4 and ROUGE-1/2/L of predictions: LLaMA-Factory 0.9.5's own scores of the same predictions
(tests/data/make_nlg_eval_golden.py), to 4 decimals. The predictions are a trained model's generations
on alpaca_en_demo and alpaca_zh_demo (tests/data/make_nlg_eval_predictions.py: LLaMA-Factory's
extras/nlg_eval example run by tuneline), whose predict_results.json gave these same numbers."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tuneline.core.errors import TunelineError
from tuneline.core.evaluation import text_metrics
from tuneline.core.evaluation.text_metrics import METRIC_KEYS, mean_similarity, similarity, words

GOLDEN = Path(__file__).resolve().parents[2] / "data/nlg_eval"


@pytest.mark.parametrize("dataset", ["alpaca_en_demo", "alpaca_zh_demo"])
def test_predict_results_equal_llamafactorys_on_the_same_predictions(dataset: str):
    rows = [json.loads(line) for line in (GOLDEN / "predictions.jsonl").read_text(encoding="utf-8").splitlines()]
    rows = [row for row in rows if row["dataset"] == dataset]
    expected = json.loads((GOLDEN / "llamafactory_predict_results.json").read_text())[dataset]
    found = mean_similarity([row["predict"] for row in rows], [row["label"] for row in rows])
    print(dataset, {key: round(found[key], 4) for key in METRIC_KEYS})
    assert {f"predict_{key}": round(value, 4) for key, value in found.items()} == {k: round(v, 4) for k, v in expected.items()}
    assert 0 < min(found.values()) < max(found.values()) < 100


def test_chinese_is_scored_on_jiebas_words_and_empty_text_scores_no_rouge():
    assert words("我们今天去北京") == ["我们", "今天", "去", "北京"]
    assert similarity("The capital is Paris.", "The capital is Paris.") == dict.fromkeys(METRIC_KEYS, 100.0)
    empty = similarity("", "something to say")
    assert (empty["rouge-1"], empty["rouge-2"], empty["rouge-l"], empty["bleu-4"]) == (0.0, 0.0, 0.0, 0.0)


def test_without_the_metrics_libraries_the_command_to_install_them_is_named(monkeypatch):
    text_metrics._libraries.cache_clear()
    monkeypatch.setitem(sys.modules, "jieba", None)  # an import of it fails, as when it is not installed
    try:
        with pytest.raises(TunelineError, match=r"jieba is not installed; install them with: pip install -e \"\.\[metrics\]\""):
            similarity("a", "b")
    finally:
        text_metrics._libraries.cache_clear()
