"""A pipeline with `task_runner: ray` runs its stages as Ray tasks on a real two-node local Ray cluster
(`ray_cluster`): the fork pipeline of test_parallel_stages (a tiny base, sft, then rm and dpo from sft,
two steps each) places its stages on both nodes, each stage's MLflow run names the node, and rm and
dpo train at the same time; what the cluster cannot run is refused before anything is written."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from conftest import assert_refused, run_cli_here
from test_parallel_stages import overlap_seconds, stage_runs, write_fork

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_server")]


def cluster_node_ids(address: str) -> set[str]:
    import ray

    ray.init(address=address, logging_level="ERROR", log_to_driver=False)
    try:
        return {node["NodeID"] for node in ray.nodes() if node["Alive"]}
    finally:
        ray.shutdown()


def test_stages_run_as_ray_tasks_on_both_nodes_and_the_fork_at_once(ray_cluster, tmp_path: Path, monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", ray_cluster.address)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    workspace = tmp_path / "workspace"
    done = run_cli_here("run", str(write_fork(tmp_path / "fork.yaml")), "--workspace", str(workspace), "task_runner=ray",
                        cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    runs = stage_runs(f"sqlite:///{workspace / 'mlflow.db'}")
    assert {"base", "sft", "sft/merge", "rm", "dpo"} <= set(runs)
    ran_on = {name: run.data.tags["tuneline.worker"] for name, run in runs.items()}
    print(f"stages by Ray node: {ran_on}")
    assert set(ran_on.values()) == cluster_node_ids(ray_cluster.address)  # both nodes, named by their Ray ids
    overlap = overlap_seconds(runs["rm"], runs["dpo"])
    print(f"rm and dpo trained on nodes {ran_on['rm'][:8]} and {ran_on['dpo'][:8]} side by side for {overlap:.1f} s")
    assert overlap > 0
    stored = {path.parent.parent.name for path in (workspace / "artifacts").rglob("manifest.json")}
    assert {"base", "tokenized", "trained", "merged", "datasets"} <= stored


def refused(tmp_path: Path, *overrides: str) -> object:
    result = run_cli_here("run", str(write_fork(tmp_path / "fork.yaml")), "--workspace", str(tmp_path / "workspace"),
                          "task_runner=ray", *overrides, cwd=tmp_path)
    assert not (tmp_path / "workspace").exists()
    return result


def test_more_cpus_or_gpus_than_a_node_has_are_named(ray_cluster, tmp_path: Path, monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", ray_cluster.address)
    result = refused(tmp_path, "rm.resources={CPU: 2}", "dpo.resources={GPU: 1}")
    assert_refused(result, "stage 'rm': 'resources: {'CPU': 2.0}' asks for 2 CPU (the largest node has 1)",
                   "stage 'dpo': 'resources: {'GPU': 1.0}' asks for 1 GPU (the largest node has 0)",
                   f"the Ray cluster at {ray_cluster.address} (2 node(s))")


def test_no_cluster_at_ray_address_and_no_ray_installed_are_named(tmp_path: Path, monkeypatch):
    from cluster_services import free_port

    address = f"127.0.0.1:{free_port()}"
    monkeypatch.setenv("RAY_ADDRESS", address)
    assert_refused(refused(tmp_path), "'task_runner: ray'", f"no Ray cluster answers at RAY_ADDRESS={address}")
    monkeypatch.setitem(sys.modules, "ray", None)  # what Python makes of an import of a package that is not installed
    assert_refused(refused(tmp_path), "'task_runner: ray'", "Ray is not installed", "pip install 'tuneline[ray]'")
