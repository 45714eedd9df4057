"""Task: train one stage (pt, sft, rm, dpo or kto) in a worker process."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from prefect import get_run_logger, task

from tuneline.core.tracking import runs as tracking
from tuneline.core.training.checkpoints import checkpoint_step, resume_point
from tuneline.core.worker.launch import JOB_FILE, launch_training
from tuneline.core.pipeline.spec import TrainingStage
from tuneline.core.pipeline.stage_runs import train_job, with_checkpointing
from tuneline.core.stages.ignored_keys import IGNORED_KEYS_TAG, datasets_map_media, ignored_keys, tag_value
from tuneline.core.training.job import LOG_FILE, LOSS_PLOT
from tuneline.tasks.common import STAGE_TASK_OPTIONS, RunContext, StageOutcome, announce, link_resumed_attempt, run_stage


@task(name="train", **STAGE_TASK_OPTIONS)
def train(
    context: RunContext, stage: TrainingStage, *, key: str, start_model: str, tokenized_path: str, upstream: dict[str, str],
    references: dict[str, str] | None = None,
) -> StageOutcome:
    """`references` maps `ref_model`/`reward_model` to the resolved path of the stage they name."""
    logger = get_run_logger()
    training = with_checkpointing(stage.config.training)
    ignored = ignored_keys(stage.config, maps_media=datasets_map_media(stage.config))

    def record_ignored(run_id: str) -> None:  # on the run that computes the stage and on each cache hit's
        if ignored:
            for item in ignored:
                announce(f"{stage.name}: warning: {item.line}")
            tracking.set_tags(context.tracking_uri, run_id, {IGNORED_KEYS_TAG: tag_value(ignored)})

    def work(draft, run_id):
        record_ignored(run_id)
        previous_run_id = previous_attempt(draft.path)
        if previous_run_id and previous_run_id != run_id:
            step = resumed_step(draft.path, training)
            link_resumed_attempt(context, run_id, previous_run_id=previous_run_id, step=step)
            logger.info("%s resumes run %s's draft from step %d", stage.name, previous_run_id, step)
        job = train_job(stage.config, start_model=start_model, dataset_path=tokenized_path, output_dir=str(draft.path),
                        training=training, references=references, tracking_uri=context.tracking_uri, run_id=run_id,
                        keep_checkpoints=False)
        draft.metrics.update(launch_training(job, log=logger.info))
        draft.extra.update(start_model=start_model, finetuning_type=stage.config.finetuning.finetuning_type)
        if (draft.path / LOSS_PLOT).is_file():
            tracking.log_artifact(context.tracking_uri, run_id, draft.path / LOSS_PLOT)

    params = {**stage.config.flat(), **(references or {}), "model_name_or_path": start_model}
    return run_stage(context, name=stage.name, kind="trained", key=key, params=params, inputs=upstream, work=work, keep_partial=True,
                     on_hit=lambda artifact, run_id: record_ignored(run_id))


def previous_attempt(draft: Path) -> str | None:
    """The MLflow run of the attempt whose draft this is, from the job file its launcher wrote."""
    try:
        return json.loads((draft / JOB_FILE).read_text(encoding="utf-8")).get("run_id")
    except (OSError, ValueError, AttributeError):  # no attempt got as far as the worker, or a file cut short
        return None


def resumed_step(draft: Path, training: Mapping[str, Any]) -> int:
    """The step the worker will resume from (0: none), chosen as it chooses, without tidying."""
    chosen = resume_point(draft, requested=training.get("resume_from_checkpoint"), fresh=False, tidy=False, log_file=LOG_FILE)
    return (checkpoint_step(Path(chosen)) or 0) if chosen else 0
