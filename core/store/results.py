"""What a stage hands to the stages after it: its artifact, typed.

A stage's key names its artifact (`<workspace>/artifacts/<kind>/<key>/`), and the artifact's
manifest names the MLflow run that computed it; `StageResult` carries those plus the few values
later stages read, so the flow never digs in a manifest dict.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tuneline.core.store.artifacts import Artifact


@dataclass(frozen=True)
class ModelRef:
    """A full-weight model a stage can start from, merge into or export: its key stands for its weights."""

    key: str
    path: str
    tokenizer_path: str


@dataclass(frozen=True)
class StageResult:
    """One stage's artifact as this run got it: computed now, or served from the store."""

    name: str
    """The stage's label in this run (`sft`, `sft/tokenize`, `dpo/merge`)."""
    kind: str
    """The artifact kind: the folder under `artifacts/` (`trained`, `tokenized`, `merged`, ...)."""
    key: str
    path: str
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
    def from_artifact(cls, artifact: Artifact, *, name: str, cache_hit: bool) -> StageResult:
        manifest = artifact.manifest
        return cls(
            name=name, kind=manifest["kind"], key=manifest["key"], path=str(artifact.path), cache_hit=cache_hit,
            metrics=dict(manifest.get("metrics") or {}), config=dict(manifest.get("config") or {}),
            inputs=dict(manifest.get("inputs") or {}), produced_by_run=manifest.get("mlflow_run_id"),
            start_model=manifest.get("start_model"), finetuning_type=manifest.get("finetuning_type"),
        )

    @property
    def is_adapter(self) -> bool:
        return self.finetuning_type in ("lora", "oft")

    def as_model(self) -> ModelRef:
        """This artifact as a full-weight model (a merge, a full fine-tune, a base build)."""
        return ModelRef(key=self.key, path=self.path, tokenizer_path=self.path)
