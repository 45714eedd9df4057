"""A pipeline's stages on a Ray cluster (`task_runner: ray`), through prefect-ray's RayTaskRunner.

`on_ray_cluster` connects to the cluster and checks it (core/pipeline/ray_stages.py) before the
pipeline's flow starts, and hands back that flow with a RayTaskRunner on the connection; `run_on_ray`
submits one unit as a Prefect task holding its stage's Ray resources and waits for it. The flow's
scheduler (flows/pipeline.py) still decides when a unit may start, so stages whose inputs are ready
at the same time run at the same time, on whichever nodes have their resources free.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from prefect import Flow
from prefect.context import FlowRunContext

from tuneline.core.errors import ConfigError
from tuneline.core.pipeline.keys import PipelineFingerprints
from tuneline.core.pipeline.ray_stages import RayUnit, connect_cluster, forwarded_env, ray_remote_options
from tuneline.core.pipeline.references import ArtifactRef, ModelInput
from tuneline.core.pipeline.spec import Pipeline
from tuneline.core.pipeline.stage_unit import RunContext, StageUnit, unit_key
from tuneline.core.pipeline.unit_plan import UnitAddress


@contextmanager
def on_ray_cluster(flow: Flow[..., Any], pipeline: Pipeline) -> Iterator[Flow[..., Any]]:
    """`flow` with its tasks on the Ray cluster at RAY_ADDRESS (checked first); disconnected after."""
    address = connect_cluster(pipeline, os.environ)  # first: it names a missing ray package
    import ray
    from prefect.settings import PREFECT_API_URL, temporary_settings
    from prefect_ray import RayTaskRunner

    try:
        # the tasks report to this run's Prefect API: without PREFECT_API_URL, each Ray worker would start a
        # temporary server of its own, so the URL of this process's is handed to them
        with temporary_settings(updates={PREFECT_API_URL: PREFECT_API_URL.value() or temporary_api_url()}):
            yield flow.with_options(task_runner=RayTaskRunner(address=address))
    finally:
        ray.shutdown()


def temporary_api_url() -> str:
    """The URL of this process's temporary Prefect server (on 127.0.0.1: Ray nodes of this machine reach it)."""
    from prefect.server.api.server import SubprocessASGIServer

    server = SubprocessASGIServer()
    server.start()
    return server.api_url


def run_on_ray(unit: StageUnit, address: UnitAddress, inputs: Mapping[str, ModelInput], *, pipeline: Pipeline,
               fingerprints: PipelineFingerprints, datasets: Mapping[str, str], context: RunContext) -> ArtifactRef:
    """Run `unit` as a Ray task holding its stage's `resources` and wait for its reference."""
    from prefect_ray import RayTaskRunner
    from prefect_ray.context import remote_options

    from tuneline.tasks.ray_stage import ray_task_for

    flow_run = FlowRunContext.get()
    if flow_run is None or not isinstance(flow_run.task_runner, RayTaskRunner):
        raise ConfigError(f"{unit.label}: the pipeline runs its stages on Ray ('task_runner: ray'), and this flow run has "
                          "no Ray task runner; start the pipeline with `tuneline run` (or `tuneline demo`), which "
                          "connects to the cluster at RAY_ADDRESS first.")
    resources = pipeline.stage(address.stage).placement.ray_resources
    assert resources is not None  # the stage is on Ray
    sent = RayUnit(pipeline=pipeline, fingerprints=fingerprints, address=address, key=unit_key(unit, inputs),
                   datasets=dict(datasets), env=forwarded_env(os.environ))
    with remote_options(**ray_remote_options(resources)):
        future = ray_task_for(unit.action).submit(context, sent, inputs)
    return future.result()
