"""Task: check every dataset the pipeline names and fingerprint its files."""

from __future__ import annotations

from prefect import task

from tuneline.core.tracking import runs as tracking
from tuneline.core.pipeline.spec import Pipeline
from tuneline.core.pipeline.keys import pipeline_dataset_fingerprints
from tuneline.tasks.common import RunContext


@task(name="register_datasets")
def register_datasets(context: RunContext, pipeline: Pipeline) -> dict[str, str]:
    """Always runs: it is what notices that data changed. Recorded on the parent run as inputs."""
    fingerprints = pipeline_dataset_fingerprints(pipeline)
    tracking.log_dataset_inputs(context.tracking_uri, context.parent_run_id, fingerprints)
    return fingerprints
