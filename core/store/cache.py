"""The artifact store as the one cache: serve a sound artifact, or compute it once.

Every stage (pipeline task or `tuneline train`'s tokenized data) asks `serve_or_compute`. A hit
costs a manifest read and a stat per file; a damaged artifact (files, or the manifest itself) is
set aside and recomputed, never served; a key another process is computing is waited for and then
served. A caller that goes on reading the artifact after it returns passes `reading`: the shared
reader lock (`core.store.readers`) is taken before the artifact is looked up and held until that
stack closes, so `tuneline gc` cannot remove it in between.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from tuneline.core.store.artifacts import (
    MANIFEST,
    Artifact,
    artifact_lock,
    artifact_path,
    damage_noted,
    find_artifact,
    manifest_damage,
    set_aside,
)
from tuneline.core.store.integrity import size_problems
from tuneline.core.store.readers import reading_artifact

T = TypeVar("T")


@dataclass(frozen=True)
class Damage:
    """A cached artifact that was found damaged and set aside."""

    path: Path  # where it was
    problems: list[str]

    @property
    def reason(self) -> str:
        return "; ".join(self.problems)


def sound_artifact(workspace: str | Path, kind: str, key: str) -> Artifact | None:
    """The artifact for `key` if it exists and its files have the recorded sizes."""
    artifact = find_artifact(workspace, kind, key)
    if artifact is None or size_problems(artifact.path, artifact.manifest):
        return None
    return artifact


def set_aside_if_damaged(workspace: str | Path, kind: str, key: str) -> Damage | None:
    """Move the artifact for `key` aside if it is damaged (its files, its manifest, or marked by
    `tuneline verify`); what was wrong with it, or None when it is sound or absent. The caller holds
    the key's lock."""
    path = artifact_path(workspace, kind, key)
    if not path.is_dir():
        return None
    artifact = find_artifact(workspace, kind, key)
    if artifact is not None:
        problems = size_problems(path, artifact.manifest)
    else:
        unusable = manifest_damage(path)
        problems = [unusable] if unusable else damage_noted(path) or [f"{MANIFEST} missing"]
    if not problems:
        return None
    set_aside(path)
    return Damage(path=path, problems=problems)


def serve_or_compute(
    workspace: str | Path,
    kind: str,
    key: str,
    *,
    serve: Callable[[Artifact], T],
    compute: Callable[[Damage | None], T],
    on_wait: Callable[[], None] | None = None,
    on_damaged: Callable[[Damage], None] | None = None,
    reading: ExitStack | None = None,
) -> T:
    """`serve(artifact)` for a sound cached artifact, else `compute(damage)` under the key's lock
    (`damage` says what was set aside, if anything). The check is repeated under the lock: another
    process may have finished, or set aside, the same key meanwhile. With `reading`, the key's
    reader lock is entered into it first and stays held until it closes."""
    if reading is not None:
        reading.enter_context(reading_artifact(artifact_path(workspace, kind, key)))
    found = sound_artifact(workspace, kind, key)
    if found is not None:
        return serve(found)
    with artifact_lock(workspace, kind, key, on_wait=on_wait):
        damage = set_aside_if_damaged(workspace, kind, key)
        found = find_artifact(workspace, kind, key)
        if found is not None:
            return serve(found)
        if damage is not None and on_damaged is not None:
            on_damaged(damage)
        return compute(damage)
