"""Task: build the project's tiny base model (tokenizer + random weights)."""

from __future__ import annotations

import dataclasses

from prefect import task

from tuneline.tasks.common import STAGE_TASK_OPTIONS, RunContext, StageOutcome, run_stage
from tuneline.core.pipeline.spec import BaseStage
from tuneline.core.pipeline.keys import run_build_base


@task(name="build_base", **STAGE_TASK_OPTIONS)
def build_base(context: RunContext, stage: BaseStage, *, key: str, inputs: dict[str, str]) -> StageOutcome:
    def work(draft, run_id):
        draft.metrics.update(run_build_base(stage, draft.path))

    params = {**dataclasses.asdict(stage.build), "corpus": ",".join(stage.corpus)}
    return run_stage(context, name=stage.name, kind="base", key=key, params=params, inputs=inputs, work=work, dataset_inputs=inputs)
