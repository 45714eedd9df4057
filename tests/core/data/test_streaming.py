"""`streaming: true` with `buffer_size`: rows come out of datasets' own seeded shuffle buffer, and
`val_size` takes the first rows out of it, as LLaMA-Factory splits a stream."""

from __future__ import annotations

import json
from pathlib import Path

from tuneline.core.data.streaming import shuffled_stream


def test_the_stream_is_shuffled_as_datasets_shuffles_a_list():
    from datasets import IterableDataset

    rows = [{"i": i, "messages": [{"role": "user", "content": str(i)}], "system": None} for i in range(40)]
    ours = list(shuffled_stream(iter(rows), buffer_size=8, seed=3))
    theirs = list(IterableDataset.from_generator(lambda: iter(rows)).shuffle(seed=3, buffer_size=8))
    assert ours == theirs and ours != rows and sorted(r["i"] for r in ours) == list(range(40))
    assert [r["i"] for r in shuffled_stream(iter(rows), buffer_size=1, seed=3)] == list(range(40))
    assert list(shuffled_stream(iter(rows), buffer_size=8, seed=4)) != ours


def test_streaming_holds_out_the_first_shuffled_rows(tiny_base: Path, tmp_path: Path):
    from datasets import load_from_disk

    from tuneline.core.stages.registry import build_stage_config, tokenize_stage_data

    rows = [{"instruction": f"Say {i}.", "output": f"{i}"} for i in range(12)]
    (tmp_path / "rows.json").write_text(json.dumps(rows))
    (tmp_path / "dataset_info.json").write_text(json.dumps({"rows": {"file_name": "rows.json"}}))
    keys = {"stage": "sft", "dataset": "rows", "dataset_dir": str(tmp_path), "template": "default", "cutoff_len": 32,
            "seed": 5}
    tokenize_stage_data(build_stage_config(keys), tokenizer_path=tiny_base, output_dir=tmp_path / "plain")
    tokenize_stage_data(build_stage_config({**keys, "streaming": True, "buffer_size": 4, "val_size": 3, "max_steps": 1}),
                        tokenizer_path=tiny_base, output_dir=tmp_path / "streamed")
    plain, streamed = load_from_disk(str(tmp_path / "plain")), load_from_disk(str(tmp_path / "streamed"))
    expected = [row["input_ids"] for row in shuffled_stream(iter(plain["train"]), buffer_size=4, seed=5)]
    assert streamed["validation"]["input_ids"] == expected[:3]
    assert streamed["train"]["input_ids"] == expected[3:]
    assert expected != plain["train"]["input_ids"]
