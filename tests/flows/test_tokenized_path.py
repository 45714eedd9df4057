"""`tokenized_path`, as LLaMA-Factory reads it: a missing or empty folder receives the tokenized
dataset (and the run trains on it), a folder with files is loaded instead of tokenizing; a folder
that is not one tuneline saved for this stage, tokenizer and template stops the command with exit 2."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest
import yaml
from datasets import load_from_disk

from tuneline.core.pipeline.tokenized_folders import RECORD
from tuneline.core.stages.registry import load_stage_config
from tuneline.flows.cli import main
from tuneline.flows.single import preview, training_data


@pytest.fixture(autouse=True)
def _own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("TUNELINE_CACHE", str(tmp_path / "cache"))


def cached_artifacts(tmp_path: Path) -> list[str]:
    return sorted(p.name for p in (tmp_path / "cache").rglob("*") if p.parent.name == "tokenized")


def train_exit(config: Path) -> tuple[int, str]:
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr):
        code = main(["train", str(config)])
    return code, stderr.getvalue()


def test_tokenized_path_is_saved_once_then_loaded_without_tokenizing(two_row_stage, tmp_path: Path, capsys):
    saved = tmp_path / "tokenized"
    config = load_stage_config(str(two_row_stage(tokenized_path=str(saved))))
    assert training_data(config) == saved
    assert "saved the tokenized dataset to tokenized_path" in capsys.readouterr().out
    assert len(load_from_disk(str(saved))["train"]) == 2 and (saved / "tokenizer" / "tokenizer_config.json").is_file()
    assert json.loads((saved / RECORD).read_text())["examples"] == "supervised"
    first = {p.relative_to(saved): p.stat().st_mtime_ns for p in saved.rglob("*")}
    artifacts = cached_artifacts(tmp_path)

    # the datasets are not read again: with their folder gone, the saved dataset still serves
    for item in (tmp_path / "data").iterdir():
        item.unlink()
    again = load_stage_config(str(two_row_stage(tokenized_path=str(saved), cutoff_len=8)))
    assert training_data(again) == saved
    out = capsys.readouterr().out
    assert "loaded the tokenized dataset of tokenized_path" in out and "cutoff_len" in out  # a setting not used, named
    assert {p.relative_to(saved): p.stat().st_mtime_ns for p in saved.rglob("*")} == first  # nothing rewritten
    assert cached_artifacts(tmp_path) == artifacts  # nothing tokenized

    # data preview shows what training loads: the saved rows and their counters, with the datasets gone
    shown = preview(str(two_row_stage(tokenized_path=str(saved))), [], count=1)
    assert shown.startswith("--- example 0: 10 tokens, 3 trained") and "rows_in=2, total_tokens=21" in shown
    assert cached_artifacts(tmp_path) == artifacts


def test_data_preprocess_output_loads_as_tokenized_path(two_row_stage, tmp_path: Path):
    out = tmp_path / "pre"
    assert main(["data", "preprocess", str(two_row_stage()), "--output", str(out)]) == 0
    config = load_stage_config(str(two_row_stage(tokenized_path=str(out))))
    assert training_data(config) == out and cached_artifacts(tmp_path) == []


def test_a_folder_that_is_not_a_saved_tokenized_dataset_exits_2(two_row_stage, tmp_path: Path):
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "notes.txt").write_text("the user's own notes\n")
    config = two_row_stage(tokenized_path=str(folder), output_dir=str(tmp_path / "out"))
    code, message = train_exit(config)
    assert code == 2 and "Traceback" not in message, message
    assert f"'tokenized_path: {folder}' already holds files (notes.txt) and is not a tokenized dataset" in message
    assert sorted(p.name for p in folder.iterdir()) == ["notes.txt"]  # never written into


def test_a_dataset_saved_for_another_stage_or_template_exits_2_naming_the_key(two_row_stage, tmp_path: Path):
    saved = tmp_path / "tokenized"
    training_data(load_stage_config(str(two_row_stage(tokenized_path=str(saved)))))
    raw = yaml.safe_load(two_row_stage().read_text())
    config = tmp_path / "other.yaml"
    config.write_text(yaml.safe_dump({**raw, "stage": "pt", "template": "chatml", "tokenized_path": str(saved),
                                      "output_dir": str(tmp_path / "out")}))
    code, message = train_exit(config)
    assert code == 2 and "Traceback" not in message, message
    assert f"'tokenized_path: {saved}' holds supervised examples, and 'stage: pt' trains on pretrain ones" in message
    assert "'template' 'default' there, 'chatml' here" in message


def test_a_tokens_file_edited_in_place_is_a_token_setting_that_differs(two_row_stage, tmp_path: Path):
    """new_special_tokens_config is compared by the tokens it names, not by its path."""
    from tuneline.core.errors import ConfigError

    tokens = tmp_path / "tokens.yaml"
    tokens.write_text('"<|tool|>": "a tool call"\n')
    saved = tmp_path / "tokenized"
    training_data(load_stage_config(str(two_row_stage(tokenized_path=str(saved), new_special_tokens_config=str(tokens)))))
    tokens.write_text('"<|tool|>": "a tool call, described anew"\n')  # same tokens: still loads
    config = load_stage_config(str(two_row_stage(tokenized_path=str(saved), new_special_tokens_config=str(tokens))))
    assert training_data(config) == saved
    tokens.write_text('"<|tool|>": "a tool call"\n"<|result|>": "its result"\n')
    with pytest.raises(ConfigError) as caught:
        training_data(load_stage_config(str(two_row_stage(tokenized_path=str(saved), new_special_tokens_config=str(tokens)))))
    assert "added tokens {'plain': [], 'special': ['<|tool|>']} there, {'plain': [], 'special': ['<|tool|>', '<|result|>']} here" \
        in str(caught.value)
