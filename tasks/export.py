"""Task: write the chosen model as a standalone Hugging Face folder."""

from __future__ import annotations

from prefect import task

from tuneline.core.config import InferenceConfig
from tuneline.core.pipeline.spec import ExportSettings
from tuneline.core.pipeline.stage_runs import ParitySource, write_export
from tuneline.core.store.results import ModelRef
from tuneline.tasks.common import STAGE_TASK_OPTIONS, RunContext, StageOutcome, run_stage


@task(name="export", **STAGE_TASK_OPTIONS)
def export(context: RunContext, settings: ExportSettings, *, key: str, model: ModelRef, template: str,
           inference: InferenceConfig, parity: ParitySource) -> StageOutcome:
    """`inference`: the exported stage's infer_dtype (the weights' dtype) and use_kv_cache (the config's use_cache);
    `parity`: what the train/serve parity gate compares the export with."""
    def work(draft, run_id):
        report = write_export(draft.path, model=model.path, template=template, export_size_gb=settings.export_size,
                              infer_dtype=inference.infer_dtype, use_kv_cache=inference.use_kv_cache, parity=parity)
        draft.metrics.update(report.metrics)
        if report.modelfile_obstacle is not None:  # the manifest says why the folder has no Ollama Modelfile
            draft.extra["ollama_modelfile_obstacle"] = report.modelfile_obstacle

    params = {"stage": settings.stage, "export_size": settings.export_size, "template": template,
              "infer_dtype": inference.infer_dtype, "use_kv_cache": inference.use_kv_cache, "parity_probes": settings.parity_probes}
    return run_stage(context, name=f"{settings.stage}/export", kind="export", key=key, params=params, inputs={"model": model.key}, work=work)
