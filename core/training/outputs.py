"""What every training stage writes as it runs and when it ends, through one path.

Trainer stages (through `LogCallback`) and stages with their own loop (ppo) write the same
files the same way: one `trainer_log.jsonl` line per logging step in LLaMA-Factory's format,
the console line, the MLflow metrics of the step, and `*_results.json` at the end.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tuneline.core.tracking import runs as tracking
from tuneline.core.training.job import LOG_FILE

ALL_RESULTS = "all_results.json"


class TrainingLog:
    """The step log of one run: `trainer_log.jsonl`, the console and the MLflow run (rank 0 only)."""

    def __init__(self, output_dir: str | Path, *, tracking_uri: str | None, run_id: str | None) -> None:
        self.path = Path(output_dir) / LOG_FILE
        self.tracking_uri, self.run_id = tracking_uri, run_id

    def write(self, record: Mapping[str, Any] | None, *, metrics: Mapping[str, float], step: int, echo: bool = True) -> None:
        """Append `record` (a trainer_log.jsonl line; None: nothing to append) and log `metrics` at `step`."""
        if record is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a", encoding="utf-8") as handle:
                handle.write(json.dumps(record) + "\n")
            if echo:
                print(progress_line(record), flush=True)
        if self.tracking_uri and self.run_id and metrics:
            tracking.log_metrics(self.tracking_uri, self.run_id, dict(metrics), step=step)


def progress_line(record: dict[str, Any]) -> str:
    """One compact console line for a trainer_log.jsonl record."""
    parts = []
    for key, fmt in (("loss", ".4f"), ("eval_loss", ".4f"), ("reward", ".4f"), ("kl", ".4f"), ("lr", ".2e"),
                     ("grad_norm", ".3g"), ("epoch", ".2f")):
        if key in record:
            parts.append(f"{key} {record[key]:{fmt}}")
    if "response_length" in record:
        parts.append(f"reply {record['response_length']:.1f} tokens")
    if "tokens_per_second" in record:
        parts.append(f"tok/s {record['tokens_per_second']:,.0f} (all {record['all_tokens_per_second']:,.0f}, "
                     f"pad {100 * record['padding_ratio']:.1f}%)")
    if "mfu" in record:
        parts.append(f"MFU {100 * record['mfu']:.3g}%")
    parts.append(f"{record['elapsed_time']} < {record['remaining_time']}")
    return f"[step {record['current_steps']}/{record['total_steps']} {record['percentage']:.1f}%] " + " | ".join(parts)


def split_results(metrics: Mapping[str, float]) -> dict[str, dict[str, float]]:
    """A run's final metrics by the split they describe: `eval_*` numbers are "eval", the rest "train"."""
    splits = {"train": {k: v for k, v in metrics.items() if not k.startswith("eval_")},
              "eval": {k: v for k, v in metrics.items() if k.startswith("eval_")}}
    return {split: values for split, values in splits.items() if values}


def save_results(output_dir: str | Path, split: str, metrics: Mapping[str, float]) -> None:
    """`{split}_results.json`, and the same numbers merged into `all_results.json`, as transformers'
    `Trainer.save_metrics` writes them (so LLaMA-Factory's readers find them), each file atomically."""
    folder = Path(output_dir)
    _write_json(folder / f"{split}_results.json", dict(metrics))
    merged = json.loads((folder / ALL_RESULTS).read_text(encoding="utf-8")) if (folder / ALL_RESULTS).is_file() else {}
    _write_json(folder / ALL_RESULTS, {**merged, **metrics})


def _write_json(path: Path, values: Mapping[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(values, indent=4, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, path)
