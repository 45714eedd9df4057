"""One stage, one dispatchable unit: `run_stage_unit(unit, inputs, context=...)`.

A unit (`core/pipeline/units.py`) says what one stage computes: its key from its inputs'
references, its parameters and its work. This module runs it the same way wherever it runs
(`tuneline train`'s caller, the in-process pipeline's Prefect task, a worker's flow run): the
artifact store is the only cache, so the stage's key is looked up and the artifact served when it
is there and sound, or computed under the key's lock, and either way the stage gets one MLflow
child run under the pipeline's parent run. What it returns is a reference, a plain value
(`references.py`). Logging goes through the `Announcer` the caller hands in, so no orchestrator
is imported here.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any, Protocol

from tuneline.core.pipeline.references import ArtifactRef, ModelInput, StageStore, model_path
from tuneline.core.pipeline.stores import open_store
from tuneline.core.store.artifacts import Artifact, ArtifactDraft, find_artifact, write_artifact
from tuneline.core.store.cache import Damage
from tuneline.core.tracking import runs as tracking
from tuneline.core.tracking.references import KEY_TAG

CACHE_HIT_TAG = "tuneline.cache_hit"
PRODUCER_TAG = "tuneline.produced_by_run"
RECOMPUTED_TAG = "tuneline.recomputed_damaged"  # why the cached artifact this run replaced was damaged
RESUMED_RUN_TAG = "tuneline.resumed_from_run"
RESUMED_STEP_TAG = "tuneline.resumed_from_step"
STAGE_TAG = "tuneline.stage"
WORKER_TAG = "tuneline.worker"  # the machine that ran the stage: $TUNELINE_WORKER, else its host name
WORKER_ENV = "TUNELINE_WORKER"
_TAG_CHARS = 500
_LOG = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunContext:
    """Plain values a stage needs to place its artifact and its MLflow child run."""

    workspace: str
    tracking_uri: str
    experiment_id: str
    parent_run_id: str


@dataclass(frozen=True)
class Announcer:
    """Where a stage's messages go: `log` and `warn` are the orchestrator's log (Prefect's run logger
    in a task); `say` also prints, for the lines a user reads on the console."""

    log: Callable[[str], None] = _LOG.info
    warn: Callable[[str], None] = _LOG.warning

    def say(self, message: str) -> None:
        self.log(message)
        print(message, flush=True)


@dataclass(frozen=True)
class StageKey:
    """A unit's key and what its manifest records it was computed from."""

    key: str
    inputs: dict[str, str]
    """Upstream keys and dataset fingerprints (the manifest's `inputs`)."""
    datasets: dict[str, str] = field(default_factory=dict)
    """Dataset digests the child run records as its MLflow inputs (none for most units)."""


@dataclass(frozen=True)
class StageInputs:
    """A unit's input references and the store they are read from on this machine."""

    store: StageStore
    references: Mapping[str, ModelInput]

    def __getitem__(self, name: str) -> ModelInput:
        return self.references[name]

    def get(self, name: str) -> ModelInput | None:
        return self.references.get(name)

    def path(self, name: str) -> str:
        """The local folder (or hub id) of input `name`."""
        return model_path(self.store, self.references[name])


@dataclass(frozen=True)
class UnitRun:
    """What a unit's work and its cache-hit record read while its child run is open."""

    context: RunContext
    run_id: str
    inputs: StageInputs
    announcer: Announcer


class StageUnit(Protocol):
    """What one stage computes (`core/pipeline/units.py` holds one per kind of work)."""

    kind: str
    """The artifact kind: the folder under `artifacts/` it is stored in."""
    action: str
    """What it does, as a verb (`train`, `merge`): the name an orchestrator gives its runs."""
    keep_partial: bool

    @property
    def label(self) -> str: ...

    def stage_key(self, inputs: Mapping[str, ModelInput]) -> StageKey: ...

    def params(self, inputs: StageInputs) -> dict[str, Any]: ...

    def work(self, draft: ArtifactDraft, run: UnitRun) -> None: ...

    def on_hit(self, artifact: Artifact, run: UnitRun) -> None: ...


def run_stage_unit(unit: StageUnit, inputs: Mapping[str, ModelInput], *, context: RunContext,
                   announcer: Announcer = Announcer(),
                   computing_slot: AbstractContextManager[Any] | None = None) -> ArtifactRef:
    """The reference of `unit`'s artifact, computed unless the store holds it sound.

    Another process on the same workspace may be computing the same key: the artifact lock makes
    this one wait for it and then serves its artifact as a cache hit, so each key is computed once
    and no two writers share a draft. `computing_slot` (a pipeline's training slots) is held only
    while the unit computes: a hit waits for no stage beside it."""
    store = open_store(context.workspace)
    resolved = StageInputs(store, dict(inputs))
    key = unit.stage_key(inputs)
    label = unit.label

    def compute(damage: Damage | None) -> ArtifactRef:
        with computing_slot or nullcontext():
            return _compute(unit, key, resolved, context=context, announcer=announcer, damage=damage)

    return store.serve_or_compute(
        unit.kind, key.key,
        compute=compute,
        serve=lambda artifact: _record_cache_hit(unit, artifact, resolved, context=context, announcer=announcer),
        on_wait=lambda: announcer.say(f"{label}: another run is computing {key.key}; waiting for it"),
        on_damaged=lambda damage: announcer.say(f"{label}: cached artifact {damage.path} is damaged ({damage.reason}); recomputing"),
    )


def serve_stored_unit(unit: StageUnit, inputs: Mapping[str, ModelInput], *, context: RunContext,
                      announcer: Announcer = Announcer()) -> ArtifactRef | None:
    """`unit`'s artifact as a cache hit when the store already holds it (a URL workspace: one manifest
    read), recorded as `run_stage_unit` records a hit; None, computing nothing, when it does not. A
    pipeline on a work pool asks this before it sends the unit to a worker."""
    store = open_store(context.workspace)
    artifact = store.find(unit.kind, unit.stage_key(inputs).key)
    if artifact is None:
        return None
    return _record_cache_hit(unit, artifact, StageInputs(store, dict(inputs)), context=context, announcer=announcer)


def unit_key(unit: StageUnit, inputs: Mapping[str, ModelInput]) -> str:
    """The key `run_stage_unit` looks `unit` up by (an orchestrator names its run after it)."""
    return unit.stage_key(inputs).key


def worker_name() -> str:
    """The `tuneline.worker` tag of the runs this machine opens."""
    return os.environ.get(WORKER_ENV) or socket.gethostname()


def _compute(unit: StageUnit, key: StageKey, inputs: StageInputs, *, context: RunContext, announcer: Announcer,
             damage: Damage | None) -> ArtifactRef:
    """Compute the artifact under its MLflow child run; the caller holds the artifact lock."""
    label, uri = unit.label, context.tracking_uri
    tags = {KEY_TAG: key.key, CACHE_HIT_TAG: "false", STAGE_TAG: unit.kind, WORKER_TAG: worker_name()}
    if damage is not None:
        tags[RECOMPUTED_TAG] = damage.reason[:_TAG_CHARS]
    params = unit.params(inputs)
    started = time.monotonic()
    with tracking.tracked_run(uri, context.experiment_id, name=label, parent_run_id=context.parent_run_id, tags=tags) as run_id:
        tracking.log_params(uri, run_id, params)
        tracking.log_dict(uri, run_id, dict(params), "config.json")
        if key.datasets:
            tracking.log_dataset_inputs(uri, run_id, key.datasets)
        store = inputs.store  # written where this machine's readers find it, then published (a URL workspace's upload)
        with write_artifact(store.root, unit.kind, key.key, config=tracking.redact(params), inputs=key.inputs,
                            keep_partial=unit.keep_partial) as draft:  # the manifest is logged to MLflow too
            draft.extra["mlflow_run_id"] = run_id
            unit.work(draft, UnitRun(context, run_id, inputs, announcer))
            draft.metrics["stage_seconds"] = round(time.monotonic() - started, 2)
        artifact = find_artifact(store.root, unit.kind, key.key)
        assert artifact is not None  # just written, under the lock
        store.publish(artifact)  # before the key's lock or lease is let go
        tracking.log_metrics(uri, run_id, artifact.manifest["metrics"])
        tracking.log_artifact(uri, run_id, artifact.path / "manifest.json")
    result = ArtifactRef.from_artifact(artifact, name=label, cache_hit=False)
    announcer.log(f"{label} computed in {time.monotonic() - started:.1f} s -> {store.place(result)}")
    return result


def _record_cache_hit(unit: StageUnit, artifact: Artifact, inputs: StageInputs, *, context: RunContext,
                      announcer: Announcer) -> ArtifactRef:
    """A child run tagged as a cache hit, linked to the run that produced the artifact; the unit's
    `on_hit` records what else the stage's run says about the artifact (from its manifest)."""
    result = ArtifactRef.from_artifact(artifact, name=unit.label, cache_hit=True)
    tags = {KEY_TAG: result.key, CACHE_HIT_TAG: "true", PRODUCER_TAG: result.produced_by_run or "", STAGE_TAG: result.kind,
            WORKER_TAG: worker_name()}
    with tracking.tracked_run(context.tracking_uri, context.experiment_id, name=unit.label,
                              parent_run_id=context.parent_run_id, tags=tags) as run_id:
        tracking.log_params(context.tracking_uri, run_id, result.config)
        tracking.log_metrics(context.tracking_uri, run_id, result.metrics)
        unit.on_hit(artifact, UnitRun(context, run_id, inputs, announcer))
    return result


def link_resumed_attempt(run: UnitRun, *, previous_run_id: str, step: int) -> None:
    """This run takes over the draft of an earlier attempt: a killed process left that attempt's run
    (and its pipeline run) RUNNING, so end them as KILLED; tag this run with the attempt and the
    checkpoint step it resumes from (0: it had saved none)."""
    if tracking.end_abandoned_run(run.context.tracking_uri, previous_run_id):
        run.announcer.log(f"run {previous_run_id} was left running by a killed process; marked KILLED")
    tracking.set_tags(run.context.tracking_uri, run.run_id, {RESUMED_RUN_TAG: previous_run_id, RESUMED_STEP_TAG: step})
