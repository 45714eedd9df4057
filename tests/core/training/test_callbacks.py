"""Training logs: token counting, MFU, trainer_log.jsonl in LLaMA-Factory's format, console lines, MLflow."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tuneline.core.training.throughput import PEAK_ENV, TokenCounter, cpu_peak, flops_per_token, gpu_peak

LLAMAFACTORY_ORDER = ["current_steps", "total_steps", "loss", "lr", "epoch", "percentage", "elapsed_time", "remaining_time"]


def tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64, pad_token_id=0)
    return LlamaForCausalLM(config)


def test_token_counter_counts_all_and_non_padding_tokens_of_training_forwards_only():
    model = tiny_llama()
    counter = TokenCounter(pad_token_id=0)
    counter.attach(model)
    input_ids = torch.tensor([[5, 6, 7, 8, 9, 10], [5, 6, 7, 8, 0, 0]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]])
    model.train()
    model(input_ids=input_ids, attention_mask=mask)
    assert (counter.all_tokens, counter.non_padding_tokens) == (12, 10)
    model(input_ids=input_ids)  # no 2D mask (packed batches): the pad id marks padding
    assert (counter.all_tokens, counter.non_padding_tokens) == (24, 20)
    model.eval()
    model(input_ids=input_ids, attention_mask=mask)  # evaluation is not training throughput
    counter.detach()
    model.train()
    model(input_ids=input_ids, attention_mask=mask)  # detached: no longer counted
    assert (counter.all_tokens, counter.non_padding_tokens) == (24, 20)


@pytest.mark.parametrize(("name", "tflops"), [
    ("NVIDIA H100 80GB HBM3", 989.0), ("NVIDIA H100 PCIe", 756.0), ("NVIDIA H200", 989.0),
    ("NVIDIA A100-SXM4-80GB", 312.0), ("NVIDIA L4", 121.0), ("NVIDIA L40S", 362.0), ("Tesla T4", 65.0),
    ("NVIDIA A10G", None),  # not the A10: unknown, so no MFU rather than a wrong one
])
def test_gpu_peak_table_matches_whole_words_of_the_device_name(name: str, tflops: float | None):
    peak = gpu_peak(name)
    assert (peak.flops / 1e12 if peak else None) == tflops


def test_cpu_peak_is_an_estimate_from_clock_and_vector_width():
    peak = cpu_peak("cpu MHz\t\t: 2000.000\nflags\t\t: fpu sse2 avx2 fma\n", threads=4)
    assert peak.flops == 4 * 2.0e9 * 32  # AVX2 + FMA: 8 fp32 lanes x 2 (fused) x 2 units
    assert peak.source.startswith("CPU estimate")
    assert cpu_peak("flags : avx512f avx2 fma\n", threads=1).flops == 2.5e9 * 64  # clock unknown: 2.5 GHz assumed


def test_flops_per_token_is_6n_for_full_training_and_less_for_frozen_weights():
    assert flops_per_token(total_params=100, trainable_params=100) == 600
    assert flops_per_token(total_params=100, trainable_params=10) == 420  # LoRA: 4 per frozen, 6 per trained


def _batches(rows):
    width = max(len(r["input_ids"]) for r in rows)
    pad = [width - len(r["input_ids"]) for r in rows]
    return {
        "input_ids": torch.tensor([r["input_ids"] + [0] * p for r, p in zip(rows, pad)]),
        "attention_mask": torch.tensor([[1] * len(r["input_ids"]) + [0] * p for r, p in zip(rows, pad)]),
        "labels": torch.tensor([r["input_ids"] + [-100] * p for r, p in zip(rows, pad)]),
    }


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> dict:
    """Two logged steps of a tiny model; every batch holds rows of 8, 8, 4 and 4 tokens (25% padding)."""
    import io
    from contextlib import redirect_stdout

    from datasets import Dataset
    from transformers import Trainer, TrainingArguments

    from tuneline.core.tracking import runs as tracking
    from tuneline.core.training.callbacks import LogCallback

    folder = tmp_path_factory.mktemp("callbacks")
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    with tracking.tracked_run(uri, tracking.ensure_experiment(uri, "callbacks"), name="train") as run_id:
        rows = Dataset.from_list([{"input_ids": list(range(1, 9))}, {"input_ids": list(range(9, 17))},
                                  {"input_ids": [1, 2, 3, 4]}, {"input_ids": [5, 6, 7, 8]}])
        args = TrainingArguments(output_dir=str(folder / "out"), per_device_train_batch_size=4, max_steps=2, logging_steps=1,
                                 learning_rate=1e-3, report_to=[], disable_tqdm=True, save_strategy="no", use_cpu=True)
        model = tiny_llama()
        callback = LogCallback(folder / "out", tracking_uri=uri, run_id=run_id)
        trainer = Trainer(model=model, args=args, train_dataset=rows, data_collator=_batches, callbacks=[callback])
        LogCallback.replace_printer(trainer)
        stdout = io.StringIO()
        with redirect_stdout(stdout), pytest.MonkeyPatch.context() as patch:
            patch.setenv(PEAK_ENV, "0.5")
            trainer.train()
    total = sum(p.numel() for p in model.parameters())
    return {"folder": folder, "uri": uri, "run_id": run_id, "stdout": stdout.getvalue(), "total_params": total}


@pytest.mark.slow
def test_trainer_log_has_llamafactory_keys_then_throughput(trained):
    lines = (trained["folder"] / "out" / "trainer_log.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert [r["current_steps"] for r in records] == [1, 2]
    for record in records:
        assert list(record)[: len(LLAMAFACTORY_ORDER)] == LLAMAFACTORY_ORDER
        assert record["total_steps"] == 2 and record["elapsed_time"].count(":") == 2
        assert record["grad_norm"] > 0 and record["lr"] > 0
        assert record["padding_ratio"] == 0.25  # 24 of 32 positions are tokens in every batch
        assert record["tokens_per_second"] == pytest.approx(0.75 * record["all_tokens_per_second"], abs=0.1)
        # full training of every parameter: 6 N FLOPs per token, against the 0.5 TFLOP/s override
        expected = 6 * trained["total_params"] * record["all_tokens_per_second"] / 0.5e12
        assert record["mfu"] == pytest.approx(expected, rel=0.01)  # the logged rate is rounded


@pytest.mark.slow
def test_console_gets_one_compact_line_per_logging_step_instead_of_the_raw_dict(trained):
    out = trained["stdout"]
    assert "MFU is estimated against 0.5 TFLOP/s per device (TUNELINE_PEAK_TFLOPS=0.5)" in out
    steps = [line for line in out.splitlines() if line.startswith("[step ")]
    assert [line.split("]")[0] for line in steps] == ["[step 1/2 50.0%", "[step 2/2 100.0%"]
    assert all(" loss " in line and "tok/s" in line and "pad 25.0%" in line and "MFU" in line for line in steps)
    assert "{'loss'" not in out  # the trainer's own printer is gone


@pytest.mark.slow
def test_throughput_is_mirrored_to_mlflow(trained):
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=trained["uri"])
    for name in ("loss", "grad_norm", "learning_rate", "tokens_per_second", "all_tokens_per_second", "mfu"):
        assert [m.step for m in client.get_metric_history(trained["run_id"], name)] == [1, 2], name
    assert [m.value for m in client.get_metric_history(trained["run_id"], "padding_ratio")] == [0.25, 0.25]


@pytest.mark.slow
def test_loss_curve_is_drawn_from_the_log(trained):
    from tuneline.core.training.callbacks import plot_loss

    path = plot_loss(trained["folder"] / "out")
    assert path is not None and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert plot_loss(Path(trained["folder"]) / "nowhere") is None


# --- training-loop keys ------------------------------------------------------------------


def test_effective_tokens_per_second_counts_every_rows_tokens_per_epoch_and_process():
    from datasets import Dataset

    from tuneline.core.training.throughput import effective_tokens_per_second

    rows = Dataset.from_dict({"input_ids": [[1, 2, 3], [4, 5, 6, 7, 8]], "labels": [[1, 2, 3], [4, 5, 6, 7, 8]]})
    assert effective_tokens_per_second(rows, {"epoch": 1.5, "train_runtime": 2.0}, world_size=1) == 8 * 1.5 / 2.0
    pairs = Dataset.from_dict({"chosen_input_ids": [[1, 2, 3]], "rejected_input_ids": [[1, 2]], "chosen_labels": [[1, 2, 3]]})
    assert effective_tokens_per_second(pairs, {"epoch": 2.0, "train_runtime": 4.0}, world_size=2) == 5 * 2.0 / 4.0 / 2


@pytest.mark.slow
@pytest.mark.parametrize("patience", [1, 3])
def test_early_stopping_stops_after_patience_evaluations_without_improvement(patience: int, tmp_path: Path):
    """With a learning rate of 0 the evaluation loss never improves on the first evaluation's, so training
    stops at evaluation 1 + patience instead of running its 20 steps."""
    from datasets import Dataset
    from transformers import Trainer

    from tuneline.core.config import FinetuningConfig
    from tuneline.core.training.arguments import training_arguments
    from tuneline.core.training.callbacks import loop_callbacks

    assert loop_callbacks(FinetuningConfig()) == []
    rows = Dataset.from_list([{"input_ids": list(range(1, 9))}, {"input_ids": [1, 2, 3, 4]}] * 4)
    args = training_arguments(str(tmp_path), {"per_device_train_batch_size": 2, "max_steps": 20, "learning_rate": 0.0,
                                              "eval_strategy": "steps", "eval_steps": 1, "metric_for_best_model": "eval_loss",
                                              "report_to": "none"})
    trainer = Trainer(model=tiny_llama(), args=args, train_dataset=rows, eval_dataset=rows.select(range(2)),
                      data_collator=_batches, callbacks=loop_callbacks(FinetuningConfig(early_stopping_steps=patience)))
    trainer.train()
    assert trainer.state.global_step == 1 + patience
