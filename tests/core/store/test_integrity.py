"""The manifest's file table, the cheap check on a cache hit, `verify`'s full one, and what the
store does with a damaged artifact: set it aside, recompute, say why."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from tuneline.core.store.artifacts import DAMAGE_NOTE, MANIFEST, damaged_path, find_artifact, write_artifact
from tuneline.core.store.cache import serve_or_compute, sound_artifact
from tuneline.core.store.gc import find_garbage
from tuneline.core.store.integrity import content_problems, size_problems
from tuneline.core.store.verify import verify_workspace


def make_artifact(workspace: Path, key: str = "k1", files: dict[str, bytes] | None = None):
    with write_artifact(workspace, "kind", key, config={}) as draft:
        for name, data in (files or {"weights.bin": b"0123456789", "sub/config.json": b"{}"}).items():
            (draft.path / name).parent.mkdir(parents=True, exist_ok=True)
            (draft.path / name).write_bytes(data)
    return find_artifact(workspace, "kind", key)


def test_manifest_records_every_file_with_size_and_sha256(tmp_path: Path):
    artifact = make_artifact(tmp_path)
    assert artifact.manifest["files"] == {
        "sub/config.json": {"size": 2, "sha256": hashlib.sha256(b"{}").hexdigest()},
        "weights.bin": {"size": 10, "sha256": hashlib.sha256(b"0123456789").hexdigest()},
    }
    assert size_problems(artifact.path, artifact.manifest) == []
    assert content_problems(artifact.path, artifact.manifest, manifest_name=MANIFEST) == []


def test_the_cheap_check_finds_a_truncated_or_missing_file_and_verify_a_changed_byte(tmp_path: Path):
    artifact = make_artifact(tmp_path)
    (artifact.path / "weights.bin").write_bytes(b"0123")
    (artifact.path / "sub/config.json").unlink()
    assert size_problems(artifact.path, artifact.manifest) == ["sub/config.json: missing", "weights.bin: 4 bytes, manifest says 10"]

    other = make_artifact(tmp_path, "k2")
    (other.path / "weights.bin").write_bytes(b"0123456780")  # one byte changed, same size
    (other.path / "notes.txt").write_text("added")
    assert size_problems(other.path, other.manifest) == []
    assert content_problems(other.path, other.manifest, manifest_name=MANIFEST) == [
        "weights.bin: content changed (same size, sha256 differs from the manifest's)",
        "notes.txt: extra file, not in the manifest",
    ]


def test_older_manifests_are_checked_by_size_or_trusted(tmp_path: Path):
    artifact = make_artifact(tmp_path)
    sizes_only = {**artifact.manifest, "files": {"weights.bin": 10, "sub/config.json": 2}}
    (artifact.path / "weights.bin").write_bytes(b"0123456780")
    assert content_problems(artifact.path, sizes_only, manifest_name=MANIFEST) == []  # no hash to compare
    (artifact.path / "weights.bin").write_bytes(b"01")
    assert size_problems(artifact.path, sizes_only) == ["weights.bin: 2 bytes, manifest says 10"]
    no_table = {k: v for k, v in artifact.manifest.items() if k != "files"}
    assert size_problems(artifact.path, no_table) == []


def serve_or_recompute(workspace: Path, key: str = "k1") -> dict:
    """serve_or_compute with a computation that writes a fresh artifact and notes what it was told."""
    told: dict = {}

    def compute(damage):
        told["damage"] = damage
        return make_artifact(workspace, key)

    told["artifact"] = serve_or_compute(workspace, "kind", key, serve=lambda artifact: artifact, compute=compute,
                                        on_damaged=lambda damage: told.setdefault("announced", damage))
    return told


def test_a_sound_artifact_is_served_and_a_damaged_one_set_aside_and_recomputed(tmp_path: Path):
    original = make_artifact(tmp_path)
    assert "damage" not in serve_or_recompute(tmp_path)  # served, nothing computed

    (original.path / "weights.bin").write_bytes(b"01")
    told = serve_or_recompute(tmp_path)
    assert told["damage"].problems == ["weights.bin: 2 bytes, manifest says 10"]
    assert told["announced"] is told["damage"] and told["damage"].path == original.path
    assert (told["artifact"].path / "weights.bin").read_bytes() == b"0123456789"
    assert (damaged_path(tmp_path, "kind", "k1") / "weights.bin").read_bytes() == b"01"  # kept aside, never served


def test_verify_marks_a_damaged_artifact_and_the_next_run_recomputes_it_saying_why(tmp_path: Path):
    make_artifact(tmp_path, "good")
    bad = make_artifact(tmp_path, "bad")
    (bad.path / "weights.bin").write_bytes(b"x123456789")
    verdicts = {v.path.name: v for v in verify_workspace(tmp_path)}
    assert not verdicts["good"].damaged
    assert verdicts["bad"].problems == ["weights.bin: content changed (same size, sha256 differs from the manifest's)"]
    assert find_artifact(tmp_path, "kind", "bad") is None  # no reader sees it now
    assert json.loads((bad.path / DAMAGE_NOTE).read_text())["problems"] == verdicts["bad"].problems

    told = serve_or_recompute(tmp_path, "bad")
    assert told["damage"].problems == verdicts["bad"].problems
    assert find_artifact(tmp_path, "kind", "bad") is not None
    assert verify_workspace(tmp_path) and not any(v.damaged for v in verify_workspace(tmp_path))


KEY = "tokenize-0123456789abcdef0123"  # the shape of a stage key: a damaged manifest there is tuneline's


@pytest.mark.parametrize(("content", "problem"), [
    ("", "manifest.json is empty (0 bytes)"),
    ('{"kind": "kind", "key": "tokeni', "manifest.json is not JSON, cut short or overwritten"),
    ("[1, 2]", "manifest.json holds a JSON list, not an object"),
    ('{"kind": "kind", "key": "another"}', "manifest.json names kind 'kind' and key 'another', not this folder"),
    (json.dumps({"kind": "kind", "key": KEY, "files": {"weights.bin": {"sha256": "00"}}}), "manifest.json: weights.bin: no size"),
])
def test_a_damaged_manifest_is_a_damaged_artifact_set_aside_and_recomputed(tmp_path: Path, content: str, problem: str):
    """Regression: an empty manifest.json (a power loss before its data reached the disk) blocked its key for good."""
    original = make_artifact(tmp_path, KEY)
    (original.path / MANIFEST).write_text(content)
    assert sound_artifact(tmp_path, "kind", KEY) is None  # never served
    told = serve_or_recompute(tmp_path, KEY)
    assert len(told["damage"].problems) == 1 and told["damage"].problems[0].startswith(problem)
    assert told["announced"] is told["damage"]  # said, as for a truncated file (and tagged tuneline.recomputed_damaged)
    assert (damaged_path(tmp_path, "kind", KEY) / MANIFEST).read_text() == content  # kept aside for inspection
    assert told["artifact"].manifest["key"] == KEY and (told["artifact"].path / "weights.bin").read_bytes() == b"0123456789"


def test_verify_and_gc_report_a_damaged_manifest_instead_of_skipping_it(tmp_path: Path):
    broken = make_artifact(tmp_path, KEY).path
    (broken / MANIFEST).write_bytes(b"")
    listed = find_garbage(tmp_path, referenced={KEY})
    assert [(item.path, item.reason) for item in listed] == [(broken, "damaged artifact: manifest.json is empty (0 bytes)")]

    verdicts = verify_workspace(tmp_path)
    assert [(v.path, v.problems) for v in verdicts] == [(broken, ["manifest.json is empty (0 bytes)"])]
    assert not (broken / MANIFEST).exists()
    assert json.loads((broken / DAMAGE_NOTE).read_text())["problems"] == ["manifest.json is empty (0 bytes)"]
    assert [item.reason for item in find_garbage(tmp_path, referenced={KEY})] == ["artifact marked damaged by tuneline verify"]


@pytest.mark.parametrize("how", ["absolute", "dotdot", "symlink"])
def test_a_manifest_naming_a_file_outside_its_artifact_is_damage_and_nothing_outside_is_read(tmp_path: Path, how: str):
    outside = tmp_path / "elsewhere" / "secret.bin"
    outside.parent.mkdir()
    outside.write_bytes(b"0123456789")
    artifact = make_artifact(tmp_path, "k1", {"weights.bin": b"0123456789"})
    name = {"absolute": str(outside), "dotdot": "../../../elsewhere/secret.bin", "symlink": "link/secret.bin"}[how]
    if how == "symlink":
        (artifact.path / "link").symlink_to(outside.parent, target_is_directory=True)
    record = {"size": 10, "sha256": hashlib.sha256(b"0123456789").hexdigest()}  # what the outside file holds
    manifest = {**artifact.manifest, "files": {**artifact.manifest["files"], name: record}}
    (artifact.path / MANIFEST).write_text(json.dumps(manifest))
    served = find_artifact(tmp_path, "kind", "k1")

    expected = [f"manifest.json names the file {name!r}, but it "]
    assert [p[: len(expected[0])] for p in size_problems(served.path, served.manifest)] == expected
    assert [p[: len(expected[0])] for p in content_problems(served.path, served.manifest, manifest_name=MANIFEST)] == expected
    told = serve_or_recompute(tmp_path, "k1")
    assert told["damage"].problems[0].startswith(expected[0])
    assert outside.read_bytes() == b"0123456789"


def test_nested_names_inside_the_artifact_are_files_of_it(tmp_path: Path):
    """Writers save folders (checkpoints, tokenizers): `sub/file` is a legitimate name, a symlink inside too."""
    artifact = make_artifact(tmp_path, "k1", {"checkpoint-2/adapter.bin": b"ab", "weights.bin": b"c"})
    (artifact.path / "alias").symlink_to(artifact.path / "checkpoint-2", target_is_directory=True)
    manifest = {**artifact.manifest, "files": {**artifact.manifest["files"], "alias/adapter.bin": {"size": 2}}}
    assert size_problems(artifact.path, manifest) == []
