"""The pipeline flow: validate the config, open the MLflow parent run, run the stages in order.

Run it with `tuneline run PIPELINE.yaml [key=value ...]` or `tuneline demo`.

Each stage's key (core/pipeline/keys.py) names its artifact in the workspace's store, which is the
only cache: every stage task runs, and serves the artifact when it is there and sound.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger

from tuneline.core.tracking import runs as tracking
from tuneline.core.store.fingerprints import tree_fingerprint
from tuneline.core.store.results import ModelRef, StageResult
from tuneline.core.config import InferenceConfig
from tuneline.core.errors import ConfigError
from tuneline.core.tracking.lineage import lineage_tags
from tuneline.core.tracking.privacy import mask_password
from tuneline.core.pipeline.spec import BaseStage, Pipeline, TrainingStage, load_pipeline
from tuneline.core.pipeline.stage_runs import ParitySource, export_template
from tuneline.core.tracking.promotion import candidate_metrics
from tuneline.core.pipeline.keys import PipelineFingerprints, base_key, evaluate_key, export_key, merge_key, tokenize_key, train_key
from tuneline.flows.report import change_summary
from tuneline.tasks.build_base import build_base
from tuneline.tasks.common import RunContext
from tuneline.tasks.evaluate import evaluate
from tuneline.tasks.export import export
from tuneline.tasks.merge import merge
from tuneline.tasks.register import register
from tuneline.tasks.register_datasets import register_datasets
from tuneline.tasks.tokenize import tokenize
from tuneline.tasks.train import train

OUTCOME_TAG = "tuneline.outcome"  # the parent run's one-line account of what the run redid


@dataclass
class ChainState:
    """What earlier stages produced, by stage name, as the flow walks the DAG."""

    pipeline: Pipeline
    context: RunContext
    fingerprints: PipelineFingerprints  # the run's dataset digests, from register_datasets
    models: dict[str, ModelRef] = field(default_factory=dict)  # full-weight causal LM per stage
    produced: dict[str, StageResult] = field(default_factory=dict)  # each stage's own artifact (built or trained)
    tokenized: dict[str, StageResult] = field(default_factory=dict)
    report: list[dict[str, Any]] = field(default_factory=list)


@flow(name="tuneline-pipeline")
def pipeline_flow(pipeline_path: str, overrides: list[str] | None = None, workspace: str | None = None) -> dict[str, Any]:
    pipeline = load_pipeline(pipeline_path, overrides, workspace=workspace)
    pipeline.workspace.mkdir(parents=True, exist_ok=True)
    uri = tracking.tracking_uri(pipeline.workspace)
    experiment_id = tracking.ensure_experiment(uri, pipeline.name, artifact_root=pipeline.workspace / "mlartifacts")
    with tracking.tracked_run(uri, experiment_id, name=f"{pipeline.name}-{time.strftime('%Y%m%d-%H%M%S')}",
                              tags={"tuneline.pipeline": pipeline.name}) as parent_run_id:
        context = RunContext(str(pipeline.workspace), uri, experiment_id, parent_run_id)
        state = ChainState(pipeline=pipeline, context=context, fingerprints=register_datasets(context, pipeline))
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
        summary["export_dir"] = exported.path
        if pipeline.register:
            summary["registered"] = run_register(pipeline, state, exported=exported, evaluation=summary.get("evaluation") or {})
    return summary


def run_register(pipeline: Pipeline, state: ChainState, *, exported: StageResult, evaluation: dict[str, Any]) -> dict[str, Any]:
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
    key, inputs = base_key(stage, fingerprints=state.fingerprints.stages[stage.name])
    built = call(state, build_base, stage.name, state.context, stage, key=key, inputs=inputs)
    state.produced[stage.name] = built
    state.models[stage.name] = built.as_model()


def run_training_stage(pipeline: Pipeline, stage: TrainingStage, state: ChainState) -> None:
    start = start_model(pipeline, stage, state)
    references = referenced_models(stage, state)
    root = pipeline.root(stage.name)
    tokenizer_source = state.models[root.name] if root.name in state.models else start
    tok_key, inputs = tokenize_key(stage, tokenizer_key=tokenizer_source.key, fingerprints=state.fingerprints.stages[stage.name])
    tokenized = call(state, tokenize, f"{stage.name}/tokenize", state.context, stage, key=tok_key,
                     tokenizer_path=tokenizer_source.tokenizer_path, inputs=inputs)
    state.tokenized[stage.name] = tokenized
    reference_keys = {ref: model.key for ref, model in references.items()}
    key = train_key(stage, tokenized_key=tokenized.key, parent_key=start.key, reference_keys=reference_keys)
    trained = call(state, train, stage.name, state.context, stage, key=key, start_model=start.path,
                   tokenized_path=tokenized.path, references={ref: model.path for ref, model in references.items()},
                   upstream={"data": tokenized.key, "model": start.key, **reference_keys})
    state.produced[stage.name] = trained
    if trained.finetuning_type == "full" and stage.produces_policy:
        state.models[stage.name] = trained.as_model()


def referenced_models(stage: TrainingStage, state: ChainState) -> dict[str, ModelRef]:
    """`ref_model` stages resolve to their full-weight model (merged if LoRA); `reward_model` stages to
    their trained artifact as it is, since a reward model is never merged into a causal LM."""
    return {ref: state.produced[name].as_model() if ref == "reward_model" else full_model(name, state)
            for ref, name in stage.references.items()}


def start_model(pipeline: Pipeline, stage: TrainingStage, state: ChainState) -> ModelRef:
    """The full-weight model a stage starts from: its parent's (merged if a LoRA stage) or a path."""
    if stage.parent:
        return full_model(stage.parent, state)
    path = stage.config.model.model_name_or_path
    assert path is not None  # checked when the pipeline was built
    key = f"external-{tree_fingerprint([path])[:20]}" if Path(path).exists() else f"hub-{path}"
    return ModelRef(key=key, path=path, tokenizer_path=path)


def full_model(name: str, state: ChainState) -> ModelRef:
    """The stage's full-weight causal LM, merging a LoRA stage's adapter once; never an rm stage's."""
    if name not in state.models:
        stage, trained = state.pipeline.stage(name), state.produced[name]
        if isinstance(stage, TrainingStage) and not stage.produces_policy:
            raise ConfigError(f"stage '{name}' is an {stage.kind} stage; its reward model is not a causal LM to start from or merge.")
        rope = {"rope_scaling": stage.config.model.rope_scaling, "model_max_length": stage.config.data.cutoff_len} \
            if isinstance(stage, TrainingStage) and stage.config.model.rope_scaling else {}
        merged = call(state, merge, f"{name}/merge", state.context, name=name, key=merge_key(trained_key=trained.key),
                      trained=trained, **rope)
        state.models[name] = merged.as_model()
    return state.models[name]


def run_evaluate(pipeline: Pipeline, state: ChainState) -> StageResult:
    settings = pipeline.evaluate
    stage = pipeline.stage(settings.stage)
    trained, tokenized = state.produced[stage.name], state.tokenized[stage.name]
    baseline = full_model(settings.baseline, state) if settings.baseline else None
    key = evaluate_key(settings, stage_key_=trained.key, baseline_key=baseline and baseline.key,
                       tokenized_key=tokenized.key, inputs=state.fingerprints.heldout)
    upstream = {"trained": trained.key, "data": tokenized.key, **({"baseline": baseline.key} if baseline else {})}
    return call(state, evaluate, f"{stage.name}/evaluate", state.context, settings, stage, key=key, trained=trained,
                baseline_model=baseline and baseline.path, tokenized_path=tokenized.path, upstream=upstream)


def run_export(pipeline: Pipeline, state: ChainState) -> StageResult:
    settings = pipeline.export
    stage = pipeline.stage(settings.stage)
    model = full_model(stage.name, state)
    template = export_template(stage.config if isinstance(stage, TrainingStage) else None)
    inference = stage.config.inference if isinstance(stage, TrainingStage) else InferenceConfig()
    key = export_key(settings, model_key=model.key, template=template, inference=inference)
    return call(state, export, f"{stage.name}/export", state.context, settings, key=key, model=model, template=template,
                inference=inference, parity=parity_source(stage, state, model=model, probes=settings.parity_probes))


def parity_source(stage: BaseStage | TrainingStage, state: ChainState, *, model: ModelRef, probes: int) -> ParitySource:
    """The export's parity gate compares with the tokenizer the stage trained with (saved with its
    artifact) and, for a LoRA stage, with its adapter on the model it started from."""
    if not isinstance(stage, TrainingStage):
        return ParitySource(None, tokenizer_path=model.tokenizer_path, probes=probes)
    trained = state.produced[stage.name]
    adapter = (trained.start_model, trained.path) if trained.is_adapter and trained.start_model else None
    return ParitySource(stage.config, tokenizer_path=trained.path, adapter=adapter, probes=probes)


STAGE_RUNNERS = {BaseStage: run_base, TrainingStage: run_training_stage}


def call(state: ChainState, task, label: str, *args: Any, **kwargs: Any) -> StageResult:
    """Run a stage task (it serves its artifact from the store or computes it) and report it."""
    started = time.monotonic()
    result: StageResult = task(*args, **kwargs, return_state=True).result()  # a hit's task returns its "Cached" state
    seconds = round(time.monotonic() - started, 1)
    state.report.append({"name": label, "key": result.key, "kind": result.kind, "cache_hit": result.cache_hit,
                         "seconds": seconds, "path": result.path})
    print(f"{label}: {'served from cache' if result.cache_hit else f'computed in {seconds} s'}", flush=True)
    return result
