"""`tuneline deploy`: register the flows' deployments (deployments/prefect.yaml) with a Prefect server.

    tuneline deploy [--prefect-file FILE] [--pool NAME]

Creates each process work pool the deployments name (or `--pool`) if it is missing, then runs
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

# flows/, data/ and deployments/ share one parent: the repository root in a checkout, the installed
# `tuneline` package's folder in a wheel. prefect.yaml's entrypoint and relative paths resolve there.
PROJECT_ROOT = Path(str(files("tuneline.flows"))).parent
DEFAULT_PREFECT_FILE = Path(str(files("tuneline.deployments") / "prefect.yaml"))
POOL_TYPE = "process"


def deploy(prefect_file: str | Path | None = None, *, pool: str | None = None) -> tuple[list[str], list[str]]:
    """Create the work pools, register the deployments; returns their `flow/deployment` names and the pools."""
    from prefect.settings import PREFECT_API_URL

    path = Path(prefect_file or DEFAULT_PREFECT_FILE).resolve()
    deployments = read_deployments(path)
    if not PREFECT_API_URL.value():
        raise ConfigError(
            "PREFECT_API_URL is not set, so the deployments would go to a temporary server that no worker can reach. "
            "Start a server with `prefect server start --host 127.0.0.1 --port 4200` and run "
            "`prefect config set PREFECT_API_URL=http://127.0.0.1:4200/api` (or export it), then deploy again.",
            source="tuneline deploy")
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
    return [f"tuneline-pipeline/{d['name']}" for d in deployments], sorted(pools)


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
