"""Task: fold a LoRA stage's adapter into the model it started from."""

from __future__ import annotations

from prefect import task

from tuneline.core.config import ModelConfig
from tuneline.core.pipeline.stage_runs import merge_into
from tuneline.core.store.results import StageResult
from tuneline.tasks.common import STAGE_TASK_OPTIONS, RunContext, StageOutcome, run_stage


@task(name="merge", **STAGE_TASK_OPTIONS)
def merge(context: RunContext, *, name: str, key: str, trained: StageResult, rope_scaling: str | None = None,
          model_max_length: int | None = None) -> StageOutcome:
    """`rope_scaling` and `model_max_length` (the stage's cutoff_len): the RoPE the adapter trained with."""
    assert trained.start_model is not None  # a training stage's result names the model it started from

    def work(draft, run_id):
        draft.metrics.update(merge_into(draft.path, start_model=trained.start_model, adapter=trained.path,
                                        model_config=ModelConfig(rope_scaling=rope_scaling), model_max_length=model_max_length))

    params = {"base_model": trained.start_model, "adapter": trained.path, **({"rope_scaling": rope_scaling} if rope_scaling else {})}
    return run_stage(context, name=f"{name}/merge", kind="merged", key=key, params=params, inputs={"trained": trained.key}, work=work)
