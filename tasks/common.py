"""What every stage task shares: Prefect caching by explicit key, the artifact, the MLflow child run."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from prefect import get_run_logger
from prefect.context import TaskRunContext

from tuneline.core.tracking import runs as tracking
from tuneline.core.store.artifacts import ArtifactDraft, artifact_lock, find_artifact, write_artifact

CACHE_HIT_TAG = "tuneline.cache_hit"
KEY_TAG = "tuneline.key"
PRODUCER_TAG = "tuneline.produced_by_run"
RESUMED_RUN_TAG = "tuneline.resumed_from_run"
RESUMED_STEP_TAG = "tuneline.resumed_from_step"


@dataclass(frozen=True)
class RunContext:
    """Plain values a task needs to place its artifact and its MLflow child run."""

    workspace: str
    tracking_uri: str
    experiment_id: str
    parent_run_id: str


def key_from_parameters(context: TaskRunContext, parameters: dict[str, Any]) -> str:
    """Prefect cache key: the stage key the flow computed with `core.stages` (never TASK_SOURCE),
    qualified by the workspace, since Prefect's result store is shared by all workspaces."""
    workspace = hashlib.sha256(parameters["context"].workspace.encode()).hexdigest()[:12]
    return f"tuneline-{workspace}-{parameters['key']}"


STAGE_TASK_OPTIONS: dict[str, Any] = {
    "cache_key_fn": key_from_parameters,
    "persist_result": True,
    "result_serializer": "json",
}


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
) -> dict[str, Any]:
    """Return the artifact for `key`, computing it with `work(draft, run_id)` if it is missing.

    Another process on the same workspace may be computing the same key: the artifact lock makes
    this one wait for it and then serves its artifact as a cache hit, so each key is computed once
    and no two writers share a draft."""
    existing = find_artifact(context.workspace, kind, key)
    if existing is not None:
        return record_cache_hit(context, name=name, manifest=existing.manifest, path=str(existing.path))
    with artifact_lock(context.workspace, kind, key, on_wait=lambda: announce_wait(name, key)):
        existing = find_artifact(context.workspace, kind, key)
        if existing is not None:
            return record_cache_hit(context, name=name, manifest=existing.manifest, path=str(existing.path))
        return compute_stage(context, name=name, kind=kind, key=key, params=params, inputs=inputs, work=work,
                             dataset_inputs=dataset_inputs, keep_partial=keep_partial)


def announce_wait(name: str, key: str) -> None:
    message = f"{name}: another run is computing {key}; waiting for it"
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
) -> dict[str, Any]:
    """Compute the artifact under its MLflow child run; the caller holds the artifact lock."""
    run_id = tracking.start_run(
        context.tracking_uri, context.experiment_id, name=name,
        parent_run_id=context.parent_run_id, tags={KEY_TAG: key, CACHE_HIT_TAG: "false", "tuneline.stage": kind},
    )
    tracking.log_params(context.tracking_uri, run_id, params)
    tracking.log_dict(context.tracking_uri, run_id, dict(params), "config.json")
    if dataset_inputs:
        tracking.log_dataset_inputs(context.tracking_uri, run_id, dataset_inputs)
    started = time.monotonic()
    try:
        with write_artifact(context.workspace, kind, key, config=tracking.redact(params), inputs=inputs,
                            keep_partial=keep_partial) as draft:  # the manifest is logged to MLflow too
            draft.extra["mlflow_run_id"] = run_id
            work(draft, run_id)
            draft.metrics["stage_seconds"] = round(time.monotonic() - started, 2)
        artifact = find_artifact(context.workspace, kind, key)
        assert artifact is not None
        tracking.log_metrics(context.tracking_uri, run_id, artifact.manifest["metrics"])
        tracking.log_artifact(context.tracking_uri, run_id, artifact.path / "manifest.json")
    except BaseException:
        tracking.end_run(context.tracking_uri, run_id, failed=True)
        raise
    tracking.end_run(context.tracking_uri, run_id)
    get_run_logger().info("%s computed in %.1f s -> %s", name, time.monotonic() - started, artifact.path)
    return {**artifact.manifest, "path": str(artifact.path), "cache_hit": False}


def record_cache_hit(context: RunContext, *, name: str, manifest: Mapping[str, Any], path: str) -> dict[str, Any]:
    """A child run tagged as a cache hit, linked to the run that produced the artifact."""
    producer = manifest.get("mlflow_run_id", "")
    run_id = tracking.start_run(
        context.tracking_uri, context.experiment_id, name=name, parent_run_id=context.parent_run_id,
        tags={KEY_TAG: manifest["key"], CACHE_HIT_TAG: "true", PRODUCER_TAG: producer, "tuneline.stage": manifest["kind"]},
    )
    tracking.log_params(context.tracking_uri, run_id, manifest.get("config", {}))
    tracking.log_metrics(context.tracking_uri, run_id, manifest.get("metrics", {}))
    tracking.end_run(context.tracking_uri, run_id)
    return {**manifest, "path": path, "cache_hit": True}


def link_resumed_attempt(context: RunContext, run_id: str, *, previous_run_id: str, step: int) -> None:
    """This run takes over the draft of an earlier attempt: a killed process left that attempt's run
    (and its pipeline run) RUNNING, so end them as KILLED; tag this run with the attempt and the
    checkpoint step it resumes from (0: it had saved none)."""
    if tracking.end_abandoned_run(context.tracking_uri, previous_run_id):
        get_run_logger().info("run %s was left running by a killed process; marked KILLED", previous_run_id)
    tracking.set_tags(context.tracking_uri, run_id, {RESUMED_RUN_TAG: previous_run_id, RESUMED_STEP_TAG: step})
