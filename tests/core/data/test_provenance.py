"""A refused row named by its dataset, file and row: the origins routed as the rows are routed, whatever the
mixing, the streaming shuffle and the validation draw, and the message tokenization gives."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tuneline.core.data.row_streams import origin_at, routed_rows
from tuneline.core.errors import DataError
from tuneline.core.stages.registry import build_stage_config, tokenize_stage_data


def write_datasets(folder: Path) -> Path:
    """Three datasets whose rows say where they are: 'a' a folder of two JSON lines files (a blank line in the
    first, so that its rows and lines differ; its third row unreadable), 'b' a JSON list, 'c' a CSV file."""
    folder.mkdir()
    (folder / "a").mkdir()

    def row(label: str) -> str:
        return json.dumps({"instruction": label, "output": "ok"})

    (folder / "a" / "1.jsonl").write_text("\n".join([
        row("a a/1.jsonl row 1 (line 1)"), "", row("a a/1.jsonl row 2 (line 3)"), '{"instruction": ',
        row("a a/1.jsonl row 4 (line 5)")]) + "\n")
    (folder / "a" / "2.jsonl").write_text("\n".join(row(f"a a/2.jsonl row {n} (line {n})") for n in range(1, 4)) + "\n")
    (folder / "b.json").write_text(json.dumps([{"instruction": f"b b.json row {n}", "output": "ok"} for n in range(1, 6)]))
    (folder / "c.csv").write_text("instruction,output\n" + "".join(f"c c.csv row {n} (line {n + 1}),ok\n" for n in range(1, 5)))
    (folder / "dataset_info.json").write_text(json.dumps({"a": {"file_name": "a"}, "b": {"file_name": "b.json"},
                                                         "c": {"file_name": "c.csv"}}))
    return folder


def expected_origin(row: dict, folder: Path) -> str:
    """The origin a row's label names: `dataset 'a' in .../dataset_info.json: row 2 (line 3) of .../a/1.jsonl`."""
    dataset, file, where = row["prompt"][0]["content"].split(" ", 2)
    return f"dataset '{dataset}' in {folder / 'dataset_info.json'}: {where.replace(' of', '')} of {folder / file}"


MIXES = {
    "concat": {"dataset": "a,b,c"},
    "interleave_under": {"dataset": "a,b,c", "mix_strategy": "interleave_under"},
    "interleave_over_probs": {"dataset": "c,a,b", "mix_strategy": "interleave_over", "interleave_probs": "0.2,0.5,0.3"},
    "val_size_share": {"dataset": "b,a", "mix_strategy": "interleave_under", "interleave_probs": "0.6,0.4", "val_size": 0.4},
    "val_size_count": {"dataset": "a,b,c", "val_size": 4, "max_samples": 3},
    "streaming": {"dataset": "a,c,b", "streaming": True, "buffer_size": 3, "val_size": 2, "max_steps": 10},
    "eval_each_dataset": {"dataset": "b", "eval_dataset": "c,a", "eval_on_each_dataset": True},
    "eval_mixed_streaming": {"dataset": "c", "eval_dataset": "a,b", "mix_strategy": "interleave_over", "streaming": True,
                             "buffer_size": 4, "max_steps": 10},
}


@pytest.mark.parametrize("mix", sorted(MIXES))
def test_each_position_of_each_split_names_the_row_there(mix: str, tmp_path: Path):
    folder = write_datasets(tmp_path / "data")
    config = build_stage_config({"stage": "sft", "dataset_dir": str(folder), "on_bad_row": "skip", "seed": 7, **MIXES[mix]})
    rows = list(routed_rows(config, reports=[]))
    origins = list(routed_rows(config, reports=[], origins=True))
    assert [split for _, split in origins] == [split for _, split in rows]
    assert [origin.describe() for origin, _ in origins] == [expected_origin(row, folder) for row, _ in rows]
    assert len({split for _, split in rows}) == (1 if mix in ("concat", "interleave_under", "interleave_over_probs") else
                                                 3 if mix == "eval_each_dataset" else 2)
    # the last row of each split, found again from its position alone
    for split in {split for _, split in rows}:
        in_split = [row for row, routed in rows if routed == split]
        found = origin_at(config, split=split, position=len(in_split) - 1)
        assert found is not None and found.describe() == expected_origin(in_split[-1], folder)
        assert origin_at(config, split=split, position=len(in_split)) is None


def test_rows_repeated_by_num_samples_name_the_row_they_repeat(tmp_path: Path):
    folder = write_datasets(tmp_path / "data")
    info = json.loads((folder / "dataset_info.json").read_text())
    info["b"]["num_samples"] = 12  # b's five rows, then again from the first
    (folder / "dataset_info.json").write_text(json.dumps(info))
    config = build_stage_config({"stage": "sft", "dataset_dir": str(folder), "dataset": "b"})
    origins = [origin.where for origin, _ in routed_rows(config, reports=[], origins=True)]
    assert origins == [f"row {n % 5 + 1} of {folder / 'b.json'}" for n in range(12)]


def bad_row_datasets(folder: Path) -> Path:
    """'good' (eight answered rows) and 'holes' (eight rows, the seventh without an answer: it loads, and the
    supervised check refuses it when it is encoded)."""
    folder.mkdir()
    (folder / "good.jsonl").write_text("".join(json.dumps({"instruction": f"g{n}", "output": "yes"}) + "\n" for n in range(8)))
    holes = [{"instruction": f"h{n}", "output": None if n == 6 else "yes"} for n in range(8)]
    (folder / "holes.jsonl").write_text("".join(json.dumps(row) + "\n" for row in holes))
    (folder / "dataset_info.json").write_text(json.dumps({"good": {"file_name": "good.jsonl"},
                                                         "holes": {"file_name": "holes.jsonl"}}))
    return folder


@pytest.mark.parametrize("workers", [1, 2])
def test_a_row_refused_when_encoded_is_named_by_its_dataset_file_and_row(workers: int, shared_dir: Path, tmp_path: Path):
    """Mixed, drawn to validation in part and encoded in batches of 3 (here, or by a pool of processes), the
    refused row is the seventh row of holes.jsonl, whatever its place in the split."""
    folder = bad_row_datasets(tmp_path / "data")
    config = build_stage_config({"stage": "sft", "dataset": "good,holes", "mix_strategy": "interleave_under",
                                 "interleave_probs": "0.5,0.5", "val_size": 0.3, "dataset_dir": str(folder),
                                 "template": "default", "preprocessing_batch_size": 3,
                                 "preprocessing_num_workers": workers})
    routed = list(routed_rows(config, reports=[]))
    split = next(split for row, split in routed if row["prompt"][0]["content"] == "h6")
    position = [row["prompt"][0]["content"] for row, routed_split in routed if routed_split == split].index("h6")
    assert (split, position) == ("train", 5)  # among rows of both datasets: the last of the second batch of 3
    with pytest.raises(DataError) as refused:
        tokenize_stage_data(config, tokenizer_path=shared_dir / "tokenizers/gpt2", output_dir=tmp_path / "out")
    message = str(refused.value)
    assert message.startswith(f"dataset 'holes' in {folder / 'dataset_info.json'}: row 7 (line 7) of "
                              f"{folder / 'holes.jsonl'}: a supervised row needs exactly one response message"), message
    assert message.endswith("got none. Fix or remove the row.")


@pytest.mark.parametrize(("stage", "dataset", "fragments"), [
    ("rm", "good", ["dataset 'good'", "good.jsonl", "holds one response per row", "'stage: rm' trains on pairwise rows",
                    '"ranking": true', '"chosen" and "rejected"']),
    ("kto", "holes", ["dataset 'holes'", "holes.jsonl", "'stage: kto' trains on feedback rows", '"kto_tag"']),
])
def test_a_dataset_of_another_shape_is_refused_by_its_entry_with_the_settings_that_give_the_shape(
        stage: str, dataset: str, fragments: list[str], tmp_path: Path):
    folder = bad_row_datasets(tmp_path / "data")
    config = build_stage_config({"stage": stage, "dataset": dataset, "dataset_dir": str(folder), "template": "default"})
    with pytest.raises(DataError) as refused:  # before any tokenizer is read: this path holds none
        tokenize_stage_data(config, tokenizer_path=tmp_path / "no_tokenizer", output_dir=tmp_path / "out")
    for fragment in fragments:
        assert fragment in str(refused.value), str(refused.value)
