"""Artifacts: directories under `<workspace>/artifacts/<kind>/<key>/` with a manifest written last.

A writer fills a temporary sibling (`.<key>.partial`) and renames it into place after writing
`manifest.json`; a directory without a manifest does not exist for any reader. The partial
directory is kept when the work fails only for writers that resume (training checkpoints).

Several processes may share a workspace: `artifact_lock` holds an exclusive `flock` on
`.<key>.lock` beside the artifact while one of them computes it, so the others wait and then find
it finished instead of writing the same draft at once.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tuneline.core.store.locks import file_lock

MANIFEST = "manifest.json"


@dataclass(frozen=True)
class Artifact:
    path: Path
    manifest: Mapping[str, Any]

    @property
    def key(self) -> str:
        return self.manifest["key"]


@dataclass
class ArtifactDraft:
    """What a writer fills in: files go under `path`, results into `metrics` and `extra`."""

    path: Path
    metrics: dict[str, float] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)


def artifact_path(workspace: str | Path, kind: str, key: str) -> Path:
    return Path(workspace) / "artifacts" / kind / key


def partial_path(workspace: str | Path, kind: str, key: str) -> Path:
    return Path(workspace) / "artifacts" / kind / f".{key}.partial"


def lock_path(workspace: str | Path, kind: str, key: str) -> Path:
    return Path(workspace) / "artifacts" / kind / f".{key}.lock"


def artifact_lock(
    workspace: str | Path, kind: str, key: str, *, on_wait: Callable[[], None] | None = None
) -> AbstractContextManager[None]:
    """Hold the exclusive lock on one artifact key across processes (see `core.locks`); `on_wait`
    is called once if another process holds it."""
    return file_lock(lock_path(workspace, kind, key), on_wait=on_wait)


def read_manifest(path: str | Path) -> dict[str, Any] | None:
    file = Path(path) / MANIFEST
    if not file.is_file():
        return None
    return json.loads(file.read_text(encoding="utf-8"))


def find_artifact(workspace: str | Path, kind: str, key: str) -> Artifact | None:
    path = artifact_path(workspace, kind, key)
    manifest = read_manifest(path)
    return Artifact(path, manifest) if manifest is not None else None


@contextmanager
def write_artifact(
    workspace: str | Path,
    kind: str,
    key: str,
    *,
    config: Mapping[str, Any],
    inputs: Mapping[str, str] | None = None,
    keep_partial: bool = False,
) -> Iterator[ArtifactDraft]:
    """Yield a draft directory; on success write the manifest last and rename it into place.

    `keep_partial` leaves files of an earlier interrupted attempt (checkpoints) for the writer
    to resume from; otherwise the draft starts empty.
    """
    final = artifact_path(workspace, kind, key)
    draft_dir = partial_path(workspace, kind, key)
    if draft_dir.exists() and not keep_partial:
        shutil.rmtree(draft_dir)
    draft_dir.mkdir(parents=True, exist_ok=True)
    draft = ArtifactDraft(draft_dir)
    try:
        yield draft
    except BaseException:
        if not keep_partial:  # nothing worth resuming from: leave no half-written files behind
            shutil.rmtree(draft_dir, ignore_errors=True)
        raise
    manifest = {
        "kind": kind,
        "key": key,
        "inputs": dict(inputs or {}),
        "config": dict(config),
        "metrics": draft.metrics,
        **draft.extra,
        "files": _file_sizes(draft_dir),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    tmp_manifest = draft_dir / f".{MANIFEST}.tmp"
    tmp_manifest.write_text(json.dumps(manifest, indent=2, sort_keys=True, default=str), encoding="utf-8")
    os.replace(tmp_manifest, draft_dir / MANIFEST)
    if final.exists():  # an equal artifact landed meanwhile (same key, same content): keep it
        shutil.rmtree(draft_dir)
        return
    os.replace(draft_dir, final)


def _file_sizes(root: Path) -> dict[str, int]:
    return {
        f.relative_to(root).as_posix(): f.stat().st_size
        for f in sorted(root.rglob("*"))
        if f.is_file() and f.name != f".{MANIFEST}.tmp"
    }
