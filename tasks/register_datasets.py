"""Task: check every dataset the pipeline names and fingerprint its files, once per run."""

from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from tuneline.core.pipeline.keys import PipelineFingerprints, pipeline_dataset_fingerprints
from tuneline.core.pipeline.spec import Pipeline
from tuneline.core.pipeline.stage_unit import RunContext
from tuneline.core.tracking import runs as tracking


@task(name="register_datasets", cache_policy=NO_CACHE, persist_result=False)
def register_datasets(context: RunContext, pipeline: Pipeline) -> PipelineFingerprints:
    """Always runs: it is what notices that data changed. The only place a run hashes its datasets;
    the stage keys take the digests from here. Recorded on the parent run as inputs."""
    fingerprints = pipeline_dataset_fingerprints(pipeline)
    tracking.log_dataset_inputs(context.tracking_uri, context.parent_run_id, fingerprints.all())
    return fingerprints
