"""Which store a run's workspace names: its local folder, or an object store reached through this
machine's cache. A module of its own because the URL workspace's store is built on `references.py`."""

from __future__ import annotations

from tuneline.core.pipeline.references import StageStore
from tuneline.core.pipeline.remote_store import RemoteStageStore
from tuneline.core.store.location import parse_workspace


def open_store(workspace: str) -> StageStore:
    """The store a run's `workspace` names: its folder, or for a URL the object store, written
    through this machine's cache (`TUNELINE_CACHE`)."""
    location = parse_workspace(workspace)
    if location.path is not None:
        return StageStore(location.path)
    return RemoteStageStore.open(location)
