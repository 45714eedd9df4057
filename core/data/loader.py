"""Read local dataset files and convert their rows into tuneline's standard row shape.

A standard row is a plain JSON-serialisable dict:
`{"prompt": [{"role", "content"}, ...], "response": [{"role", "content"}, ...],
"system": str, "tools": str}`; the same shape as LLaMA-Factory's aligned dataset.

LLaMA-Factory drops sharegpt rows with a wrong role order or message count with only a log
warning; tuneline refuses them on purpose and names every bad row, so that a dataset never
shrinks without anyone noticing.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tuneline.core.errors import DataError

if TYPE_CHECKING:
    from tuneline.core.data.registry import DatasetAttr

SUPPORTED_SUFFIXES = (".json", ".jsonl")
SUPPORTED_HELP = ".json (a list of objects) and .jsonl (one object per line)"
MAX_LISTED_PROBLEMS = 5

Message = dict[str, str]


@dataclass(frozen=True)
class Record:
    """One raw row of a dataset file, with where it came from for error messages."""

    path: Path
    index: int
    line: int | None
    data: Mapping[str, Any]

    def where(self) -> str:
        return _location(self.path, self.index, self.line)


def _location(path: Path, index: int, line: int | None) -> str:
    """`row 3 (line 4) of /data/x.jsonl`; rows count from 0, lines from 1."""
    line_text = f" (line {line})" if line is not None else ""
    return f"row {index}{line_text} of {path}"


class RowProblem(Exception):
    """Why one row cannot be converted; collected and reported together as a DataError."""


def read_records(path: Path, *, entry: str) -> list[Record]:
    """The rows of one .json or .jsonl file, each checked to be a JSON object."""
    readers = {".json": _read_json_list, ".jsonl": _read_json_lines}
    reader = readers.get(path.suffix.lower())
    if reader is None:
        raise DataError(
            f"{entry}: {path} has extension '{path.suffix}', which tuneline cannot read. "
            f"Supported: {SUPPORTED_HELP}. Convert the file or point file_name at another one."
        )
    return reader(path, entry=entry)


def _read_json_list(path: Path, *, entry: str) -> list[Record]:
    value = _parse_json(path.read_text(encoding="utf-8"), path=path, entry=entry, line_offset=0)
    if not isinstance(value, list):
        raise DataError(
            f"{entry}: {path} holds a JSON {type(value).__name__}, but a .json dataset must be "
            "a list of row objects ([{...}, {...}]). Wrap the rows in a list, or store one "
            "object per line in a .jsonl file."
        )
    return [_record(path, index, None, row, entry=entry) for index, row in enumerate(value)]


def _read_json_lines(path: Path, *, entry: str) -> list[Record]:
    records = []
    for number, text in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if text.strip():
            row = _parse_json(text, path=path, entry=entry, line_offset=number - 1)
            records.append(_record(path, len(records), number, row, entry=entry))
    return records


def _parse_json(text: str, *, path: Path, entry: str, line_offset: int) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise DataError(
            f"{entry}: {path} is not valid JSON: {e.msg} at line {e.lineno + line_offset}, "
            f"column {e.colno}. Fix the file at that line."
        ) from e


def _record(path: Path, index: int, line: int | None, row: Any, *, entry: str) -> Record:
    if not isinstance(row, dict):
        raise DataError(
            f"{entry}: {_location(path, index, line)} is a JSON {type(row).__name__}, but "
            "every row must be an object with the columns named in the entry's \"columns\"."
        )
    return Record(path=path, index=index, line=line, data=row)


def convert_records(records: Sequence[Record], attr: DatasetAttr, *, entry: str) -> list[dict]:
    """Standard rows for `records`, or one DataError naming up to five bad rows and the count."""
    converters: dict[str, Callable[[Mapping[str, Any], DatasetAttr], dict]] = {
        "alpaca": alpaca_row,
        "sharegpt": sharegpt_row,
    }
    convert = converters[attr.formatting]
    rows: list[dict] = []
    problems: list[str] = []
    for record in records:
        try:
            rows.append(convert(record.data, attr))
        except RowProblem as e:
            problems.append(f"{record.where()}: {e}")
    if problems:
        raise DataError(_bad_rows_message(problems, entry=entry))
    return rows


def _bad_rows_message(problems: list[str], *, entry: str) -> str:
    listed = "; ".join(problems[:MAX_LISTED_PROBLEMS])
    more = len(problems) - MAX_LISTED_PROBLEMS
    tail = f"; and {more} more" if more > 0 else ""
    return (
        f"{entry}: {len(problems)} row(s) cannot be used: {listed}{tail}. Fix or remove these "
        "rows (tuneline refuses bad rows instead of dropping them silently as LLaMA-Factory does)."
    )


def alpaca_row(data: Mapping[str, Any], attr: DatasetAttr) -> dict:
    """History pairs, then `instruction + "\\n" + input` as the user turn, then the output."""
    columns = attr.columns
    prompt = _history(data, columns["history"]) if "history" in columns else []
    parts = [_text(data, columns[key], key) for key in ("prompt", "query") if key in columns]
    prompt.append(_message("user", "\n".join(part for part in parts if part)))
    if attr.ranking:
        response = [_message("assistant", _text(data, columns[key], key, required=True))
                    for key in ("chosen", "rejected")]
    elif "response" in columns and _column(data, columns["response"], "response") is not None:
        response = [_message("assistant", _text(data, columns["response"], "response"))]
    else:
        response = []
    return _standard(prompt, response, data=data, columns=columns)


def _history(data: Mapping[str, Any], column: str) -> list[Message]:
    value = _column(data, column, "history")
    if value is None:
        return []
    if not isinstance(value, list):
        raise RowProblem(f"column '{column}' (history) must be a list of [query, response] pairs")
    messages = []
    for number, pair in enumerate(value):
        if not (isinstance(pair, list) and len(pair) == 2 and all(isinstance(t, str) for t in pair)):
            raise RowProblem(
                f"history item {number} in column '{column}' must be a [query, response] pair "
                "of strings"
            )
        messages += [_message("user", pair[0]), _message("assistant", pair[1])]
    return messages


def sharegpt_row(data: Mapping[str, Any], attr: DatasetAttr) -> dict:
    """A leading system message becomes `system`; the last message (or chosen/rejected) the
    response."""
    tags = attr.tags
    messages = _messages(data, attr.columns["messages"])
    system = None
    if messages and messages[0].get(tags["role_tag"]) == tags["system_tag"]:
        system = _content(messages[0], tags, number=0)
        messages = messages[1:]
    offset = 0 if system is None else 1
    aligned = [_aligned(message, tags, turn=turn, number=turn + offset)
               for turn, message in enumerate(messages)]
    _check_count(len(aligned), ranking=attr.ranking)
    if attr.ranking:
        prompt, response = aligned, [_ranked(data, attr, key) for key in ("chosen", "rejected")]
    else:
        prompt, response = aligned[:-1], aligned[-1:]
    return _standard(prompt, response, data=data, columns=attr.columns, system=system)


def _messages(data: Mapping[str, Any], column: str) -> list[Mapping[str, Any]]:
    value = _column(data, column, "messages")
    if not isinstance(value, list) or not all(isinstance(m, dict) for m in value):
        raise RowProblem(f"column '{column}' (messages) must be a list of message objects")
    if not value:
        raise RowProblem(f"column '{column}' (messages) is empty")
    return value


def _role_names(tags: Mapping[str, str]) -> dict[str, str]:
    return {
        tags["user_tag"]: "user",
        tags["assistant_tag"]: "assistant",
        tags["observation_tag"]: "observation",
        tags["function_tag"]: "function",
        tags["system_tag"]: "system",
    }


def _aligned(message: Mapping[str, Any], tags: Mapping[str, str], *, turn: int,
             number: int) -> Message:
    """Message `number` (turn `turn` after any system message) with its role checked and
    mapped."""
    role = message.get(tags["role_tag"])
    allowed = ((tags["user_tag"], tags["observation_tag"]) if turn % 2 == 0
               else (tags["assistant_tag"], tags["function_tag"]))
    if role not in allowed:
        side = "user" if turn % 2 == 0 else "assistant"
        raise RowProblem(
            f"message {number} has {tags['role_tag']} {role!r} where a {side} turn "
            f"({' or '.join(repr(t) for t in allowed)}) is expected; messages must alternate "
            "user and assistant, starting with the user"
        )
    return _message(_role_names(tags)[role], _content(message, tags, number=number))


def _content(message: Mapping[str, Any], tags: Mapping[str, str], *, number: int) -> str:
    content = message.get(tags["content_tag"])
    if not isinstance(content, str):
        raise RowProblem(f"message {number} has no string '{tags['content_tag']}'")
    return content


def _check_count(count: int, *, ranking: bool) -> None:
    if count == 0:
        raise RowProblem("has no messages besides the system message")
    if not ranking and count % 2 != 0:
        raise RowProblem(
            f"has {count} messages besides the system message; a training row needs an even "
            "number (user/assistant pairs) ending with an assistant turn"
        )
    if ranking and count % 2 == 0:
        raise RowProblem(
            f"has {count} messages besides the system message; a ranking row needs an odd "
            "number ending with a user turn, followed by the chosen and rejected columns"
        )


def _ranked(data: Mapping[str, Any], attr: DatasetAttr, key: str) -> Message:
    value = _column(data, attr.columns[key], key)
    if not isinstance(value, dict):
        raise RowProblem(f"column '{attr.columns[key]}' ({key}) must be one message object")
    return _ranked_message(value, attr.tags, key=key)


def _ranked_message(value: Mapping[str, Any], tags: Mapping[str, str], *, key: str) -> Message:
    role = value.get(tags["role_tag"])
    allowed = (tags["assistant_tag"], tags["function_tag"])
    if role not in allowed:
        raise RowProblem(f"the {key} message has {tags['role_tag']} {role!r}, expected "
                         f"{' or '.join(repr(t) for t in allowed)}")
    content = value.get(tags["content_tag"])
    if not isinstance(content, str):
        raise RowProblem(f"the {key} message has no string '{tags['content_tag']}'")
    return _message(_role_names(tags)[role], content)


def _standard(prompt: list[Message], response: list[Message], *, data: Mapping[str, Any],
              columns: Mapping[str, str], system: str | None = None) -> dict:
    if system is None:
        system = _text(data, columns["system"], "system") if "system" in columns else ""
    tools = _tools(data, columns["tools"]) if "tools" in columns else ""
    return {"prompt": prompt, "response": response, "system": system, "tools": tools}


def _tools(data: Mapping[str, Any], column: str) -> str:
    value = _column(data, column, "tools")
    if value is None:
        return ""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _column(data: Mapping[str, Any], column: str, key: str) -> Any:
    if column not in data:
        raise RowProblem(
            f"no column '{column}' (mapped as {key} in the entry's \"columns\"); add it to "
            "every row or change the mapping"
        )
    return data[column]


def _text(data: Mapping[str, Any], column: str, key: str, *, required: bool = False) -> str:
    value = _column(data, column, key)
    if value is None and not required:
        return ""
    if not isinstance(value, str):
        raise RowProblem(f"column '{column}' ({key}) must be a string, got {value!r:.60}")
    return value


def _message(role: str, content: str) -> Message:
    return {"role": role, "content": content}
