"""Golden BLEU-4 and ROUGE-1/2/L of predictions on alpaca_en_demo and alpaca_zh_demo, as LLaMA-Factory
0.9.5 writes them into predict_results.json (its ComputeSimilarity: jieba, rouge-chinese and NLTK).

The predictions (tests/data/nlg_eval/predictions.jsonl) are a model's generations, written by
make_nlg_eval_predictions.py (tuneline running LLaMA-Factory's extras/nlg_eval example on a model it
trained). LLaMA-Factory scores token ids, which it decodes; the ids are Qwen2.5's, whose decoding gives
each text back exactly (checked). Run with LLaMA-Factory's Python (metrics installed: jieba, nltk,
rouge-chinese) from the repository root:

    /work/lfvenv/bin/python tests/data/make_nlg_eval_golden.py ../shared
"""

import json
import sys
from pathlib import Path

import numpy as np
from llamafactory.extras.constants import IGNORE_INDEX
from llamafactory.train.sft.metric import ComputeSimilarity
from transformers import AutoTokenizer, EvalPrediction

OUT = Path("tests/data/nlg_eval")
DATASETS = ("alpaca_en_demo", "alpaca_zh_demo")


def padded(ids: list[list[int]]) -> np.ndarray:
    width = max(len(row) for row in ids) or 1
    return np.array([row + [IGNORE_INDEX] * (width - len(row)) for row in ids])


def main(shared: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(shared / "tokenizers/qwen2.5")
    rows = [json.loads(line) for line in (OUT / "predictions.jsonl").read_text(encoding="utf-8").splitlines()]
    results = {}
    for name in DATASETS:
        predictions = [row["predict"] for row in rows if row["dataset"] == name]
        labels = [row["label"] for row in rows if row["dataset"] == name]
        encoded = [[tokenizer.encode(text, add_special_tokens=False) for text in texts] for texts in (predictions, labels)]
        for texts, ids in zip((predictions, labels), encoded):
            assert tokenizer.batch_decode(ids, skip_special_tokens=True) == texts  # LLaMA-Factory reads these texts
        scores = ComputeSimilarity(tokenizer=tokenizer)(EvalPrediction(predictions=padded(encoded[0]), label_ids=padded(encoded[1])))
        results[name] = {f"predict_{key}": value for key, value in scores.items()}
    (OUT / "llamafactory_predict_results.json").write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
