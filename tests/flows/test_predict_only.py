"""`tuneline train` on a prediction config shaped like LLaMA-Factory's
examples/extras/nlg_eval/llama3_lora_predict.yaml: an existing adapter, `eval_dataset`, `do_predict`
without `do_train`. It answers the predict set with the adapter merged, and trains nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]


def lora_adapter(tiny_base: Path, folder: Path) -> None:
    """A LoRA adapter whose B matrices are far from zero, so that it changes every answer."""
    import torch
    from transformers import AutoTokenizer

    from tuneline.core.config import FinetuningConfig
    from tuneline.core.models.loading import apply_finetuning, load_model

    model = apply_finetuning(load_model(tiny_base), FinetuningConfig(lora_rank=4))
    torch.manual_seed(3)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(std=0.3)
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(tiny_base).save_pretrained(folder)


@pytest.mark.slow
def test_a_prediction_config_predicts_with_the_adapter_and_trains_nothing(tiny_base: Path, tmp_path: Path, monkeypatch,
                                                                        one_torch_thread):
    import torch

    from conftest import run_cli_here, train_in_this_process
    from tuneline.core.config import GeneratingConfig
    from tuneline.core.evaluation.predict import generate_answers
    from tuneline.core.models.export import merge_adapter
    from tuneline.core.models.loading import load_model, load_tokenizer

    lora_adapter(tiny_base, tmp_path / "adapter")
    config = {
        "model_name_or_path": str(tiny_base), "adapter_name_or_path": str(tmp_path / "adapter"),
        "stage": "sft", "do_predict": True, "finetuning_type": "lora",
        "eval_dataset": "demo_alpaca", "dataset_dir": str(REPO_ROOT / "data"), "template": "chatml", "cutoff_len": 64,
        "max_samples": 3, "output_dir": "predict", "overwrite_output_dir": True, "report_to": "none",
        "per_device_eval_batch_size": 2, "predict_with_generate": True, "max_new_tokens": 6, "do_sample": False,
    }
    (tmp_path / "predict.yaml").write_text(yaml.safe_dump(config))
    train_in_this_process(monkeypatch)  # the worker's run, without a process to start and import torch in
    result = run_cli_here("train", "predict.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]

    output = tmp_path / "predict"
    rows = [json.loads(line) for line in (output / "generated_predictions.jsonl").read_text().splitlines()]
    assert len(rows) == 3 and all(set(row) == {"prompt", "predict", "label"} for row in rows)
    assert rows[0]["prompt"].startswith("<|im_start|>") and rows[0]["label"]
    results = json.loads((output / "predict_results.json").read_text())
    assert {"predict_bleu-4", "predict_rouge-1", "predict_rouge-2", "predict_rouge-l", "predict_runtime"} <= set(results)
    assert not (output / "adapter_model.safetensors").exists() and not (output / "trainer_log.jsonl").exists()

    # the answers are the merged adapter's greedy answers, which differ from the base's
    merge_adapter(tiny_base, tmp_path / "adapter", tmp_path / "merged")
    tokenizer = load_tokenizer(tmp_path / "merged")
    prompts = [tokenizer.encode(row["prompt"], add_special_tokens=False) for row in rows]
    greedy = GeneratingConfig(max_new_tokens=6, do_sample=False)
    with torch.no_grad():
        merged = generate_answers(load_model(tmp_path / "merged"), tokenizer, prompts, generating=greedy)
        base = generate_answers(load_model(tiny_base), tokenizer, prompts, generating=greedy)
    assert [row["predict"] for row in rows] == tokenizer.batch_decode(merged, skip_special_tokens=True)
    assert merged != base
