"""Load a registered dataset as standard rows: whole (`load_rows`) or streamed (`iter_rows`).

Row selection follows LLaMA-Factory: `num_samples` (of the entry) first, then `max_samples`
(of the run), both counted in raw rows, bad ones included. LLaMA-Factory samples `num_samples`
rows at random; tuneline takes the first N, repeated in order when the dataset has fewer, so
that the same config always reads the same rows.

A bad row is an error by default, reported with its file, row and problem (all bad rows of a
dataset in one message when it is loaded whole). With `on_bad_row="skip"` bad rows are dropped
and counted by reason in a `LoadReport`, for the caller to log.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from tuneline.core.data.converters import RowProblem, convert_row
from tuneline.core.data.media.columns import MEDIA_COLUMNS
from tuneline.core.data.media.files import resolved_media
from tuneline.core.data.provenance import RowOrigin
from tuneline.core.data.readers import Record
from tuneline.core.data.sources import entry_label, open_records
from tuneline.core.errors import ConfigError, DataError

if TYPE_CHECKING:
    from tuneline.core.data.dataset_attr import DatasetAttr

OnBadRow = Literal["error", "skip"]
ON_BAD_ROW = ("error", "skip")
MAX_LISTED_PROBLEMS = 5
SKIP_HINT = "or set on_bad_row: skip to drop them and log how many were dropped"


@dataclass
class LoadReport:
    """What loading one dataset read, kept and dropped."""

    dataset: str
    """The dataset's name in dataset_info.json."""
    rows_read: int = 0
    """Raw rows read, after num_samples and max_samples."""
    rows_kept: int = 0
    """Standard rows returned."""
    dropped: dict[str, int] = field(default_factory=dict)
    """Dropped rows by reason (missing_column, wrong_role_order, empty_content, ...)."""
    examples: list[str] = field(default_factory=list)
    """The first few dropped rows: where they are and what is wrong with them."""

    @property
    def rows_dropped(self) -> int:
        return sum(self.dropped.values())

    def summary(self) -> str:
        """One line for the log: `dataset 'x': kept 98 of 100 rows; dropped 2 (reason: n)`."""
        text = f"dataset '{self.dataset}': kept {self.rows_kept} of {self.rows_read} rows"
        if self.dropped:
            text += f"; dropped {self.rows_dropped} ({_counts(self.dropped)})"
        return text

    def add_drop(self, problem: str, *, reason: str) -> None:
        self.dropped[reason] = self.dropped.get(reason, 0) + 1
        if len(self.examples) < MAX_LISTED_PROBLEMS:
            self.examples.append(problem)


def load_rows(attr: DatasetAttr, dataset_dir: str | Path, *, on_bad_row: OnBadRow = "error",
              max_samples: int | None = None, token: str | None = None, media_dir: str | Path | None = None) -> list[dict]:
    """The dataset's rows in the standard shape (see `tuneline.core.data.converters`); `token`
    is the Hugging Face Hub token of a hub dataset; a row's media files are resolved against
    `media_dir` (None: `dataset_dir`) and checked (`core.data.media`)."""
    rows, _ = load_rows_with_report(attr, dataset_dir, on_bad_row=on_bad_row,
                                    max_samples=max_samples, token=token, media_dir=media_dir)
    return rows


def load_rows_with_report(attr: DatasetAttr, dataset_dir: str | Path, *,
                          on_bad_row: OnBadRow = "error",
                          max_samples: int | None = None, token: str | None = None,
                          media_dir: str | Path | None = None, origins: bool = False) -> tuple[list[Any], LoadReport]:
    """The dataset's standard rows (with `origins`, their `RowOrigin`s) and what was read and
    dropped; see `load_rows`."""
    entry = entry_label(attr, dataset_dir)
    media = Path(media_dir if media_dir is not None else dataset_dir)
    records, source = _open(attr, dataset_dir, entry=entry, on_bad_row=on_bad_row,
                            streaming=False, token=token)
    report = LoadReport(dataset=attr.name)
    rows: list[Any] = []
    for record in _selected(records, num_samples=attr.num_samples, max_samples=max_samples):
        report.rows_read += 1
        try:
            row = _convert(record, attr, media_dir=media)
            rows.append(RowOrigin(entry, record.where()) if origins else row)
        except RowProblem as e:
            report.add_drop(f"{record.where()}: {e}", reason=e.reason)
    report.rows_kept = len(rows)
    _check_result(report, entry=entry, source=source, on_bad_row=on_bad_row)
    return rows, report


def iter_rows(attr: DatasetAttr, dataset_dir: str | Path, *, on_bad_row: OnBadRow = "error",
              max_samples: int | None = None, report: LoadReport | None = None,
              token: str | None = None, media_dir: str | Path | None = None,
              origins: bool = False) -> Iterator[dict] | Iterator[RowOrigin]:
    """The dataset's standard rows one at a time, in bounded memory (for `streaming: true`); with
    `origins`, the `RowOrigin` of each of those rows instead (see `core.data.provenance`).

    JSON lines, JSON lists (incrementally, by ijson), CSV, Parquet, Arrow and text files are read
    a row or a batch at a time. Hub datasets stream through `load_dataset(streaming=True)`. With
    `on_bad_row="error"` the first bad row raises; `report`, when given, is filled as rows go.
    The entry and its files are checked before the first row is asked for.
    """
    entry = entry_label(attr, dataset_dir)
    records, source = _open(attr, dataset_dir, entry=entry, on_bad_row=on_bad_row,
                            streaming=True, token=token)
    return _iter_rows(attr, records, entry=entry, source=source, on_bad_row=on_bad_row,
                      max_samples=max_samples, media_dir=Path(media_dir if media_dir is not None else dataset_dir),
                      report=report if report is not None else LoadReport(dataset=attr.name), origins=origins)


def _iter_rows(attr: DatasetAttr, records: Callable[[], Iterator[Record]], *, entry: str,
               source: str, on_bad_row: OnBadRow, max_samples: int | None, media_dir: Path,
               report: LoadReport, origins: bool) -> Iterator[dict] | Iterator[RowOrigin]:
    for record in _selected(records, num_samples=attr.num_samples, max_samples=max_samples):
        report.rows_read += 1
        try:
            row = _convert(record, attr, media_dir=media_dir)
        except RowProblem as e:
            if on_bad_row == "error":
                raise DataError(f"{entry}: {record.where()}: {e}. Fix or remove the row, "
                                f"{SKIP_HINT}.") from None
            report.add_drop(f"{record.where()}: {e}", reason=e.reason)
            continue
        report.rows_kept += 1
        yield RowOrigin(entry, record.where()) if origins else row
    _check_result(report, entry=entry, source=source, on_bad_row=on_bad_row)


def _open(attr: DatasetAttr, dataset_dir: str | Path, *, entry: str, on_bad_row: str,
          streaming: bool, token: str | None) -> tuple[Callable[[], Iterator[Record]], str]:
    if on_bad_row not in ON_BAD_ROW:
        raise ConfigError(f"on_bad_row must be one of {', '.join(ON_BAD_ROW)}, not "
                          f"{on_bad_row!r}: 'error' refuses bad rows, 'skip' drops and counts "
                          "them.")
    _check_loadable(attr, entry=entry)
    return open_records(attr, dataset_dir, streaming=streaming, token=token)


def _selected(records: Callable[[], Iterator[Record]], *, num_samples: int | None,
              max_samples: int | None) -> Iterator[Record]:
    """num_samples rows (the first, cycled when fewer), then at most max_samples of them."""
    selected = records() if num_samples is None else _cycled(records, num_samples)
    return selected if max_samples is None else islice(selected, max_samples)


def _cycled(records: Callable[[], Iterator[Record]], count: int) -> Iterator[Record]:
    produced = 0
    while produced < count:
        before = produced
        for record in islice(records(), count - produced):
            produced += 1
            yield record
        if produced == before:
            return


def _convert(record: Record, attr: DatasetAttr, *, media_dir: Path) -> dict:
    if record.problem is not None:
        raise RowProblem(record.problem, reason=record.reason or "unreadable")
    row = convert_row(record.data, attr)
    if any(key in row for key in MEDIA_COLUMNS):
        row.update(resolved_media(row, media_dir=media_dir))
    return row


def _check_result(report: LoadReport, *, entry: str, source: str, on_bad_row: str) -> None:
    if report.rows_read == 0:
        raise DataError(f"{entry} has no rows: {source} holds none. Add rows to it or remove "
                        "the entry.")
    if report.dropped and on_bad_row == "error":
        raise DataError(_bad_rows_message(report, entry=entry))
    if report.rows_kept == 0:
        raise DataError(
            f"{entry}: all {report.rows_read} rows are bad and were dropped "
            f"({_counts(report.dropped)}), first: {report.examples[0]}. Fix the rows or the "
            "entry's \"columns\"/\"tags\"."
        )


def _bad_rows_message(report: LoadReport, *, entry: str) -> str:
    listed = "; ".join(report.examples)
    more = report.rows_dropped - len(report.examples)
    tail = f"; and {more} more" if more > 0 else ""
    return (
        f"{entry}: {report.rows_dropped} row(s) cannot be used ({_counts(report.dropped)}): "
        f"{listed}{tail}. Fix or remove these rows, {SKIP_HINT} (LLaMA-Factory drops some of "
        "them silently)."
    )


def _counts(dropped: dict[str, int]) -> str:
    return ", ".join(f"{reason}: {count}" for reason, count in sorted(dropped.items()))


def _check_loadable(attr: DatasetAttr, *, entry: str) -> None:
    """Entry-level reasons that no row of the dataset can be loaded."""
    if attr.formatting == "alpaca" and not {"prompt", "query"} & set(attr.columns):
        raise DataError(
            f"{entry} maps neither prompt nor query in \"columns\", so its rows have no user "
            "turn; map the column that holds the instruction (or the text) as \"prompt\"."
        )
    if attr.ranking and not {"chosen", "rejected"} <= set(attr.columns):
        raise DataError(
            f"{entry} has \"ranking\": true but does not map both chosen and rejected; add "
            "them to \"columns\" (the preferred and the rejected response)."
        )
    if attr.formatting == "alpaca" and "kto_tag" in attr.columns and (
        "response" not in attr.columns
    ):
        raise DataError(
            f"{entry} maps kto_tag but no response column; add \"response\" to \"columns\" "
            "(the answer that kto_tag marks as desirable or not)."
        )
