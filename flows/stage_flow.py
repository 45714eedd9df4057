"""One stage as its own flow run on a work pool's worker: `stage_flow`, deployed once per pool as
`tuneline-stage/<pool>` by `tuneline deploy`, and `run_on_pool`, with which the pipeline flow starts it.

The worker is sent the pipeline YAML's text and overrides (never a path on the launching machine),
the unit's address and its inputs' references; it builds the same unit the parent keyed and calls
`run_stage_unit`. The parent needs no Prefect result: it knows the stage's key from its inputs'
references and reads the artifact's manifest from the store once the flow run has completed. A
tracking URI taken from MLFLOW_TRACKING_URI (a server, perhaps with a password) is never a
parameter: the worker reads its own MLFLOW_TRACKING_URI instead.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass

import yaml
from prefect import flow, get_run_logger
from prefect.states import Completed, State

from tuneline.core.config import parse_overrides
from tuneline.core.errors import ConfigError
from tuneline.core.pipeline.keys import PipelineFingerprints
from tuneline.core.pipeline.references import ArtifactRef, ModelInput, StageStore
from tuneline.core.pipeline.spec import Placement, build_pipeline
from tuneline.core.pipeline.stage_unit import Announcer, RunContext, StageUnit, run_stage_unit, unit_key
from tuneline.core.pipeline.train_unit import TrainUnit, warm_up_training
from tuneline.core.pipeline.unit_plan import UnitAddress, decode_inputs, encode_inputs, rebuild_sent_unit
from tuneline.core.store.cache import Damage
from tuneline.core.training.job import TRACKING_URI_ENV, TRACKING_URI_FROM_ENV
from tuneline.flows.stage_liveness import StageRunWatch, stage_lease_watch, wait_for_stage_run

STAGE_FLOW = "tuneline-stage"
ENTRYPOINT = "tuneline.flows.stage_flow:stage_flow"  # a module path: the deployment depends on no folder
CACHED_STATE = "Cached"  # the name of a completed flow run whose stage the store served


def deployment_name(pool: str) -> str:
    return f"{STAGE_FLOW}/{pool}"


@flow(name=STAGE_FLOW, persist_result=False)
def stage_flow(pipeline_yaml: str, overrides: list[str], workspace: str, unit: dict[str, str], key: str,
               inputs: dict[str, dict], fingerprints: dict[str, dict], context: dict[str, str],
               datasets: dict[str, str] | None = None) -> State:
    # `register` is the parent's own step; its promote_function module is looked for beside the parent's YAML
    raw = {k: v for k, v in (yaml.safe_load(pipeline_yaml) or {}).items() if k != "register"}
    pipeline = build_pipeline(raw, overrides=parse_overrides(overrides), workspace=workspace)
    if unit["kind"] == TrainUnit.kind:  # the trainer's imports run while the stage's inputs are fetched
        warm_up_training(pipeline.stage(unit["stage"]))
    references = decode_inputs(inputs)
    built = rebuild_sent_unit(pipeline, PipelineFingerprints(**fingerprints), UnitAddress(**unit), references, key=key,
                              datasets=datasets or {}, workspace=workspace, machine="this worker")
    uri = os.environ.get(TRACKING_URI_ENV) if context["tracking_uri"] == TRACKING_URI_FROM_ENV else context["tracking_uri"]
    if not uri:
        raise ConfigError(f"the pipeline's runs go to the tracking server its MLFLOW_TRACKING_URI names, but this worker's "
                          f"environment has no {TRACKING_URI_ENV}; set it to the same server on every worker.")
    logger = get_run_logger()
    result = run_stage_unit(built, references, context=RunContext(**{**context, "tracking_uri": uri}),
                            announcer=Announcer(log=logger.info, warn=logger.warning))
    return Completed(name=CACHED_STATE) if result.cache_hit else Completed()


@dataclass(frozen=True)
class PoolDispatch:
    """What every stage flow run of one pipeline run is sent besides its unit."""

    pipeline_yaml: str
    overrides: list[str]
    fingerprints: PipelineFingerprints
    datasets: Mapping[str, str]
    """The `datasets` artifact of each dataset folder the pipeline names (`shipped_datasets`)."""


class StageRunFailed(RuntimeError):
    """A stage's flow run failed, or crashed more often than its `retries` allow."""


def run_on_pool(unit: StageUnit, address: UnitAddress, inputs: Mapping[str, ModelInput], *, placement: Placement,
                dispatch: PoolDispatch, context: RunContext, store: StageStore, say: Callable[[str], None]) -> ArtifactRef:
    """Run `unit` as a flow run of `tuneline-stage/<pool>` and wait for it; a run that crashed (its process
    died) or was found dead (its machine died: `stage_liveness`) is submitted again up to
    `placement.retries` times. Returns the artifact's reference, read from the manifest the stage
    committed to the store."""
    from prefect.client.orchestration import get_client
    from prefect.deployments import run_deployment

    assert placement.work_pool is not None
    key = unit_key(unit, inputs)
    parameters = {"pipeline_yaml": dispatch.pipeline_yaml, "overrides": dispatch.overrides, "workspace": context.workspace,
                  "unit": asdict(address), "key": key, "inputs": encode_inputs(inputs), "fingerprints": asdict(dispatch.fingerprints),
                  "context": {**asdict(context), "tracking_uri": parameter_uri(context.tracking_uri)}, "datasets": dict(dispatch.datasets)}
    with get_client(sync_client=True) as client:
        for attempt in range(placement.retries + 1):
            submitted = run_deployment(deployment_name(placement.work_pool), parameters=parameters, timeout=0,
                                       job_variables=dict(placement.job_variables), flow_run_name=f"{unit.label}-{key}")
            watch = StageRunWatch(client, placement.work_pool, stage_lease_watch(store, unit.kind, key))
            flow_run = wait_for_stage_run(client, submitted.id, watch)
            state = flow_run.state
            if state is not None and state.is_completed():
                return stored_reference(store, context.workspace, unit, key, cache_hit=state.name == CACHED_STATE)
            ended = (f"{unit.label}: flow run {flow_run.name} on pool {placement.work_pool} ended "
                     f"{state.type.value if state else 'without a state'} ({state.message if state else ''})")
            if state is None or not state.is_crashed() or attempt == placement.retries:
                raise StageRunFailed(f"{ended}; see the flow run's log in Prefect.")
            say(f"{ended}; submitting it again (retry {attempt + 1} of {placement.retries})")
    raise AssertionError("unreachable")


def parameter_uri(uri: str) -> str:
    """The tracking URI a flow run's parameters may carry: the environment's is named, never copied."""
    return TRACKING_URI_FROM_ENV if uri == os.environ.get(TRACKING_URI_ENV) else uri


def stored_reference(store: StageStore, workspace: str, unit: StageUnit, key: str, *, cache_hit: bool) -> ArtifactRef:
    """The reference of the artifact a worker committed, from its manifest in the store (one read)."""

    def missing(damage: Damage | None) -> ArtifactRef:
        raise StageRunFailed(f"{unit.label}: its flow run completed, but the workspace {workspace} holds no sound "
                             f"{unit.kind} artifact {key}" + (f" ({damage.reason})" if damage else "") +
                             "; the workers must run with the same workspace as this pipeline (an s3:// URL every machine reaches).")

    return store.serve_or_compute(
        unit.kind, key, serve=lambda artifact: ArtifactRef.from_artifact(artifact, name=unit.label, cache_hit=cache_hit),
        compute=missing, on_wait=lambda: None, on_damaged=lambda damage: None)
