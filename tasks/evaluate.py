"""Task: validation loss and held-out answer quality of a trained stage against its baseline."""

from __future__ import annotations

import dataclasses
import json

from prefect import task

from tuneline.core.pipeline.spec import EvaluateSettings, TrainingStage
from tuneline.core.evaluation.heldout import score_model
from tuneline.core.pipeline.keys import heldout_rows
from tuneline.core.store.results import StageResult
from tuneline.tasks.common import STAGE_TASK_OPTIONS, RunContext, StageOutcome, run_stage


@task(name="evaluate", **STAGE_TASK_OPTIONS)
def evaluate(
    context: RunContext,
    settings: EvaluateSettings,
    stage: TrainingStage,
    *,
    key: str,
    trained: StageResult,
    baseline_model: str | None,
    tokenized_path: str,
    upstream: dict[str, str],
) -> StageOutcome:
    def work(draft, run_id):
        adapter = trained.path if trained.is_adapter else None
        model_path = trained.start_model if adapter else trained.path
        rows = heldout_rows(settings, stage.config)
        plan = settings.benchmark_plan()
        result = score_model(model_path, adapter_path=adapter, config=stage.config, tokenized_path=tokenized_path, rows=rows,
                             max_new_tokens=settings.max_new_tokens, plan=plan)
        draft.metrics.update(result.metrics)
        _write_predictions(draft.path / "generated_predictions.jsonl", result.predictions)
        if baseline_model:
            baseline = score_model(baseline_model, adapter_path=None, config=stage.config, tokenized_path=tokenized_path,
                                   rows=rows, max_new_tokens=settings.max_new_tokens, plan=plan)
            draft.metrics.update({f"baseline_{k}": v for k, v in baseline.metrics.items()})

    return run_stage(context, name=f"{stage.name}/evaluate", kind="evaluation", key=key,
                     params=dataclasses.asdict(settings), inputs=upstream, work=work)


def _write_predictions(path, predictions: list[dict[str, str]]) -> None:
    path.write_text("".join(json.dumps(p, ensure_ascii=False) + "\n" for p in predictions), encoding="utf-8")
