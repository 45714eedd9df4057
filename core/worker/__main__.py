"""The training worker: `python -m tuneline.core.worker JOB.json`, or `... --wait-for-job STAGE`.

Started by `launch.py` as a child process (or several, through torchrun; on Ray, `ray_launch.py` runs
`train_job_file` in each Ray Train worker), so training never shares
a process with the orchestrator. Rank 0 prints the metrics as one JSON line at the end; a problem
the user can fix is printed as one JSON line too, so the launcher can report it whatever exit
status the process launcher (torchrun) turns it into.

With `--wait-for-job STAGE [--without-bitsandbytes]` the worker is started ahead of its job
(`launch.worker_started_ahead`): it imports what stage STAGE trains with, then reads the job's path
from its standard input, and ends quietly if that closes first.
"""

from __future__ import annotations

import json
import os
import sys

from tuneline.core.errors import TunelineError
from tuneline.core.worker.protocol import ERROR_PREFIX, RESULT_PREFIX, WAIT_FOR_JOB, WITHOUT_BITSANDBYTES

USAGE = f"usage: python -m tuneline.core.worker JOB.json | {WAIT_FOR_JOB} STAGE [{WITHOUT_BITSANDBYTES}]"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == [WAIT_FOR_JOB] and len(argv) in (2, 3) and argv[2:] in ([], [WITHOUT_BITSANDBYTES]):
        job_path = _wait_for_job(argv[1], without_bitsandbytes=len(argv) == 3)
        return 0 if job_path is None else train(job_path)
    if len(argv) != 1:
        print(USAGE, file=sys.stderr)
        return 2
    return train(argv[0])


def _wait_for_job(stage: str, *, without_bitsandbytes: bool) -> str | None:
    from tuneline.core.stages.registry import stage_kind
    from tuneline.core.worker.preload import keep_out_bitsandbytes, preload

    if without_bitsandbytes:
        keep_out_bitsandbytes()
    preload(stage_kind(stage).trainer_modules)
    return sys.stdin.readline().strip() or None


def train(job_path: str) -> int:
    try:
        metrics = train_job_file(job_path)
    except TunelineError as e:
        print(ERROR_PREFIX + json.dumps(str(e)), flush=True)
        return e.exit_code
    if int(os.environ.get("RANK", "0")) == 0:
        print(RESULT_PREFIX + json.dumps(metrics), flush=True)
    return 0


def train_job_file(job_path: str) -> dict[str, float]:
    """Train the job at `job_path` in this process, one of WORLD_SIZE (torchrun's or Ray Train's); its metrics."""
    from tuneline.core.training.distributed import check_world_size
    from tuneline.core.training.job import TrainJob
    from tuneline.core.worker.preload import job_needs_bitsandbytes, keep_out_bitsandbytes

    job = TrainJob.read(job_path)
    if not job_needs_bitsandbytes(job):
        keep_out_bitsandbytes()
    check_world_size(job.world_size, seen=int(os.environ.get("WORLD_SIZE", "1")))  # before any model loads
    from tuneline.core.worker.run import run_training

    return run_training(job)


if __name__ == "__main__":
    sys.exit(main())
