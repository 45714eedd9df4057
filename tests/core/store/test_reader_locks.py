"""What `tuneline api`, `webchat` and `chat` hold while they serve: the reader lock of each artifact
folder their model comes from, and of nothing else."""

from __future__ import annotations

from pathlib import Path

from tuneline.core.store.artifacts import artifact_path, readers_path, write_artifact
from tuneline.core.store.gc import find_garbage
from tuneline.core.store.readers import reading_artifacts


def test_serving_holds_the_artifact_folders_it_loads_and_nothing_else(tmp_path: Path):
    for key in ("merge-a", "merge-b"):
        with write_artifact(tmp_path, "merged", key, config={}) as draft:
            (draft.path / "config.json").write_text("{}")
    served, other = artifact_path(tmp_path, "merged", "merge-a"), artifact_path(tmp_path, "merged", "merge-b")
    plain = tmp_path / "plain-model"  # a folder outside any store: not the store's to lock
    plain.mkdir()
    with reading_artifacts([str(served), None, str(plain), "hub-org/hub-model"]):
        assert {item.path: item.in_use for item in find_garbage(tmp_path, referenced=set())} == {served: True, other: False}
    assert not readers_path(plain).exists()
    assert {item.path: item.in_use for item in find_garbage(tmp_path, referenced=set())} == {served: False, other: False}
