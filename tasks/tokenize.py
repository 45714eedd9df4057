"""Task: tokenize a training stage's datasets to Arrow with its template."""

from __future__ import annotations

from prefect import task

from tuneline.core.tracking import runs as tracking
from tuneline.core.data.tokenization import PREVIEW_FILE
from tuneline.core.pipeline.spec import TrainingStage
from tuneline.core.pipeline.stage_runs import TEMPLATE_WARNING, TOKENIZED_KIND, tokenize_into, tokenize_params
from tuneline.core.tracking.references import TEMPLATE_WARNING_TAG
from tuneline.tasks.common import STAGE_TASK_OPTIONS, RunContext, StageOutcome, announce, run_stage

_TAG_CHARS = 5000  # MLflow keeps tag values up to 8000 characters; the paragraph is well under


@task(name="tokenize", **STAGE_TASK_OPTIONS)
def tokenize(context: RunContext, stage: TrainingStage, *, key: str, tokenizer_path: str, inputs: dict[str, str]) -> StageOutcome:
    def record_warning(warning: str | None, run_id: str) -> None:
        if warning:
            announce(f"{stage.name}/tokenize: {warning}")
            tracking.set_tags(context.tracking_uri, run_id, {TEMPLATE_WARNING_TAG: warning[:_TAG_CHARS]})

    def work(draft, run_id):
        tokenize_into(draft, stage.config, tokenizer_path=tokenizer_path)
        tracking.log_artifact(context.tracking_uri, run_id, draft.path / PREVIEW_FILE)
        record_warning(draft.extra.get(TEMPLATE_WARNING), run_id)

    # a hit's run carries the warning too, from the manifest, so every run of the stage shows it
    return run_stage(context, name=f"{stage.name}/tokenize", kind=TOKENIZED_KIND, key=key, params=tokenize_params(stage.config),
                     inputs=inputs, work=work, dataset_inputs=inputs,
                     on_hit=lambda artifact, run_id: record_warning(artifact.manifest.get(TEMPLATE_WARNING), run_id))
