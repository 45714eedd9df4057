"""A tokenizer or model folder that cannot be loaded is a clear error: exit 2 naming the folder,
what is wrong and the fix, no traceback, and no code from the folder runs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from conftest import assert_refused, export_config
from conftest import run_cli_here as run_cli


def tokenizer_copy(shared_dir: Path, folder: Path) -> Path:
    shutil.copytree(shared_dir / "tokenizers/gpt2", folder)
    return folder


def custom_code(folder: Path, config_file: str, auto_map: dict, sentinel: Path) -> None:
    config = json.loads((folder / config_file).read_text())
    (folder / config_file).write_text(json.dumps({**config, "auto_map": auto_map}))
    (folder / "custom.py").write_text(f"open({str(sentinel)!r}, 'w').write('ran')\n")


def broken_tokenizer(case: str, folder: Path, shared_dir: Path, sentinel: Path) -> str:
    """Break a tokenizer folder as `case` says; what the message must say."""
    if case == "empty":
        folder.mkdir()
        return "is an empty folder"
    if case == "missing_files":
        folder.mkdir()
        (folder / "config.json").write_text('{"model_type": "llama"}')
        return "has no tokenizer files"
    tokenizer_copy(shared_dir, folder)
    if case == "custom_code":
        custom_code(folder, "tokenizer_config.json", {"AutoTokenizer": ["custom.Tok", "custom.Tok"]}, sentinel)
        config = json.loads((folder / "tokenizer_config.json").read_text())
        (folder / "tokenizer_config.json").write_text(json.dumps({**config, "tokenizer_class": "Tok"}))
        return "ships its own tokenizer code"
    if case == "vocabulary_cut_short":
        (folder / "tokenizer.json").write_text((folder / "tokenizer.json").read_text()[:5000])
        return "tokenizer.json does not parse"
    (folder / "tokenizer.json").write_text(json.dumps({"version": "1.0", "model": {"type": "BPE", "vocab": 3}}))
    return "holds a tokenizer that cannot be loaded"


@pytest.mark.parametrize("case", ["empty", "missing_files", "custom_code", "vocabulary_cut_short", "vocabulary_malformed"])
def test_tokenizer_folder_that_cannot_be_loaded_exits_2(case: str, two_row_stage, tmp_path: Path, shared_dir: Path):
    folder, sentinel = tmp_path / "tok", tmp_path / "code_ran"
    says = broken_tokenizer(case, folder, shared_dir, sentinel)
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    result = run_cli("data", "preprocess", str(two_row_stage(model_name_or_path=str(folder))), "--output", str(tmp_path / "out"),
                     cwd=tmp_path)
    assert_refused(result, f"'model_name_or_path: {folder}'", says)
    if case == "custom_code":
        assert "trust_remote_code: true" in result.stderr
    assert not sentinel.exists()
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before
    assert not (tmp_path / "out").exists()


def broken_model(case: str, folder: Path, sentinel: Path) -> str:
    if case == "no_weights":
        (folder / "model.safetensors").unlink()
        return "has a config.json but no weights"
    if case == "no_config":
        (folder / "config.json").unlink()
        return "has no config.json"
    if case == "custom_code":
        custom_code(folder, "config.json", {"AutoConfig": "custom.Config", "AutoModelForCausalLM": "custom.Model"}, sentinel)
        return "ships its own model code"
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    return "has weights that cannot be read"


@pytest.mark.parametrize("case", ["no_weights", "no_config", "custom_code", "weights_cut_short"])
def test_model_folder_that_cannot_be_loaded_exits_2(case: str, tiny_base: Path, tmp_path: Path):
    folder, sentinel = tmp_path / "model", tmp_path / "code_ran"
    shutil.copytree(tiny_base, folder)
    says = broken_model(case, folder, sentinel)
    result = run_cli("export", str(export_config(tmp_path, folder, tmp_path / "exported")), cwd=tmp_path)
    assert_refused(result, f"'model_name_or_path: {folder}'", says)
    assert not sentinel.exists() and not (tmp_path / "exported").exists()
