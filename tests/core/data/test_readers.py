"""Reading local dataset files (core/data/readers.py): JSON lists are read incrementally."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tuneline.core.data.readers import read_file
from tuneline.core.errors import DataError

ROWS = [{"instruction": "Add 1.5 and 2.", "input": "", "output": "3.5", "score": 0.25, "n": 7, "tags": ["a", None]},
        {"instruction": "Say hi.", "output": "Hi.", "nested": {"x": True}}]


def test_json_list_rows_equal_the_standard_parser(tmp_path: Path) -> None:
    path = tmp_path / "d.json"
    path.write_text(json.dumps(ROWS, indent=2), encoding="utf-8")
    records = list(read_file(path, entry="d"))
    assert [r.data for r in records] == json.loads(path.read_text())
    assert [r.index for r in records] == [0, 1] and all(r.line is None for r in records)
    assert type(records[0].data["score"]) is float  # not Decimal, as json.loads gives it


def test_json_list_after_a_byte_order_mark_and_blank_lines(tmp_path: Path) -> None:
    path = tmp_path / "d.json"
    path.write_bytes(b"\xef\xbb\xbf\n  \n" + json.dumps(ROWS).encode())
    assert [r.data for r in read_file(path, entry="d")] == ROWS


def test_json_list_is_read_incrementally(tmp_path: Path) -> None:
    """The first rows come out before the parser reaches a broken tail: nothing parses the whole list first."""
    path = tmp_path / "d.json"
    path.write_text("[" + ", ".join(json.dumps(row) for row in ROWS) + ', {"instruction": ', encoding="utf-8")
    records = read_file(path, entry="d")
    assert next(records).data == ROWS[0]
    assert next(records).data == ROWS[1]
    with pytest.raises(DataError) as info:
        next(records)
    assert f"d: {path} is not valid JSON" in str(info.value) and "at line 1" in str(info.value)


def test_item_that_is_not_an_object_is_a_bad_row(tmp_path: Path) -> None:
    path = tmp_path / "d.json"
    path.write_text(json.dumps([ROWS[0], 3, ROWS[1]]), encoding="utf-8")
    records = list(read_file(path, entry="d"))
    assert [r.problem is None for r in records] == [True, False, True]
    assert records[1].reason == "not_an_object" and records[1].index == 1


def test_json_list_that_is_not_utf8_says_so(tmp_path: Path) -> None:
    path = tmp_path / "d.json"
    path.write_bytes(b'[{"instruction": "caf\xe9"}]')
    with pytest.raises(DataError, match="is not UTF-8 text"):
        list(read_file(path, entry="d"))


def test_value_json_accepts_but_ijson_refuses_is_named(tmp_path: Path) -> None:
    path = tmp_path / "d.json"
    path.write_text('[{"instruction": "x", "score": NaN}]', encoding="utf-8")
    with pytest.raises(DataError) as info:
        list(read_file(path, entry="d"))
    assert "ijson cannot parse after 0 row(s)" in str(info.value) and "NaN" in str(info.value)


def test_without_ijson_a_json_list_is_read_whole_with_the_same_rows(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "d.json"
    path.write_text(json.dumps(ROWS), encoding="utf-8")
    monkeypatch.setitem(sys.modules, "ijson", None)  # what an environment without the package gives
    assert [r.data for r in read_file(path, entry="d")] == ROWS
    jsonl = tmp_path / "d.jsonl"
    jsonl.write_text("\n".join(json.dumps(row) for row in ROWS), encoding="utf-8")
    assert [r.data for r in read_file(jsonl, entry="d")] == ROWS  # JSON lines need no extra
