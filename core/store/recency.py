"""When a cached artifact was last used: its manifest's modification time.

Writing the manifest sets it, and each cache hit that counts as a use renews it (the manifest's
content, and so its record of the files, is unchanged). `tuneline gc` keeps the tokenized-data
cache's most recently used artifacts, as it keeps the stages of a pipeline's recent runs.
"""

from __future__ import annotations

import os
from pathlib import Path

from tuneline.core.store.artifacts import MANIFEST, Artifact
from tuneline.core.store.verify import finished_artifacts


def note_use(artifact: Artifact) -> None:
    """Record that `artifact` was used now; a cache this process may only read keeps its old time
    (its artifacts then look older to `tuneline gc` than they are, and nothing else changes)."""
    try:
        os.utime(artifact.path / MANIFEST)
    except OSError:
        pass


def recently_used(workspace: str | Path, kind: str, *, count: int) -> set[str]:
    """The keys of the `count` artifacts of `kind` used most recently (ties broken by key)."""
    artifacts = list(finished_artifacts(workspace, kinds=(kind,)))
    by_recency = sorted(artifacts, key=lambda a: ((a.path / MANIFEST).stat().st_mtime_ns, a.key), reverse=True)
    return {artifact.key for artifact in by_recency[:count]}
