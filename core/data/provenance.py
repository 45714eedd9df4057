"""Where a refused row came from: its dataset, file and row number, found again from its position.

Rows travel from their files to the encoder as plain dicts with nothing added: a record of each row's
origin would be one more object per row on tokenization's hot path, and it is read only when a check
refuses a row. Every step between is deterministic (loading, `mix_strategy` with its seed, the
streaming shuffle buffer, the seeded validation draw), so a row's split and its position in the order
that split's rows reach the encoder identify it. A check that refuses a row raises `RowRefused` with
that position; `row_streams.origin_at` runs the same steps again over each row's `RowOrigin` instead
of the row and names the origin at that position. A check added anywhere on the way is named the same,
without knowing where its row came from.
"""

from __future__ import annotations

from dataclasses import dataclass

from tuneline.core.errors import DataError


@dataclass(frozen=True)
class RowOrigin:
    """Where one row of a stage's stream was read."""

    entry: str
    """Its dataset as messages name it: `dataset 'x' in /data/dataset_info.json`."""
    where: str
    """Its row in its file: `row 3 (line 3) of /data/x.jsonl`, counted from 1."""

    def describe(self) -> str:
        return f"{self.entry}: {self.where}"


class RowRefused(DataError):
    """A check refused a row between loading and encoding: `problem` says why; `split` and `position`
    (from 0, in the order the split's rows reach the encoder) say which row. `located` turns it into
    the message that names the row's dataset, file and row number."""

    def __init__(self, problem: str, split: str, position: int) -> None:
        super().__init__(problem, split, position)  # positional, so that it pickles back from an encoding process
        self.problem = problem
        self.split = split
        self.position = position

    def __str__(self) -> str:
        return f"row {self.position + 1} of the {self.split} rows: {self.problem}"

    def located(self, origin: RowOrigin | None, *, datasets: str) -> DataError:
        """The error to show: the row named by its `origin`, or by its place among the rows of `datasets`
        (`dataset 'a', 'b'`) when the origin cannot be found again (the files changed while tokenizing)."""
        where = origin.describe() if origin else f"{datasets}, row {self.position + 1} of the {self.split} rows"
        problem = self.problem.rstrip(". ")
        return DataError(f"{where}: {problem}. Fix or remove the row.")
