"""`tuneline deploy`: register the flows' deployments (deployments/prefect.yaml) with a Prefect server.

    tuneline deploy [--prefect-file FILE] [--pool NAME]
    tuneline deploy PIPELINE.yaml [key=value ...]      # the one-stage flow on every pool the pipeline names

With a pipeline, it creates each process work pool the pipeline's stages name (`work_pool`) if it is
missing and registers the one-stage flow there as `tuneline-stage/<pool>`, by its module path
(`tuneline.flows.stage_flow:stage_flow`) and with no pull step: a worker runs it from the tuneline it
has installed, in whatever folder it was started, and is sent everything else with each flow run.
Without one:
it creates each process work pool the deployments name (or `--pool`) if it is missing, then runs
`prefect deploy --all` from the folder that holds flows/ and data/ (the repository root in a checkout,
the installed `tuneline` package's folder otherwise), so that Prefect records a `set_working_directory`
pull step to that folder: a process worker then runs every flow there, where the entrypoint
(`flows/pipeline.py:pipeline_flow`) and the relative parameters (`data/demo_pipeline.yaml`,
`workspace`) resolve.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from importlib.resources import files
from pathlib import Path

import yaml

from tuneline.core.errors import ConfigError
from tuneline.core.pipeline.spec import Pipeline

# flows/, data/ and deployments/ share one parent: the repository root in a checkout, the installed
# `tuneline` package's folder in a wheel. prefect.yaml's entrypoint and relative paths resolve there.
PROJECT_ROOT = Path(str(files("tuneline.flows"))).parent
DEFAULT_PREFECT_FILE = Path(str(files("tuneline.deployments") / "prefect.yaml"))
POOL_TYPE = "process"


def deploy(prefect_file: str | Path | None = None, *, pool: str | None = None) -> tuple[list[str], list[str]]:
    """Create the work pools, register the deployments; returns their `flow/deployment` names and the pools."""
    path = Path(prefect_file or DEFAULT_PREFECT_FILE).resolve()
    deployments = read_deployments(path)
    require_api_url()
    pools = {pool} if pool else {d["work_pool"]["name"] for d in deployments}
    for name in sorted(pools):
        ensure_work_pool(name)
    with tempfile.TemporaryDirectory() as scratch:
        if pool:  # `prefect deploy --all` ignores --pool: deploy a copy of the file naming the pool instead
            path = with_pool(path, pool, Path(scratch) / path.name)
        command = [sys.executable, "-m", "prefect", "deploy", "--all", "--prefect-file", str(path), "--no-prompt"]
        result = subprocess.run(command, cwd=PROJECT_ROOT, env=os.environ, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"`{' '.join(command)}` failed (exit {result.returncode}):\n{result.stdout}\n{result.stderr}")
    stage_flows = deploy_stage_flows(sorted(pools))  # so that `tuneline demo --work-pool POOL` finds its stages' flow
    return [*(f"tuneline-pipeline/{d['name']}" for d in deployments), *stage_flows], sorted(pools)


def deploy_stage_flows(pools: list[str]) -> list[str]:
    """Create each pool if missing and register the one-stage flow on it; returns the deployments' names."""
    from prefect.client.orchestration import get_client
    from prefect.utilities.callables import parameter_schema

    from tuneline.flows.stage_flow import ENTRYPOINT, STAGE_FLOW, deployment_name, stage_flow

    require_api_url()
    schema = parameter_schema(stage_flow).model_dump_for_openapi()
    with get_client(sync_client=True) as client:
        flow_id = client.create_flow_from_name(STAGE_FLOW)
        for pool in pools:
            ensure_work_pool(pool)
            client.create_deployment(flow_id, pool, entrypoint=ENTRYPOINT, work_pool_name=pool, pull_steps=[],
                                     parameter_openapi_schema=schema, enforce_parameter_schema=False,
                                     description=f"One stage of a tuneline pipeline, on a worker of pool {pool}.")
    return [deployment_name(pool) for pool in pools]


def pipeline_pools(pipeline: Pipeline) -> list[str]:
    """The work pools the pipeline's stages name, or a ConfigError when they name none."""
    pools = sorted({stage.placement.work_pool for stage in pipeline.stages if stage.placement.work_pool})
    if not pools:
        raise ConfigError("no stage names a work pool, so no worker has anything to run; set `work_pool: NAME` at the "
                          "top of the pipeline or in a stage (or pass work_pool=NAME), then deploy again.",
                          source=pipeline.source)
    return pools


def require_api_url() -> None:
    from prefect.settings import PREFECT_API_URL

    if not PREFECT_API_URL.value():
        raise ConfigError(
            "PREFECT_API_URL is not set, so the deployments would go to a temporary server that no worker can reach. "
            "Start a server with `prefect server start --host 127.0.0.1 --port 4200` and run "
            "`prefect config set PREFECT_API_URL=http://127.0.0.1:4200/api` (or export it), then deploy again.",
            source="tuneline deploy")


def with_pool(path: Path, pool: str, copy: Path) -> Path:
    """Write to `copy` the prefect.yaml at `path` with every deployment on work pool `pool`."""
    config = yaml.safe_load(path.read_text(encoding="utf-8"))
    for deployment in config["deployments"]:
        deployment["work_pool"]["name"] = pool
    copy.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return copy


def read_deployments(path: Path) -> list[dict]:
    """The deployments listed in a prefect.yaml, each checked for a name and a work pool."""
    if not path.is_file():
        raise ConfigError(f"--prefect-file {path}: no such file.", source="tuneline deploy")
    deployments = (yaml.safe_load(path.read_text(encoding="utf-8")) or {}).get("deployments") or []
    problems = [f"deployment #{i + 1} needs a `name` and a `work_pool: {{name: ...}}`."
                for i, d in enumerate(deployments) if not d.get("name") or not (d.get("work_pool") or {}).get("name")]
    if not deployments or problems:
        raise ConfigError(problems or ["it lists no deployments."], source=str(path))
    return deployments


def ensure_work_pool(name: str) -> bool:
    """Create the process work pool `name` unless it exists; True when it was created."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectNotFound
    from prefect.workers.process import ProcessWorker

    with get_client(sync_client=True) as client:
        try:
            client.read_work_pool(name)
            return False
        except ObjectNotFound:
            template = ProcessWorker.get_default_base_job_template()
            client.create_work_pool(WorkPoolCreate(name=name, type=POOL_TYPE, base_job_template=template))
            return True
