"""Generated predictions for the BLEU/ROUGE golden: LLaMA-Factory's extras/nlg_eval example
(`do_predict` with `predict_with_generate` on alpaca_en_demo and alpaca_zh_demo) run by tuneline on a
model it trains here, so that the predictions are a model's generations that share words with the
labels, in English and in Chinese.

The model: the project's tiny LLaMA-shaped base, its tokenizer trained on both demo sets' texts
(byte-level BPE, so Chinese is written too), fully fine-tuned on their first rows until it recalls
parts of the answers. Then `tuneline train` predicts each set with the example's keys, writing
generated_predictions.jsonl and predict_results.json as LLaMA-Factory does. Run from the repository
root with the project's Python, then make_nlg_eval_golden.py with LLaMA-Factory's:

    .venv/bin/python tests/data/make_nlg_eval_predictions.py ../shared
    /work/lfvenv/bin/python tests/data/make_nlg_eval_golden.py ../shared
"""

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from tuneline.core.models.tiny.text import BaseModelConfig, build_base_model

OUT = Path("tests/data/nlg_eval")
DATASETS = ("alpaca_en_demo", "alpaca_zh_demo")
ROWS = 24


def tuneline(config: dict, folder: Path) -> None:
    path = folder / f"{config['output_dir'].replace('/', '_')}.yaml"
    path.write_text(yaml.safe_dump(config, allow_unicode=True))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TUNELINE_CACHE": str(folder / "cache")}
    subprocess.run([sys.executable, "-m", "tuneline.flows.cli", "train", str(path)], cwd=folder, env=env, check=True)


def main(shared: Path) -> None:
    data = (shared / "llamafactory/data").resolve()
    rows = {name: json.loads((data / f"{name}.json").read_text(encoding="utf-8")) for name in DATASETS}
    texts = [f"{row['instruction']} {row['input']} {row['output']}" for name in DATASETS for row in rows[name][:200]]
    common = {"stage": "sft", "template": "default", "dataset_dir": str(data), "cutoff_len": 320, "max_samples": ROWS,
              "overwrite_cache": True, "overwrite_output_dir": True, "report_to": "none", "seed": 42}
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        build_base_model(texts, folder / "base", config=BaseModelConfig(vocab_size=3000, hidden_size=192, intermediate_size=512,
                                                                        num_hidden_layers=3, num_attention_heads=4,
                                                                        num_key_value_heads=2))
        tuneline({**common, "model_name_or_path": str(folder / "base"), "do_train": True, "finetuning_type": "full",
                  "dataset": ",".join(DATASETS), "output_dir": "saves/sft", "per_device_train_batch_size": 8,
                  "learning_rate": 2.0e-3, "num_train_epochs": 40, "lr_scheduler_type": "cosine", "logging_steps": 20}, folder)
        lines, produced = [], {}
        for name in DATASETS:  # the example's prediction keys, one set at a time
            output = f"saves/predict_{name}"
            tuneline({**common, "model_name_or_path": str(folder / "saves/sft"), "do_predict": True, "finetuning_type": "full",
                      "eval_dataset": name, "output_dir": output, "per_device_eval_batch_size": 1,
                      "predict_with_generate": True, "max_new_tokens": 48, "do_sample": False}, folder)
            for line in (folder / output / "generated_predictions.jsonl").read_text(encoding="utf-8").splitlines():
                row = json.loads(line)
                lines.append(json.dumps({"dataset": name, "predict": row["predict"], "label": row["label"]}, ensure_ascii=False))
            produced[name] = json.loads((folder / output / "predict_results.json").read_text())
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "predictions.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(json.dumps(produced, indent=1))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
