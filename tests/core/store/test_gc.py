"""`tuneline gc`'s choice: exactly the unreferenced artifacts and the stale drafts, never a draft in use."""

from __future__ import annotations

from pathlib import Path

import pytest

from tuneline.core.store.artifacts import artifact_lock, artifact_path, partial_path, set_aside, write_artifact
from tuneline.core.store.gc import find_garbage, remove_garbage


def finished(workspace: Path, kind: str, key: str) -> Path:
    with write_artifact(workspace, kind, key, config={}) as draft:
        (draft.path / "weights.bin").write_bytes(b"w" * 100)
    return artifact_path(workspace, kind, key)


def draft(workspace: Path, kind: str, key: str) -> Path:
    path = partial_path(workspace, kind, key)
    (path / "checkpoint-2").mkdir(parents=True)
    (path / "checkpoint-2" / "adapter.bin").write_bytes(b"c" * 10)
    return path


@pytest.fixture
def workspace(tmp_path: Path) -> dict[str, Path]:
    paths = {
        "kept": finished(tmp_path, "trained", "sft-kept"),
        "old": finished(tmp_path, "trained", "sft-old"),
        "old_tokens": finished(tmp_path, "tokenized", "tokenize-old"),
        "superseded": draft(tmp_path, "trained", "sft-kept"),  # its artifact is finished
        "stale": draft(tmp_path, "trained", "sft-stale"),  # no lock, no run references it
        "resumable": draft(tmp_path, "trained", "sft-resumable"),  # a recent (killed) run references it
        "in_use": draft(tmp_path, "trained", "sft-running"),  # a process holds its lock
    }
    paths["damaged"] = set_aside(finished(tmp_path, "trained", "sft-damaged"))
    return paths


REFERENCED = {"sft-kept", "sft-resumable", "sft-damaged"}
GARBAGE = {"old", "old_tokens", "superseded", "stale", "damaged"}


def test_gc_lists_exactly_the_unreferenced_artifacts_and_stale_drafts(tmp_path: Path, workspace: dict[str, Path]):
    with artifact_lock(tmp_path, "trained", "sft-running"):
        garbage = find_garbage(tmp_path, referenced=REFERENCED)
    assert {item.path for item in garbage} == {workspace[name] for name in GARBAGE}
    by_path = {item.path: item for item in garbage}
    assert by_path[workspace["stale"]].size == 10
    assert by_path[workspace["old"]].size == sum(f.stat().st_size for f in workspace["old"].iterdir())  # weights and manifest
    assert by_path[workspace["superseded"]].reason == "draft superseded by its finished artifact"


def test_gc_removes_them_and_keeps_the_rest(tmp_path: Path, workspace: dict[str, Path]):
    with artifact_lock(tmp_path, "trained", "sft-running"):
        removed = list(remove_garbage(tmp_path, find_garbage(tmp_path, referenced=REFERENCED)))
    assert {item.path for item in removed} == {workspace[name] for name in GARBAGE}
    assert {name for name, path in workspace.items() if path.exists()} == {"kept", "resumable", "in_use"}


def test_gc_skips_what_a_process_locked_after_the_listing(tmp_path: Path, workspace: dict[str, Path]):
    garbage = find_garbage(tmp_path, referenced=REFERENCED | {"sft-running"})
    with artifact_lock(tmp_path, "trained", "sft-stale"):
        removed = {item.path for item in remove_garbage(tmp_path, garbage)}
    assert workspace["stale"] not in removed and workspace["stale"].is_dir()
    assert workspace["old"] in removed


@pytest.mark.parametrize("content", ["not json {", "[1, 2]", '{"kind": "trained", "key": "someone-else"}'])
def test_folders_with_another_programs_manifest_are_left_alone_by_gc_and_verify(tmp_path: Path, content: str):
    """A shared cache may hold any folder: a manifest.json tuneline did not write for it is never garbage."""
    from tuneline.core.store.verify import finished_artifacts

    foreign = tmp_path / "artifacts" / "trained" / "theirs"
    foreign.mkdir(parents=True)
    (foreign / "manifest.json").write_text(content)
    mine = finished(tmp_path, "trained", "sft-mine")
    assert [item.path for item in find_garbage(tmp_path, referenced=set())] == [mine]
    assert [artifact.path for artifact in finished_artifacts(tmp_path)] == [mine]


def test_noting_a_use_survives_a_manifest_gone_meanwhile(tmp_path: Path):
    """gc removes an artifact's manifest first; a process serving it at that moment (or from a cache it
    may only read, where os.utime fails alike) keeps serving what it holds."""
    from tuneline.core.store.artifacts import find_artifact
    from tuneline.core.store.recency import note_use

    finished(tmp_path, "tokenized", "tokenize-a")
    artifact = find_artifact(tmp_path, "tokenized", "tokenize-a")
    (artifact.path / "manifest.json").unlink()
    note_use(artifact)  # neither raises nor writes the manifest back, which would resurrect a half-removed artifact
    assert not (artifact.path / "manifest.json").exists() and find_artifact(tmp_path, "tokenized", "tokenize-a") is None
    assert (artifact.path / "weights.bin").read_bytes() == b"w" * 100


def test_gc_keeps_what_a_process_reads_says_so_and_removes_it_once_the_reader_is_gone(tmp_path: Path):
    """A server may read an artifact for days: its shared reader lock keeps the artifact, however old."""
    from tuneline.core.store.readers import reading_artifact

    served = finished(tmp_path, "merged", "merge-served")
    with reading_artifact(served):
        listed = find_garbage(tmp_path, referenced=set())
        assert [(item.path, item.in_use) for item in listed] == [(served, True)]
        assert list(remove_garbage(tmp_path, listed)) == [] and (served / "weights.bin").is_file()
    listed = find_garbage(tmp_path, referenced=set())
    assert [(item.path, item.in_use) for item in listed] == [(served, False)]
    assert [item.path for item in remove_garbage(tmp_path, listed)] == [served] and not served.exists()


def test_gc_skips_what_a_process_started_reading_after_the_listing(tmp_path: Path):
    from tuneline.core.store.readers import reading_artifact

    served = finished(tmp_path, "merged", "merge-served")
    listed = find_garbage(tmp_path, referenced=set())
    with reading_artifact(served):
        assert list(remove_garbage(tmp_path, listed)) == [] and (served / "manifest.json").is_file()


def test_a_cache_reader_holds_its_artifact_from_before_the_lookup_until_it_is_done(tmp_path: Path):
    """serve_or_compute's `reading` stack: the lock is taken before the artifact is looked up, so gc
    cannot remove it between the hit and its use; computed or served alike."""
    from contextlib import ExitStack

    from tuneline.core.store.artifacts import find_artifact
    from tuneline.core.store.cache import serve_or_compute

    def compute(damage):
        return finished(tmp_path, "tokenized", "tokenize-x")

    for _ in ("computed", "served"):
        with ExitStack() as reading:
            serve_or_compute(tmp_path, "tokenized", "tokenize-x", serve=lambda artifact: artifact.path, compute=compute,
                             reading=reading)
            assert [item.in_use for item in find_garbage(tmp_path, referenced=set())] == [True]
    assert [item.in_use for item in find_garbage(tmp_path, referenced=set())] == [False]
    assert find_artifact(tmp_path, "tokenized", "tokenize-x") is not None
