"""Task: train one stage (pt, sft, rm, dpo or kto) in a worker process."""

from __future__ import annotations

import dataclasses
from typing import Any

from prefect import get_run_logger, task

from tuneline.core import tracking
from tuneline.core.launch import launch_training
from tuneline.core.pipeline import TrainingStage
from tuneline.core.train import LOSS_PLOT, TrainJob
from tuneline.tasks.common import STAGE_TASK_OPTIONS, RunContext, run_stage


@task(name="train", **STAGE_TASK_OPTIONS)
def train(
    context: RunContext, stage: TrainingStage, *, key: str, start_model: str, tokenized_path: str, upstream: dict[str, str],
    references: dict[str, str] | None = None,
) -> dict[str, Any]:
    """`references` maps `ref_model`/`reward_model` to the resolved path of the stage they name."""
    logger = get_run_logger()
    finetuning = {**dataclasses.asdict(stage.config.finetuning), **(references or {})}

    def work(draft, run_id):
        job = TrainJob(
            model_path=start_model,
            dataset_path=tokenized_path,
            output_dir=str(draft.path),
            finetuning=finetuning,
            training=dict(stage.config.training),
            model={**dataclasses.asdict(stage.config.model), "model_name_or_path": start_model},
            tracking_uri=context.tracking_uri,
            run_id=run_id,
            keep_checkpoints=False,
        )
        draft.metrics.update(launch_training(job, log=logger.info))
        draft.extra.update(start_model=start_model, finetuning_type=stage.config.finetuning.finetuning_type)
        if (draft.path / LOSS_PLOT).is_file():
            tracking.log_artifact(context.tracking_uri, run_id, draft.path / LOSS_PLOT)

    params = {**stage.config.flat(), **(references or {}), "model_name_or_path": start_model}
    return run_stage(context, name=stage.name, kind="trained", key=key, params=params, inputs=upstream, work=work, keep_partial=True)
