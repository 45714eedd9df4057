"""Read the rows of one local dataset file, lazily, as LLaMA-Factory's `load_dataset` sees them.

File types follow LLaMA-Factory's `FILEEXT2TYPE`: .json and .jsonl (a JSON list or JSON lines,
either way round, as the `datasets` json builder accepts), .csv, .parquet, .arrow and .txt (one
row per line in a column named "text"). Every reader is a generator that holds one row or one
record batch at a time; a .json list is parsed incrementally by ijson (the `streaming` extra, else whole), so
memory does not grow with the file.

A row that cannot be read (a malformed JSON line, a CSV line with the wrong number of fields, a
value that is not an object) comes out as a `Record` with a `problem`, so the caller decides
whether it is an error or a dropped row; a file that cannot be read at all raises `DataError`.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from tuneline.core.errors import DataError

FILE_TYPES = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet",
              ".arrow": "arrow", ".txt": "text"}
SUPPORTED_HELP = (".json/.jsonl (a JSON list of objects, or one object per line), .csv (with a "
                  "header line), .parquet, .arrow and .txt (one text per line)")
TEXT_COLUMN = "text"
BATCH_ROWS = 1024
_BOM = b"\xef\xbb\xbf"
_CSV_FIELD_LIMIT = 2**31 - 1  # the csv module's default (128 KiB per value) cuts long texts


@dataclass(frozen=True)
class Record:
    """One raw row with where it came from; `problem` is set when the row could not be read."""

    source: str
    """The file (or hub dataset) the row is in, as shown in messages."""
    index: int
    """Position of the row in its file, from 0; unreadable rows count too (messages count rows from 1)."""
    line: int | None
    """Line number in the file, from 1, where the format has lines."""
    data: Mapping[str, Any]
    problem: str | None = None
    """Why the row could not be read (then `data` is empty)."""
    reason: str | None = None
    """Short key for `problem`, used to count dropped rows."""

    def where(self) -> str:
        """`row 3 (line 4) of /data/x.jsonl`: the row counted from 1, as a user counts it, and its line
        where the format has lines (a JSON lines file's blank lines and a CSV file's header make them differ)."""
        line_text = f" (line {self.line})" if self.line is not None else ""
        return f"row {self.index + 1}{line_text} of {self.source}"


def file_type(path: Path) -> str | None:
    """LLaMA-Factory's loader name for `path` (json, csv, parquet, arrow, text), or None."""
    return FILE_TYPES.get(path.suffix.lower())


def read_file(path: Path, *, entry: str) -> Iterator[Record]:
    """The rows of one file; raises DataError for an unknown extension or an unreadable file."""
    readers = {"json": _read_json, "csv": _read_csv, "parquet": _read_parquet,
               "arrow": _read_arrow, "text": _read_text}
    kind = file_type(path)
    if kind is None:
        raise DataError(
            f"{entry}: cannot read {path} (extension '{path.suffix}'). Supported: "
            f"{SUPPORTED_HELP}. Convert the file or point file_name at another one."
        )
    try:
        yield from readers[kind](path, entry=entry)
    except UnicodeDecodeError as e:
        raise DataError(
            f"{entry}: {path} is not UTF-8 text ({e.reason} at byte {e.start}). Save the file "
            "as UTF-8."
        ) from e


def _bad(path: Path, index: int, line: int | None, problem: str, reason: str) -> Record:
    return Record(source=str(path), index=index, line=line, data={}, problem=problem,
                  reason=reason)


def _row(path: Path, index: int, line: int | None, value: Any) -> Record:
    if isinstance(value, dict):
        return Record(source=str(path), index=index, line=line, data=value)
    return _bad(path, index, line,
                f"is a JSON {type(value).__name__}, but every row must be an object with the "
                "columns named in the entry's \"columns\"", "not_an_object")


def _read_json(path: Path, *, entry: str) -> Iterator[Record]:
    """A JSON list, or JSON lines: the `datasets` json builder accepts both in .json and .jsonl."""
    with path.open("rb") as raw:
        first = _first_byte(raw)
        if first == b"[":
            yield from _json_list(path, raw, entry=entry)
            return
    if first:
        with path.open(encoding="utf-8-sig") as handle:
            yield from _json_lines(path, handle, entry=entry)


def _first_byte(raw: BinaryIO) -> bytes:
    """The first non-blank byte; `raw` is left at the start of the JSON text (after a UTF-8 BOM)."""
    start = len(_BOM) if raw.read(len(_BOM)) == _BOM else 0
    raw.seek(start)
    while chunk := raw.read(4096):
        if chunk.strip():
            raw.seek(start)
            return chunk.lstrip()[:1]
    return b""


def _json_list(path: Path, raw: BinaryIO, *, entry: str) -> Iterator[Record]:
    """The list's items one at a time: ijson (the `streaming` extra) holds one item, never the whole
    list; without it the list is parsed whole by the json module, with memory growing with the file."""
    try:
        import ijson
    except ImportError:
        yield from _json_list_whole(path, entry=entry)
        return
    rows_read = 0
    try:
        for row in ijson.items(raw, "item", use_float=True):
            yield _row(path, rows_read, None, row)
            rows_read += 1
    except ijson.JSONError as e:
        raise _json_list_error(path, e, entry=entry, rows_read=rows_read) from e


def _json_list_whole(path: Path, *, entry: str) -> Iterator[Record]:
    try:
        rows = json.loads(path.read_text(encoding="utf-8-sig"))
    except json.JSONDecodeError as e:
        raise DataError(f"{entry}: {path} is not valid JSON: {e.msg} at line {e.lineno}, column {e.colno}. "
                        "Fix the file at that line.") from e
    for index, row in enumerate(rows):
        yield _row(path, index, None, row)


def _json_list_error(path: Path, error: Exception, *, entry: str, rows_read: int) -> DataError:
    """The standard library's line and column for the message; ijson's C parser gives neither.
    Parsing the whole file costs memory, but only for a file that is broken anyway."""
    try:
        json.loads(path.read_text(encoding="utf-8-sig"))
    except json.JSONDecodeError as e:
        return DataError(
            f"{entry}: {path} is not valid JSON: {e.msg} at line {e.lineno}, column {e.colno}. "
            "Fix the file at that line."
        )
    first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return DataError(
        f"{entry}: {path} is a JSON list that ijson cannot parse after {rows_read} row(s) "
        f"({first_line}), though Python's json module reads it (NaN or Infinity values, for "
        "instance, are not JSON); write those values as null or numbers."
    )


def _json_lines(path: Path, handle, *, entry: str) -> Iterator[Record]:
    index = 0
    for number, text in enumerate(handle, start=1):
        if not text.strip():
            continue
        try:
            value = json.loads(text)
        except json.JSONDecodeError as e:
            if index == 0:
                _raise_if_one_object(path, entry=entry)
            yield _bad(path, index, number,
                       f"is not valid JSON: {e.msg} at column {e.colno}; fix the line (each "
                       "line must hold one complete JSON object)", "invalid_json")
        else:
            yield _row(path, index, number, value)
        index += 1


def _raise_if_one_object(path: Path, *, entry: str) -> None:
    """A file that is one JSON object spread over lines gets its own message, not a bad line."""
    try:
        value = json.loads(path.read_text(encoding="utf-8-sig"))
    except json.JSONDecodeError:
        return
    raise DataError(
        f"{entry}: {path} holds a JSON {type(value).__name__}, but a .json dataset must be a "
        "list of row objects ([{...}, {...}]) or one object per line. Wrap the rows in a list."
    )


def _read_text(path: Path, *, entry: str) -> Iterator[Record]:
    """One row per line, as the `datasets` text builder splits them; blank lines are skipped."""
    index = 0
    with path.open(encoding="utf-8-sig") as handle:
        for number, physical in enumerate(handle, start=1):
            for text in physical.splitlines():
                if text.strip():
                    yield Record(source=str(path), index=index, line=number,
                                 data={TEXT_COLUMN: text})
                    index += 1


def _read_csv(path: Path, *, entry: str) -> Iterator[Record]:
    """Every value as text (an empty cell is null), so "12" stays "12" and "" means no value."""
    csv.field_size_limit(_CSV_FIELD_LIMIT)
    with path.open(encoding="utf-8-sig", newline="") as handle:
        reader = csv.reader(handle)
        try:
            header = next(reader, None)
            if header is None:
                return
            for index, fields in enumerate(reader):
                yield _csv_record(path, index, reader.line_num, header, fields)
        except csv.Error as e:
            raise DataError(
                f"{entry}: {path} is not valid CSV at line {reader.line_num}: {e}. Fix the file "
                "at that line."
            ) from e


def _csv_record(path: Path, index: int, line: int, header: list[str],
                fields: list[str]) -> Record:
    if len(fields) != len(header):
        return _bad(path, index, line,
                    f"has {len(fields)} field(s) but the header has {len(header)}; quote values "
                    "that contain commas or line breaks", "invalid_csv")
    return Record(source=str(path), index=index, line=line,
                  data={name: value if value != "" else None
                        for name, value in zip(header, fields)})


def _read_parquet(path: Path, *, entry: str) -> Iterator[Record]:
    return _pyarrow_records(path, _parquet_batches(path), entry=entry, kind="Parquet",
                            fix="Write it again with pyarrow, pandas or datasets' to_parquet.")


def _read_arrow(path: Path, *, entry: str) -> Iterator[Record]:
    """An Arrow IPC stream (what `datasets` writes) or an Arrow IPC file."""
    return _pyarrow_records(path, _arrow_batches(path), entry=entry, kind="Arrow",
                            fix="Write it with datasets' save_to_disk or pyarrow.ipc.")


def _parquet_batches(path: Path) -> Iterator[Any]:
    import pyarrow.parquet as pq

    yield from pq.ParquetFile(path).iter_batches(batch_size=BATCH_ROWS)


def _arrow_batches(path: Path) -> Iterator[Any]:
    import pyarrow as pa

    with pa.memory_map(str(path)) as source:
        try:
            reader = pa.ipc.open_stream(source)
        except pa.ArrowInvalid:
            source.seek(0)
            file_reader = pa.ipc.open_file(source)
            reader = (file_reader.get_batch(i) for i in range(file_reader.num_record_batches))
        yield from reader


def _pyarrow_records(path: Path, batches: Iterator[Any], *, entry: str, kind: str, fix: str) -> Iterator[Record]:
    """The rows of pyarrow record batches, read lazily; pyarrow's and the OS's errors, opening the
    file included, become a DataError naming the entry, the file, its `kind` and the `fix`."""
    import pyarrow as pa

    try:
        yield from _batch_records(path, batches)
    except (pa.ArrowException, OSError) as e:
        raise DataError(f"{entry}: {path} is not a readable {kind} file ({e}). {fix}") from e


def _batch_records(path: Path, batches) -> Iterator[Record]:
    index = 0
    for batch in batches:
        for row in batch.to_pylist():
            yield Record(source=str(path), index=index, line=None, data=row)
            index += 1
