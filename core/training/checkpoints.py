"""Checkpoints: which are complete, where a rerun resumes, and what it tidies before training.

transformers' `get_last_checkpoint` picks the highest-numbered `checkpoint-N` folder by its name
alone, even one that a kill cut short. Here a checkpoint is complete when its trainer state names
its step and its weights are there, and either its completion record (written by rank 0 after every
process finished saving, see `checkpoint_record.py`) lists files that are all still there, or, for a
checkpoint written without one (plain transformers, LLaMA-Factory), every saved archive is whole.
"""

from __future__ import annotations

import json
import os
import shutil
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tuneline.core.errors import ConfigError

CHECKPOINT_PREFIX = "checkpoint-"
RECORD_FILE = "tuneline_checkpoint.json"
TRAINER_STATE = "trainer_state.json"
WEIGHT_FILES = ("model.safetensors", "adapter_model.safetensors", "pytorch_model.bin", "adapter_model.bin")
WEIGHT_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
SHARDED_STATES = ("pytorch_model_fsdp*", "global_step*")  # FSDP and DeepSpeed keep weights sharded
ARCHIVE_SUFFIXES = (".pt", ".pth", ".bin")  # written by torch.save as zip archives


def checkpoint_step(path: Path) -> int | None:
    """N of a `checkpoint-N` folder, None for anything else."""
    digits = path.name.removeprefix(CHECKPOINT_PREFIX)
    return int(digits) if path.name.startswith(CHECKPOINT_PREFIX) and digits.isdigit() and path.is_dir() else None


def checkpoints(output_dir: str | Path) -> list[Path]:
    """The `checkpoint-N` folders of `output_dir`, newest (highest N) first."""
    root = Path(output_dir)
    found = [p for p in root.iterdir() if checkpoint_step(p) is not None] if root.is_dir() else []
    return sorted(found, key=checkpoint_step, reverse=True)


def rotate_checkpoints(output_dir: str | Path, *, limit: int | None, keep: str | Path | None = None) -> list[Path]:
    """Remove all but the newest `limit` checkpoints (`save_total_limit`; None or 0 keeps all), never
    `keep` (the best checkpoint when the run tracks one); the folders removed."""
    if not limit:
        return []
    protected = Path(keep).resolve() if keep else None
    stale = [p for p in checkpoints(output_dir)[limit:] if p.resolve() != protected]
    for folder in stale:
        shutil.rmtree(folder)
    return stale


def incomplete_reason(path: Path) -> str | None:
    """Why the checkpoint at `path` cannot be resumed from, or None when it is complete."""
    state = _read_json(path / TRAINER_STATE)
    if state is None:
        return f"{TRAINER_STATE} is missing or cut short"
    if state.get("global_step") != checkpoint_step(path):
        return f"{TRAINER_STATE} is for step {state.get('global_step')}, not {checkpoint_step(path)}"
    if not _has_weights(path):
        return "it holds no model weights"
    record = _read_json(path / RECORD_FILE)
    if record is not None:
        changed = [name for name, size in record.get("files", {}).items()
                   if not (path / name).is_file() or (path / name).stat().st_size != size]
        return f"{', '.join(changed[:3])} missing or changed since it was saved" if changed else None
    broken = [f.name for f in path.rglob("*") if f.suffix in ARCHIVE_SUFFIXES and f.is_file() and not zipfile.is_zipfile(f)]
    return f"{', '.join(broken[:3])} cut short" if broken else None


def _has_weights(path: Path) -> bool:
    if any((path / name).is_file() and (path / name).stat().st_size > 0 for name in WEIGHT_FILES):
        return True
    for index in WEIGHT_INDEXES:
        shards = (_read_json(path / index) or {}).get("weight_map", {}).values()
        if shards and all((path / shard).is_file() for shard in set(shards)):
            return True
    return any(next(path.glob(pattern), None) is not None for pattern in SHARDED_STATES)


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        loaded = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return loaded if isinstance(loaded, dict) else None


def newest_complete(output_dir: str | Path, *, log: Callable[[str], None] = print) -> Path | None:
    """The newest complete checkpoint in `output_dir`; each newer incomplete one is reported."""
    for path in checkpoints(output_dir):
        reason = incomplete_reason(path)
        if reason is None:
            return path
        log(f"skipping {path.name}: {reason}")
    return None


def resume_point(output_dir: str | Path, *, requested: str | None, fresh: bool, tidy: bool, log_file: str) -> str | None:
    """The checkpoint a run in `output_dir` resumes from (None: from step 0).

    `requested` is the `resume_from_checkpoint` key, which must name a complete checkpoint; `fresh`
    (`overwrite_output_dir`) starts over. With `tidy` (rank 0 only) the files that would confuse the
    rerun go first: the checkpoints of `output_dir` after the resumed step (incomplete ones, or ones
    of another course of training) and the lines of `log_file` for steps after it, so that file
    names each step once.
    """
    report = print if tidy else (lambda _: None)
    if fresh:
        chosen = None
    elif requested:
        chosen = Path(requested)
        reason = incomplete_reason(chosen) if chosen.is_dir() else "it is not a folder"
        if reason is not None:
            raise ConfigError(f"'resume_from_checkpoint: {requested}' cannot be resumed from: {reason}; name a complete "
                              "checkpoint-N folder or remove the key to resume from the newest complete one.")
    else:
        chosen = newest_complete(output_dir, log=report)
    step = checkpoint_step(chosen) if chosen is not None else 0
    if tidy:
        drop_newer(Path(output_dir), than=step)
        trim_log(Path(output_dir) / log_file, last_step=step)
    report(f"resuming from {chosen} (step {step})" if chosen is not None else "training from step 0")
    return str(chosen) if chosen is not None else None


def drop_newer(output_dir: Path, *, than: int) -> None:
    """Remove the checkpoints after step `than` (incomplete ones, or all of them when starting over)."""
    for path in checkpoints(output_dir):
        if checkpoint_step(path) > than:
            shutil.rmtree(path)


def trim_log(log_path: Path, *, last_step: int) -> None:
    """Keep the records of `trainer_log.jsonl` up to `last_step`; a line cut short goes too."""
    if not log_path.is_file():
        return
    kept = []
    for line in log_path.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("current_steps", 0) <= last_step:
            kept.append(line)
    tmp = log_path.with_name(f".{log_path.name}.tmp")
    tmp.write_text("".join(f"{line}\n" for line in kept), encoding="utf-8")
    os.replace(tmp, log_path)
