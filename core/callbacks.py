"""Trainer callbacks: `trainer_log.jsonl` in LLaMA-Factory's format, MLflow metrics, a loss curve."""

from __future__ import annotations

import json
import time
from pathlib import Path

from transformers import TrainerCallback

from tuneline.core import tracking
from tuneline.core.train import LOG_FILE, LOSS_PLOT


class LogCallback(TrainerCallback):
    """Writes one JSON line per logging step and mirrors the numbers to an MLflow run."""

    def __init__(self, output_dir: str | Path, *, tracking_uri: str | None, run_id: str | None) -> None:
        self.log_path = Path(output_dir) / LOG_FILE
        self.tracking_uri = tracking_uri
        self.run_id = run_id
        self.start = time.monotonic()
        self.last = (self.start, 0)

    def on_train_begin(self, args, state, control, **kwargs):
        self.start = time.monotonic()
        self.last = (self.start, state.num_input_tokens_seen)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs:
            return
        now = time.monotonic()
        last_time, last_tokens = self.last
        tokens_per_second = (state.num_input_tokens_seen - last_tokens) / max(now - last_time, 1e-9)
        self.last = (now, state.num_input_tokens_seen)
        record = {
            "current_steps": state.global_step,
            "total_steps": state.max_steps,
            "loss": logs.get("loss"),
            "eval_loss": logs.get("eval_loss"),
            "lr": logs.get("learning_rate"),
            "grad_norm": logs.get("grad_norm"),
            "epoch": logs.get("epoch"),
            "percentage": round(100 * state.global_step / max(state.max_steps, 1), 2),
            "elapsed_time": _clock(now - self.start),
            "tokens_per_second": round(tokens_per_second, 1),
        }
        record = {k: v for k, v in record.items() if v is not None}
        if "loss" in record or "eval_loss" in record:  # the end-of-training summary is not a step
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            with self.log_path.open("a", encoding="utf-8") as handle:
                handle.write(json.dumps(record) + "\n")
        if self.tracking_uri and self.run_id:
            numbers = {k: v for k, v in logs.items() if isinstance(v, (int, float))}
            if "loss" in logs:
                numbers["tokens_per_second"] = tokens_per_second
            tracking.log_metrics(self.tracking_uri, self.run_id, numbers, step=state.global_step)


def plot_loss(output_dir: str | Path) -> Path | None:
    """Draw the training loss from `trainer_log.jsonl`; None when nothing was logged."""
    log_path = Path(output_dir) / LOG_FILE
    if not log_path.is_file():
        return None
    records = [json.loads(line) for line in log_path.read_text(encoding="utf-8").splitlines() if line]
    points = [(r["current_steps"], r["loss"]) for r in records if "loss" in r]
    if not points:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(6, 4))
    axes.plot(*zip(*points), label="train loss")
    axes.set_xlabel("step")
    axes.set_ylabel("loss")
    axes.legend()
    path = Path(output_dir) / LOSS_PLOT
    figure.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(figure)
    return path


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}"
