"""Writing into a folder the user names without touching their files (core/store/user_folders.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tuneline.core.errors import ConfigError
from tuneline.core.store.user_folders import WRITTEN_RECORD, foreign_entries, write_user_folder


def result(*names: str):
    """A writer that fills the draft with `names` (a name ending in / is a folder)."""
    def write(draft: Path) -> None:
        draft.mkdir()
        for name in names:
            if name.endswith("/"):
                (draft / name).mkdir()
                (draft / name / "part").write_text(name)
            else:
                (draft / name).write_text(name)
    return write


def test_new_folder_gets_the_result_and_its_record(tmp_path: Path) -> None:
    out = write_user_folder(tmp_path / "out", result("a.txt", "b/"), key="--output", overwrite=False)
    assert sorted(p.name for p in out.iterdir()) == ["a.txt", "b", WRITTEN_RECORD]
    assert json.loads((out / WRITTEN_RECORD).read_text())["entries"] == ["a.txt", "b"]
    assert foreign_entries(out) == [] and not (tmp_path / ".out.partial").exists()


def test_rewrite_replaces_only_what_was_written(tmp_path: Path) -> None:
    out = write_user_folder(tmp_path / "out", result("a.txt", "old/"), key="--output", overwrite=False)
    (out / "mine.txt").write_text("user")
    with pytest.raises(ConfigError, match=r"--output .* already holds files that tuneline did not write \(mine.txt\)"):
        write_user_folder(out, result("a.txt"), key="--output", overwrite=False)
    write_user_folder(out, result("a.txt", "new/"), key="--output", overwrite=True)
    assert sorted(p.name for p in out.iterdir()) == ["a.txt", "mine.txt", "new", WRITTEN_RECORD]
    assert (out / "mine.txt").read_text() == "user"


def test_a_users_entry_of_an_output_name_is_never_replaced(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "a.txt").write_text("user")
    with pytest.raises(ConfigError, match="holds a.txt, which tuneline did not write and would have to replace"):
        write_user_folder(out, result("a.txt"), key="export_dir", overwrite=True)
    assert sorted(p.name for p in out.iterdir()) == ["a.txt"] and (out / "a.txt").read_text() == "user"


def test_failed_write_leaves_the_folder_as_it_was(tmp_path: Path) -> None:
    out = write_user_folder(tmp_path / "out", result("a.txt"), key="--output", overwrite=False)

    def fail(draft: Path) -> None:
        result("b.txt")(draft)
        raise RuntimeError("tokenizing failed")

    with pytest.raises(RuntimeError):
        write_user_folder(out, fail, key="--output", overwrite=False)
    assert sorted(p.name for p in out.iterdir()) == ["a.txt", WRITTEN_RECORD]
    assert not (tmp_path / ".out.partial").exists()


def outside_record(tmp_path: Path, how: str) -> tuple[Path, Path]:
    """An output folder whose record names a file outside it (`how`), and that file."""
    outside = tmp_path / "elsewhere" / "precious.txt"
    outside.parent.mkdir()
    outside.write_text("not tuneline's")
    out = tmp_path / "out"
    out.mkdir()
    entry = {"absolute": str(outside), "dotdot": "../elsewhere/precious.txt", "symlink": "link", "nested": "sub/x"}[how]
    if how == "symlink":
        (out / "link").symlink_to(outside.parent, target_is_directory=True)
    (out / WRITTEN_RECORD).write_text(json.dumps({"entries": [entry]}))
    return out, outside


@pytest.mark.parametrize("how", ["absolute", "dotdot", "symlink", "nested"])
def test_a_record_naming_anything_outside_the_folder_is_refused_and_nothing_deleted(tmp_path: Path, how: str) -> None:
    out, outside = outside_record(tmp_path, how)
    with pytest.raises(ConfigError, match=rf"{WRITTEN_RECORD} lists the entry .* as one tuneline wrote, but it .*nothing "
                                          "was read or deleted"):
        write_user_folder(out, result("a.txt"), key="export_dir", overwrite=True)
    assert outside.read_text() == "not tuneline's"
    assert sorted(p.name for p in out.iterdir()) == sorted(["link"] * (how == "symlink") + [WRITTEN_RECORD])


def test_files_copied_out_of_an_owner_only_artifact_take_the_users_umask(tmp_path: Path) -> None:
    """`tokenized_path` receives a copy of cached data: the store's 0700/0600 stay in the store."""
    import os
    import stat

    from tuneline.core.store.artifacts import artifact_path, write_artifact
    from tuneline.core.store.user_folders import copy_into

    with write_artifact(tmp_path / "ws", "tokenized", "tokenize-a", config={}) as draft:
        (draft.path / "train").mkdir()
        (draft.path / "train" / "data.arrow").write_bytes(b"0")
    previous = os.umask(0o022)
    try:
        out = write_user_folder(tmp_path / "out", lambda d: copy_into(artifact_path(tmp_path / "ws", "tokenized", "tokenize-a"),
                                                                      d, skip={"manifest.json"}),
                                key="tokenized_path", overwrite=False)
    finally:
        os.umask(previous)
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*")) == ["train", "train/data.arrow", WRITTEN_RECORD]
    assert {stat.S_IMODE((out / name).stat().st_mode) for name in ("train", "train/data.arrow")} == {0o755, 0o644}
