"""File formats, OpenAI-style messages, KTO and pairwise rows, sampling and streaming."""

from __future__ import annotations

import json
from itertools import islice
from pathlib import Path

import pytest

from tuneline.core.data.dataset_info import (
    LoadReport,
    dataset_file_paths,
    get_dataset_attrs,
    iter_rows,
    load_rows,
    load_rows_with_report,
)
from tuneline.core.errors import DataError

ALPACA = [
    {"instruction": "Add the numbers.", "input": "7 and 5", "output": "12"},
    {"instruction": "Say hi, politely.", "input": "", "output": "Hello,\n\"friend\"."},
    {"instruction": "Name a colour.", "input": None, "output": "Blue"},
]
EXPECTED_PROMPTS = ["Add the numbers.\n7 and 5", "Say hi, politely.", "Name a colour."]
EXPECTED_RESPONSES = ["12", "Hello,\n\"friend\".", "Blue"]


def write_info(folder: Path, entries: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "dataset_info.json").write_text(json.dumps(entries), encoding="utf-8")
    return folder


def load(folder: Path, name: str, **kwargs) -> list[dict]:
    return load_rows(get_dataset_attrs([name], folder)[0], folder, **kwargs)


def write_table(path: Path, rows: list[dict], kind: str) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pylist(rows)
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "parquet":
        pq.write_table(table, path)
        return
    writer = pa.ipc.new_stream if kind == "arrow_stream" else pa.ipc.new_file
    with pa.OSFile(str(path), "wb") as sink, writer(sink, table.schema) as out:
        out.write_table(table)


def write_csv(path: Path, rows: list[dict]) -> None:
    import csv

    with path.open("w", encoding="utf-8", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows({k: "" if v is None else v for k, v in row.items()} for row in rows)


WRITERS = {
    "list.json": lambda p, rows: p.write_text(json.dumps(rows), encoding="utf-8"),
    "lines.jsonl": lambda p, rows: p.write_text("".join(json.dumps(r) + "\n" for r in rows)),
    "lines.json": lambda p, rows: p.write_text("\n".join(json.dumps(r) for r in rows)),
    "list.jsonl": lambda p, rows: p.write_text(json.dumps(rows, indent=2)),
    "rows.csv": write_csv,
    "rows.parquet": lambda p, rows: write_table(p, rows, "parquet"),
    "stream.arrow": lambda p, rows: write_table(p, rows, "arrow_stream"),
    "file.arrow": lambda p, rows: write_table(p, rows, "arrow_file"),
}


@pytest.mark.parametrize("file_name", sorted(WRITERS))
def test_every_file_type_gives_the_same_rows(tmp_path: Path, file_name: str) -> None:
    WRITERS[file_name](tmp_path / file_name, ALPACA)
    write_info(tmp_path, {"d": {"file_name": file_name}})
    rows = load(tmp_path, "d")
    assert [r["prompt"] for r in rows] == [[{"role": "user", "content": p}]
                                           for p in EXPECTED_PROMPTS]
    assert [r["response"][0]["content"] for r in rows] == EXPECTED_RESPONSES
    assert list(iter_rows(get_dataset_attrs(["d"], tmp_path)[0], tmp_path)) == rows


@pytest.mark.parametrize("suffix", ["parquet", "csv", "jsonl"])
def test_folder_of_one_file_type_reads_in_name_order(tmp_path: Path, suffix: str) -> None:
    writer = {"parquet": WRITERS["rows.parquet"], "csv": write_csv,
              "jsonl": WRITERS["lines.jsonl"]}[suffix]
    (tmp_path / "parts").mkdir()
    writer(tmp_path / "parts" / f"b.{suffix}", ALPACA[1:])
    writer(tmp_path / "parts" / f"a.{suffix}", ALPACA[:1])
    write_info(tmp_path, {"d": {"file_name": "parts"}})
    attr = get_dataset_attrs(["d"], tmp_path)[0]
    assert [p.name for p in dataset_file_paths(attr, tmp_path)] == [f"a.{suffix}", f"b.{suffix}"]
    assert [r["response"][0]["content"] for r in load_rows(attr, tmp_path)] == EXPECTED_RESPONSES


def test_csv_keeps_text_as_text(tmp_path: Path) -> None:
    (tmp_path / "t.csv").write_text(
        'instruction,input,output\r\n"Say ""a, b""",,007\r\n"Two\nlines",x,1.50\r\n',
        encoding="utf-8")
    write_info(tmp_path, {"t": {"file_name": "t.csv"}})
    rows = load(tmp_path, "t")
    assert [r["prompt"][0]["content"] for r in rows] == ['Say "a, b"', "Two\nlines\nx"]
    assert [r["response"][0]["content"] for r in rows] == ["007", "1.50"]


def test_parquet_nested_messages_and_many_batches(tmp_path: Path) -> None:
    rows = [{"conversations": [{"from": "human", "value": f"q{i}"},
                               {"from": "gpt", "value": f"a{i}"}]} for i in range(2500)]
    write_table(tmp_path / "s.parquet", rows, "parquet")
    write_info(tmp_path, {"s": {"file_name": "s.parquet", "formatting": "sharegpt"}})
    loaded = load(tmp_path, "s")
    assert len(loaded) == 2500
    assert loaded[2049]["prompt"] == [{"role": "user", "content": "q2049"}]
    assert loaded[2049]["response"] == [{"role": "assistant", "content": "a2049"}]


def test_arrow_written_by_datasets_loads(tmp_path: Path) -> None:
    from datasets import Dataset

    Dataset.from_list(ALPACA).save_to_disk(str(tmp_path / "saved"))
    (arrow,) = (tmp_path / "saved").glob("*.arrow")
    write_info(tmp_path, {"d": {"file_name": f"saved/{arrow.name}"}})
    assert [r["response"][0]["content"] for r in load(tmp_path, "d")] == EXPECTED_RESPONSES


def test_text_file_rows_skip_blank_lines(tmp_path: Path) -> None:
    (tmp_path / "t.txt").write_bytes(b"first line\r\n\r\nsecond, with \"quotes\"\nlast")
    write_info(tmp_path, {"t": {"file_name": "t.txt", "columns": {"prompt": "text"}}})
    rows = load(tmp_path, "t")
    assert [r["prompt"] for r in rows] == [[{"role": "user", "content": t}] for t in
                                           ("first line", 'second, with "quotes"', "last")]
    assert all(r["response"] == [] for r in rows)


OPENAI_TAGS = {"role_tag": "role", "content_tag": "content", "user_tag": "user",
               "assistant_tag": "assistant", "system_tag": "system", "observation_tag": "tool",
               "function_tag": "tool_call"}


def test_openai_messages_through_tags(tmp_path: Path) -> None:
    messages = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Weather in Paris?"},
                {"role": "tool_call", "content": '{"name": "weather"}'},
                {"role": "tool", "content": "sunny"},
                {"role": "assistant", "content": "Sunny."}]
    (tmp_path / "m.jsonl").write_text(json.dumps({"messages": messages, "tools": []}) + "\n")
    write_info(tmp_path, {"m": {"file_name": "m.jsonl", "formatting": "sharegpt",
                                "columns": {"messages": "messages", "tools": "tools"},
                                "tags": OPENAI_TAGS}})
    (row,) = load(tmp_path, "m")
    assert row == {
        "prompt": [{"role": "user", "content": "Weather in Paris?"},
                   {"role": "function", "content": '{"name": "weather"}'},
                   {"role": "observation", "content": "sunny"}],
        "response": [{"role": "assistant", "content": "Sunny."}],
        "system": "Be brief.", "tools": "[]",
    }


def test_alpaca_feedback_and_pairwise_rows(tmp_path: Path) -> None:
    write_csv(tmp_path / "k.csv", [{"instruction": "q", "output": "good", "label": "true"},
                                   {"instruction": "q", "output": "bad", "label": "False"}])
    (tmp_path / "p.json").write_text(json.dumps(
        [{"instruction": "q", "chosen": "good", "rejected": "bad", "system": "S"}]))
    write_info(tmp_path, {
        "k": {"file_name": "k.csv",
              "columns": {"prompt": "instruction", "response": "output", "kto_tag": "label"}},
        "p": {"file_name": "p.json", "ranking": True,
              "columns": {"prompt": "instruction", "chosen": "chosen", "rejected": "rejected",
                          "system": "system"}},
    })
    good, bad = load(tmp_path, "k")
    assert (good["kto_tag"], bad["kto_tag"]) == (True, False)
    assert good["response"] == [{"role": "assistant", "content": "good"}]
    (pair,) = load(tmp_path, "p")
    assert pair == {"prompt": [{"role": "user", "content": "q"}],
                    "response": [{"role": "assistant", "content": "good"},
                                 {"role": "assistant", "content": "bad"}],
                    "system": "S", "tools": ""}


def numbered(tmp_path: Path, count: int, **entry) -> Path:
    (tmp_path / "n.jsonl").write_text("".join(json.dumps({"text": f"t{i}"}) + "\n"
                                              for i in range(count)))
    return write_info(tmp_path, {"n": {"file_name": "n.jsonl", "columns": {"prompt": "text"},
                                       **entry}})


def texts(rows: list[dict]) -> list[str]:
    return [r["prompt"][0]["content"] for r in rows]


def test_num_samples_then_max_samples(tmp_path: Path) -> None:
    numbered(tmp_path, 3, num_samples=7)
    attr = get_dataset_attrs(["n"], tmp_path)[0]
    assert texts(load_rows(attr, tmp_path)) == ["t0", "t1", "t2", "t0", "t1", "t2", "t0"]
    assert texts(load_rows(attr, tmp_path, max_samples=4)) == ["t0", "t1", "t2", "t0"]
    assert texts(iter_rows(attr, tmp_path, max_samples=5)) == ["t0", "t1", "t2", "t0", "t1"]


def test_max_samples_takes_the_first_rows(tmp_path: Path) -> None:
    numbered(tmp_path, 10)
    attr = get_dataset_attrs(["n"], tmp_path)[0]
    assert texts(load_rows(attr, tmp_path, max_samples=3)) == ["t0", "t1", "t2"]
    assert len(load_rows(attr, tmp_path, max_samples=50)) == 10


def test_streaming_reads_lazily(tmp_path: Path) -> None:
    path = numbered(tmp_path, 3) / "n.jsonl"
    path.write_text(path.read_text() + "{broken\n")
    attr = get_dataset_attrs(["n"], tmp_path)[0]
    assert texts(islice(iter_rows(attr, tmp_path), 3)) == ["t0", "t1", "t2"]
    with pytest.raises(DataError, match=r"row 4 \(line 4\) of .*n\.jsonl: is not valid JSON"):
        list(iter_rows(attr, tmp_path))


def test_streaming_report_counts_as_rows_go(tmp_path: Path) -> None:
    path = numbered(tmp_path, 4) / "n.jsonl"
    path.write_text(path.read_text() + '{"text": ""}\n')
    attr = get_dataset_attrs(["n"], tmp_path)[0]
    report = LoadReport(dataset="n")
    rows = list(iter_rows(attr, tmp_path, on_bad_row="skip", report=report))
    assert texts(rows) == ["t0", "t1", "t2", "t3"]
    assert (report.rows_read, report.rows_kept, report.dropped) == (5, 4, {"empty_content": 1})
    _, whole = load_rows_with_report(attr, tmp_path, on_bad_row="skip")
    assert whole == report
