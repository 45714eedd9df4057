"""The completion record of a checkpoint, written once every process has finished saving it.

The trainer saves a checkpoint from every process (rank 0 the weights and trainer state, each rank
its RNG state, each shard-holder its shards) without a last step that says "done". This callback
adds one: after a barrier, rank 0 lists the checkpoint's files and sizes in `RECORD_FILE`, written
atomically, so a checkpoint cut short by a kill never counts as complete (see `checkpoints.py`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from transformers import TrainerCallback

from tuneline.core.training.checkpoints import CHECKPOINT_PREFIX, RECORD_FILE, rotate_checkpoints


class CheckpointRecord(TrainerCallback):
    """Writes `checkpoint-N/tuneline_checkpoint.json` after all processes saved checkpoint N, then
    keeps the newest `limit` checkpoints (`save_total_limit`, which tuneline applies itself for
    every stage kind, so that only complete checkpoints count; see `rotate_checkpoints`)."""

    def __init__(self, *, limit: int | None = None) -> None:
        self.limit = limit

    def on_save(self, args, state, control, **kwargs):
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized() and args.world_size > 1:
            dist.barrier()
        if state.is_world_process_zero:
            write_record(Path(args.output_dir) / f"{CHECKPOINT_PREFIX}{state.global_step}",
                         step=state.global_step, world_size=args.world_size)
            rotate_checkpoints(args.output_dir, limit=self.limit, keep=state.best_model_checkpoint)


def write_record(folder: Path, *, step: int, world_size: int) -> Path:
    """List every file of `folder` with its size; the record is the checkpoint's last file."""
    files = {f.relative_to(folder).as_posix(): f.stat().st_size for f in sorted(folder.rglob("*"))
             if f.is_file() and f.name not in (RECORD_FILE, f".{RECORD_FILE}.tmp")}
    tmp = folder / f".{RECORD_FILE}.tmp"
    tmp.write_text(json.dumps({"global_step": step, "world_size": world_size, "files": files}, indent=1), encoding="utf-8")
    os.replace(tmp, folder / RECORD_FILE)
    return folder / RECORD_FILE
