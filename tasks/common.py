"""What every stage task shares: the artifact store as the cache, the MLflow child run, the Prefect state.

The artifact store is the only cache. Stage tasks keep no Prefect results and use no Prefect cache
policy: each task run executes, finds its key's artifact in the store (a manifest read and a stat
per file) or computes it, and records the outcome in an MLflow child run. A hit ends the task run
in a Completed state named "Cached", so Prefect's UI still shows which stages were served; the
task run is named after the stage key.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from prefect import get_run_logger
from prefect.cache_policies import NO_CACHE
from prefect.states import Completed, State

from tuneline.core.tracking import runs as tracking
from tuneline.core.tracking.references import KEY_TAG
from tuneline.core.store.artifacts import Artifact, ArtifactDraft, find_artifact, write_artifact
from tuneline.core.store.cache import Damage, serve_or_compute
from tuneline.core.store.results import StageResult

CACHE_HIT_TAG = "tuneline.cache_hit"
PRODUCER_TAG = "tuneline.produced_by_run"
RECOMPUTED_TAG = "tuneline.recomputed_damaged"  # why the cached artifact this run replaced was damaged
RESUMED_RUN_TAG = "tuneline.resumed_from_run"
RESUMED_STEP_TAG = "tuneline.resumed_from_step"
_TAG_CHARS = 500


@dataclass(frozen=True)
class RunContext:
    """Plain values a task needs to place its artifact and its MLflow child run."""

    workspace: str
    tracking_uri: str
    experiment_id: str
    parent_run_id: str


STAGE_TASK_OPTIONS: dict[str, Any] = {
    "cache_policy": NO_CACHE,
    "persist_result": False,
    "task_run_name": "{key}",
}

# What a stage task returns: its result, wrapped in a "Cached" state when the store served it.
StageOutcome = StageResult | State


def as_task_outcome(result: StageResult) -> StageOutcome:
    return Completed(name="Cached", data=result) if result.cache_hit else result


def run_stage(
    context: RunContext,
    *,
    name: str,
    kind: str,
    key: str,
    params: Mapping[str, Any],
    inputs: Mapping[str, str],
    work: Callable[[ArtifactDraft, str], None],
    dataset_inputs: Mapping[str, str] | None = None,
    keep_partial: bool = False,
    on_hit: Callable[[Artifact, str], None] | None = None,
) -> StageOutcome:
    """The artifact for `key`, computed with `work(draft, run_id)` unless the store holds it sound;
    a served artifact is passed to `on_hit(artifact, run_id)` inside its cache-hit run.

    Another process on the same workspace may be computing the same key: the artifact lock makes
    this one wait for it and then serves its artifact as a cache hit, so each key is computed once
    and no two writers share a draft."""

    def compute(damage: Damage | None) -> StageResult:
        return compute_stage(context, name=name, kind=kind, key=key, params=params, inputs=inputs, work=work,
                             dataset_inputs=dataset_inputs, keep_partial=keep_partial, damage=damage)

    result = serve_or_compute(
        context.workspace, kind, key, compute=compute,
        serve=lambda artifact: record_cache_hit(context, name=name, artifact=artifact, on_hit=on_hit),
        on_wait=lambda: announce(f"{name}: another run is computing {key}; waiting for it"),
        on_damaged=lambda damage: announce(f"{name}: cached artifact {damage.path} is damaged ({damage.reason}); recomputing"),
    )
    return as_task_outcome(result)


def announce(message: str) -> None:
    get_run_logger().info(message)
    print(message, flush=True)


def compute_stage(
    context: RunContext,
    *,
    name: str,
    kind: str,
    key: str,
    params: Mapping[str, Any],
    inputs: Mapping[str, str],
    work: Callable[[ArtifactDraft, str], None],
    dataset_inputs: Mapping[str, str] | None,
    keep_partial: bool,
    damage: Damage | None,
) -> StageResult:
    """Compute the artifact under its MLflow child run; the caller holds the artifact lock."""
    tags = {KEY_TAG: key, CACHE_HIT_TAG: "false", "tuneline.stage": kind}
    if damage is not None:
        tags[RECOMPUTED_TAG] = damage.reason[:_TAG_CHARS]
    started = time.monotonic()
    with tracking.tracked_run(context.tracking_uri, context.experiment_id, name=name,
                              parent_run_id=context.parent_run_id, tags=tags) as run_id:
        tracking.log_params(context.tracking_uri, run_id, params)
        tracking.log_dict(context.tracking_uri, run_id, dict(params), "config.json")
        if dataset_inputs:
            tracking.log_dataset_inputs(context.tracking_uri, run_id, dataset_inputs)
        with write_artifact(context.workspace, kind, key, config=tracking.redact(params), inputs=inputs,
                            keep_partial=keep_partial) as draft:  # the manifest is logged to MLflow too
            draft.extra["mlflow_run_id"] = run_id
            work(draft, run_id)
            draft.metrics["stage_seconds"] = round(time.monotonic() - started, 2)
        artifact = find_artifact(context.workspace, kind, key)
        assert artifact is not None  # just written, under the lock
        tracking.log_metrics(context.tracking_uri, run_id, artifact.manifest["metrics"])
        tracking.log_artifact(context.tracking_uri, run_id, artifact.path / "manifest.json")
    get_run_logger().info("%s computed in %.1f s -> %s", name, time.monotonic() - started, artifact.path)
    return StageResult.from_artifact(artifact, name=name, cache_hit=False)


def record_cache_hit(context: RunContext, *, name: str, artifact: Artifact,
                     on_hit: Callable[[Artifact, str], None] | None = None) -> StageResult:
    """A child run tagged as a cache hit, linked to the run that produced the artifact; `on_hit`
    records what else the stage's run says about the artifact (from its manifest)."""
    result = StageResult.from_artifact(artifact, name=name, cache_hit=True)
    tags = {KEY_TAG: result.key, CACHE_HIT_TAG: "true", PRODUCER_TAG: result.produced_by_run or "", "tuneline.stage": result.kind}
    with tracking.tracked_run(context.tracking_uri, context.experiment_id, name=name, parent_run_id=context.parent_run_id,
                              tags=tags) as run_id:
        tracking.log_params(context.tracking_uri, run_id, result.config)
        tracking.log_metrics(context.tracking_uri, run_id, result.metrics)
        if on_hit is not None:
            on_hit(artifact, run_id)
    return result


def link_resumed_attempt(context: RunContext, run_id: str, *, previous_run_id: str, step: int) -> None:
    """This run takes over the draft of an earlier attempt: a killed process left that attempt's run
    (and its pipeline run) RUNNING, so end them as KILLED; tag this run with the attempt and the
    checkpoint step it resumes from (0: it had saved none)."""
    if tracking.end_abandoned_run(context.tracking_uri, previous_run_id):
        get_run_logger().info("run %s was left running by a killed process; marked KILLED", previous_run_id)
    tracking.set_tags(context.tracking_uri, run_id, {RESUMED_RUN_TAG: previous_run_id, RESUMED_STEP_TAG: step})
