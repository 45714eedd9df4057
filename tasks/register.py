"""Task: register the exported model, then promote it or make it challenger (`core/pipeline/registration.py`)."""

from __future__ import annotations

from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from tuneline.core.pipeline.references import ArtifactRef
from tuneline.core.pipeline.registration import register_export
from tuneline.core.pipeline.spec import RegisterSettings
from tuneline.core.pipeline.stage_unit import RunContext
from tuneline.tasks.stage import task_announcer


@task(name="register", cache_policy=NO_CACHE, persist_result=False)
def register(context: RunContext, settings: RegisterSettings, *, exported: ArtifactRef, lineage: dict[str, str],
             metrics: dict[str, float], metric_origin: dict[str, str], search_dir: str | None) -> dict[str, Any]:
    return register_export(context, settings, exported=exported, lineage=lineage, metrics=metrics, metric_origin=metric_origin,
                           search_dir=search_dir, announcer=task_announcer())
