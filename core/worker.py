"""The training worker: `python -m tuneline.core.worker JOB.json`.

Started by `launch.py` as a child process (or several, through torchrun/accelerate), so training
never shares a process with the orchestrator. Metrics are printed as one JSON line at the end.
"""

from __future__ import annotations

import json
import sys

from tuneline.core.errors import TunelineError
from tuneline.core.train import TrainJob, run_training

RESULT_PREFIX = "TUNELINE_RESULT "


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m tuneline.core.worker JOB.json", file=sys.stderr)
        return 2
    try:
        metrics = run_training(TrainJob.read(argv[0]))
    except TunelineError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    print(RESULT_PREFIX + json.dumps(metrics), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
