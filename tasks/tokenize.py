"""Task: tokenize a training stage's datasets to Arrow with its template."""

from __future__ import annotations

from typing import Any

from prefect import task

from tuneline.core.tracking import runs as tracking
from tuneline.core.data.tokenization import PREVIEW_FILE, tokenize_dataset
from tuneline.core.pipeline.spec import TrainingStage
from tuneline.tasks.common import STAGE_TASK_OPTIONS, RunContext, run_stage


@task(name="tokenize", **STAGE_TASK_OPTIONS)
def tokenize(context: RunContext, stage: TrainingStage, *, key: str, tokenizer_path: str, inputs: dict[str, str]) -> dict[str, Any]:
    def work(draft, run_id):
        counters = tokenize_dataset(stage.config, tokenizer_path=tokenizer_path, output_dir=draft.path)
        draft.metrics.update(counters)
        tracking.log_artifact(context.tracking_uri, run_id, draft.path / PREVIEW_FILE)

    params = {k: v for k, v in stage.config.flat().items() if k in _DATA_PARAMS}
    return run_stage(context, name=f"{stage.name}/tokenize", kind="tokenized", key=key, params=params, inputs=inputs, work=work, dataset_inputs=inputs)


_DATA_PARAMS = ("dataset", "eval_dataset", "dataset_dir", "template", "cutoff_len", "train_on_prompt", "mask_history",
                "max_samples", "val_size", "packing", "stage")
