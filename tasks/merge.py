"""Task: fold a LoRA stage's adapter into the model it started from."""

from __future__ import annotations

from prefect import task

from tuneline.core.pipeline.stage_runs import merge_into
from tuneline.core.store.results import StageResult
from tuneline.tasks.common import STAGE_TASK_OPTIONS, RunContext, StageOutcome, run_stage


@task(name="merge", **STAGE_TASK_OPTIONS)
def merge(context: RunContext, *, name: str, key: str, trained: StageResult) -> StageOutcome:
    assert trained.start_model is not None  # a training stage's result names the model it started from

    def work(draft, run_id):
        draft.metrics.update(merge_into(draft.path, start_model=trained.start_model, adapter=trained.path))

    params = {"base_model": trained.start_model, "adapter": trained.path}
    return run_stage(context, name=f"{name}/merge", kind="merged", key=key, params=params, inputs={"trained": trained.key}, work=work)
