"""Task: register the exported model in the MLflow model registry and point the alias at it."""

from __future__ import annotations

from typing import Any

from prefect import get_run_logger, task

from tuneline.core import tracking
from tuneline.core.fingerprint import package_version
from tuneline.core.pipeline import RegisterSettings
from tuneline.tasks.common import CACHE_HIT_TAG, KEY_TAG, RunContext

EXPORT_KEY_TAG = "tuneline.export_key"


@task(name="register")
def register(
    context: RunContext, settings: RegisterSettings, *, exported: dict[str, Any], lineage: dict[str, str]
) -> dict[str, Any]:
    """Reuse the version already registered for this export (same key), else register a new one."""
    uri, key = context.tracking_uri, exported["key"]
    existing = tracking.find_model_version(uri, name=settings.model_name, tag=EXPORT_KEY_TAG, value=key)
    run_id = tracking.start_run(
        uri, context.experiment_id, name="register", parent_run_id=context.parent_run_id,
        tags={KEY_TAG: key, CACHE_HIT_TAG: str(existing is not None).lower(), "tuneline.stage": "register"},
    )
    tracking.log_params(uri, run_id, {"model_name": settings.model_name, "alias": settings.alias, "export": exported["path"]})
    if existing is None:
        tracking.log_artifact(uri, run_id, exported["path"], artifact_path="model")
        tags = {EXPORT_KEY_TAG: key, "tuneline.version": package_version(), **lineage}
        version = tracking.register_model_version(uri, name=settings.model_name, run_id=run_id, artifact_path="model", tags=tags, alias=settings.alias)
    else:
        version = existing
        tracking.set_alias(uri, name=settings.model_name, alias=settings.alias, version=version)
    tracking.end_run(uri, run_id)
    get_run_logger().info("registered %s version %s as @%s", settings.model_name, version, settings.alias)
    return {"model_name": settings.model_name, "version": version, "alias": settings.alias, "cache_hit": existing is not None}
