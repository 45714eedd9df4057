"""Start the training worker in a child process and stream its output (DESIGN.md §4)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from tuneline.core.errors import TunelineError
from tuneline.core.train import TrainJob
from tuneline.core.worker import RESULT_PREFIX

JOB_FILE = "job.json"


class WorkerFailed(RuntimeError):
    """The worker process ended with an error that is not a configuration problem."""


def launch_training(job: TrainJob, *, log: Callable[[str], None] = print) -> dict[str, float]:
    """Run `job` in a worker process, passing each output line to `log`; return its metrics."""
    output_dir = Path(job.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    job_path = job.write(output_dir / JOB_FILE)
    command = [sys.executable, "-m", "tuneline.core.worker", str(job_path)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"}
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    metrics: dict[str, float] = {}
    tail: list[str] = []
    assert process.stdout is not None
    for line in process.stdout:
        line = line.rstrip("\n")
        if line.startswith(RESULT_PREFIX):
            metrics = json.loads(line[len(RESULT_PREFIX) :])
            continue
        tail = (tail + [line])[-20:]
        log(line)
    code = process.wait()
    if code == 2:
        errors = [line.removeprefix("error: ") for line in tail if line.startswith("error: ")]
        raise TunelineError(errors[-1] if errors else "\n".join(tail))
    if code != 0:
        raise WorkerFailed(f"training worker exited with status {code}; last output:\n" + "\n".join(tail))
    return metrics
