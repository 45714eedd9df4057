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
