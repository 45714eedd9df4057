"""Register the exported model in the MLflow model registry, then promote it or make it challenger.

The pipeline's last step after its export (`tasks/register.py` wraps it in a Prefect task).
"""

from __future__ import annotations

from typing import Any

from tuneline.core.pipeline.references import ArtifactRef
from tuneline.core.pipeline.spec import RegisterSettings
from tuneline.core.pipeline.stage_unit import CACHE_HIT_TAG, STAGE_TAG, WORKER_TAG, Announcer, RunContext, worker_name
from tuneline.core.pipeline.stores import open_store
from tuneline.core.tracking import model_registry as registry
from tuneline.core.tracking import runs as tracking
from tuneline.core.tracking.promotion import check_metric, decide, metric_tags, rule_from_settings
from tuneline.core.tracking.references import EXPORT_KEY_TAG, KEY_TAG

FLAVOR_TAG = "tuneline.mlflow_flavor"
FALLBACK_TAG = "tuneline.mlflow_flavor_fallback"


def register_export(
    context: RunContext,
    settings: RegisterSettings,
    *,
    exported: ArtifactRef,
    lineage: dict[str, str],
    metrics: dict[str, float],
    metric_origin: dict[str, str],
    search_dir: str | None,
    announcer: Announcer = Announcer(),
) -> dict[str, Any]:
    """Reuse the version already registered for this export (same key), else register a new one; then
    compare it with the champion on the configured metric and point `champion` or `challenger` at it."""
    key = exported.key
    rule = rule_from_settings(metric=settings.promote_metric, greater=settings.greater_is_better,
                              min_improvement=settings.min_improvement, function=settings.promote_function)
    check_metric(rule, metrics, metric_origin)
    with open_store(context.workspace).exclusive("register", key):  # two runs of one export on a workspace register it once
        return _register_and_decide(context, settings, rule, exported=exported, lineage=lineage, metrics=metrics,
                                    search_dir=search_dir, announcer=announcer)


def _register_and_decide(context: RunContext, settings: RegisterSettings, rule: Any, *, exported: ArtifactRef,
                         lineage: dict[str, str], metrics: dict[str, float], search_dir: str | None,
                         announcer: Announcer) -> dict[str, Any]:
    uri, key, name = context.tracking_uri, exported.key, settings.model_name
    store = open_store(context.workspace)
    existing = tracking.find_model_version(uri, name=name, tag=EXPORT_KEY_TAG, value=key)
    tags = {KEY_TAG: key, CACHE_HIT_TAG: str(existing is not None).lower(), STAGE_TAG: "register", WORKER_TAG: worker_name()}
    with tracking.tracked_run(uri, context.experiment_id, name="register", parent_run_id=context.parent_run_id, tags=tags) as run_id:
        tracking.log_params(uri, run_id, {"model_name": name, "alias": settings.alias, "export": store.place(exported),
                                          "promote_metric": settings.promote_metric, "promote_function": settings.promote_function,
                                          "min_improvement": settings.min_improvement, "greater_is_better": rule.greater_is_better})
        version = existing or _register_new(uri, run_id, name=name, key=key, export_dir=str(store.folder(exported)),
                                            announcer=announcer, tags={**lineage, **metric_tags(metrics)})
        champion_version, champion_metrics = registry.champion(uri, name=name, alias=settings.alias)
        decision = decide(rule, version=version, candidate=metrics, champion_version=champion_version, champion=champion_metrics,
                          alias=settings.alias, search_dir=search_dir)
        registry.apply_decision(uri, name=name, decision=decision)
        tracking.set_tags(uri, run_id, {"tuneline.promotion": decision.message})
    announcer.log(f"registered {name} version {version}: {decision.message}")
    return {"model_name": name, "version": version, "alias": decision.alias, "promoted": decision.promoted,
            "decision": decision.message, "cache_hit": existing is not None}


def _register_new(uri: str, run_id: str, *, name: str, key: str, export_dir: str, announcer: Announcer,
                  tags: dict[str, str]) -> str:
    flavor, fallback = tracking.log_chat_model(uri, run_id, export_dir, artifact_path="model")
    if fallback:
        announcer.warn(f"logged {export_dir} as plain files, not as an MLflow transformers model: {fallback}")
    tags = {EXPORT_KEY_TAG: key, FLAVOR_TAG: flavor, **({FALLBACK_TAG: fallback} if fallback else {}), **tags}
    return tracking.register_model_version(uri, name=name, run_id=run_id, artifact_path="model", tags=tags, alias=None)
