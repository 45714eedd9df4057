"""No command deletes or changes a file it did not write, and a folder that cannot be loaded is a
clear error: exit 2 naming the folder, what is wrong and the fix, no traceback, no code run."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

USER_FILE = "notes.txt"
USER_TEXT = "the user's own notes\n"


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tuneline.flows.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "TUNELINE_CACHE": str(cwd / "cache")})


def assert_refused(result: subprocess.CompletedProcess, *fragments: str) -> None:
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    for fragment in fragments:
        assert fragment in result.stderr, result.stderr


def user_folder(path: Path, name: str = USER_FILE) -> Path:
    path.mkdir(parents=True)
    (path / name).write_text(USER_TEXT)
    return path


@pytest.fixture
def stage(tmp_path: Path, shared_dir: Path):
    """`stage(**keys)`: a preprocess config on two alpaca rows with the gpt2 tokenizer."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "d.jsonl").write_text('{"instruction": "Hi", "input": "", "output": "Hello"}\n'
                                  '{"instruction": "Bye", "input": "", "output": "Goodbye"}\n')
    (data / "dataset_info.json").write_text(json.dumps({"d": {"file_name": "d.jsonl"}}))

    def write(**keys) -> Path:
        config = tmp_path / "stage.yaml"
        config.write_text(yaml.safe_dump({"model_name_or_path": str(shared_dir / "tokenizers/gpt2"), "stage": "sft",
                                          "dataset": "d", "dataset_dir": str(data), "template": "default", **keys}))
        return config

    return write


# --- data preprocess --output ------------------------------------------------------------------


def test_preprocess_refuses_an_output_holding_a_users_file(stage, tmp_path: Path):
    out = user_folder(tmp_path / "out")
    result = run_cli("data", "preprocess", str(stage()), "--output", str(out), cwd=tmp_path)
    assert_refused(result, f"--output {out} already holds files that tuneline did not write ({USER_FILE})",
                   "overwrite_output_dir: true")
    assert sorted(p.name for p in out.iterdir()) == [USER_FILE]
    assert (out / USER_FILE).read_text() == USER_TEXT


def test_preprocess_with_overwrite_writes_beside_the_users_file_and_replaces_only_its_own(stage, tmp_path: Path):
    from datasets import load_from_disk

    out = user_folder(tmp_path / "out")
    config = stage(overwrite_output_dir=True)
    for _ in range(2):  # the second run replaces what the first wrote, and only that
        result = run_cli("data", "preprocess", str(config), "--output", str(out), cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        assert (out / USER_FILE).read_text() == USER_TEXT
        assert len(load_from_disk(str(out))["train"]) == 2
    assert not (tmp_path / ".out.partial").exists()


def test_preprocess_replaces_its_own_earlier_output_without_overwrite(stage, tmp_path: Path):
    out = tmp_path / "out"
    assert run_cli("data", "preprocess", str(stage()), "--output", str(out), cwd=tmp_path).returncode == 0
    (out / "train" / "stale.arrow").write_text("from the first run")  # inside an entry tuneline wrote
    result = run_cli("data", "preprocess", str(stage(cutoff_len=8)), "--output", str(out), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert not (out / "train" / "stale.arrow").exists()


def test_preprocess_never_replaces_a_users_file_of_an_output_name(stage, tmp_path: Path):
    out = user_folder(tmp_path / "out", name="preview.txt")
    result = run_cli("data", "preprocess", str(stage(overwrite_output_dir=True)), "--output", str(out), cwd=tmp_path)
    assert_refused(result, f"--output {out} holds preview.txt, which tuneline did not write")
    assert sorted(p.name for p in out.iterdir()) == ["preview.txt"]
    assert (out / "preview.txt").read_text() == USER_TEXT


def test_preprocess_refuses_an_output_that_is_a_file(stage, tmp_path: Path):
    out = tmp_path / "out"
    out.write_text(USER_TEXT)
    result = run_cli("data", "preprocess", str(stage(overwrite_output_dir=True)), "--output", str(out), cwd=tmp_path)
    assert_refused(result, f"--output {out} is a file, not a folder")
    assert out.read_text() == USER_TEXT


# --- train output_dir and export_dir -----------------------------------------------------------


def test_train_refuses_an_output_dir_holding_a_users_file(stage, tmp_path: Path):
    out = user_folder(tmp_path / "out")
    result = run_cli("train", str(stage(output_dir=str(out))), cwd=tmp_path)
    assert_refused(result, f"output_dir {out} already holds files", "overwrite_output_dir: true")
    assert sorted(p.name for p in out.iterdir()) == [USER_FILE] and (out / USER_FILE).read_text() == USER_TEXT


def test_train_with_overwrite_refuses_to_remove_checkpoints_it_did_not_write(stage, tmp_path: Path):
    out = tmp_path / "out"
    user_folder(out / "checkpoint-3", name="trainer_state.json")  # another tool's checkpoint: no tuneline record
    result = run_cli("train", str(stage(output_dir=str(out), overwrite_output_dir=True)), cwd=tmp_path)
    assert_refused(result, f"output_dir {out} holds checkpoint-3, which tuneline did not write")
    assert (out / "checkpoint-3" / "trainer_state.json").read_text() == USER_TEXT


def export_config(tmp_path: Path, model: Path, export_dir: Path, **keys) -> Path:
    config = tmp_path / "export.yaml"
    config.write_text(yaml.safe_dump({"model_name_or_path": str(model), "export_dir": str(export_dir),
                                      "template": "default", **keys}))
    return config


def test_export_refuses_an_export_dir_holding_a_users_file(tiny_base: Path, tmp_path: Path):
    exported = user_folder(tmp_path / "exported")
    result = run_cli("export", str(export_config(tmp_path, tiny_base, exported)), cwd=tmp_path)
    assert_refused(result, f"export_dir {exported} already holds files that tuneline did not write ({USER_FILE})",
                   "overwrite_output_dir: true")
    assert sorted(p.name for p in exported.iterdir()) == [USER_FILE]


def test_export_with_overwrite_keeps_the_users_file(tiny_base: Path, tmp_path: Path):
    exported = user_folder(tmp_path / "exported")
    config = export_config(tmp_path, tiny_base, exported, overwrite_output_dir=True)
    for _ in range(2):
        result = run_cli("export", str(config), cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        assert (exported / "model.safetensors").is_file() and (exported / USER_FILE).read_text() == USER_TEXT


# --- folders that cannot be loaded --------------------------------------------------------------


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
def test_tokenizer_folder_that_cannot_be_loaded_exits_2(case: str, stage, tmp_path: Path, shared_dir: Path):
    folder, sentinel = tmp_path / "tok", tmp_path / "code_ran"
    says = broken_tokenizer(case, folder, shared_dir, sentinel)
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    result = run_cli("data", "preprocess", str(stage(model_name_or_path=str(folder))), "--output", str(tmp_path / "out"),
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
