"""The sample of completions an online RL stage keeps per logged step (`completions.jsonl`) and its
MLflow table: what the policy wrote, how each reward scored it, and its advantage.

A resumed run writes the steps after its checkpoint again; the table keeps the last block of each step.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from tuneline.core.tracking import runs as tracking

COMPLETIONS_FILE = "completions.jsonl"
COMPLETIONS_TABLE = "completions.json"  # the MLflow artifact
_BLOCK = "_block"  # marks the rows written together, so that a rewrite of a step is told from the first write


def append_completions(output_dir: str | Path, rows: Iterable[Mapping[str, Any]]) -> None:
    """Add one logged step's rows (each with its `step`) to the output folder's sample."""
    block = uuid.uuid4().hex
    with (Path(output_dir) / COMPLETIONS_FILE).open("a", encoding="utf-8") as out:
        out.writelines(json.dumps({**row, _BLOCK: block}, ensure_ascii=False) + "\n" for row in rows)


def completions_table(output_dir: str | Path) -> dict[str, list[Any]] | None:
    """The sample as columns, steps in order, or None when the stage wrote none."""
    path = Path(output_dir) / COMPLETIONS_FILE
    if not path.is_file():
        return None
    by_step: dict[int, list[dict[str, Any]]] = {}
    last_block = None
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        row = json.loads(line)
        block = row.pop(_BLOCK, None)
        if block != last_block:
            by_step[row["step"]] = []  # a later block of the same step replaces the earlier one
            last_block = block
        by_step[row["step"]].append(row)
    rows = [row for step in sorted(by_step) for row in by_step[step]]
    columns = list(dict.fromkeys(key for row in rows for key in row))
    return {column: [row.get(column) for row in rows] for column in columns}


def log_completions_table(output_dir: str | Path, *, tracking_uri: str | None, run_id: str | None) -> bool:
    """Log the sample as the run's MLflow table `completions.json`; False when there is nothing to log."""
    table = completions_table(output_dir)
    if not table or not tracking_uri or not run_id:
        return False
    tracking.log_table(tracking_uri, run_id, table, COMPLETIONS_TABLE)
    return True
