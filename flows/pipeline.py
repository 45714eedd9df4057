"""The pipeline flow: validate the config, open the MLflow parent run, run the stages in order.

Run it with `tuneline run PIPELINE.yaml [key=value ...]` or `tuneline demo`.

Each stage's key (core/pipeline/keys.py) names its artifact in the workspace's store, which is the
only cache: every stage task runs, and serves the artifact when it is there and sound.
"""

from __future__ import annotations

import time
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger

from tuneline.core.config import InferenceConfig
from tuneline.core.errors import ConfigError
from tuneline.core.pipeline.references import ArtifactRef, ExternalModel, ModelInput, StageStore, open_store
from tuneline.core.pipeline.spec import BaseStage, Pipeline, TrainingStage, load_pipeline
from tuneline.core.pipeline.stage_runs import export_template
from tuneline.core.pipeline.stage_unit import RunContext, StageUnit
from tuneline.core.pipeline.train_unit import TrainUnit
from tuneline.core.pipeline.units import BaseUnit, EvaluateUnit, ExportUnit, MergeUnit, TokenizeUnit
from tuneline.core.pipeline.keys import PipelineFingerprints
from tuneline.core.store.fingerprints import tree_fingerprint
from tuneline.core.tracking import runs as tracking
from tuneline.core.tracking.lineage import lineage_tags
from tuneline.core.tracking.privacy import mask_password
from tuneline.core.tracking.promotion import candidate_metrics
from tuneline.flows.report import change_summary
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


# The pipeline `run_checked_pipeline` hands its flow run: Prefect records a flow's parameters, and a
# resolved config may hold a hub token, so the flow takes the YAML's path and this carries the result.
_CHECKED: ContextVar[Pipeline | None] = ContextVar("checked_pipeline", default=None)


def run_checked_pipeline(pipeline: Pipeline, *, pipeline_path: str, overrides: list[str] | None,
                         workspace: str | None) -> dict[str, Any]:
    """The flow on `pipeline`, which the caller read and checked from these arguments (`tuneline run`
    does, before Prefect starts), so that the YAML is read once."""
    handed = _CHECKED.set(pipeline)
    try:
        return pipeline_flow(pipeline_path, overrides, workspace)
    finally:
        _CHECKED.reset(handed)


@flow(name="tuneline-pipeline")
def pipeline_flow(pipeline_path: str, overrides: list[str] | None = None, workspace: str | None = None) -> dict[str, Any]:
    pipeline = _CHECKED.get() or load_pipeline(pipeline_path, overrides, workspace=workspace)
    local = pipeline.workspace if isinstance(pipeline.workspace, Path) else None  # else a URL: nothing is written here
    if local is not None:
        local.mkdir(parents=True, exist_ok=True)
    uri = tracking.tracking_uri(pipeline.workspace)
    experiment_id = tracking.ensure_experiment(uri, pipeline.name, artifact_root=local / "mlartifacts" if local else None)
    with tracking.tracked_run(uri, experiment_id, name=f"{pipeline.name}-{time.strftime('%Y%m%d-%H%M%S')}",
                              tags={"tuneline.pipeline": pipeline.name}) as parent_run_id:
        context = RunContext(str(pipeline.workspace), uri, experiment_id, parent_run_id)
        state = ChainState(pipeline=pipeline, context=context, fingerprints=register_datasets(context, pipeline),
                           store=open_store(context.workspace))
        summary = run_chain(pipeline, state)
        outcome = change_summary(summary["stages"])
        get_run_logger().info(outcome)
        tracking.set_tags(uri, parent_run_id, {OUTCOME_TAG: outcome})
    return {**summary, "outcome": outcome, "tracking_uri": mask_password(uri), "parent_run_id": parent_run_id,
            "workspace": str(pipeline.workspace)}


def run_chain(pipeline: Pipeline, state: ChainState) -> dict[str, Any]:
    for stage in pipeline.stages:
        STAGE_RUNNERS[type(stage)](pipeline, stage, state)
    summary: dict[str, Any] = {"stages": state.report, "datasets": state.fingerprints.all()}
    if pipeline.evaluate:
        summary["evaluation"] = dict(run_evaluate(pipeline, state).metrics)
    if pipeline.export:
        exported = run_export(pipeline, state)
        summary["export_dir"] = state.store.place(exported)
        if pipeline.register:
            summary["registered"] = run_register(pipeline, state, exported=exported, evaluation=summary.get("evaluation") or {})
    return summary


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
    built = call(state, BaseUnit(stage, fingerprints=state.fingerprints.stages[stage.name]), {})
    state.produced[stage.name] = built
    state.models[stage.name] = built


def run_training_stage(pipeline: Pipeline, stage: TrainingStage, state: ChainState) -> None:
    start = start_model(pipeline, stage, state)
    references = referenced_models(stage, state)
    tokenizer = state.models.get(pipeline.root(stage.name).name, start)  # the chain's root provides the tokenizer
    tokenized = call(state, TokenizeUnit(stage, fingerprints=state.fingerprints.stages[stage.name]), {"tokenizer": tokenizer})
    state.tokenized[stage.name] = tokenized
    trained = call(state, TrainUnit(stage), {"data": tokenized, "model": start, **references})
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
    """The stage's full-weight causal LM, merging a LoRA stage's adapter once; never an rm stage's."""
    if name not in state.models:
        stage, trained = state.pipeline.stage(name), state.produced[name]
        if isinstance(stage, TrainingStage) and not stage.produces_policy:
            raise ConfigError(f"stage '{name}' is an {stage.kind} stage; its reward model is not a causal LM to start from or merge.")
        rope = {"rope_scaling": stage.config.model.rope_scaling, "model_max_length": stage.config.data.cutoff_len} \
            if isinstance(stage, TrainingStage) and stage.config.model.rope_scaling else {}
        state.models[name] = call(state, MergeUnit(name, **rope), {"trained": trained})
    return state.models[name]


def run_evaluate(pipeline: Pipeline, state: ChainState) -> ArtifactRef:
    settings = pipeline.evaluate
    stage = pipeline.stage(settings.stage)
    inputs: dict[str, ModelInput] = {"trained": state.produced[stage.name], "data": state.tokenized[stage.name]}
    if settings.baseline:
        inputs["baseline"] = full_model(settings.baseline, state)
    return call(state, EvaluateUnit(settings, stage, heldout=state.fingerprints.heldout), inputs)


def run_export(pipeline: Pipeline, state: ChainState) -> ArtifactRef:
    """The export of the stage's full-weight model; a training stage's own artifact goes along for
    the parity gate (the tokenizer it trained with and, for a LoRA stage, its adapter)."""
    settings = pipeline.export
    stage = pipeline.stage(settings.stage)
    model = full_model(stage.name, state)
    config = stage.config if isinstance(stage, TrainingStage) else None
    inference = config.inference if config is not None else InferenceConfig()
    inputs = {"model": model, **({"trained": state.produced[stage.name]} if config is not None else {})}
    return call(state, ExportUnit(settings, template=export_template(config), inference=inference, config=config), inputs)


STAGE_RUNNERS = {BaseStage: run_base, TrainingStage: run_training_stage}


def call(state: ChainState, unit: StageUnit, inputs: dict[str, ModelInput]) -> ArtifactRef:
    """Run a stage unit in its task (it serves its artifact from the store or computes it) and report it."""
    started = time.monotonic()
    result: ArtifactRef = task_for(unit)(state.context, unit, inputs, return_state=True).result()  # a hit returns its "Cached" state
    seconds = round(time.monotonic() - started, 1)
    state.report.append({"name": result.name, "key": result.key, "kind": result.kind, "cache_hit": result.cache_hit,
                         "seconds": seconds, "path": state.store.place(result)})
    print(f"{result.name}: {'served from cache' if result.cache_hit else f'computed in {seconds} s'}", flush=True)
    return result
