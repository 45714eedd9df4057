"""The pipeline flow: validate the config, open the MLflow parent run, run the stages in order.

Run it with `tuneline run PIPELINE.yaml [key=value ...]` or `tuneline demo`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger

from tuneline.core.tracking import runs as tracking
from tuneline.core.store.artifacts import read_manifest
from tuneline.core.data.tokenization import DEFAULT_TEMPLATE, TOKENIZER_DIR
from tuneline.core.store.fingerprints import tree_fingerprint
from tuneline.core.errors import ConfigError
from tuneline.core.tracking.lineage import lineage_tags
from tuneline.core.stages.registry import stage_kind
from tuneline.core.pipeline.spec import BaseStage, Pipeline, TrainingStage, load_pipeline
from tuneline.core.tracking.promotion import candidate_metrics
from tuneline.core.pipeline.keys import base_key, evaluate_key, export_key, heldout_fingerprints, merge_key, tokenize_key, train_key
from tuneline.flows.report import change_summary
from tuneline.tasks.build_base import build_base
from tuneline.tasks.common import RunContext, record_cache_hit
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

    context: RunContext
    models: dict[str, dict[str, Any]] = field(default_factory=dict)  # full-weight model per stage
    trained: dict[str, dict[str, Any]] = field(default_factory=dict)
    tokenized: dict[str, dict[str, Any]] = field(default_factory=dict)
    report: list[dict[str, Any]] = field(default_factory=list)


@flow(name="tuneline-pipeline")
def pipeline_flow(pipeline_path: str, overrides: list[str] | None = None, workspace: str | None = None) -> dict[str, Any]:
    pipeline = load_pipeline(pipeline_path, overrides, workspace=workspace)
    pipeline.workspace.mkdir(parents=True, exist_ok=True)
    uri = tracking.tracking_uri(pipeline.workspace)
    experiment_id = tracking.ensure_experiment(uri, pipeline.name, artifact_root=pipeline.workspace / "mlartifacts")
    parent_run_id = tracking.start_run(uri, experiment_id, name=f"{pipeline.name}-{time.strftime('%Y%m%d-%H%M%S')}",
                                       tags={"tuneline.pipeline": pipeline.name})
    state = ChainState(context=RunContext(str(pipeline.workspace), uri, experiment_id, parent_run_id))
    try:
        summary = run_chain(pipeline, state)
    except BaseException:
        tracking.end_run(uri, parent_run_id, failed=True)
        raise
    outcome = change_summary(summary["stages"])
    get_run_logger().info(outcome)
    tracking.set_tags(uri, parent_run_id, {OUTCOME_TAG: outcome})
    tracking.end_run(uri, parent_run_id)
    return {**summary, "outcome": outcome, "tracking_uri": uri, "parent_run_id": parent_run_id,
            "workspace": str(pipeline.workspace)}


def run_chain(pipeline: Pipeline, state: ChainState) -> dict[str, Any]:
    fingerprints = register_datasets(state.context, pipeline)
    for stage in pipeline.stages:
        STAGE_RUNNERS[type(stage)](pipeline, stage, state)
    summary: dict[str, Any] = {"stages": state.report, "datasets": fingerprints}
    if pipeline.evaluate:
        summary["evaluation"] = run_evaluate(pipeline, state)["metrics"]
    if pipeline.export:
        exported = run_export(pipeline, state)
        summary["export_dir"] = exported["path"]
        if pipeline.register:
            summary["registered"] = run_register(pipeline, state, exported=exported, fingerprints=fingerprints,
                                                 evaluation=summary.get("evaluation") or {})
    return summary


def run_register(pipeline: Pipeline, state: ChainState, *, exported: dict[str, Any], fingerprints: dict[str, str],
                 evaluation: dict[str, Any]) -> dict[str, Any]:
    """Register the export with its lineage and metrics (the exported stage's manifest first, then the
    `evaluate` section's), then promote it or make it challenger."""
    settings, stage_name = pipeline.register, pipeline.export.stage
    produced = state.trained.get(stage_name) or state.models[stage_name]
    sources = {f"stage '{stage_name}' manifest": produced.get("metrics") or {}}
    if pipeline.evaluate:
        sources[f"'{pipeline.evaluate.stage}/evaluate' (evaluate section)"] = evaluation
    metrics, origin = candidate_metrics(sources)
    lineage = lineage_tags(((item["name"], item["key"]) for item in state.report), fingerprints, pipeline_source=pipeline.source)
    search_dir = str(Path(pipeline.source).resolve().parent) if pipeline.source else None
    registered = register(state.context, settings, exported=exported, lineage=lineage, metrics=metrics,
                          metric_origin=origin, search_dir=search_dir)
    if settings.promote_metric:
        registered["metric_source"] = f"{settings.promote_metric} read from {origin[settings.promote_metric]}"
    state.report.append({"name": "register", "key": exported["key"], "cache_hit": registered["cache_hit"],
                         "path": f"models:/{settings.model_name}@{registered['alias']}"})
    print(f"register: {registered['decision']}", flush=True)
    return registered


def run_base(pipeline: Pipeline, stage: BaseStage, state: ChainState) -> None:
    key, inputs = base_key(stage)
    built = call(state, build_base, stage.name, state.context, stage, key=key, inputs=inputs)
    state.models[stage.name] = {**built, "tokenizer_path": built["path"]}


def run_training_stage(pipeline: Pipeline, stage: TrainingStage, state: ChainState) -> None:
    start = start_model(pipeline, stage, state)
    references = referenced_models(stage, state)
    root = pipeline.root(stage.name)
    tokenizer_source = state.models[root.name] if root.name in state.models else start
    tok_key, inputs = tokenize_key(stage, tokenizer_key=tokenizer_source["key"])
    tokenized = call(state, tokenize, f"{stage.name}/tokenize", state.context, stage, key=tok_key,
                     tokenizer_path=tokenizer_source["tokenizer_path"], inputs=inputs)
    state.tokenized[stage.name] = tokenized
    reference_keys = {ref: model["key"] for ref, model in references.items()}
    key = train_key(stage, tokenized_key=tokenized["key"], parent_key=start["key"], reference_keys=reference_keys)
    trained = call(state, train, stage.name, state.context, stage, key=key, start_model=start["path"],
                   tokenized_path=tokenized["path"], references={ref: model["path"] for ref, model in references.items()},
                   upstream={"data": tokenized["key"], "model": start["key"], **reference_keys})
    state.trained[stage.name] = trained
    if trained["finetuning_type"] == "full" and stage.produces_policy:
        state.models[stage.name] = {**trained, "tokenizer_path": trained["path"]}


def referenced_models(stage: TrainingStage, state: ChainState) -> dict[str, dict[str, Any]]:
    """`ref_model` stages resolve to their full-weight model (merged if LoRA); `reward_model` stages to
    their trained artifact as it is, since a reward model is never merged into a causal LM."""
    return {ref: state.trained[name] if ref == "reward_model" else full_model(name, state)
            for ref, name in stage.references.items()}


def start_model(pipeline: Pipeline, stage: TrainingStage, state: ChainState) -> dict[str, Any]:
    """The full-weight model a stage starts from: its parent's (merged if a LoRA stage) or a path."""
    if stage.parent:
        return full_model(stage.parent, state)
    path = stage.config.model.model_name_or_path
    assert path is not None  # checked when the pipeline was built
    key = f"external-{tree_fingerprint([path])[:20]}" if Path(path).exists() else f"hub-{path}"
    return {"key": key, "path": path, "tokenizer_path": path}


def full_model(name: str, state: ChainState) -> dict[str, Any]:
    """The stage's full-weight causal LM, merging a LoRA stage's adapter once; never an rm stage's."""
    if name not in state.models:
        trained = state.trained[name]
        if not stage_kind(trained["config"]["stage"]).produces_policy:
            raise ConfigError(f"stage '{name}' is an rm stage; its reward model is not a causal LM to start from or merge.")
        merged = call(state, merge, f"{name}/merge", state.context, name=name, key=merge_key(trained_key=trained["key"]), trained=trained)
        state.models[name] = {**merged, "tokenizer_path": merged["path"]}
    return state.models[name]


def run_evaluate(pipeline: Pipeline, state: ChainState) -> dict[str, Any]:
    settings = pipeline.evaluate
    stage = pipeline.stage(settings.stage)
    trained, tokenized = state.trained[stage.name], state.tokenized[stage.name]
    baseline = full_model(settings.baseline, state) if settings.baseline else None
    inputs = heldout_fingerprints(settings, stage.config)
    key = evaluate_key(settings, stage_key_=trained["key"], baseline_key=baseline and baseline["key"],
                       tokenized_key=tokenized["key"], inputs=inputs)
    upstream = {"trained": trained["key"], "data": tokenized["key"], **({"baseline": baseline["key"]} if baseline else {})}
    return call(state, evaluate, f"{stage.name}/evaluate", state.context, settings, stage, key=key, trained=trained,
                baseline_model=baseline and baseline["path"], tokenized_path=tokenized["path"], upstream=upstream)


def run_export(pipeline: Pipeline, state: ChainState) -> dict[str, Any]:
    settings = pipeline.export
    stage = pipeline.stage(settings.stage)
    model = full_model(stage.name, state)
    template = (stage.config.data.template if isinstance(stage, TrainingStage) else None) or DEFAULT_TEMPLATE
    key = export_key(settings, model_key=model["key"], template=template)
    return call(state, export, f"{stage.name}/export", state.context, settings, key=key, model=model, template=template)


STAGE_RUNNERS = {BaseStage: run_base, TrainingStage: run_training_stage}


def call(state: ChainState, task, label: str, *args: Any, **kwargs: Any) -> dict[str, Any]:
    """Run a stage task; a Prefect cache hit whose artifact vanished from disk is recomputed."""
    started = time.monotonic()
    result_state = task(*args, **kwargs, return_state=True)
    result = result_state.result()
    if result_state.name == "Cached":
        if read_manifest(result["path"]) is None:
            get_run_logger().warning("%s: cached result's artifact is gone; recomputing", label)
            result = task.with_options(refresh_cache=True)(*args, **kwargs)
        else:
            result = record_cache_hit(state.context, name=label, manifest=result, path=result["path"])
    seconds = round(time.monotonic() - started, 1)
    state.report.append({"name": label, "key": result["key"], "kind": result.get("kind"), "cache_hit": result["cache_hit"],
                         "seconds": seconds, "path": result["path"]})
    print(f"{label}: {'served from cache' if result['cache_hit'] else f'computed in {seconds} s'}", flush=True)
    return result
