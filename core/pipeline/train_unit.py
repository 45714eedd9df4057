"""The training unit: one stage, of any kind in `core/stages/registry.py`, trained in a worker process.

Inputs: `data` (its tokenized datasets), `model` (the full-weight model it starts from) and, for
`ref_model`/`reward_model` naming a stage, that stage's model under the same name.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from tuneline.core.config.ray import trains_on_ray
from tuneline.core.pipeline.keys import train_key
from tuneline.core.pipeline.references import ModelInput
from tuneline.core.pipeline.spec import TrainingStage
from tuneline.core.pipeline.stage_runs import train_job, with_checkpointing
from tuneline.core.pipeline.stage_unit import StageInputs, StageKey, UnitRun, link_resumed_attempt
from tuneline.core.stages.ignored_keys import IGNORED_KEYS_TAG, datasets_map_media, ignored_keys, tag_value
from tuneline.core.store.artifacts import Artifact, ArtifactDraft
from tuneline.core.tracking import runs as tracking
from tuneline.core.training.checkpoint_sync import uploading_checkpoints
from tuneline.core.training.checkpoints import checkpoint_step, checkpoints, resume_point
from tuneline.core.training.job import LOG_FILE, LOSS_PLOT
from tuneline.core.worker.launch import JOB_FILE, launch_training, warm_up
from tuneline.core.worker.preload import needs_bitsandbytes


@dataclass(frozen=True)
class TrainUnit:
    stage: TrainingStage
    kind: ClassVar[str] = "trained"
    action: ClassVar[str] = "train"
    keep_partial: ClassVar[bool] = True  # the draft keeps its checkpoints: a rerun resumes from them

    @property
    def label(self) -> str:
        return self.stage.name

    def stage_key(self, inputs: Mapping[str, ModelInput]) -> StageKey:
        data, start = inputs["data"], inputs["model"]
        reference_keys = {ref: inputs[ref].key for ref in self.stage.references}
        key = train_key(self.stage, tokenized_key=data.key, parent_key=start.key, reference_keys=reference_keys)
        return StageKey(key, {"data": data.key, "model": start.key, **reference_keys})

    def params(self, inputs: StageInputs) -> dict[str, Any]:
        return {**self.stage.config.flat(), **self.reference_paths(inputs), "model_name_or_path": inputs.path("model")}

    def reference_paths(self, inputs: StageInputs) -> dict[str, str]:
        """`ref_model`/`reward_model` -> the resolved folder of the stage they name."""
        return {ref: inputs.path(ref) for ref in self.stage.references}

    def work(self, draft: ArtifactDraft, run: UnitRun) -> None:
        config, log = self.stage.config, run.announcer.log
        training = with_checkpointing(config.training)
        self._record_ignored(run)
        sync = run.inputs.store.checkpoint_sync(draft.path)
        previous_run_id = previous_attempt(draft.path)
        if sync is not None and previous_run_id is None and not checkpoints(draft.path):
            # no draft on this machine: another one may have trained part of the stage and uploaded its checkpoints
            restored = sync.restore(draft.path)
            if restored is not None:
                previous_run_id = restored.run_id
                log(f"{self.stage.name} fetched checkpoint-{restored.step} from {sync.url}")
        if previous_run_id and previous_run_id != run.run_id:
            step = resumed_step(draft.path, training)
            link_resumed_attempt(run, previous_run_id=previous_run_id, step=step)
            log(f"{self.stage.name} resumes run {previous_run_id}'s draft from step {step}")
        start_model = run.inputs.path("model")
        job = train_job(config, start_model=start_model, dataset_path=run.inputs.path("data"), output_dir=str(draft.path),
                        training=training, references=self.reference_paths(run.inputs) or None,
                        tracking_uri=run.context.tracking_uri, run_id=run.run_id, keep_checkpoints=False)
        with uploading_checkpoints(sync, draft.path, run_id=run.run_id, log=log) if sync is not None else nullcontext():
            draft.metrics.update(launch_training(job, log=log))
        draft.extra.update(start_model=start_model, finetuning_type=config.finetuning.finetuning_type)
        if (draft.path / LOSS_PLOT).is_file():
            tracking.log_artifact(run.context.tracking_uri, run.run_id, draft.path / LOSS_PLOT)

    def on_hit(self, artifact: Artifact, run: UnitRun) -> None:
        self._record_ignored(run)

    def _record_ignored(self, run: UnitRun) -> None:
        """On the run that computes the stage and on each cache hit's: the keys its kind does not read."""
        ignored = ignored_keys(self.stage.config, maps_media=datasets_map_media(self.stage.config))
        if ignored:
            for item in ignored:
                run.announcer.say(f"{self.stage.name}: warning: {item.line}")
            tracking.set_tags(run.context.tracking_uri, run.run_id, {IGNORED_KEYS_TAG: tag_value(ignored)})


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


def warm_up_training(stage: TrainingStage) -> bool:
    """Start this process's warm worker for `stage`'s training now (`launch.warm_up`), so that its
    imports, seconds long, run while the stage's inputs are tokenized or fetched; False, starting
    nothing, where the job will not be forked from it (Ray, torchrun, bitsandbytes). Its reference
    models are not looked at: they are the pipeline's own unquantized artifacts, or the job starts a
    process of its own and the warm worker merely waits."""
    config = stage.config
    if trains_on_ray(dataclasses.asdict(config.ray), os.environ):
        return False
    if needs_bitsandbytes(model=dataclasses.asdict(config.model), training=config.training,
                          finetuning=dataclasses.asdict(config.finetuning), optimizer=dataclasses.asdict(config.optimizer),
                          model_paths=[]):
        return False
    return warm_up()
