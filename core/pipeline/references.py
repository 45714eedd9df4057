"""What one stage hands to the next: a reference to its artifact, and the one door to the store.

A reference is a plain value (kind, key and the few manifest facts later stages read), never a
path that only one machine knows; it pickles and serializes to JSON as it is. The machine that
reads it turns it into a local folder through `StageStore.folder`, and every stage looks its key
up through `StageStore.serve_or_compute`: those two methods are where a store other than a local
workspace folder plugs in (`stores.open_store` chooses it; a URL workspace's is
`remote_store.py`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from tuneline.core.store.artifacts import Artifact, artifact_lock, artifact_path
from tuneline.core.store.cache import Damage, serve_or_compute, sound_artifact
from tuneline.core.training.checkpoint_sync import CheckpointSync

T = TypeVar("T")


@dataclass(frozen=True)
class ArtifactRef:
    """One stage's artifact as this run got it: computed now, or served from the store."""

    name: str
    """The stage's label in this run (`sft`, `sft/tokenize`, `dpo/merge`)."""
    kind: str
    """The artifact kind: the folder under `artifacts/` (`trained`, `tokenized`, `merged`, ...)."""
    key: str
    cache_hit: bool
    metrics: Mapping[str, float] = field(default_factory=dict)
    config: Mapping[str, Any] = field(default_factory=dict)
    """The stage's resolved settings as the manifest holds them (secrets masked)."""
    inputs: Mapping[str, str] = field(default_factory=dict)
    """Upstream keys and dataset fingerprints the key was computed from."""
    produced_by_run: str | None = None
    """The MLflow run that computed the artifact (not this run's, for a cache hit)."""
    start_model: str | None = None
    """Training stages: the full-weight model they started from (what a LoRA adapter applies to)."""
    finetuning_type: str | None = None
    """Training stages: lora, oft, freeze or full."""

    @classmethod
    def from_artifact(cls, artifact: Artifact, *, name: str, cache_hit: bool) -> ArtifactRef:
        manifest = artifact.manifest
        return cls(
            name=name, kind=manifest["kind"], key=manifest["key"], cache_hit=cache_hit,
            metrics=dict(manifest.get("metrics") or {}), config=dict(manifest.get("config") or {}),
            inputs=dict(manifest.get("inputs") or {}), produced_by_run=manifest.get("mlflow_run_id"),
            start_model=manifest.get("start_model"), finetuning_type=manifest.get("finetuning_type"),
        )

    @property
    def is_adapter(self) -> bool:
        return self.finetuning_type in ("lora", "oft")


@dataclass(frozen=True)
class ExternalModel:
    """A model no stage produced: a hub id or a folder the stage config names (`model_name_or_path`)."""

    key: str
    path: str


ModelInput = ArtifactRef | ExternalModel
"""A full-weight model a stage starts from, merges into, evaluates against or exports."""


@dataclass(frozen=True)
class StageStore:
    """The artifact store of a workspace folder, as the stages read and write it."""

    root: Path
    """The folder whose `artifacts/` a stage writes into (the workspace itself, here)."""

    def folder(self, reference: ArtifactRef) -> Path:
        """The local folder holding `reference`'s artifact."""
        return artifact_path(self.root, reference.kind, reference.key)

    def place(self, reference: ArtifactRef) -> str:
        """Where `reference`'s artifact lives, for a user to read (a folder here), fetching nothing."""
        return str(self.folder(reference))

    def serve_or_compute(self, kind: str, key: str, *, serve: Callable[[Artifact], T], compute: Callable[[Damage | None], T],
                         on_wait: Callable[[], None], on_damaged: Callable[[Damage], None]) -> T:
        """`core.store.cache.serve_or_compute` on this store."""
        return serve_or_compute(self.root, kind, key, serve=serve, compute=compute, on_wait=on_wait, on_damaged=on_damaged)

    @property
    def is_cache(self) -> bool:
        """Whether `root` is only this machine's cache of a store elsewhere (a URL workspace)."""
        return False

    def find(self, kind: str, key: str) -> Artifact | None:
        """The artifact stored under `key` when it is there and sound, without waiting for a writer of
        it; None otherwise (its writer, or `serve_or_compute`, decides what to do then)."""
        return sound_artifact(self.root, kind, key)

    def publish(self, artifact: Artifact) -> None:
        """Make an artifact just written under `root` the store's (it already is, here)."""

    def exclusive(self, kind: str, key: str) -> AbstractContextManager[None]:
        """Hold the key's lock across every process that shares this store."""
        return artifact_lock(self.root, kind, key)

    def checkpoint_sync(self, draft: Path) -> CheckpointSync | None:
        """What keeps the checkpoints of `draft` (a draft under `root`) beyond this machine: nothing
        here, where the draft is in the workspace itself."""
        return None


def model_path(store: StageStore, model: ModelInput) -> str:
    """Where `model`'s weights and tokenizer are read from on this machine."""
    return model.path if isinstance(model, ExternalModel) else str(store.folder(model))
