"""Convert raw dataset rows into tuneline's standard row shape.

A standard row is a plain JSON-serialisable dict:
`{"prompt": [{"role", "content"}, ...], "response": [{"role", "content"}, ...],
"system": str, "tools": str}`, plus `"kto_tag": bool` for feedback (KTO) data; the same shape
as LLaMA-Factory's aligned dataset. Roles are "user", "assistant", "function" (an assistant
tool call) and "observation" (a tool result). A pairwise (ranking) row's response is
[chosen, rejected]. A KTO row keeps its one response and says in `kto_tag` whether it is
desirable; LLaMA-Factory encodes the same tag as an extra empty assistant message.

LLaMA-Factory drops sharegpt rows with a wrong role order or message count with only a log
warning, and takes empty, numeric or mistyped values as they come. tuneline raises `RowProblem`
for every such row, so that the caller can refuse it or drop and count it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from tuneline.core.data.media.columns import MEDIA_COLUMNS

if TYPE_CHECKING:
    from tuneline.core.data.dataset_attr import DatasetAttr

Message = dict[str, str]
KTO_TEXT = {"true": True, "false": False}


class RowProblem(Exception):
    """Why one row cannot be converted: `reason` is a short key for counting dropped rows."""

    def __init__(self, message: str, *, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


def convert_row(data: Mapping[str, Any], attr: DatasetAttr) -> dict:
    """The standard row for one raw row of `attr`'s dataset; raises RowProblem."""
    convert = alpaca_row if attr.formatting == "alpaca" else sharegpt_row
    return convert(data, attr)


def alpaca_row(data: Mapping[str, Any], attr: DatasetAttr) -> dict:
    """History pairs, then `instruction + "\\n" + input` as the user turn, then the output."""
    columns = attr.columns
    prompt = _history(data, columns["history"]) if "history" in columns else []
    keys = [key for key in ("prompt", "query") if key in columns]
    parts = [_text(data, columns[key], key) for key in keys]
    if not any(parts):
        names = " and ".join(f"'{columns[k]}' ({k})" for k in keys)
        raise RowProblem(f"the user turn is empty: {names} hold no text; fill it in or remove "
                         "the row", reason="empty_content")
    prompt.append(_message("user", "\n".join(part for part in parts if part)))
    if attr.ranking:
        response = [_message("assistant", _text(data, columns[key], key, required=True))
                    for key in ("chosen", "rejected")]
    elif "kto_tag" in columns or (
        "response" in columns and _column(data, columns["response"], "response") is not None
    ):
        response = [_message("assistant", _text(data, columns["response"], "response",
                                                required=True))]
    else:
        response = []
    return _standard(prompt, response, data=data, attr=attr)


def _history(data: Mapping[str, Any], column: str) -> list[Message]:
    value = _column(data, column, "history", optional=True)
    if value is None:
        return []
    if not isinstance(value, list):
        raise RowProblem(f"column '{column}' (history) must be a list of [query, response] "
                         f"pairs, not {type(value).__name__}", reason="wrong_type")
    messages = []
    for number, pair in enumerate(value):
        if not (isinstance(pair, list | tuple) and len(pair) == 2
                and all(isinstance(t, str) for t in pair)):
            raise RowProblem(f"history item {number} in column '{column}' must be a "
                             "[query, response] pair of strings", reason="wrong_type")
        if not (pair[0].strip() and pair[1].strip()):
            raise RowProblem(f"history item {number} in column '{column}' has an empty query "
                             "or response; fill it in or remove the pair",
                             reason="empty_content")
        messages += [_message("user", pair[0]), _message("assistant", pair[1])]
    return messages


def sharegpt_row(data: Mapping[str, Any], attr: DatasetAttr) -> dict:
    """A leading system message becomes `system`; the last message (or chosen/rejected) the
    response."""
    tags = attr.tags
    messages = _messages(data, attr.columns["messages"])
    system = None
    if messages[0].get(tags["role_tag"]) == tags["system_tag"]:
        system = _content(messages[0], tags, number=0, allow_empty=True)
        messages = messages[1:]
    offset = 0 if system is None else 1
    aligned = [_aligned(message, tags, turn=turn, number=turn + offset)
               for turn, message in enumerate(messages)]
    _check_count(len(aligned), ranking=attr.ranking)
    if attr.ranking:
        prompt, response = aligned, [_ranked(data, attr, key) for key in ("chosen", "rejected")]
    else:
        prompt, response = aligned[:-1], aligned[-1:]
    return _standard(prompt, response, data=data, attr=attr, system=system)


def _messages(data: Mapping[str, Any], column: str) -> list[Mapping[str, Any]]:
    value = _column(data, column, "messages")
    if not isinstance(value, list) or not all(isinstance(m, dict) for m in value):
        raise RowProblem(f"column '{column}' (messages) must be a list of message objects",
                         reason="wrong_type")
    if not value:
        raise RowProblem(f"column '{column}' (messages) is empty", reason="message_count")
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
        known = [t for t in _role_names(tags) if t != tags["system_tag"]]
        if role not in known:
            raise RowProblem(
                f"message {number} has {tags['role_tag']} {role!r}, which is not a role of this "
                f"entry ({', '.join(repr(t) for t in known)}); fix the message or set the "
                "entry's \"tags\"", reason="unknown_role")
        side = "user" if turn % 2 == 0 else "assistant"
        raise RowProblem(
            f"message {number} has {tags['role_tag']} {role!r} where a {side} turn "
            f"({' or '.join(repr(t) for t in allowed)}) is expected; messages must alternate "
            "user and assistant, starting with the user", reason="wrong_role_order")
    return _message(_role_names(tags)[role], _content(message, tags, number=number))


def _content(message: Mapping[str, Any], tags: Mapping[str, str], *, number: int,
             allow_empty: bool = False) -> str:
    key = tags["content_tag"]
    if key not in message:
        raise RowProblem(f"message {number} has no '{key}' (the entry's content_tag); add it "
                         "or fix \"tags\"", reason="missing_column")
    content = message[key]
    if not isinstance(content, str):
        raise RowProblem(
            f"message {number} has a {type(content).__name__} as '{key}', not a string; "
            "tuneline reads text-only messages (no lists of content parts)",
            reason="non_string_content")
    if not allow_empty and not content.strip():
        raise RowProblem(f"message {number} has an empty '{key}'; fill it in or remove the row",
                         reason="empty_content")
    return content


def _check_count(count: int, *, ranking: bool) -> None:
    if count == 0:
        raise RowProblem("has no messages besides the system message", reason="message_count")
    if not ranking and count % 2 != 0:
        raise RowProblem(
            f"has {count} messages besides the system message; a training row needs an even "
            "number (user/assistant pairs) ending with an assistant turn",
            reason="message_count")
    if ranking and count % 2 == 0:
        raise RowProblem(
            f"has {count} messages besides the system message; a ranking row needs an odd "
            "number ending with a user turn, followed by the chosen and rejected columns",
            reason="message_count")


def _ranked(data: Mapping[str, Any], attr: DatasetAttr, key: str) -> Message:
    column = attr.columns[key]
    value = _column(data, column, key)
    if not isinstance(value, dict):
        raise RowProblem(f"column '{column}' ({key}) must be one message object, not "
                         f"{type(value).__name__}", reason="wrong_type")
    tags = attr.tags
    role = value.get(tags["role_tag"])
    allowed = (tags["assistant_tag"], tags["function_tag"])
    if role not in allowed:
        raise RowProblem(f"the {key} message has {tags['role_tag']} {role!r}, expected "
                         f"{' or '.join(repr(t) for t in allowed)}", reason="wrong_role_order")
    try:
        content = _content(value, tags, number=0)
    except RowProblem as e:
        raise RowProblem(str(e).replace("message 0", f"the {key} message"),
                         reason=e.reason) from None
    return _message(_role_names(tags)[role], content)


def _standard(prompt: list[Message], response: list[Message], *, data: Mapping[str, Any],
              attr: DatasetAttr, system: str | None = None) -> dict:
    columns = attr.columns
    if system is None:
        system = _text(data, columns["system"], "system") if "system" in columns else ""
    tools = _tools(data, columns["tools"]) if "tools" in columns else ""
    row = {"prompt": prompt, "response": response, "system": system, "tools": tools}
    if "kto_tag" in columns:
        row["kto_tag"] = _kto_tag(data, columns["kto_tag"])
    row.update(media_lists(data, columns))
    return row


def media_lists(data: Mapping[str, Any], columns: Mapping[str, str]) -> dict[str, list[str]]:
    """The raw row's media references by media column (a single string counts as a list of one)."""
    found = {}
    for key in MEDIA_COLUMNS:
        if key not in columns:
            continue
        value = data.get(columns[key])
        if value is None:
            value = []
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
            raise RowProblem(f"column '{columns[key]}' ({key}) must hold a list of file paths, got {str(value)[:80]!r}",
                             reason="wrong_type")
        found[key] = value
    return found


def _kto_tag(data: Mapping[str, Any], column: str) -> bool:
    """true/false; the strings "true"/"false" too, since a CSV file has no booleans."""
    value = _column(data, column, "kto_tag")
    if isinstance(value, str) and value.strip().lower() in KTO_TEXT:
        return KTO_TEXT[value.strip().lower()]
    if not isinstance(value, bool):
        raise RowProblem(f"column '{column}' (kto_tag) must be true or false, got {value!r:.40}; "
                         "mark desirable responses true and undesirable ones false",
                         reason="bad_kto_tag")
    return value


def _tools(data: Mapping[str, Any], column: str) -> str:
    value = _column(data, column, "tools", optional=True)
    if value is None:
        return ""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _column(data: Mapping[str, Any], column: str, key: str, *, optional: bool = False) -> Any:
    """The row's value of `column`. An optional column missing from a row reads as null, as
    LLaMA-Factory sees it (`datasets` fills keys some rows lack with None)."""
    if column not in data:
        if optional:
            return None
        raise RowProblem(
            f"no column '{column}' (mapped as {key} in the entry's \"columns\"); add it to "
            "every row or change the mapping", reason="missing_column")
    return data[column]


def _text(data: Mapping[str, Any], column: str, key: str, *, required: bool = False) -> str:
    """The column's string; null is "" unless `required`, where it must be non-empty text."""
    value = _column(data, column, key, optional=not required)
    if value is None and not required:
        return ""
    if not isinstance(value, str):
        raise RowProblem(f"column '{column}' ({key}) must be a string, got {value!r:.60}",
                         reason="wrong_type")
    if required and not value.strip():
        raise RowProblem(f"column '{column}' ({key}) is empty; fill it in or remove the row",
                         reason="empty_content")
    return value


def _message(role: str, content: str) -> Message:
    return {"role": role, "content": content}
