from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from tuneline.core.store.artifacts import find_artifact, partial_path, write_artifact
from tuneline.core.store.fingerprints import stage_key, tree_fingerprint


def test_artifact_appears_only_when_complete(tmp_path: Path):
    with write_artifact(tmp_path, "kind", "k1", config={"a": 1}) as draft:
        (draft.path / "data.txt").write_text("x")
        assert find_artifact(tmp_path, "kind", "k1") is None  # not visible while being written
        draft.metrics["m"] = 2.0
    artifact = find_artifact(tmp_path, "kind", "k1")
    assert artifact is not None
    assert artifact.manifest["files"] == {"data.txt": {"size": 1, "sha256": hashlib.sha256(b"x").hexdigest()}}
    assert artifact.manifest["metrics"] == {"m": 2.0}
    assert not partial_path(tmp_path, "kind", "k1").exists()


def test_failed_writer_leaves_nothing_unless_it_resumes(tmp_path: Path):
    with pytest.raises(RuntimeError):
        with write_artifact(tmp_path, "kind", "k3", config={}) as draft:
            (draft.path / "half.arrow").write_text("x")
            raise RuntimeError("bad row")
    assert not partial_path(tmp_path, "kind", "k3").exists()
    assert find_artifact(tmp_path, "kind", "k3") is None


def test_failed_resumable_writer_keeps_its_partial_work(tmp_path: Path):
    with pytest.raises(RuntimeError):
        with write_artifact(tmp_path, "kind", "k2", config={}, keep_partial=True) as draft:
            (draft.path / "checkpoint-1").mkdir()
            raise RuntimeError("killed")
    assert find_artifact(tmp_path, "kind", "k2") is None
    assert (partial_path(tmp_path, "kind", "k2") / "checkpoint-1").is_dir()
    with write_artifact(tmp_path, "kind", "k2", config={}, keep_partial=True) as draft:
        assert (draft.path / "checkpoint-1").is_dir()
    manifest = json.loads((tmp_path / "artifacts/kind/k2/manifest.json").read_text())
    assert manifest["key"] == "k2"


def test_stage_key_follows_config_upstream_and_content(tmp_path: Path):
    data = tmp_path / "d.json"
    data.write_text("[1]")
    base = stage_key("s", config={"lr": 1}, upstream={"u": "a"}, inputs={"d": tree_fingerprint([data])})
    assert base == stage_key("s", config={"lr": 1}, upstream={"u": "a"}, inputs={"d": tree_fingerprint([data])})
    assert base != stage_key("s", config={"lr": 2}, upstream={"u": "a"}, inputs={"d": tree_fingerprint([data])})
    assert base != stage_key("s", config={"lr": 1}, upstream={"u": "b"}, inputs={"d": tree_fingerprint([data])})
    data.write_text("[2]")
    assert base != stage_key("s", config={"lr": 1}, upstream={"u": "a"}, inputs={"d": tree_fingerprint([data])})


def test_files_then_folders_are_flushed_before_the_rename_and_the_parent_after(tmp_path: Path, monkeypatch):
    """A power loss must never leave an empty manifest under the final name: every fsync is watched."""
    import os

    events: list[tuple[str, str]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(descriptor: int) -> None:
        events.append(("fsync", os.readlink(f"/proc/self/fd/{descriptor}")))
        real_fsync(descriptor)

    def replace(source, target) -> None:
        events.append(("rename", f"{source} -> {target}"))
        real_replace(source, target)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    with write_artifact(tmp_path, "kind", "k4", config={}) as draft:
        (draft.path / "sub").mkdir()
        (draft.path / "sub" / "weights.bin").write_bytes(b"w" * 10)
        (draft.path / "data.txt").write_text("x")
    partial, final = str(partial_path(tmp_path, "kind", "k4")), str(tmp_path / "artifacts/kind/k4")
    into_place = events.index(("rename", f"{partial} -> {final}"))
    manifest_in = events.index(("rename", f"{partial}/.manifest.json.tmp -> {partial}/manifest.json"))
    flushed = [path for op, path in events[:into_place] if op == "fsync"]
    for path in ("sub/weights.bin", "data.txt", "sub", ".manifest.json.tmp"):
        assert flushed.index(f"{partial}/{path}") < manifest_in  # contents and entries before the manifest appears
    assert events[manifest_in + 1:into_place] == [("fsync", partial)]  # the manifest's entry, before the folder moves
    assert events[into_place + 1:] == [("fsync", str(tmp_path / "artifacts/kind"))]  # the new entry itself


def test_artifacts_are_owner_only_whatever_the_umask(tmp_path: Path):
    import os
    import stat

    previous = os.umask(0o022)
    try:
        with write_artifact(tmp_path, "kind", "k5", config={}) as draft:
            (draft.path / "sub").mkdir()
            (draft.path / "sub" / "weights.bin").write_bytes(b"w")
            (draft.path / "run.sh").write_text("echo")
            (draft.path / "run.sh").chmod(0o755)
    finally:
        os.umask(previous)
    final = tmp_path / "artifacts/kind/k5"
    modes = {p.relative_to(final).as_posix(): stat.S_IMODE(p.stat().st_mode) for p in [final, *final.rglob("*")]}
    assert modes == {".": 0o700, "sub": 0o700, "sub/weights.bin": 0o600, "run.sh": 0o700, "manifest.json": 0o600}
