"""Where a local dataset's files are: the path rules of `file_name` (core/data/sources.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tuneline.core.data.dataset_info import dataset_file_paths, get_dataset_attrs, load_rows
from tuneline.core.data.sources import file_name_problem
from tuneline.core.errors import DataError

ROW = {"instruction": "Say hi.", "input": "", "output": "Hi."}


def registry(folder: Path, entries: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "dataset_info.json").write_text(json.dumps(entries), encoding="utf-8")
    return folder


def prompts(folder: Path, name: str) -> list[str]:
    rows = load_rows(get_dataset_attrs([name], folder)[0], folder)
    return [row["prompt"][-1]["content"] for row in rows]


def test_absolute_file_name_is_read_as_written(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere" / "rows.json"
    elsewhere.parent.mkdir()
    elsewhere.write_text(json.dumps([ROW]), encoding="utf-8")
    folder = registry(tmp_path / "registry", {"d": {"file_name": str(elsewhere)}})
    assert dataset_file_paths(get_dataset_attrs(["d"], folder)[0], folder) == [elsewhere]
    assert prompts(folder, "d") == ["Say hi."]


def test_absolute_folder_is_read_file_by_file(tmp_path: Path) -> None:
    parts = tmp_path / "parts"
    parts.mkdir()
    (parts / "a.jsonl").write_text(json.dumps({**ROW, "instruction": "first"}) + "\n", encoding="utf-8")
    (parts / "b.jsonl").write_text(json.dumps({**ROW, "instruction": "second"}) + "\n", encoding="utf-8")
    folder = registry(tmp_path / "registry", {"d": {"file_name": str(parts)}})
    assert prompts(folder, "d") == ["first", "second"]


def test_missing_absolute_file_names_the_path_without_the_dataset_folder(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere.json"
    folder = registry(tmp_path / "registry", {"d": {"file_name": str(missing)}})
    with pytest.raises(DataError) as info:
        prompts(folder, "d")
    assert f"but {missing} does not exist; create it or fix file_name." in str(info.value)
    assert "relative to" not in str(info.value)


def test_relative_file_name_stays_relative_to_the_dataset_folder(tmp_path: Path) -> None:
    folder = registry(tmp_path / "registry", {"d": {"file_name": "sub/../sub/rows.json"}})
    (folder / "sub").mkdir()
    (folder / "sub" / "rows.json").write_text(json.dumps([ROW]), encoding="utf-8")
    (tmp_path / "rows.json").write_text(json.dumps([{**ROW, "instruction": "wrong file"}]), encoding="utf-8")
    assert prompts(folder, "d") == ["Say hi."]


@pytest.mark.parametrize("file_name", ["../rows.json", "sub/../../rows.json", "./../registry/../rows.json"])
def test_relative_file_name_may_not_climb_out(tmp_path: Path, file_name: str) -> None:
    (tmp_path / "rows.json").write_text(json.dumps([ROW]), encoding="utf-8")
    folder = registry(tmp_path / "registry", {"d": {"file_name": file_name}})
    with pytest.raises(DataError) as info:
        get_dataset_attrs(["d"], folder)
    message = str(info.value)
    assert f"dataset 'd': file_name '{file_name}' climbs out of the folder of dataset_info.json" in message
    assert "give the data's absolute path" in message


def test_file_name_rules() -> None:
    assert file_name_problem("/data/rows.json") is None
    assert file_name_problem("rows.json") is None
    assert file_name_problem("a/../rows.json") is None
    assert file_name_problem("..rows.json") is None  # a name that starts with dots is no parent
    assert "climbs out" in file_name_problem("a/../../rows.json")
