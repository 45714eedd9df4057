"""The pipeline flow: validate the config, open the MLflow parent run, run the stages as their inputs get ready.

Run it with `tuneline run PIPELINE.yaml [key=value ...]` or `tuneline demo`.

Each stage's key (core/pipeline/keys.py) names its artifact in the workspace's store, which is the
only cache: every stage task runs, and serves the artifact when it is there and sound.

Scheduling: the flow submits every stage whose stages it refers to have ended and waits for whichever
ends first, so stages that do not depend on each other (rm and dpo after sft) run at the same time; a
stage's tokenization starts as soon as its tokenizer is built. A stage with a `work_pool` runs as a flow
run on a worker of that pool (flows/stage_flow.py); one without runs in this process, in a thread of its
own, with at most `parallel_training` of them training at a time (one training stage uses every core and
GPU of the machine). With `task_runner: ray` every stage runs as a Ray task holding its `resources`
(flows/ray_stages.py).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from contextvars import ContextVar, copy_context
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger

from tuneline.core.errors import ConfigError
from tuneline.core.pipeline.keys import PipelineFingerprints
from tuneline.core.pipeline.references import ArtifactRef, ExternalModel, ModelInput, StageStore
from tuneline.core.pipeline.shipped_datasets import on_a_pool, ship_datasets
from tuneline.core.pipeline.spec import BaseStage, Pipeline, TrainingStage, load_pipeline
from tuneline.core.pipeline.stage_runs import TOKENIZED_KIND
from tuneline.core.pipeline.stage_unit import RunContext, StageUnit, serve_stored_unit, unit_key
from tuneline.core.pipeline.stores import open_store
from tuneline.core.pipeline.train_unit import TrainUnit, warm_up_training
from tuneline.core.pipeline.unit_plan import UnitAddress, build_unit
from tuneline.core.pipeline.units import BaseUnit, EvaluateUnit, ExportUnit, MergeUnit
from tuneline.core.store.fingerprints import tree_fingerprint
from tuneline.core.tracking import runs as tracking
from tuneline.core.tracking.lineage import lineage_tags
from tuneline.core.tracking.privacy import mask_password
from tuneline.core.tracking.promotion import candidate_metrics
from tuneline.flows.ray_stages import on_ray_cluster, run_on_ray
from tuneline.flows.report import change_summary
from tuneline.flows.stage_flow import PoolDispatch, run_on_pool
from tuneline.tasks.register import register
from tuneline.tasks.register_datasets import register_datasets
from tuneline.tasks.stage import task_for

OUTCOME_TAG = "tuneline.outcome"  # the parent run's one-line account of what the run redid


@dataclass
class ChainState:
    """What earlier stages produced, by stage name, as the flow walks the DAG."""

    pipeline: Pipeline
    context: RunContext
    fingerprints: PipelineFingerprints  # the run's dataset digests, from register_datasets
    store: StageStore  # where this process reads the artifacts the stages referred to
    models: dict[str, ArtifactRef] = field(default_factory=dict)  # full-weight causal LM per stage
    produced: dict[str, ArtifactRef] = field(default_factory=dict)  # each stage's own artifact (built or trained)
    tokenized: dict[str, ArtifactRef] = field(default_factory=dict)
    report: list[dict[str, Any]] = field(default_factory=list)
    dispatch: PoolDispatch | None = None  # what a stage's flow run on a work pool is sent
    merging: threading.Lock = field(default_factory=threading.Lock)  # one merge of a stage, however many stages need it
    training_slots: threading.Semaphore = field(default_factory=lambda: threading.Semaphore(1))


# The pipeline `run_checked_pipeline` hands its flow run: Prefect records a flow's parameters, and a
# resolved config may hold a hub token, so the flow takes the YAML's path and this carries the result.
_CHECKED: ContextVar[Pipeline | None] = ContextVar("checked_pipeline", default=None)


def checked_pipeline() -> Pipeline | None:
    # the flow reads the variable through this function: a Ray task is sent the flow with the globals it
    # names, and a ContextVar does not pickle
    return _CHECKED.get()


def run_checked_pipeline(pipeline: Pipeline, *, pipeline_path: str, overrides: list[str] | None,
                         workspace: str | None) -> dict[str, Any]:
    """The flow on `pipeline`, which the caller read and checked from these arguments (`tuneline run`
    does, before Prefect starts), so that the YAML is read once."""
    handed = _CHECKED.set(pipeline)
    try:
        if pipeline.on_ray:  # the cluster is checked before anything is written
            with on_ray_cluster(pipeline_flow, pipeline) as flow_on_ray:
                return flow_on_ray(pipeline_path, overrides, workspace)
        return pipeline_flow(pipeline_path, overrides, workspace)
    finally:
        _CHECKED.reset(handed)


@flow(name="tuneline-pipeline")
def pipeline_flow(pipeline_path: str, overrides: list[str] | None = None, workspace: str | None = None) -> dict[str, Any]:
    pipeline = checked_pipeline() or load_pipeline(pipeline_path, overrides, workspace=workspace)
    local = pipeline.workspace if isinstance(pipeline.workspace, Path) else None  # else a URL: nothing is written here
    if local is not None:
        local.mkdir(parents=True, exist_ok=True)
    uri = tracking.tracking_uri(pipeline.workspace)
    experiment_id = tracking.ensure_experiment(uri, pipeline.name, artifact_root=local / "mlartifacts" if local else None)
    with tracking.tracked_run(uri, experiment_id, name=f"{pipeline.name}-{time.strftime('%Y%m%d-%H%M%S')}",
                              tags={"tuneline.pipeline": pipeline.name}) as parent_run_id:
        context = RunContext(str(pipeline.workspace), uri, experiment_id, parent_run_id)
        fingerprints = register_datasets(context, pipeline)
        store = open_store(context.workspace)
        dispatch = PoolDispatch(Path(pipeline_path).read_text(encoding="utf-8"), list(overrides or []), fingerprints,
                                datasets=ship_datasets(pipeline, store)) if on_a_pool(pipeline) else None
        state = ChainState(pipeline=pipeline, context=context, fingerprints=fingerprints, store=store,
                           dispatch=dispatch, training_slots=threading.Semaphore(pipeline.parallel_training))
        summary = run_chain(pipeline, state)
        outcome = change_summary(summary["stages"])
        get_run_logger().info(outcome)
        tracking.set_tags(uri, parent_run_id, {OUTCOME_TAG: outcome})
    return {**summary, "outcome": outcome, "tracking_uri": mask_password(uri), "parent_run_id": parent_run_id,
            "workspace": str(pipeline.workspace)}


def run_chain(pipeline: Pipeline, state: ChainState) -> dict[str, Any]:
    run_stages(pipeline, state)
    # stages end in whatever order they end; the summary lists them in the pipeline's order all the same
    order = {stage.name: index for index, stage in enumerate(pipeline.stages)}
    state.report.sort(key=lambda item: order[item["name"].split("/")[0]])
    summary: dict[str, Any] = {"stages": state.report, "datasets": state.fingerprints.all()}
    if pipeline.evaluate:
        summary["evaluation"] = dict(run_evaluate(pipeline, state).metrics)
    if pipeline.export:
        exported = run_export(pipeline, state)
        summary["export_dir"] = state.store.place(exported)
        if pipeline.register:
            summary["registered"] = run_register(pipeline, state, exported=exported, evaluation=summary.get("evaluation") or {})
    return summary


@dataclass(frozen=True)
class StageJob:
    """One step the scheduler submits: a stage, or a stage's tokenization when it can run early."""

    name: str
    needs: frozenset[str]
    """The jobs that must have ended first."""
    run: Callable[[], None]


def stage_jobs(pipeline: Pipeline, state: ChainState) -> list[StageJob]:
    """A job per stage after the stages it refers to; a stage whose chain starts at a base stage
    tokenizes as soon as that base model is built (its tokenizer), beside the stages before it."""
    jobs = []
    for stage in pipeline.stages:
        if isinstance(stage, BaseStage):
            jobs.append(StageJob(stage.name, frozenset(), partial(run_base, pipeline, stage, state)))
            continue
        needs = set(stage.links().values())
        root = pipeline.root(stage.name)
        if isinstance(root, BaseStage):
            jobs.append(StageJob(f"{stage.name}/tokenize", frozenset({root.name}), partial(run_tokenize, stage, state, root.name)))
            needs.add(f"{stage.name}/tokenize")
        jobs.append(StageJob(stage.name, frozenset(needs), partial(run_training_stage, pipeline, stage, state)))
    return jobs


def run_stages(pipeline: Pipeline, state: ChainState) -> None:
    """Submit every job whose needs have ended, wait for whichever ends first, repeat. A job that
    fails stops new submissions; the ones running end before its error is raised."""
    pending, ended = stage_jobs(pipeline, state), set()
    running: dict[Future[None], str] = {}
    failed: list[Future[None]] = []
    with ThreadPoolExecutor(max_workers=len(pending), thread_name_prefix="stage") as threads:
        while pending or running:
            for job in [j for j in pending if j.needs <= ended]:
                pending.remove(job)
                # each thread runs in a copy of this one's context: the flow run its tasks belong to
                running[threads.submit(copy_context().run, job.run)] = job.name
            finished, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in finished:
                ended.add(running.pop(future))
                if future.exception() is not None:
                    failed.append(future)
                    pending.clear()
    if failed:
        failed[0].result()


def run_register(pipeline: Pipeline, state: ChainState, *, exported: ArtifactRef, evaluation: dict[str, Any]) -> dict[str, Any]:
    """Register the export with its lineage and metrics (the exported stage's manifest first, then the
    `evaluate` section's), then promote it or make it challenger."""
    settings, stage_name = pipeline.register, pipeline.export.stage
    sources = {f"stage '{stage_name}' manifest": dict(state.produced[stage_name].metrics)}
    if pipeline.evaluate:
        sources[f"'{pipeline.evaluate.stage}/evaluate' (evaluate section)"] = evaluation
    metrics, origin = candidate_metrics(sources)
    lineage = lineage_tags(((item["name"], item["key"]) for item in state.report), state.fingerprints.all(),
                           pipeline_source=pipeline.source)
    search_dir = str(Path(pipeline.source).resolve().parent) if pipeline.source else None
    registered = register(state.context, settings, exported=exported, lineage=lineage, metrics=metrics,
                          metric_origin=origin, search_dir=search_dir)
    if settings.promote_metric:
        registered["metric_source"] = f"{settings.promote_metric} read from {origin[settings.promote_metric]}"
    state.report.append({"name": "register", "key": exported.key, "cache_hit": registered["cache_hit"],
                         "path": f"models:/{settings.model_name}@{registered['alias']}"})
    print(f"register: {registered['decision']}", flush=True)
    return registered


def run_base(pipeline: Pipeline, stage: BaseStage, state: ChainState) -> None:
    built = call(state, UnitAddress(BaseUnit.kind, stage.name), {})
    state.produced[stage.name] = built
    state.models[stage.name] = built


def run_tokenize(stage: TrainingStage, state: ChainState, tokenizer_stage: str) -> None:
    state.tokenized[stage.name] = call(state, UnitAddress(TOKENIZED_KIND, stage.name), {"tokenizer": state.models[tokenizer_stage]})


def run_training_stage(pipeline: Pipeline, stage: TrainingStage, state: ChainState) -> None:
    start = start_model(pipeline, stage, state)
    references = referenced_models(stage, state)
    if stage.name not in state.tokenized:  # not tokenized early (stage_jobs)
        tokenizer = state.models.get(pipeline.root(stage.name).name, start)  # the chain's root provides the tokenizer
        state.tokenized[stage.name] = call(state, UnitAddress(TOKENIZED_KIND, stage.name), {"tokenizer": tokenizer})
    tokenized = state.tokenized[stage.name]
    trained = call(state, UnitAddress(TrainUnit.kind, stage.name), {"data": tokenized, "model": start, **references})
    state.produced[stage.name] = trained
    if trained.finetuning_type == "full" and stage.produces_policy:
        state.models[stage.name] = trained


def referenced_models(stage: TrainingStage, state: ChainState) -> dict[str, ArtifactRef]:
    """`ref_model` stages resolve to their full-weight model (merged if LoRA); `reward_model` stages to
    their trained artifact as it is, since a reward model is never merged into a causal LM."""
    return {ref: state.produced[name] if ref == "reward_model" else full_model(name, state)
            for ref, name in stage.references.items()}


def start_model(pipeline: Pipeline, stage: TrainingStage, state: ChainState) -> ModelInput:
    """The full-weight model a stage starts from: its parent's (merged if a LoRA stage) or a path."""
    if stage.parent:
        return full_model(stage.parent, state)
    path = stage.config.model.model_name_or_path
    assert path is not None  # checked when the pipeline was built
    key = f"external-{tree_fingerprint([path])[:20]}" if Path(path).exists() else f"hub-{path}"
    return ExternalModel(key=key, path=path)


def full_model(name: str, state: ChainState) -> ArtifactRef:
    """The stage's full-weight causal LM, merging a LoRA stage's adapter once (the stages that start from
    it at the same time wait for that merge); never an rm stage's."""
    with state.merging:
        if name not in state.models:
            stage, trained = state.pipeline.stage(name), state.produced[name]
            if isinstance(stage, TrainingStage) and not stage.produces_policy:
                raise ConfigError(f"stage '{name}' is an {stage.kind} stage; its reward model is not a causal LM to start from or merge.")
            state.models[name] = call(state, UnitAddress(MergeUnit.kind, name), {"trained": trained})
        return state.models[name]


def run_evaluate(pipeline: Pipeline, state: ChainState) -> ArtifactRef:
    settings = pipeline.evaluate
    stage = pipeline.stage(settings.stage)
    inputs: dict[str, ModelInput] = {"trained": state.produced[stage.name], "data": state.tokenized[stage.name]}
    if settings.baseline:
        inputs["baseline"] = full_model(settings.baseline, state)
    return call(state, UnitAddress(EvaluateUnit.kind, stage.name), inputs)


def run_export(pipeline: Pipeline, state: ChainState) -> ArtifactRef:
    """The export of the stage's full-weight model; a training stage's own artifact goes along for
    the parity gate (the tokenizer it trained with and, for a LoRA stage, its adapter)."""
    stage = pipeline.stage(pipeline.export.stage)
    model = full_model(stage.name, state)
    inputs = {"model": model, **({"trained": state.produced[stage.name]} if isinstance(stage, TrainingStage) else {})}
    return call(state, UnitAddress(ExportUnit.kind, stage.name), inputs)


STAGE_RUNNERS = {BaseStage: run_base, TrainingStage: run_training_stage}


def call(state: ChainState, address: UnitAddress, inputs: dict[str, ModelInput]) -> ArtifactRef:
    """Run a stage unit (it serves its artifact from the store or computes it) and report it: as a flow
    run on its stage's work pool, a Ray task on the cluster, else in its task in this process (a training
    unit computes once a training slot is free)."""
    unit = build_unit(state.pipeline, state.fingerprints, address)
    placement = state.pipeline.stage(address.stage).placement
    started = time.monotonic()
    if placement.work_pool is not None:
        assert state.dispatch is not None
        # a stored stage costs a manifest read here, not a flow run on a worker
        result = serve_stored_unit(unit, inputs, context=state.context) or run_on_pool(
            unit, address, inputs, placement=placement, dispatch=state.dispatch, context=state.context, store=state.store,
            say=lambda message: print(message, flush=True))
    elif placement.ray_resources is not None:
        assert state.dispatch is not None
        result = serve_stored_unit(unit, inputs, context=state.context) or run_on_ray(
            unit, address, inputs, pipeline=state.pipeline, fingerprints=state.fingerprints,
            datasets=state.dispatch.datasets, context=state.context)
    elif unit.kind == TrainUnit.kind:
        warm_up_unless_stored(state, address, unit, inputs)
        # the slot is taken only to compute: a stored stage waits for none, though a stage beside it trains
        result = run_in_task(state, unit, inputs, computing_slot=state.training_slots)
    else:
        if unit.kind == TOKENIZED_KIND:
            warm_up_unless_stored(state, address, unit, inputs)
        result = run_in_task(state, unit, inputs)
    seconds = round(time.monotonic() - started, 1)
    state.report.append({"name": result.name, "key": result.key, "kind": result.kind, "cache_hit": result.cache_hit,
                         "seconds": seconds, "path": state.store.place(result)})
    print(f"{result.name}: {'served from cache' if result.cache_hit else f'computed in {seconds} s'}", flush=True)
    return result


def warm_up_unless_stored(state: ChainState, address: UnitAddress, unit: StageUnit, inputs: dict[str, ModelInput]) -> None:
    """A training stage's tokenize or train unit about to be computed in this process: its training will
    be forked from this process's warm worker, so that worker starts importing now, while the stage
    tokenizes. A stored unit starts nothing (a rerun served from cache imports no trainer); nor does a
    URL workspace's, where asking the store would cost a second manifest read per hit."""
    stage = state.pipeline.stage(address.stage)
    if isinstance(stage, TrainingStage) and not state.store.is_cache and state.store.find(unit.kind, unit_key(unit, inputs)) is None:
        warm_up_training(stage)


def run_in_task(state: ChainState, unit: StageUnit, inputs: dict[str, ModelInput],
                computing_slot: threading.Semaphore | None = None) -> ArtifactRef:
    # a hit returns its "Cached" state
    return task_for(unit)(state.context, unit, inputs, computing_slot, return_state=True).result()
