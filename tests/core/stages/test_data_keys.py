"""The data keys a trained stage reads: `eval_on_each_dataset` (a validation split and metrics per
evaluation dataset, named `eval_<name>_*` as LLaMA-Factory names them), `eval_num_beams` (the beams
of `predict_with_generate`) and `ignore_pad_token_for_loss` (sft's label padding)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tuneline.core.errors import ConfigError
from tuneline.core.stages.registry import build_stage_config

REPO_DATA = str(Path(__file__).resolve().parents[3] / "data")
EACH = {"dataset": "demo_alpaca", "eval_dataset": "demo_alpaca,demo_heldout", "eval_on_each_dataset": True,
        "dataset_dir": REPO_DATA, "template": "default", "cutoff_len": 48, "max_samples": 4}


@pytest.mark.parametrize(("keys", "fragment"), [
    ({"stage": "dpo", "ignore_pad_token_for_loss": False}, "'ignore_pad_token_for_loss: false' trains the padding of sft"),
    ({"stage": "ppo", "reward_model": "rm", **EACH}, "stage 'ppo' runs its own loop and scores all held-out rows together"),
    ({**EACH, "eval_dataset": "demo alpaca"}, "'demo alpaca' holds other characters"),
    ({"eval_num_beams": 0}, "'eval_num_beams' must be at least 1, got 0"),
    ({"buffer_size": 0}, "'buffer_size' is the number of rows of the streaming shuffle buffer"),
])
def test_data_keys_that_cannot_work_are_named(keys: dict, fragment: str) -> None:
    with pytest.raises(ConfigError) as error:
        build_stage_config({"stage": "sft", **keys})
    assert any(fragment in problem for problem in error.value.problems), error.value.problems


def test_padding_trains_in_sft_labels_when_not_ignored(load) -> None:
    from datasets import Dataset

    from tuneline.core.training.collators import build_collator

    tokenizer = load("qwen2.5")
    rows = Dataset.from_list([{"input_ids": [1, 2, 3], "attention_mask": [1, 1, 1], "labels": [-100, 2, 3]},
                              {"input_ids": [4], "attention_mask": [1], "labels": [4]}])
    for ignored, pad in ((True, -100), (False, tokenizer.pad_token_id)):
        collate = build_collator(rows, tokenizer=tokenizer, model=None, ignore_pad_token_for_loss=ignored)
        assert collate(list(rows))["labels"].tolist() == [[-100, 2, 3], [4, pad, pad]]


def test_eval_num_beams_sets_the_beams_of_prediction_only() -> None:
    from tuneline.core.config import DataConfig
    from tuneline.core.worker.run import prediction_generating

    assert prediction_generating({"num_beams": 1, "max_new_tokens": 8}, DataConfig(eval_num_beams=3)) == {
        "num_beams": 3, "max_new_tokens": 8}
    assert prediction_generating({"num_beams": 2}, DataConfig()) == {"num_beams": 2}


def test_each_evaluation_dataset_gets_its_own_split(tiny_base: Path, tmp_path: Path) -> None:
    from datasets import load_from_disk

    from tuneline.core.stages.registry import tokenize_stage_data

    tokenize_stage_data(build_stage_config({"stage": "sft", **EACH}), tokenizer_path=tiny_base, output_dir=tmp_path / "each")
    tokenize_stage_data(build_stage_config({"stage": "sft", **EACH, "eval_on_each_dataset": False}), tokenizer_path=tiny_base,
                        output_dir=tmp_path / "mixed")
    each, mixed = load_from_disk(str(tmp_path / "each")), load_from_disk(str(tmp_path / "mixed"))
    assert set(each) == {"train", "validation_demo_alpaca", "validation_demo_heldout"} and set(mixed) == {"train", "validation"}
    separate = [list(each[f"validation_{name}"]["input_ids"]) for name in ("demo_alpaca", "demo_heldout")]
    assert len(separate[0]) == len(separate[1]) == 4 and separate[0] + separate[1] == list(mixed["validation"]["input_ids"])


@pytest.mark.slow
def test_a_stage_reports_each_evaluation_dataset_under_its_name(tiny_base: Path, tmp_path: Path) -> None:
    """One short sft run: evaluated during training and at the end per dataset, in the results files
    and in MLflow; predictions answer every evaluation dataset's rows with two beams."""
    from mlflow import MlflowClient

    from tuneline.core.pipeline.stage_runs import train_job
    from tuneline.core.stages.registry import tokenize_stage_data
    from tuneline.core.tracking import runs as tracking
    from tuneline.core.worker.run import run_training

    training = {"max_steps": 2, "per_device_train_batch_size": 2, "logging_steps": 1, "seed": 0, "report_to": "none",
                "eval_strategy": "steps", "eval_steps": 2, "do_train": True, "do_predict": True,
                "predict_with_generate": True}
    config = build_stage_config({"stage": "sft", "finetuning_type": "lora", "lora_rank": 4, **EACH, **training,
                                 "eval_num_beams": 2, "max_new_tokens": 4, "ignore_pad_token_for_loss": False})
    tokenize_stage_data(config, tokenizer_path=tiny_base, output_dir=tmp_path / "data")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    with tracking.tracked_run(uri, tracking.ensure_experiment(uri, "each"), name="train") as run_id:
        job = train_job(config, start_model=str(tiny_base), dataset_path=str(tmp_path / "data"), output_dir=str(tmp_path / "out"),
                        training=training, tracking_uri=uri, run_id=run_id)
        metrics = run_training(job)
    names = ("demo_alpaca", "demo_heldout")
    for name in names:
        assert metrics[f"eval_{name}_perplexity"] > 1 and f"eval_{name}_runtime" in metrics
    assert "eval_loss" not in metrics and metrics["eval_demo_alpaca_loss"] != metrics["eval_demo_heldout_loss"]
    results = json.loads((tmp_path / "out" / "eval_results.json").read_text())
    assert {f"eval_{name}_loss" for name in names} <= set(results)
    history = json.loads((tmp_path / "out" / "trainer_state.json").read_text())["log_history"]
    assert all(any(f"eval_{name}_loss" in entry for entry in history) for name in names)  # during training too
    client = MlflowClient(tracking_uri=uri)
    logged = client.get_run(run_id).data.metrics
    assert all(logged[f"eval_{name}_loss"] == pytest.approx(metrics[f"eval_{name}_loss"]) for name in names)
    predictions = (tmp_path / "out" / "generated_predictions.jsonl").read_text().splitlines()
    assert len(predictions) == 8 and "predict_bleu-4" in metrics


def test_the_data_keys_the_worker_reads_change_the_train_key_only_when_set() -> None:
    from tuneline.core.pipeline.keys import train_key
    from tuneline.core.pipeline.spec import TrainingStage

    def key(**keys) -> str:
        stage = TrainingStage(name="sft", parent=None, config=build_stage_config({"stage": "sft", **keys}))
        return train_key(stage, tokenized_key="t", parent_key="p")

    plain = key()
    assert plain == key(eval_num_beams=None, ignore_pad_token_for_loss=True)
    assert len({plain, key(eval_num_beams=2), key(eval_num_beams=3), key(ignore_pad_token_for_loss=False)}) == 4
