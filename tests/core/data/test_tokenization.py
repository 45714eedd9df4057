"""Tokenizing a stage's datasets to Arrow: exact ids, splits, counters, workers, guard, bad input."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tuneline.core.data.tokenization import TEMPLATE_WARNING_FILE
from tuneline.core.errors import ConfigError, DataError
from tuneline.core.stages.registry import build_stage_config, tokenize_stage_data

REPO_ROOT = Path(__file__).resolve().parents[3]


def _config(**values):
    return build_stage_config({"stage": "sft", "dataset_dir": str(REPO_ROOT / "data"), "template": "default",
                               "cutoff_len": 64, **values})


def test_sft_tokens_equal_the_per_row_encoder_and_counters_add_up(shared_dir: Path, tmp_path: Path):
    from datasets import load_from_disk
    from transformers import AutoTokenizer

    from tuneline.core.data.processors import RowEncoding, encode_supervised_row
    from tuneline.core.data.tokenization import read_rows
    from tuneline.core.templates.conversation import fix_tokenizer, get_template

    config = _config(dataset="demo_alpaca,demo_sharegpt", max_samples=150, preprocessing_batch_size=64)
    counters = tokenize_stage_data(config, tokenizer_path=shared_dir / "tokenizers/gpt2", output_dir=tmp_path / "out")
    train = load_from_disk(str(tmp_path / "out"))["train"]

    tokenizer = AutoTokenizer.from_pretrained(shared_dir / "tokenizers/gpt2")
    template = get_template("default")
    fix_tokenizer(template, tokenizer)
    encoding = RowEncoding(template=template, cutoff_len=64)
    expected = [encode_supervised_row(row, tokenizer=tokenizer, encoding=encoding)
                for row in read_rows(["demo_alpaca", "demo_sharegpt"], config)]
    assert [e["input_ids"] for e in expected] == train["input_ids"]
    assert [e["labels"] for e in expected] == train["labels"]
    assert counters["rows_in"] == counters["examples"] == 300
    assert counters["total_tokens"] == sum(len(ids) for ids in train["input_ids"])
    assert counters["trained_tokens"] == sum(sum(1 for x in labels if x != -100) for labels in train["labels"])
    assert 0 < counters["padding_ratio"] < 1
    assert (tmp_path / "out/tokenizer/tokenizer_config.json").is_file()
    assert "[[" in (tmp_path / "out/preview.txt").read_text()


def test_worker_processes_give_the_same_dataset(shared_dir: Path, tmp_path: Path):
    from datasets import load_from_disk

    for workers in (1, 2):
        config = _config(dataset="demo_alpaca", max_samples=200, preprocessing_batch_size=50, preprocessing_num_workers=workers,
                         val_size=0.1)
        tokenize_stage_data(config, tokenizer_path=shared_dir / "tokenizers/gpt2", output_dir=tmp_path / f"w{workers}")
    one, two = load_from_disk(str(tmp_path / "w1")), load_from_disk(str(tmp_path / "w2"))
    assert one["train"]["input_ids"] == two["train"]["input_ids"]
    assert one["validation"]["input_ids"] == two["validation"]["input_ids"]
    assert len(one["train"]) + len(one["validation"]) == 200 and 5 <= len(one["validation"]) <= 40


def test_named_template_that_renders_differently_is_a_warning_unless_strict(shared_dir: Path, tmp_path: Path):
    qwen = shared_dir / "tokenizers/qwen2.5"
    out = tmp_path / "chatml"
    counters = tokenize_stage_data(_config(dataset="demo_alpaca", max_samples=5, template="chatml"), tokenizer_path=qwen,
                                   output_dir=out)
    assert counters["examples"] == 5
    warning = (out / TEMPLATE_WARNING_FILE).read_text()
    assert warning.startswith("template 'chatml' does not write what this tokenizer's own chat template writes")
    assert "first differ at position 1" in warning
    with pytest.raises(ConfigError, match="strict_template"):
        tokenize_stage_data(_config(dataset="demo_alpaca", max_samples=5, template="chatml", strict_template=True),
                            tokenizer_path=qwen, output_dir=tmp_path / "strict")
    assert not (tmp_path / "strict").exists()
    out = tmp_path / "qwen"
    assert tokenize_stage_data(_config(dataset="demo_alpaca", max_samples=5, template="qwen", strict_template=True),
                               tokenizer_path=qwen, output_dir=out)["examples"] == 5
    assert not (out / TEMPLATE_WARNING_FILE).exists()


def test_template_markers_the_tokenizer_cannot_write_stay_an_error(shared_dir: Path, tmp_path: Path):
    # llama3's <|start_header_id|> is no token of Qwen2.5: the model would learn it as text
    with pytest.raises(ConfigError, match=re.escape("'<|start_header_id|>', which this tokenizer splits into")):
        tokenize_stage_data(_config(dataset="demo_alpaca", max_samples=5, template="llama3"),
                            tokenizer_path=shared_dir / "tokenizers/qwen2.5", output_dir=tmp_path / "a")
    # chatml on gpt2: its markers are added by the template, which needs resize_vocab
    gpt2 = shared_dir / "tokenizers/gpt2"
    with pytest.raises(ConfigError, match="resize_vocab"):
        tokenize_stage_data(_config(dataset="demo_alpaca", max_samples=5, template="chatml"), tokenizer_path=gpt2,
                            output_dir=tmp_path / "b")
    counters = tokenize_stage_data(_config(dataset="demo_alpaca", max_samples=5, template="chatml", resize_vocab=True),
                                   tokenizer_path=gpt2, output_dir=tmp_path / "c")
    assert counters["examples"] == 5



def test_gemma_markers_are_checked_and_added_special_tokens_provide_them(shared_dir: Path):
    from tuneline.core.data.tokenization import prepare_tokenizer

    llama3 = shared_dir / "tokenizers/llama3"
    with pytest.raises(ConfigError) as refused:
        prepare_tokenizer(_config(template="gemma"), llama3)
    message = str(refused.value)
    assert "writes the marker '<start_of_turn>', which this tokenizer splits into" in message
    assert "'<end_of_turn>', which this tokenizer does not have" in message and "resize_vocab" in message
    # resize_vocab grows the embeddings for the added eos, but cannot make <start_of_turn> one token
    with pytest.raises(ConfigError, match=re.escape("'<start_of_turn>', which this tokenizer splits into")):
        prepare_tokenizer(_config(template="gemma", resize_vocab=True), llama3)
    prepared = prepare_tokenizer(_config(template="gemma", add_special_tokens="<start_of_turn>"), llama3)
    assert len(prepared.tokenizer("<start_of_turn>user\n", add_special_tokens=False)["input_ids"]) == 3
    assert prepared.tokenizer.eos_token == "<end_of_turn>"


SUPERVISED = {"input_ids", "attention_mask", "labels"}
PAIRWISE = {"chosen_input_ids", "chosen_attention_mask", "chosen_labels", "rejected_input_ids", "rejected_attention_mask",
            "rejected_labels"}


# Every text dataset with a local file in LLaMA-Factory's demo dataset_info.json.
@pytest.mark.parametrize(("dataset", "stage", "columns"), [
    ("alpaca_en_demo", "sft", SUPERVISED),
    ("alpaca_zh_demo", "sft", SUPERVISED),
    ("identity", "sft", SUPERVISED),
    ("glaive_toolcall_en_demo", "sft", SUPERVISED),
    ("glaive_toolcall_zh_demo", "sft", SUPERVISED),
    ("dpo_en_demo", "dpo", PAIRWISE),
    ("dpo_zh_demo", "rm", PAIRWISE),
    ("kto_en_demo", "kto", {"input_ids", "attention_mask", "labels", "kl_input_ids", "kl_attention_mask", "kl_labels", "kto_tags"}),
    ("c4_demo", "pt", SUPERVISED),
    ("wiki_demo", "pt", SUPERVISED),
])
def test_llamafactory_demo_datasets_tokenize_with_their_stage(shared_dir: Path, tmp_path: Path, dataset, stage, columns):
    from datasets import load_from_disk

    config = build_stage_config({"stage": stage, "dataset": dataset, "dataset_dir": str(shared_dir / "llamafactory/data"),
                                 "template": "qwen", "cutoff_len": 256, "max_samples": 40})
    counters = tokenize_stage_data(config, tokenizer_path=shared_dir / "tokenizers/qwen2.5", output_dir=tmp_path / "out")
    train = load_from_disk(str(tmp_path / "out"))["train"]
    assert set(train.column_names) == columns
    assert len(train) > 0 and counters["trained_tokens"] > 0


def test_bad_row_leaves_no_output_and_names_the_row(shared_dir: Path, tmp_path: Path):
    data = tmp_path / "data"
    data.mkdir()
    rows = [{"instruction": "Hi", "input": "", "output": "Hello"}, {"instruction": "Hi", "input": "", "output": ["not", "text"]}]
    (data / "d.json").write_text(json.dumps(rows))
    (data / "dataset_info.json").write_text(json.dumps({"d": {"file_name": "d.json"}}))
    config = build_stage_config({"stage": "sft", "dataset": "d", "dataset_dir": str(data), "template": "default"})
    with pytest.raises(DataError, match=r"row 2 of .*d\.json"):
        tokenize_stage_data(config, tokenizer_path=shared_dir / "tokenizers/gpt2", output_dir=tmp_path / "out")
    lenient = build_stage_config({"stage": "sft", "dataset": "d", "dataset_dir": str(data), "template": "default", "on_bad_row": "skip"})
    counters = tokenize_stage_data(lenient, tokenizer_path=shared_dir / "tokenizers/gpt2", output_dir=tmp_path / "ok")
    assert counters["examples"] == 1
    assert sum(v for k, v in counters.items() if k.startswith("rows_dropped_")) == 1


def test_truncation_is_counted(shared_dir: Path, tmp_path: Path):
    data = tmp_path / "data"
    data.mkdir()
    long_reply = " ".join(["word"] * 200)
    rows = [{"instruction": "Hi", "input": "", "output": "Hello"}, {"instruction": "Tell a story", "input": "", "output": long_reply}]
    (data / "d.json").write_text(json.dumps(rows))
    (data / "dataset_info.json").write_text(json.dumps({"d": {"file_name": "d.json"}}))
    for packing in (False, True):
        config = build_stage_config({"stage": "sft", "dataset": "d", "dataset_dir": str(data), "template": "default",
                                     "cutoff_len": 64, "packing": packing})
        counters = tokenize_stage_data(config, tokenizer_path=shared_dir / "tokenizers/gpt2", output_dir=tmp_path / f"out{packing}")
        assert counters["rows_truncated"] == 1 and counters["responses_cut"] == 1
        assert counters["examples"] == 2  # packed: the long row fills a pack on its own


def test_split_special_tokens_is_kept_by_the_saved_tokenizer_and_refuses_templates_it_would_split(shared_dir: Path,
                                                                                                  tiny_base: Path, tmp_path: Path):
    from transformers import AutoTokenizer

    config = _config(dataset="demo_alpaca", max_samples=4, split_special_tokens=True)
    tokenize_stage_data(config, tokenizer_path=shared_dir / "tokenizers/gpt2", output_dir=tmp_path / "out")
    saved = AutoTokenizer.from_pretrained(tmp_path / "out/tokenizer")
    assert saved("a<|endoftext|>", add_special_tokens=False)["input_ids"] == [64, 27, 91, 437, 1659, 5239, 91, 29]
    with pytest.raises(ConfigError, match=r"'split_special_tokens: true' splits into \d+ tokens"):
        tokenize_stage_data(_config(dataset="demo_alpaca", max_samples=4, split_special_tokens=True, template="chatml"),
                            tokenizer_path=tiny_base, output_dir=tmp_path / "chatml")
