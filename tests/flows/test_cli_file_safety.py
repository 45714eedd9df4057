"""No command deletes or changes a file it did not write: an output folder holding other files is
refused (exit 2, the user's file untouched) unless `overwrite_output_dir: true`."""

from __future__ import annotations

from pathlib import Path

from conftest import assert_refused, export_config
from conftest import run_cli_here as run_cli

USER_FILE = "notes.txt"
USER_TEXT = "the user's own notes\n"


def user_folder(path: Path, name: str = USER_FILE) -> Path:
    path.mkdir(parents=True)
    (path / name).write_text(USER_TEXT)
    return path


# --- data preprocess --output ------------------------------------------------------------------


def test_preprocess_refuses_an_output_holding_a_users_file(two_row_stage, tmp_path: Path):
    out = user_folder(tmp_path / "out")
    result = run_cli("data", "preprocess", str(two_row_stage()), "--output", str(out), cwd=tmp_path)
    assert_refused(result, f"--output {out} already holds files that tuneline did not write ({USER_FILE})",
                   "overwrite_output_dir: true")
    assert sorted(p.name for p in out.iterdir()) == [USER_FILE]
    assert (out / USER_FILE).read_text() == USER_TEXT


def test_preprocess_with_overwrite_writes_beside_the_users_file_and_replaces_only_its_own(two_row_stage, tmp_path: Path):
    from datasets import load_from_disk

    out = user_folder(tmp_path / "out")
    config = two_row_stage(overwrite_output_dir=True)
    for _ in range(2):  # the second run replaces what the first wrote, and only that
        result = run_cli("data", "preprocess", str(config), "--output", str(out), cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        assert (out / USER_FILE).read_text() == USER_TEXT
        assert len(load_from_disk(str(out))["train"]) == 2
    assert not (tmp_path / ".out.partial").exists()


def test_preprocess_replaces_its_own_earlier_output_without_overwrite(two_row_stage, tmp_path: Path):
    out = tmp_path / "out"
    assert run_cli("data", "preprocess", str(two_row_stage()), "--output", str(out), cwd=tmp_path).returncode == 0
    (out / "train" / "stale.arrow").write_text("from the first run")  # inside an entry tuneline wrote
    result = run_cli("data", "preprocess", str(two_row_stage(cutoff_len=8)), "--output", str(out), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert not (out / "train" / "stale.arrow").exists()


def test_preprocess_never_replaces_a_users_file_of_an_output_name(two_row_stage, tmp_path: Path):
    out = user_folder(tmp_path / "out", name="preview.txt")
    result = run_cli("data", "preprocess", str(two_row_stage(overwrite_output_dir=True)), "--output", str(out), cwd=tmp_path)
    assert_refused(result, f"--output {out} holds preview.txt, which tuneline did not write")
    assert sorted(p.name for p in out.iterdir()) == ["preview.txt"]
    assert (out / "preview.txt").read_text() == USER_TEXT


def test_preprocess_refuses_an_output_that_is_a_file(two_row_stage, tmp_path: Path):
    out = tmp_path / "out"
    out.write_text(USER_TEXT)
    result = run_cli("data", "preprocess", str(two_row_stage(overwrite_output_dir=True)), "--output", str(out), cwd=tmp_path)
    assert_refused(result, f"--output {out} is a file, not a folder")
    assert out.read_text() == USER_TEXT


# --- train output_dir and export_dir -----------------------------------------------------------


def test_train_refuses_an_output_dir_holding_a_users_file(two_row_stage, tmp_path: Path):
    out = user_folder(tmp_path / "out")
    result = run_cli("train", str(two_row_stage(output_dir=str(out))), cwd=tmp_path)
    assert_refused(result, f"output_dir {out} already holds files", "overwrite_output_dir: true")
    assert sorted(p.name for p in out.iterdir()) == [USER_FILE] and (out / USER_FILE).read_text() == USER_TEXT


def test_train_with_overwrite_refuses_to_remove_checkpoints_it_did_not_write(two_row_stage, tmp_path: Path):
    out = tmp_path / "out"
    user_folder(out / "checkpoint-3", name="trainer_state.json")  # another tool's checkpoint: no tuneline record
    result = run_cli("train", str(two_row_stage(output_dir=str(out), overwrite_output_dir=True)), cwd=tmp_path)
    assert_refused(result, f"output_dir {out} holds checkpoint-3, which tuneline did not write")
    assert (out / "checkpoint-3" / "trainer_state.json").read_text() == USER_TEXT


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
