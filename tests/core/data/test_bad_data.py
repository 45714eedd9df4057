"""Bad data is refused with a message naming the file, the row and the fix; or dropped and
counted when asked (on_bad_row="skip")."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tuneline.core.data.dataset_info import (
    get_dataset_attrs,
    iter_rows,
    load_rows,
    load_rows_with_report,
)
from tuneline.core.errors import ConfigError, DataError, TunelineError

SHAREGPT = {"formatting": "sharegpt"}
OPENAI = {"formatting": "sharegpt", "columns": {"messages": "messages"},
          "tags": {"role_tag": "role", "content_tag": "content", "user_tag": "user",
                   "assistant_tag": "assistant"}}
RANKING = {"formatting": "sharegpt", "ranking": True,
           "columns": {"messages": "conversations", "chosen": "chosen", "rejected": "rejected"}}
KTO = {**OPENAI, "columns": {"messages": "messages", "kto_tag": "label"}}
INFO = "{dir}/dataset_info.json"


def turn(role: str, value: object) -> dict:
    return {"from": role, "value": value}


def chat(*turns: dict) -> dict:
    return {"conversations": list(turns)}


GOOD_CHAT = chat(turn("human", "Q"), turn("gpt", "A"))
GOOD_ALPACA = {"instruction": "Q", "input": "", "output": "A"}


@dataclass
class Case:
    entry: dict
    files: dict[str, object]
    fragments: list[str]
    error: type[TunelineError] = DataError
    name: str = "d"
    info: dict = field(default_factory=dict)


CASES = {
    "malformed_json_line": Case(
        {"file_name": "d.jsonl"}, {"d.jsonl": json.dumps(GOOD_ALPACA) + '\n{"instruction": "Q",\n'},
        ["row 2 (line 2) of {dir}/d.jsonl: is not valid JSON", "fix the line"]),
    "invalid_json_file": Case(
        {"file_name": "d.json"}, {"d.json": '[\n  {"instruction": "Q",}\n]'},
        ["{dir}/d.json is not valid JSON", "at line 2", "Fix the file at that line"]),
    "row_not_an_object": Case(
        {"file_name": "d.jsonl"}, {"d.jsonl": json.dumps(GOOD_ALPACA) + '\n["Q", "A"]\n'},
        ["row 2 (line 2) of {dir}/d.jsonl: is a JSON list", "every row must be an object"]),
    "missing_column": Case(
        {"file_name": "d.json"}, {"d.json": [GOOD_ALPACA, {"instruction": "Q", "input": ""}]},
        ["row 2 of {dir}/d.json: no column 'output' (mapped as response",
         "add it to every row or change the mapping"]),
    "wrong_role_order": Case(
        {"file_name": "d.json", **SHAREGPT},
        {"d.json": [GOOD_CHAT, chat(turn("gpt", "A"), turn("human", "Q"))]},
        ["row 2 of {dir}/d.json: message 0 has from 'gpt' where a user turn",
         "messages must alternate user and assistant"]),
    "unknown_role": Case(
        {"file_name": "d.json", **SHAREGPT}, {"d.json": [chat(turn("bot", "Q"), turn("gpt", "A"))]},
        ["row 1 of {dir}/d.json: message 0 has from 'bot', which is not a role of this entry",
         "set the entry's \"tags\""]),
    "empty_turn_content": Case(
        {"file_name": "d.json", **SHAREGPT},
        {"d.json": [chat(turn("human", "Q"), turn("gpt", " "))]},
        ["row 1 of {dir}/d.json: message 1 has an empty 'value'", "fill it in or remove the row"]),
    "empty_alpaca_prompt": Case(
        {"file_name": "d.json"}, {"d.json": [{"instruction": "", "input": None, "output": "A"}]},
        ["row 1 of {dir}/d.json: the user turn is empty", "fill it in or remove the row"]),
    "no_prompt_column": Case(
        {"file_name": "d.json", "columns": {"response": "output"}}, {"d.json": [GOOD_ALPACA]},
        ["dataset 'd' in " + INFO + " maps neither prompt nor query",
         "map the column that holds the instruction (or the text) as \"prompt\""]),
    "non_string_content": Case(
        {"file_name": "d.jsonl", **OPENAI},
        {"d.jsonl": json.dumps({"messages": [
            {"role": "user", "content": [{"type": "text", "value": "Q"}]},
            {"role": "assistant", "content": "A"}]}) + "\n"},
        ["row 1 (line 1) of {dir}/d.jsonl: message 0 has a list as 'content', not a string",
         "text-only messages"]),
    "non_string_alpaca_value": Case(
        {"file_name": "d.json"}, {"d.json": [{"instruction": "Q", "input": "", "output": 12}]},
        ["row 1 of {dir}/d.json: column 'output' (response) must be a string, got 12"]),
    "odd_message_count": Case(
        {"file_name": "d.json", **SHAREGPT},
        {"d.json": [chat(turn("human", "Q"), turn("gpt", "A"), turn("human", "Q2"))]},
        ["row 1 of {dir}/d.json: has 3 messages besides the system message",
         "needs an even number (user/assistant pairs)"]),
    "ranking_missing_rejected": Case(
        {"file_name": "d.json", **RANKING},
        {"d.json": [{"conversations": [turn("human", "Q")], "chosen": turn("gpt", "A")}]},
        ["row 1 of {dir}/d.json: no column 'rejected' (mapped as rejected",
         "add it to every row"]),
    "ranking_even_message_count": Case(
        {"file_name": "d.json", **RANKING},
        {"d.json": [{**chat(turn("human", "Q"), turn("gpt", "A")), "chosen": turn("gpt", "B"),
                     "rejected": turn("gpt", "C")}]},
        ["row 1 of {dir}/d.json: has 2 messages", "a ranking row needs an odd number"]),
    "kto_tag_not_boolean": Case(
        {"file_name": "d.jsonl", **KTO},
        {"d.jsonl": json.dumps({"messages": [{"role": "user", "content": "Q"},
                                             {"role": "assistant", "content": "A"}],
                                "label": "yes"}) + "\n"},
        ["row 1 (line 1) of {dir}/d.jsonl: column 'label' (kto_tag) must be true or false",
         "mark desirable responses true"]),
    "bad_history": Case(
        {"file_name": "d.json", "columns": {"prompt": "instruction", "response": "output",
                                            "history": "history"}},
        {"d.json": [{"instruction": "Q", "output": "A", "history": [["only one"]]}]},
        ["row 1 of {dir}/d.json: history item 0 in column 'history' must be a [query, response]"]),
    "csv_wrong_field_count": Case(
        {"file_name": "d.csv"}, {"d.csv": "instruction,input,output\nQ,,A\nQ,x,A,extra\n"},
        ["row 2 (line 3) of {dir}/d.csv: has 4 field(s) but the header has 3",
         "quote values that contain commas"]),
    "not_utf8": Case(
        {"file_name": "d.jsonl"}, {"d.jsonl": '{"instruction": "caf\xe9"}\n'.encode("latin-1")},
        ["{dir}/d.jsonl is not UTF-8 text", "Save the file as UTF-8"]),
    "not_parquet": Case(
        {"file_name": "d.parquet"}, {"d.parquet": b"PAR1 but not really"},
        ["{dir}/d.parquet is not a readable Parquet file", "Write it again"]),
    "empty_file": Case(
        {"file_name": "d.jsonl"}, {"d.jsonl": ""},
        ["dataset 'd' in " + INFO + " has no rows: {dir}/d.jsonl holds none", "Add rows"]),
    "header_only_csv": Case(
        {"file_name": "d.csv"}, {"d.csv": "instruction,input,output\n"},
        ["dataset 'd' in " + INFO + " has no rows: {dir}/d.csv holds none"]),
    "empty_folder": Case(
        {"file_name": "parts"}, {"parts/.keep": ""},
        ["folder {dir}/parts is empty; put data files in it"]),
    "mixed_folder_types": Case(
        {"file_name": "parts"}, {"parts/a.json": [GOOD_ALPACA], "parts/b.csv": "instruction\nQ\n"},
        ["folder {dir}/parts mixes file types (csv, json)", "Convert the files to one type"]),
    "unsupported_extension": Case(
        {"file_name": "d.xlsx"}, {"d.xlsx": b"PK"},
        ["cannot read {dir}/d.xlsx (extension '.xlsx'). Supported: .json/.jsonl",
         "Convert the file"]),
    "missing_file": Case(
        {"file_name": "d.json"}, {},
        ["dataset 'd' in " + INFO + " points to file_name 'd.json', but {dir}/d.json does not "
         "exist", "create it or fix file_name"]),
    "path_outside_dataset_dir": Case(
        {"file_name": "../d.json"}, {},
        [INFO + " has an invalid entry: dataset 'd': file_name '../d.json' climbs out of the folder",
         "give the data's absolute path, or move it into that folder"]),
    "missing_absolute_path": Case(
        {"file_name": "/nonexistent/tuneline/d.json"}, {},
        ["points to file_name '/nonexistent/tuneline/d.json', but /nonexistent/tuneline/d.json does not exist; "
         "create it or fix file_name."]),
    "unknown_formatting": Case(
        {"file_name": "d.json", "formatting": "openai"}, {},
        [INFO + " has an invalid entry: dataset 'd': unknown formatting 'openai'",
         "valid: alpaca, sharegpt"]),
    "unknown_column_key": Case(
        {"file_name": "d.json", "columns": {"promt": "instruction"}}, {},
        [INFO, "dataset 'd': unknown column key 'promt'; did you mean 'prompt'?"]),
    "unknown_tag_key": Case(
        {"file_name": "d.json", "formatting": "sharegpt", "tags": {"role": "r"}}, {},
        [INFO, "dataset 'd': unknown tag 'role'; did you mean 'role_tag'?"]),
    "unknown_entry_key": Case(
        {"file_name": "d.json", "colums": {}}, {},
        [INFO, "dataset 'd': unknown key 'colums'; did you mean 'columns'?"]),
    "ranking_and_kto": Case(
        {"file_name": "d.json", "ranking": True,
         "columns": {"prompt": "q", "chosen": "c", "rejected": "r", "kto_tag": "k"}}, {},
        [INFO, "ranking (pairwise) and columns.kto_tag (feedback) exclude each other"]),
    "txt_without_text_column": Case(
        {"file_name": "d.txt"}, {"d.txt": "one\ntwo\n"},
        ["dataset 'd' in " + INFO + " reads .txt files, which have one column, 'text'",
         "Set \"columns\": {\"prompt\": \"text\"}"]),
    "split_of_local_file": Case(
        {"file_name": "d.json", "split": "validation"}, {"d.json": [GOOD_ALPACA]},
        ["asks for split 'validation', but a local file holds only the 'train' split"]),
    "modelscope_only": Case(
        {"ms_hub_url": "someone/data"}, {},
        ["dataset 'd' in " + INFO + " loads from ms_hub_url 'someone/data'",
         "set \"file_name\" to it"]),
    "dataset_not_registered": Case(
        {"file_name": "d.json"}, {}, name="nope",
        fragments=["unknown dataset 'nope'", INFO, "add an entry for it to that file"]),
}


def build(tmp_path: Path, case: Case) -> Path:
    (tmp_path / "dataset_info.json").write_text(json.dumps({"d": case.entry}), encoding="utf-8")
    for name, content in case.files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content if isinstance(content, str) else json.dumps(content),
                            encoding="utf-8")
    return tmp_path


@pytest.mark.parametrize("case_id", sorted(CASES))
def test_bad_data_is_refused_with_file_row_and_fix(tmp_path: Path, case_id: str) -> None:
    case = CASES[case_id]
    folder = build(tmp_path, case)
    with pytest.raises(case.error) as info:
        load_rows(get_dataset_attrs([case.name], folder)[0], folder)
    message = str(info.value)
    for fragment in case.fragments:
        assert fragment.replace("{dir}", str(folder)) in message, (case_id, message)
    assert info.value.exit_code == 2


def test_hub_offline_says_how_to_use_a_local_file(tmp_path: Path, monkeypatch) -> None:
    import datasets
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "cache")
    folder = build(tmp_path, Case({"hf_hub_url": "someone/data", "subset": "en"}, {}, []))
    attr = get_dataset_attrs(["d"], folder)[0]
    for load in (load_rows, lambda a, d: next(iter_rows(a, d))):
        with pytest.raises(DataError) as info:
            load(attr, folder)
        message = str(info.value)
        assert message.startswith(f"dataset 'd' in {folder / 'dataset_info.json'}: cannot load "
                                  "hf_hub_url 'someone/data': the hub is offline here")
        assert 'replace hf_hub_url with "file_name": "d.jsonl"' in message
        assert isinstance(info.value.__cause__, Exception)


def test_missing_dataset_info_names_the_folder(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="no dataset_info.json in dataset_dir") as info:
        get_dataset_attrs(["d"], tmp_path / "nowhere")
    assert f"{tmp_path / 'nowhere'} itself does not exist" in str(info.value)


def test_unknown_on_bad_row_is_a_config_error(tmp_path: Path) -> None:
    folder = build(tmp_path, Case({"file_name": "d.json"}, {"d.json": [GOOD_ALPACA]}, []))
    with pytest.raises(ConfigError, match="on_bad_row must be one of error, skip, not 'drop'"):
        load_rows(get_dataset_attrs(["d"], folder)[0], folder, on_bad_row="drop")


# --- lenient mode -----------------------------------------------------------------------

MIXED_ROWS = [
    GOOD_CHAT,
    chat(turn("gpt", "A"), turn("human", "Q")),                       # wrong_role_order
    chat(turn("human", "Q"), turn("gpt", "A"), turn("human", "Q2")),  # message_count
    chat(turn("human", "Q"), turn("gpt", "")),                        # empty_content
    {"messages": []},                                                 # missing_column
    chat(turn("human", ["Q"]), turn("gpt", "A")),                     # non_string_content
    chat(turn("system", "S"), turn("human", "Q2"), turn("gpt", "A2")),
] + [chat(turn("gpt", "A"))] * 4                                      # wrong_role_order x4


def mixed_folder(tmp_path: Path) -> Path:
    lines = "".join(json.dumps(row) + "\n" for row in MIXED_ROWS) + "{oops\n"
    return build(tmp_path, Case({"file_name": "d.jsonl", **SHAREGPT}, {"d.jsonl": lines}, []))


def test_error_mode_lists_five_bad_rows_and_counts_all(tmp_path: Path) -> None:
    folder = mixed_folder(tmp_path)
    with pytest.raises(DataError) as info:
        load_rows(get_dataset_attrs(["d"], folder)[0], folder)
    message = str(info.value)
    assert message.startswith(f"dataset 'd' in {folder / 'dataset_info.json'}: 10 row(s) "
                              "cannot be used (empty_content: 1, invalid_json: 1, message_count: "
                              "1, missing_column: 1, non_string_content: 1, wrong_role_order: 5)")
    assert f"row 2 (line 2) of {folder / 'd.jsonl'}: message 0 has from 'gpt'" in message
    assert f"row 6 (line 6) of {folder / 'd.jsonl'}" in message
    assert "row 8 (line 8)" not in message and "and 5 more" in message
    assert "or set on_bad_row: skip to drop them" in message


def test_skip_mode_drops_and_counts_by_reason(tmp_path: Path) -> None:
    folder = mixed_folder(tmp_path)
    attr = get_dataset_attrs(["d"], folder)[0]
    rows, report = load_rows_with_report(attr, folder, on_bad_row="skip")
    assert [r["prompt"][0]["content"] for r in rows] == ["Q", "Q2"]
    assert rows[1]["system"] == "S"
    assert report.dropped == {"wrong_role_order": 5, "message_count": 1, "empty_content": 1,
                              "missing_column": 1, "non_string_content": 1, "invalid_json": 1}
    assert (report.rows_read, report.rows_kept, report.rows_dropped) == (12, 2, 10)
    assert len(report.examples) == 5 and report.examples[0].startswith("row 2 (line 2) of ")
    assert report.summary() == (
        "dataset 'd': kept 2 of 12 rows; dropped 10 (empty_content: 1, invalid_json: 1, "
        "message_count: 1, missing_column: 1, non_string_content: 1, wrong_role_order: 5)")
    assert load_rows(attr, folder, on_bad_row="skip") == rows
    assert list(iter_rows(attr, folder, on_bad_row="skip")) == rows


def test_skip_mode_with_max_samples_counts_raw_rows(tmp_path: Path) -> None:
    folder = mixed_folder(tmp_path)
    attr = get_dataset_attrs(["d"], folder)[0]
    rows, report = load_rows_with_report(attr, folder, on_bad_row="skip", max_samples=3)
    assert len(rows) == 1 and report.dropped == {"wrong_role_order": 1, "message_count": 1}


def test_skip_mode_still_refuses_when_every_row_is_bad(tmp_path: Path) -> None:
    folder = build(tmp_path, Case({"file_name": "d.json", **SHAREGPT},
                                  {"d.json": [chat(turn("gpt", "A"))] * 3}, []))
    with pytest.raises(DataError) as info:
        load_rows(get_dataset_attrs(["d"], folder)[0], folder, on_bad_row="skip")
    message = str(info.value)
    assert "all 3 rows are bad and were dropped (wrong_role_order: 3)" in message
    assert f"first: row 1 of {folder / 'd.json'}" in message
