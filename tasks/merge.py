"""Task: fold a LoRA stage's adapter into the model it started from."""

from __future__ import annotations

from typing import Any

from prefect import task

from tuneline.core.models.export import merge_adapter
from tuneline.tasks.common import STAGE_TASK_OPTIONS, RunContext, run_stage


@task(name="merge", **STAGE_TASK_OPTIONS)
def merge(context: RunContext, *, name: str, key: str, trained: dict[str, Any]) -> dict[str, Any]:
    def work(draft, run_id):
        draft.metrics.update(merge_adapter(trained["start_model"], trained["path"], draft.path))

    params = {"base_model": trained["start_model"], "adapter": trained["path"]}
    return run_stage(context, name=f"{name}/merge", kind="merged", key=key, params=params, inputs={"trained": trained["key"]}, work=work)
