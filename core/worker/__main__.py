"""The training worker: `python -m tuneline.core.worker JOB.json`.

Started by `launch.py` as a child process (or several, through torchrun), so training never shares
a process with the orchestrator. Rank 0 prints the metrics as one JSON line at the end; a problem
the user can fix is printed as one JSON line too, so the launcher can report it whatever exit
status the process launcher (torchrun) turns it into.
"""

from __future__ import annotations

import json
import os
import sys

from tuneline.core.errors import TunelineError
from tuneline.core.worker.protocol import ERROR_PREFIX, RESULT_PREFIX



def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m tuneline.core.worker JOB.json", file=sys.stderr)
        return 2
    from tuneline.core.training.distributed import check_world_size
    from tuneline.core.training.job import TrainJob
    from tuneline.core.worker.run import run_training

    try:
        job = TrainJob.read(argv[0])
        check_world_size(job.world_size, seen=int(os.environ.get("WORLD_SIZE", "1")))  # before any model loads
        metrics = run_training(job)
    except TunelineError as e:
        print(ERROR_PREFIX + json.dumps(str(e)), flush=True)
        return e.exit_code
    if int(os.environ.get("RANK", "0")) == 0:
        print(RESULT_PREFIX + json.dumps(metrics), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
