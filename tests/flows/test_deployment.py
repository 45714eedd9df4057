"""Deployments end to end: a real Prefect server on 127.0.0.1 and a process worker, both started here.

`tuneline deploy` registers deployments/prefect.yaml; `prefect deployment run` triggers the demo chain
(small settings passed as deployment parameters), which must complete and register a new MLflow model
version. Triggered again with nothing changed, the run trains nothing, says so in its log, and takes
under a quarter of the first run's time.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import httpx
import pytest

from cluster_services import prefect_worker_command
from conftest import start_prefect_server, start_process, stop_process
from tuneline.flows.report import NOTHING_CHANGED

pytestmark = pytest.mark.slow

REPO_ROOT = Path(__file__).resolve().parents[2]
POOL = "tuneline-ci"
SMALL = ["dataset_dir=data", "max_steps=2", "max_samples=16", "hidden_size=32", "intermediate_size=64", "vocab_size=512",
         "num_hidden_layers=2"]


@pytest.fixture(scope="module")
def prefect(tmp_path_factory):
    """Server and worker on a private PREFECT_HOME; yields the environment that reaches them."""
    home = tmp_path_factory.mktemp("prefect_home")
    # INFO: the test reads the flow run's own log lines
    env = {**os.environ, "PREFECT_HOME": str(home), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "PREFECT_LOGGING_LEVEL": "INFO", "PREFECT_WORKER_QUERY_SECONDS": "1", "PREFECT_WORKER_PREFETCH_SECONDS": "1",
           "OMP_NUM_THREADS": "1"}
    env.pop("PREFECT_PROFILE", None)
    processes = []
    try:
        server, api = start_prefect_server(home, env)
        processes.append(server)
        env["PREFECT_API_URL"] = api
        deployed = subprocess.run([sys.executable, "-m", "tuneline.flows.cli", "deploy", "--pool", POOL], env=env,
                                  cwd=REPO_ROOT, capture_output=True, text=True, timeout=180)
        assert deployed.returncode == 0, deployed.stdout + deployed.stderr
        processes.append(start_process(prefect_worker_command(POOL), env, home / "worker.log"))
        yield {"env": env, "api": api, "home": home, "deploy_output": deployed.stdout}
    finally:
        for process in reversed(processes):
            stop_process(process)


def run_deployment(prefect: dict, workspace: Path) -> dict:
    """`prefect deployment run` on the demo deployment; the finished flow run, its duration and its log."""
    command = [sys.executable, "-m", "prefect", "deployment", "run", "tuneline-pipeline/demo",
               "-p", f"overrides={json.dumps(SMALL + ['ppo.max_steps=2'])}", "-p", f"workspace={json.dumps(str(workspace))}",
               "--watch", "--watch-interval", "1", "--watch-timeout", "600"]
    result = subprocess.run(command, env=prefect["env"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=660)
    worker_log = (prefect["home"] / "worker.log").read_text()[-4000:]
    run_id = re.search(r"UUID:\s*([0-9a-f-]{36})", result.stdout).group(1)
    flow_run = httpx.get(f"{prefect['api']}/flow_runs/{run_id}", timeout=10).json()
    assert result.returncode == 0 and flow_run["state"]["type"] == "COMPLETED", result.stdout + result.stderr + worker_log
    logs = httpx.post(f"{prefect['api']}/logs/filter", json={"logs": {"flow_run_id": {"any_": [run_id]}}, "limit": 200},
                      timeout=10).json()
    seconds = (datetime.fromisoformat(flow_run["end_time"]) - datetime.fromisoformat(flow_run["start_time"])).total_seconds()
    return {"flow_run": flow_run, "seconds": seconds, "log": "\n".join(entry["message"] for entry in logs)}


def mlflow_client(workspace: Path):
    from mlflow import MlflowClient

    uri = f"sqlite:///{workspace / 'mlflow.db'}"
    return MlflowClient(tracking_uri=uri, registry_uri=uri)


def test_deployed_chain_runs_on_a_worker_and_a_rerun_with_unchanged_data_trains_nothing(prefect, tmp_path):
    workspace = tmp_path / "workspace"
    assert "tuneline-pipeline/demo" in prefect["deploy_output"] and "tuneline-pipeline/retrain" in prefect["deploy_output"]
    deployment = httpx.get(f"{prefect['api']}/deployments/name/tuneline-pipeline/demo", timeout=10).json()
    assert deployment["pull_steps"] == [{"prefect.deployments.steps.set_working_directory": {"directory": str(REPO_ROOT)}}]
    assert deployment["work_pool_name"] == POOL
    retrain = httpx.get(f"{prefect['api']}/deployments/name/tuneline-pipeline/retrain", timeout=10).json()
    assert [(s["schedule"]["cron"], s["active"]) for s in retrain["schedules"]] == [("0 3 * * *", False)]

    first = run_deployment(prefect, workspace)
    client = mlflow_client(workspace)
    versions = client.search_model_versions("name='tuneline-demo'")
    assert [int(v.version) for v in versions] == [1]
    trained = sorted(p.name for p in (workspace / "artifacts" / "trained").iterdir() if not p.name.startswith("."))
    assert len(trained) == 5 and "changed since the last run: computed base" in first["log"]

    second = run_deployment(prefect, workspace)
    print(f"first run {first['seconds']:.1f} s, unchanged rerun {second['seconds']:.1f} s")
    assert NOTHING_CHANGED in second["log"]
    assert sorted(p.name for p in (workspace / "artifacts" / "trained").iterdir() if not p.name.startswith(".")) == trained
    assert [int(v.version) for v in client.search_model_versions("name='tuneline-demo'")] == [1]
    experiment = client.get_experiment_by_name("tuneline-demo")
    runs = client.search_runs([experiment.experiment_id])
    parents = sorted((r for r in runs if "mlflow.parentRunId" not in r.data.tags), key=lambda r: r.info.start_time)
    assert len(parents) == 2 and parents[-1].data.tags["tuneline.outcome"] == NOTHING_CHANGED
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parents[-1].info.run_id]
    assert len(children) >= 16 and {r.data.tags["tuneline.cache_hit"] for r in children} == {"true"}
    assert second["seconds"] < 0.25 * first["seconds"], (first["seconds"], second["seconds"])


def test_deploy_without_a_server_is_refused_with_the_commands_to_start_one(tmp_path):
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect_home")}
    env.pop("PREFECT_API_URL", None)
    result = subprocess.run([sys.executable, "-m", "tuneline.flows.cli", "deploy"], env=env, cwd=REPO_ROOT,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "PREFECT_API_URL is not set" in result.stderr and "--host 127.0.0.1" in result.stderr
    assert "Traceback" not in result.stderr
