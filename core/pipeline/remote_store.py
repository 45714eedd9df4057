"""The stage store of a URL workspace (`s3://bucket/prefix`): the bucket holds the artifacts, this
machine's cache (`TUNELINE_CACHE`) the copies its stages read and write.

A lookup is one GET of the artifact's manifest: a hit is served from the manifest alone, and its
files are fetched (and verified) only when a later stage reads them (`folder`). A miss is computed
under the key's lease (`core.store.leases`), checked again once the lease is held, into the cache
laid out as a local workspace (so `write_artifact` writes it as always), and published (files, then
the manifest) before the lease is released. An artifact the cache holds whole whose upload was cut
short (the store went away) is published as it is, not computed again.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from tuneline.core.config.machine_cache import cache_root
from tuneline.core.errors import ObjectStoreError
from tuneline.core.pipeline.references import ArtifactRef, StageStore
from tuneline.core.store.artifacts import DAMAGE_NOTE, MANIFEST, Artifact, artifact_lock, artifact_path
from tuneline.core.store.cache import Damage, set_aside_if_damaged, sound_artifact
from tuneline.core.store.leases import LEASE_TTL_S, remote_lease
from tuneline.core.store.location import WorkspaceLocation
from tuneline.core.store.remote import RemoteWorkspace
from tuneline.core.store.remote_artifacts import fetch_artifact, publish_artifact
from tuneline.core.training.checkpoint_sync import CheckpointSync

T = TypeVar("T")
LEASE_TTL_ENV = "TUNELINE_LEASE_TTL_S"  # how long a killed holder's lease blocks the key (default LEASE_TTL_S)


def lease_ttl_s() -> float:
    text = os.environ.get(LEASE_TTL_ENV)
    try:
        ttl = float(text) if text else LEASE_TTL_S
    except ValueError:
        raise ObjectStoreError(f"{LEASE_TTL_ENV}={text!r} is not a number of seconds; unset it or give one such as 30.") from None
    if ttl <= 0:
        raise ObjectStoreError(f"{LEASE_TTL_ENV}={text!r} must be a positive number of seconds.")
    return ttl


@dataclass(frozen=True)
class RemoteStageStore(StageStore):
    """`root` is this machine's cache; `remote` the workspace's objects."""

    remote: RemoteWorkspace
    _fetched: dict[tuple[str, str], Path] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def open(cls, location: WorkspaceLocation) -> RemoteStageStore:
        return cls(cache_root(), RemoteWorkspace(location))

    def folder(self, reference: ArtifactRef) -> Path:
        """The cache's copy of the artifact, fetched and verified on its first use in this process."""
        where = (reference.kind, reference.key)
        if where not in self._fetched:
            fetched = fetch_artifact(self.remote, reference.kind, reference.key, cache=self.root)
            if fetched is None:
                raise ObjectStoreError(f"{self.place(reference)} has no {MANIFEST} (removed, or marked damaged by "
                                       f"`tuneline verify`) although this run was handed it; run the same command again "
                                       "to compute it again.")
            self._fetched[where] = fetched.path
        return self._fetched[where]

    def place(self, reference: ArtifactRef) -> str:
        return self.remote.artifact_url(reference.kind, reference.key)

    def serve_or_compute(self, kind: str, key: str, *, serve: Callable[[Artifact], T], compute: Callable[[Damage | None], T],
                         on_wait: Callable[[], None], on_damaged: Callable[[Damage], None]) -> T:
        """`serve` with the store's manifest (the files stay in the store until read), else `compute`
        under the key's lease and this machine's lock on its cache folder."""
        if (found := self._published(kind, key)) is not None:
            return serve(found)
        with remote_lease(self.remote, kind, key, ttl_s=lease_ttl_s(), on_wait=on_wait):
            if (found := self._published(kind, key)) is not None:  # its holder finished it while this one waited
                return serve(found)
            with artifact_lock(self.root, kind, key):
                damage = set_aside_if_damaged(self.root, kind, key)
                if damage is None and (local := sound_artifact(self.root, kind, key)) is not None:
                    publish_artifact(self.remote, local)  # computed here, its upload cut short
                    return serve(local)
                damage = self._noted_damage(kind, key) or damage
                if damage is not None:
                    on_damaged(damage)
                return compute(damage)

    @property
    def is_cache(self) -> bool:
        return True

    def find(self, kind: str, key: str) -> Artifact | None:
        return self._published(kind, key)

    def publish(self, artifact: Artifact) -> None:
        publish_artifact(self.remote, artifact)
        kind, key = artifact.path.parent.name, artifact.path.name
        CheckpointSync(self.remote, f"{kind}/.{key}.partial").discard()  # its checkpoints are no longer needed

    @contextmanager
    def exclusive(self, kind: str, key: str) -> Iterator[None]:
        with remote_lease(self.remote, kind, key, ttl_s=lease_ttl_s()):
            yield

    def checkpoint_sync(self, draft: Path) -> CheckpointSync | None:
        return CheckpointSync(self.remote, draft.relative_to(self.root / "artifacts").as_posix())

    def _published(self, kind: str, key: str) -> Artifact | None:
        """The artifact as its manifest in the store describes it (one GET), at its place in the cache."""
        manifest = self.remote.read_manifest(kind, key)
        return None if manifest is None else Artifact(artifact_path(self.root, kind, key), manifest)

    def _noted_damage(self, kind: str, key: str) -> Damage | None:
        """What `tuneline verify` noted in place of the manifest it removed, if it did."""
        text = self.remote.read_text(self.remote.artifact_url(kind, key, DAMAGE_NOTE))
        if text is None:
            return None
        try:
            problems = [str(p) for p in json.loads(text).get("problems") or []]
        except (ValueError, AttributeError):
            problems = []
        return Damage(path=self.remote.artifact_url(kind, key), problems=problems or ["marked damaged"])  # type: ignore[arg-type]
