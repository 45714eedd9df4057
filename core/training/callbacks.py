"""Trainer callbacks: `trainer_log.jsonl` in LLaMA-Factory's format, console progress, MLflow, a loss curve.

Each logging step becomes one JSON line with LLaMA-Factory's keys (`current_steps`, `total_steps`,
`loss`, `eval_loss`, `predict_loss`, `reward`, `accuracy`, `lr`, `epoch`, `percentage`,
`elapsed_time`, `remaining_time`; absent values are left out, as LLaMA-Factory does) and
tuneline's own: `grad_norm`; `tokens_per_second` (non-padding tokens) and `all_tokens_per_second`
(padding included) per second spent inside the training steps (forward, backward and optimizer,
from `on_step_begin` to `on_step_end`; loading batches, logging, evaluating and saving are left out)
since the previous logging step; `padding_ratio` of those steps; and `mfu`, the model FLOPs
utilisation estimate of `tuneline.core.training.throughput`. `elapsed_time` and `remaining_time` are wall
clock, as in LLaMA-Factory.

The same numbers go to the stage's MLflow run. On the console, when the trainer's tqdm bar is off
(`disable_tqdm`, the default when stdout is not a terminal, as in the training worker whose output
is streamed into logs), each logging step prints one compact line instead of the raw dict.
"""

from __future__ import annotations

import json
import time
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from transformers import TrainerCallback

from tuneline.core.config import FinetuningConfig
from tuneline.core.training.job import LOG_FILE, LOSS_PLOT
from tuneline.core.training.outputs import TrainingLog
from tuneline.core.training.throughput import Peak, TokenCounter, device_peak, flops_per_token, mfu

if TYPE_CHECKING:
    from transformers import (
        PreTrainedModel,
        PreTrainedTokenizerBase,
        Trainer,
        TrainerControl,
        TrainerState,
        TrainingArguments,
    )

# LLaMA-Factory's trainer_log.jsonl keys, in its order, and the trainer log each one comes from.
LLAMAFACTORY_KEYS = {
    "loss": "loss",
    "eval_loss": "eval_loss",
    "predict_loss": "predict_loss",
    "reward": "reward",
    "accuracy": "rewards/accuracies",
    "lr": "learning_rate",
    "epoch": "epoch",
}
THROUGHPUT_KEYS = ("tokens_per_second", "all_tokens_per_second", "padding_ratio", "mfu")


class LogCallback(TrainerCallback):
    """Writes one JSON line per logging step, prints it compactly, and mirrors it to an MLflow run."""

    def __init__(self, output_dir: str | Path, *, tracking_uri: str | None, run_id: str | None,
                 log_keys: tuple[str, ...] = ()) -> None:
        """`log_keys`: the trainer's own log keys (or prefixes ending in '/') that trainer_log.jsonl
        holds beside LLaMA-Factory's (the stage kind's `log_keys`)."""
        self.log = TrainingLog(output_dir, tracking_uri=tracking_uri, run_id=run_id)
        self.log_keys = frozenset(k for k in log_keys if not k.endswith("/"))
        self.log_prefixes = tuple(k for k in log_keys if k.endswith("/"))
        self.counter = TokenCounter(pad_token_id=None)
        self.start = time.monotonic()
        self.start_step = 0
        self.step_started = self.start
        self.busy = 0.0  # seconds spent inside training steps
        self.last = (0.0, 0, 0)  # busy seconds, all tokens, non-padding tokens at the previous log
        self.flops_per_token = 0.0
        self.peak: Peak | None = None

    @staticmethod
    def replace_printer(trainer: Trainer) -> None:
        """Drop the trainer's raw-dict printer (installed when tqdm is off): this callback prints instead."""
        from transformers import PrinterCallback

        trainer.remove_callback(PrinterCallback)

    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                       model: PreTrainedModel | None = None, processing_class: PreTrainedTokenizerBase | None = None,
                       **kwargs) -> None:
        from tuneline.core.models.loading import count_parameters

        self.start, self.start_step = time.monotonic(), state.global_step
        self.busy, self.last = 0.0, (0.0, 0, 0)
        self.counter = TokenCounter(pad_token_id=processing_class.pad_token_id if processing_class is not None else None)
        self.counter.attach(model)
        trainable, total = count_parameters(model)
        self.flops_per_token = flops_per_token(total_params=total, trainable_params=trainable)
        self.peak = device_peak(args.device)
        if state.is_world_process_zero:
            print(_peak_line(self.peak, processes=args.world_size), flush=True)

    def on_step_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs) -> None:
        self.step_started = time.monotonic()

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs) -> None:
        self.busy += time.monotonic() - self.step_started

    def on_train_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs) -> None:
        self.counter.detach()

    def on_log(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
               logs: dict[str, Any] | None = None, **kwargs) -> None:
        if not state.is_world_process_zero or not logs:
            return
        record = self._record(args, state, logs)
        numbers = {k: v for k, v in logs.items() if isinstance(v, (int, float))}
        numbers.update({k: record[k] for k in THROUGHPUT_KEYS if k in record})
        is_step = "loss" in record or "eval_loss" in record  # the end-of-training summary is not a step
        self.log.write(record if is_step else None, metrics=numbers, step=state.global_step, echo=args.disable_tqdm)

    def _record(self, args: TrainingArguments, state: TrainerState, logs: dict[str, Any]) -> dict[str, Any]:
        """The trainer_log.jsonl line for `logs`: LLaMA-Factory's keys first, then tuneline's."""
        now = time.monotonic()
        elapsed = now - self.start
        steps_done = state.global_step - self.start_step
        remaining = elapsed / steps_done * (state.max_steps - state.global_step) if steps_done > 0 else 0.0
        record: dict[str, Any] = {"current_steps": state.global_step, "total_steps": state.max_steps}
        record.update({key: logs.get(source) for key, source in LLAMAFACTORY_KEYS.items()})
        record.update({
            "percentage": round(100 * state.global_step / state.max_steps, 2) if state.max_steps else 100,
            "elapsed_time": str(timedelta(seconds=int(elapsed))),
            "remaining_time": str(timedelta(seconds=int(remaining))),
            "grad_norm": logs.get("grad_norm"),
        })
        record.update({key: value for key, value in logs.items() if key in self.log_keys or key.startswith(self.log_prefixes)})
        if "loss" in logs:
            record.update(self._throughput(processes=args.world_size))
        return {k: v for k, v in record.items() if v is not None}

    def _throughput(self, *, processes: int) -> dict[str, float]:
        """Token rates, padding share and MFU of the steps since the previous logging step (all processes)."""
        all_tokens, non_padding = self.counter.all_tokens * processes, self.counter.non_padding_tokens * processes
        last_busy, last_all, last_non_padding = self.last
        self.last = (self.busy, all_tokens, non_padding)
        seconds = max(self.busy - last_busy, 1e-9)
        step_all, step_non_padding = all_tokens - last_all, non_padding - last_non_padding
        numbers = {
            "tokens_per_second": round(step_non_padding / seconds, 1),
            "all_tokens_per_second": round(step_all / seconds, 1),
            "padding_ratio": round(1 - step_non_padding / step_all, 4) if step_all else 0.0,
        }
        if self.peak is not None:
            share = mfu(tokens_per_second=step_all / seconds, flops_per_token_=self.flops_per_token,
                        peak_flops=self.peak.flops * processes)
            numbers["mfu"] = float(f"{share:.4g}")
        return numbers


def _peak_line(peak: Peak | None, *, processes: int) -> str:
    if peak is None:
        return "MFU: peak FLOP/s of this device unknown; set TUNELINE_PEAK_TFLOPS (per device) to report it."
    scale = f" x {processes} processes" if processes > 1 else ""
    return f"MFU is estimated against {peak.flops / 1e12:.3g} TFLOP/s per device{scale} ({peak.source})."


def plot_loss(output_dir: str | Path, keys: tuple[str, ...] = ()) -> Path | None:
    """Draw training (and evaluation) loss from `trainer_log.jsonl`, and a curve of each of `keys` (the
    kind's `plotted_keys`) that was logged, from the log, else from trainer_state.json's log history, to
    `training_<key>.png` (`/` written as `_`); None when no loss was logged."""
    folder = Path(output_dir)
    log_path = folder / LOG_FILE
    if not log_path.is_file():
        return None
    records = [json.loads(line) for line in log_path.read_text(encoding="utf-8").splitlines() if line]
    points = [(r["current_steps"], r["loss"]) for r in records if "loss" in r]
    if not points:
        return None
    from matplotlib.figure import Figure  # drawn without pyplot, whose import and backend choice cost more

    figure = Figure(figsize=(6, 4))
    axes = figure.subplots()
    axes.plot(*zip(*points), label="train loss")
    evaluated = [(r["current_steps"], r["eval_loss"]) for r in records if "eval_loss" in r]
    if evaluated:
        axes.plot(*zip(*evaluated), "o--", label="eval loss")
    axes.set_xlabel("step")
    axes.set_ylabel("loss")
    axes.legend()
    path = folder / LOSS_PLOT
    figure.savefig(path, dpi=100, bbox_inches="tight")
    state_path = folder / "trainer_state.json"
    history = json.loads(state_path.read_text(encoding="utf-8")).get("log_history", []) if state_path.is_file() else []
    for key in keys:
        logged = [(r["current_steps"], r[key]) for r in records if key in r] or \
            [(r["step"], r[key]) for r in history if key in r and "step" in r]
        if logged:
            _plot_curve(logged, key, folder / f"training_{key.replace('/', '_')}.png")
    return path


def _plot_curve(points: list[tuple[int, float]], key: str, path: Path) -> None:
    from matplotlib.figure import Figure

    figure = Figure(figsize=(6, 4))
    axes = figure.subplots()
    axes.plot(*zip(*points), "o-" if len(points) < 3 else "-", label=key)
    axes.set_xlabel("step")
    axes.set_ylabel(key)
    axes.legend()
    figure.savefig(path, dpi=100, bbox_inches="tight")


def loop_callbacks(finetuning: FinetuningConfig) -> list[TrainerCallback]:
    """The callbacks the method's training-loop keys ask for: `early_stopping_steps` stops training when
    `metric_for_best_model` has not improved for that many evaluations (transformers' EarlyStoppingCallback);
    `pissa_convert` saves the PiSSA adapter converted to a plain LoRA adapter at the end."""
    from transformers import EarlyStoppingCallback

    from tuneline.core.training.pissa_conversion import PissaConversion

    callbacks: list[TrainerCallback] = []
    if finetuning.early_stopping_steps is not None:
        callbacks.append(EarlyStoppingCallback(early_stopping_patience=finetuning.early_stopping_steps))
    if finetuning.pissa_convert:
        callbacks.append(PissaConversion())
    return callbacks
