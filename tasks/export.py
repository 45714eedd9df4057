"""Task: write the chosen model as a standalone Hugging Face folder."""

from __future__ import annotations

from typing import Any

from prefect import task

from tuneline.core.models.export import write_hf_folder
from tuneline.core.pipeline.spec import ExportSettings
from tuneline.tasks.common import STAGE_TASK_OPTIONS, RunContext, run_stage


@task(name="export", **STAGE_TASK_OPTIONS)
def export(context: RunContext, settings: ExportSettings, *, key: str, model: dict[str, Any], template: str) -> dict[str, Any]:
    def work(draft, run_id):
        write_hf_folder(model["path"], draft.path, template=template, export_size_gb=settings.export_size)

    params = {"stage": settings.stage, "export_size": settings.export_size, "template": template}
    return run_stage(context, name=f"{settings.stage}/export", kind="export", key=key, params=params, inputs={"model": model["key"]}, work=work)
