"""The training worker process: `python -m tuneline.core.worker JOB.json` (see `__main__`)."""
