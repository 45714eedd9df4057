"""dataset_info.json reading and local dataset loading, on tmp files and the shipped demo data."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tuneline.core.data.dataset_info import (
    DEFAULT_TAGS,
    DatasetAttr,
    dataset_file_paths,
    get_dataset_attrs,
    load_rows,
    read_dataset_info,
)
from tuneline.core.errors import DataError

DATA_DIR = Path(__file__).resolve().parents[3] / "data"
DEMO_FILES = ["dataset_info.json", "demo_pretrain.jsonl", "demo_alpaca.json",
              "demo_sharegpt.json", "demo_heldout.json"]


def write_dataset(tmp_path: Path, entries: dict, files: dict[str, object]) -> Path:
    """A dataset folder with `entries` as dataset_info.json and each file as JSON (list) or
    JSON lines (a str is written as is)."""
    (tmp_path / "dataset_info.json").write_text(json.dumps(entries), encoding="utf-8")
    for name, content in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        text = content if isinstance(content, str) else json.dumps(content)
        path.write_text(text, encoding="utf-8")
    return tmp_path


def load(tmp_path: Path, name: str) -> list[dict]:
    return load_rows(get_dataset_attrs([name], tmp_path)[0], tmp_path)


def turn(role: str, content: str, **tags: str) -> dict:
    return {tags.get("role", "from"): role, tags.get("content", "value"): content}


def conversation(*pairs: tuple[str, str]) -> list[dict]:
    return [turn(role, content) for role, content in pairs]


# --- shipped demo data ------------------------------------------------------------------


def assert_standard(row: dict) -> None:
    assert set(row) == {"prompt", "response", "system", "tools"}
    assert isinstance(row["system"], str) and isinstance(row["tools"], str)
    for message in row["prompt"] + row["response"]:
        assert set(message) == {"role", "content"}
        assert message["role"] in {"user", "assistant", "observation", "function"}
        assert isinstance(message["content"], str) and message["content"]
    json.dumps(row)


@pytest.mark.parametrize(("name", "low", "high"), [
    ("demo_pretrain", 2500, 3500), ("demo_alpaca", 1200, 1800),
    ("demo_sharegpt", 250, 400), ("demo_heldout", 40, 100),
])
def test_shipped_demo_datasets_load_in_standard_shape(name: str, low: int, high: int) -> None:
    rows = load_rows(get_dataset_attrs([name], DATA_DIR)[0], DATA_DIR)
    assert low <= len(rows) <= high
    for row in rows:
        assert_standard(row)
        assert row["prompt"][0]["role"] == "user"
        expected_response = [] if name == "demo_pretrain" else ["assistant"]
        assert [m["role"] for m in row["response"]] == expected_response


def test_shipped_alpaca_joins_input_and_sharegpt_keeps_system() -> None:
    alpaca = load_rows(get_dataset_attrs(["demo_alpaca"], DATA_DIR)[0], DATA_DIR)
    joined = [r for r in alpaca if "\n" in r["prompt"][0]["content"]]
    assert 200 < len(joined) < len(alpaca)
    france = [r for r in alpaca
              if r["prompt"][0]["content"] == "Answer the question.\nWhat is the capital of France?"]
    assert france and france[0]["response"][0]["content"] == "The capital of France is Paris."

    sharegpt = load_rows(get_dataset_attrs(["demo_sharegpt"], DATA_DIR)[0], DATA_DIR)
    with_system = [r for r in sharegpt if r["system"]]
    assert 0 < len(with_system) < len(sharegpt) / 2
    assert {len(r["prompt"]) for r in sharegpt} == {3, 5}


def test_heldout_questions_never_appear_in_fine_tuning_data() -> None:
    alpaca = json.loads((DATA_DIR / "demo_alpaca.json").read_text())
    sharegpt = json.loads((DATA_DIR / "demo_sharegpt.json").read_text())
    heldout = json.loads((DATA_DIR / "demo_heldout.json").read_text())
    asked = {r["instruction"] for r in alpaca} | {r["input"] for r in alpaca}
    asked |= {m["value"] for r in sharegpt for m in r["conversations"] if m["from"] == "human"}
    held = {r["instruction"] for r in heldout}
    assert len(held) == len(heldout) >= 50
    assert held.isdisjoint(asked)
    answers = {r["output"] for r in alpaca}
    assert {r["output"] for r in heldout}.isdisjoint(answers)
    kinds = {"capital of", "opposite of", "color is", "sound does", "plural of", "plus", "minus"}
    assert all(any(k in q for q in held) for k in kinds)


def test_generator_reproduces_the_shipped_files(tmp_path: Path) -> None:
    script = DATA_DIR / "generate_demo_data.py"
    subprocess.run([sys.executable, str(script), "--out-dir", str(tmp_path)], check=True,
                   capture_output=True)
    for name in DEMO_FILES:
        assert (tmp_path / name).read_bytes() == (DATA_DIR / name).read_bytes(), name
    assert sum((DATA_DIR / name).stat().st_size for name in DEMO_FILES) < 2_000_000


# --- dataset_info.json entries ----------------------------------------------------------


def test_entry_defaults_follow_llamafactory(tmp_path: Path) -> None:
    write_dataset(tmp_path, {
        "a": {"file_name": "a.json"},
        "s": {"file_name": "s.json", "formatting": "sharegpt", "tags": {"role_tag": "role"}},
        "p": {"file_name": "p.jsonl", "columns": {"prompt": "text"}, "num_samples": 3},
    }, {})
    attrs = read_dataset_info(tmp_path)
    assert attrs["a"] == DatasetAttr(name="a", file_name="a.json", columns={
        "prompt": "instruction", "query": "input", "response": "output"})
    assert attrs["s"].columns == {"messages": "conversations"}
    assert attrs["s"].tags == {**DEFAULT_TAGS, "role_tag": "role"}
    assert attrs["p"].columns == {"prompt": "text"}
    assert attrs["p"].num_samples == 3 and attrs["p"].split == "train"


def test_every_bad_entry_is_reported_at_once(tmp_path: Path) -> None:
    write_dataset(tmp_path, {
        "typo": {"file_name": "a.json", "colums": {"prompt": "q"}},
        "fmt": {"file_name": "a.json", "formatting": "sharegtp"},
        "col": {"file_name": "a.json", "columns": {"messages": "conversations"}},
        "up": {"file_name": "../secret.json"},
        "none": {"formatting": "alpaca"},
        "n": {"file_name": "a.json", "num_samples": 0},
    }, {})
    with pytest.raises(DataError) as info:
        read_dataset_info(tmp_path)
    message = str(info.value)
    assert str(tmp_path / "dataset_info.json") in message
    assert "6 problems" in message
    assert "dataset 'typo': unknown key 'colums'; did you mean 'columns'?" in message
    assert "dataset 'fmt': unknown formatting 'sharegtp'; did you mean 'sharegpt'?" in message
    assert "dataset 'col': column key 'messages' belongs to sharegpt" in message
    assert "dataset 'up': file_name '../secret.json' climbs out of the folder" in message
    assert "dataset 'none': it has no file_name" in message
    assert "dataset 'n': num_samples must be a positive integer, not 0" in message


def test_only_the_named_entries_must_be_valid(tmp_path: Path, caplog) -> None:
    write_dataset(tmp_path, {
        "good": {"file_name": "a.json"},
        "typo": {"file_name": "a.json", "colums": {"prompt": "q"}},
    }, {"a.json": [{"instruction": "Hi.", "input": "", "output": "Hello."}]})
    with caplog.at_level("WARNING", logger="tuneline.core.data.dataset_info"):
        (attr,) = get_dataset_attrs(["good"], tmp_path)
        get_dataset_attrs(["good"], tmp_path)
    assert attr.name == "good" and load_rows(attr, tmp_path)[0]["response"][0]["content"] == "Hello."
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 1  # told once, however often the run reads the file
    assert "dataset 'typo': unknown key 'colums'; did you mean 'columns'?" in warned[0]
    assert "not used by this run" in warned[0]


def test_a_named_bad_entry_is_an_error_with_every_problem(tmp_path: Path) -> None:
    write_dataset(tmp_path, {
        "good": {"file_name": "a.json"},
        "bad": {"file_name": "../a.json", "num_samples": 0},
        "other": {"formatting": "sharegtp"},
    }, {})
    with pytest.raises(DataError) as info:
        get_dataset_attrs(["good", "bad"], tmp_path)
    message = str(info.value)
    assert "2 problems" in message
    assert "dataset 'bad': file_name '../a.json' climbs out" in message
    assert "dataset 'bad': num_samples must be a positive integer, not 0" in message
    assert "other" not in message


def test_missing_dataset_info_names_the_folder(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="no dataset_info.json in dataset_dir") as info:
        read_dataset_info(tmp_path)
    assert str(tmp_path) in str(info.value)


def test_invalid_dataset_info_json_names_file_and_line(tmp_path: Path) -> None:
    (tmp_path / "dataset_info.json").write_text('{\n  "a": {"file_name": "a.json",}\n}\n')
    with pytest.raises(DataError) as info:
        read_dataset_info(tmp_path)
    assert f"{tmp_path / 'dataset_info.json'} is not valid JSON" in str(info.value)
    assert "line 2" in str(info.value)


def test_unknown_dataset_name_suggests_nearest(tmp_path: Path) -> None:
    write_dataset(tmp_path, {"demo_alpaca": {"file_name": "a.json"}}, {})
    with pytest.raises(DataError) as info:
        get_dataset_attrs(["demo_alpacca"], tmp_path)
    message = str(info.value)
    assert "unknown dataset 'demo_alpacca'; did you mean 'demo_alpaca'?" in message
    assert str(tmp_path / "dataset_info.json") in message


# --- files ------------------------------------------------------------------------------


def test_missing_file_names_entry_and_path(tmp_path: Path) -> None:
    write_dataset(tmp_path, {"x": {"file_name": "y.json"}}, {})
    with pytest.raises(DataError) as info:
        load(tmp_path, "x")
    info_path = tmp_path / "dataset_info.json"
    assert str(info.value).startswith(
        f"dataset 'x' in {info_path} points to file_name 'y.json', but {tmp_path / 'y.json'} "
        "does not exist;")


def test_escaping_file_name_is_refused_when_loading(tmp_path: Path) -> None:
    attr = DatasetAttr(name="x", file_name="../outside.json")
    with pytest.raises(DataError, match="file_name '../outside.json' climbs out of the folder"):
        dataset_file_paths(attr, tmp_path)


def test_invalid_jsonl_names_the_line(tmp_path: Path) -> None:
    write_dataset(tmp_path, {"p": {"file_name": "p.jsonl", "columns": {"prompt": "text"}}},
                  {"p.jsonl": '{"text": "one"}\n\n{"text": "two"\n'})
    with pytest.raises(DataError) as info:
        load(tmp_path, "p")
    assert f"row 2 (line 3) of {tmp_path / 'p.jsonl'}: is not valid JSON" in str(info.value)


def test_folder_of_files_is_read_in_name_order(tmp_path: Path) -> None:
    write_dataset(tmp_path, {"p": {"file_name": "parts", "columns": {"prompt": "text"}}}, {
        "parts/b.jsonl": '{"text": "second"}\n{"text": "third"}\n',
        "parts/a.json": [{"text": "first"}],
    })
    attr = get_dataset_attrs(["p"], tmp_path)[0]
    assert dataset_file_paths(attr, tmp_path) == [tmp_path / "parts/a.json",
                                                  tmp_path / "parts/b.jsonl"]
    rows = load_rows(attr, tmp_path)
    assert [r["prompt"] for r in rows] == [[{"role": "user", "content": t}]
                                           for t in ("first", "second", "third")]
    assert all(r["response"] == [] for r in rows)


# --- alpaca -----------------------------------------------------------------------------


def test_alpaca_joins_instruction_and_input_and_keeps_history(tmp_path: Path) -> None:
    columns = {"prompt": "instruction", "query": "input", "response": "output",
               "history": "history", "system": "system"}
    write_dataset(tmp_path, {"a": {"file_name": "a.json", "columns": columns}}, {"a.json": [
        {"instruction": "Answer the question.", "input": "What is 7 plus 5?",
         "output": "7 plus 5 is 12.", "history": [], "system": ""},
        {"instruction": "What is the opposite of hot?", "input": "", "output": "cold",
         "history": [["Hi", "Hello."], ["What is 1 plus 1?", "2"]], "system": "Be brief."},
    ]})
    first, second = load(tmp_path, "a")
    assert first == {
        "prompt": [{"role": "user", "content": "Answer the question.\nWhat is 7 plus 5?"}],
        "response": [{"role": "assistant", "content": "7 plus 5 is 12."}],
        "system": "", "tools": "",
    }
    assert second["prompt"] == [
        {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "What is 1 plus 1?"}, {"role": "assistant", "content": "2"},
        {"role": "user", "content": "What is the opposite of hot?"},
    ]
    assert second["system"] == "Be brief."


def test_missing_required_column_names_the_row(tmp_path: Path) -> None:
    write_dataset(tmp_path, {"a": {"file_name": "a.json"}}, {"a.json": [
        {"instruction": "q0", "input": "", "output": "r0"},
        {"instruction": "q1", "input": ""},
    ]})
    with pytest.raises(DataError) as info:
        load(tmp_path, "a")
    message = str(info.value)
    assert f"dataset 'a' in {tmp_path / 'dataset_info.json'}" in message
    assert f"row 2 of {tmp_path / 'a.json'}: no column 'output' (mapped as response" in message
    assert "1 row(s)" in message


def test_missing_optional_column_reads_as_empty_as_in_llamafactory(tmp_path: Path) -> None:
    write_dataset(tmp_path, {"a": {"file_name": "a.json"}}, {"a.json": [
        {"instruction": "q0", "input": "i0", "output": "r0"},
        {"instruction": "q1", "output": "r1"},
    ]})
    rows = load(tmp_path, "a")
    assert [r["prompt"][-1]["content"] for r in rows] == ["q0\ni0", "q1"]


def test_num_samples_takes_first_rows_and_cycles(tmp_path: Path) -> None:
    rows = [{"text": f"t{i}"} for i in range(4)]
    write_dataset(tmp_path, {
        "few": {"file_name": "p.json", "columns": {"prompt": "text"}, "num_samples": 2},
        "many": {"file_name": "p.json", "columns": {"prompt": "text"}, "num_samples": 6},
    }, {"p.json": rows})
    texts = lambda name: [r["prompt"][0]["content"] for r in load(tmp_path, name)]  # noqa: E731
    assert texts("few") == ["t0", "t1"]
    assert texts("many") == ["t0", "t1", "t2", "t3", "t0", "t1"]


# --- sharegpt ---------------------------------------------------------------------------


def test_sharegpt_system_message_roles_and_tools(tmp_path: Path) -> None:
    entry = {"file_name": "s.json", "formatting": "sharegpt",
             "columns": {"messages": "conversations", "system": "system", "tools": "tools"}}
    write_dataset(tmp_path, {"s": entry}, {"s.json": [
        {"conversations": conversation(("system", "From messages."), ("human", "Hi"),
                                       ("gpt", "Hello.")),
         "system": "From column.", "tools": ""},
        {"conversations": conversation(("human", "Weather?"), ("function_call", "{}"),
                                       ("observation", "sunny"), ("gpt", "It is sunny.")),
         "system": "From column.", "tools": [{"name": "weather"}]},
    ]})
    first, second = load(tmp_path, "s")
    assert first["system"] == "From messages."
    assert first["prompt"] == [{"role": "user", "content": "Hi"}]
    assert first["response"] == [{"role": "assistant", "content": "Hello."}]
    assert second["system"] == "From column."
    assert [m["role"] for m in second["prompt"]] == ["user", "function", "observation"]
    assert second["response"] == [{"role": "assistant", "content": "It is sunny."}]
    assert json.loads(second["tools"]) == [{"name": "weather"}]


def test_sharegpt_custom_tags_keep_defaults_for_the_rest(tmp_path: Path) -> None:
    tags = {"role_tag": "role", "content_tag": "content", "user_tag": "user",
            "assistant_tag": "assistant"}
    entry = {"file_name": "s.jsonl", "formatting": "sharegpt", "columns": {"messages": "m"},
             "tags": tags}
    line = {"m": [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"},
                  {"role": "assistant", "content": "A"}]}
    write_dataset(tmp_path, {"s": entry}, {"s.jsonl": json.dumps(line) + "\n"})
    (row,) = load(tmp_path, "s")
    assert row["system"] == "S"
    assert row["prompt"] == [{"role": "user", "content": "Q"}]


def test_sharegpt_bad_rows_are_refused_with_index_and_count(tmp_path: Path) -> None:
    good = conversation(("human", "Q"), ("gpt", "A"))
    bad_order = conversation(("gpt", "A"), ("human", "Q"))
    odd = conversation(("human", "Q"), ("gpt", "A"), ("human", "Q2"))
    rows = [{"conversations": c} for c in [good, bad_order, odd] + [bad_order] * 5]
    entry = {"file_name": "s.json", "formatting": "sharegpt"}
    write_dataset(tmp_path, {"s": entry}, {"s.json": rows})
    with pytest.raises(DataError) as info:
        load(tmp_path, "s")
    message = str(info.value)
    path = tmp_path / "s.json"
    assert message.startswith(f"dataset 's' in {tmp_path / 'dataset_info.json'}: 7 row(s)")
    assert f"row 2 of {path}: message 0 has from 'gpt' where a user turn" in message
    assert f"row 3 of {path}: has 3 messages" in message
    assert f"row 6 of {path}" in message and f"row 7 of {path}" not in message
    assert "and 2 more" in message


def test_sharegpt_ranking_rows(tmp_path: Path) -> None:
    entry = {"file_name": "d.json", "formatting": "sharegpt", "ranking": True,
             "columns": {"messages": "conversations", "chosen": "chosen", "rejected": "rejected"}}
    write_dataset(tmp_path, {"d": entry}, {"d.json": [
        {"conversations": conversation(("human", "Q")),
         "chosen": turn("gpt", "good"), "rejected": turn("gpt", "bad")},
    ]})
    (row,) = load(tmp_path, "d")
    assert row["prompt"] == [{"role": "user", "content": "Q"}]
    assert row["response"] == [{"role": "assistant", "content": "good"},
                               {"role": "assistant", "content": "bad"}]


def test_rows_must_be_objects_in_a_list_or_lines(tmp_path: Path) -> None:
    entry = {"columns": {"prompt": "text"}}
    write_dataset(tmp_path, {"line": {"file_name": "line.json", **entry},
                             "obj": {"file_name": "obj.json", **entry},
                             "row": {"file_name": "row.jsonl", **entry}},
                  {"line.json": '{"text": "a"}\n', "obj.json": '{\n  "text": "a"\n}\n',
                   "row.jsonl": '{"text": "a"}\n["b"]\n'})
    # One object per line is JSON lines, whatever the extension (as `datasets` reads it).
    assert [r["prompt"][0]["content"] for r in load(tmp_path, "line")] == ["a"]
    with pytest.raises(DataError, match=r"obj\.json holds a JSON dict, but a \.json dataset"):
        load(tmp_path, "obj")
    with pytest.raises(DataError) as info:
        load(tmp_path, "row")
    assert f"row 2 (line 2) of {tmp_path / 'row.jsonl'}: is a JSON list" in str(info.value)


def test_system_only_conversation_is_refused(tmp_path: Path) -> None:
    write_dataset(tmp_path, {"s": {"file_name": "s.json", "formatting": "sharegpt"}},
                  {"s.json": [{"conversations": conversation(("system", "S"))}]})
    with pytest.raises(DataError, match="row 1 of .*s.json: has no messages besides the system"):
        load(tmp_path, "s")


def test_picture_generator_reproduces_the_shipped_pictures_and_rows(tmp_path: Path) -> None:
    """The same rows byte for byte and the same pixels (PNG bytes may differ between zlib builds)."""
    from PIL import Image, ImageChops

    subprocess.run([sys.executable, str(DATA_DIR / "generate_picture_data.py"), "--out-dir", str(tmp_path)], check=True,
                   capture_output=True)
    shipped = DATA_DIR / "picture_demo"
    for name in ("dataset_info.json", "picture_questions.json", "picture_heldout.json", "picture_pairs.json"):
        assert (tmp_path / name).read_bytes() == (shipped / name).read_bytes(), name
    drawn = sorted(path.name for path in (tmp_path / "pictures").iterdir())
    assert drawn == sorted(path.name for path in (shipped / "pictures").iterdir())
    for name in drawn:
        with Image.open(tmp_path / "pictures" / name) as new, Image.open(shipped / "pictures" / name) as old:
            assert ImageChops.difference(new.convert("RGB"), old.convert("RGB")).getbbox() is None, name
