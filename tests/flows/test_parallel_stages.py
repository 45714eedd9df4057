"""Stages that do not depend on each other run at the same time: in the pipeline's process (with
`parallel_training=2`), and as flow runs on two process workers of one work pool.

The pipeline is the smallest with a fork: a tiny base model, sft (LoRA), then rm and dpo (`ref_model:
sft`), both from sft's merged model, two steps each. Real Prefect server and workers, real MLflow,
real training.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import yaml

from conftest import run_cli_here
from pipeline_runs import stage_rows

REPO = Path(__file__).resolve().parents[2]
POOL = "fork-pool"
SMALL = {"dataset_dir": str(REPO / "data"), "template": "default", "cutoff_len": 48, "max_samples": 16, "seed": 42,
         "per_device_train_batch_size": 4, "max_steps": 2, "logging_steps": 1, "learning_rate": 1.0e-3,
         "finetuning_type": "lora", "lora_rank": 4, "lora_target": "all"}
FORK = {
    "name": "fork",
    "defaults": SMALL,
    "stages": [
        {"name": "base", "stage": "build_base", "corpus": "demo_pretrain,demo_alpaca", "vocab_size": 512, "hidden_size": 32,
         "intermediate_size": 64, "num_hidden_layers": 2},
        {"name": "sft", "stage": "sft", "from": "base", "dataset": "demo_alpaca"},
        {"name": "rm", "stage": "rm", "from": "sft", "dataset": "demo_preference"},
        {"name": "dpo", "stage": "dpo", "from": "sft", "ref_model": "sft", "dataset": "demo_preference"},
    ],
}
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_server")]


def write_fork(path: Path) -> Path:
    path.write_text(yaml.safe_dump(FORK, sort_keys=False))
    return path


def stage_runs(tracking_uri: str) -> dict[str, object]:
    """The pipeline's child runs by name (`sft`, `rm/tokenize`, ...), each stage's latest."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri)
    experiment = client.get_experiment_by_name(FORK["name"])
    runs = client.search_runs([experiment.experiment_id], "tags.`tuneline.stage` LIKE '%'", order_by=["attributes.start_time ASC"])
    return {run.info.run_name: run for run in runs}


def overlap_seconds(first, second) -> float:
    """How long two runs were both running (negative: the gap between them)."""
    return (min(first.info.end_time, second.info.end_time) - max(first.info.start_time, second.info.start_time)) / 1000


def test_independent_stages_train_at_the_same_time_in_process_and_a_stored_one_waits_for_none(tmp_path: Path):
    workspace = tmp_path / "workspace"
    done = run_cli_here("run", str(write_fork(tmp_path / "fork.yaml")), "--workspace", str(workspace), "parallel_training=2",
                        cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    runs = stage_runs(f"sqlite:///{workspace / 'mlflow.db'}")
    assert {"base", "sft", "sft/merge", "rm", "dpo"} <= set(runs)
    overlap = overlap_seconds(runs["rm"], runs["dpo"])
    print(f"rm and dpo trained side by side for {overlap:.1f} s")
    assert overlap > 0
    assert runs["sft"].info.end_time <= min(runs["rm"].info.start_time, runs["dpo"].info.start_time)

    # a rerun with one training slot where dpo changed and rm did not, with rm's tokenized data deleted:
    # dpo takes the slot while rm tokenizes again (same key, so rm's training is still stored), and rm's
    # cache hit, which takes no slot, is served while dpo trains instead of after it
    shutil.rmtree(stage_rows(done.stdout)["rm/tokenize"][1])
    again = run_cli_here("run", str(tmp_path / "fork.yaml"), "--workspace", str(workspace), "dpo.learning_rate=2.0e-3",
                         cwd=tmp_path)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    ended = [line.split(":")[0] for line in again.stdout.splitlines() if line.startswith(("rm: ", "dpo: "))]
    assert ended == ["rm", "dpo"], again.stdout[-3000:]
    rows = stage_rows(again.stdout)
    assert [rows[name][0] for name in ("rm/tokenize", "rm", "dpo")] == ["computed", "served from cache", "computed"]


def test_stages_on_a_work_pool_run_on_both_workers_and_the_fork_at_once(tmp_path: Path, prefect_workers, mlflow_server,
                                                                       s3_store, monkeypatch):
    """Two workers that share no path; the workspace is a bucket and the runs go to a tracking server."""
    services = {**s3_store.env(), "MLFLOW_TRACKING_URI": mlflow_server.uri}
    workers = [prefect_workers(POOL, name, env={**os.environ, **services, "OMP_NUM_THREADS": "1"})
               for name in ("worker-a", "worker-b")]
    chain = write_fork(tmp_path / "fork.yaml")
    deployed = run_cli_here("deploy", str(chain), f"work_pool={POOL}", cwd=tmp_path)
    assert deployed.returncode == 0, deployed.stdout + deployed.stderr
    assert f"tuneline-stage/{POOL}" in deployed.stdout
    for name, value in services.items():
        monkeypatch.setenv(name, value)
    workspace = f"{s3_store.make_bucket('fork')}/workspace"
    launch_dir = tmp_path / "launch"
    launch_dir.mkdir()
    done = run_cli_here("run", str(chain), "--workspace", workspace, f"work_pool={POOL}", cwd=launch_dir)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:] + "".join(w.log.read_text()[-3000:] for w in workers)
    runs = stage_runs(mlflow_server.uri)
    assert {"base", "sft", "sft/merge", "rm", "dpo"} <= set(runs)
    ran_on = {name: run.data.tags["tuneline.worker"] for name, run in runs.items()}
    print(f"stages by worker: {ran_on}")
    assert set(ran_on.values()) == {"worker-a", "worker-b"}
    overlap = overlap_seconds(runs["rm"], runs["dpo"])
    print(f"rm and dpo trained on {ran_on['rm']} and {ran_on['dpo']} side by side for {overlap:.1f} s")
    assert overlap > 0
    stored = {Path(path).parent.parent.name for path in s3_store.filesystem().find(workspace) if path.endswith("/manifest.json")}
    assert {"base", "tokenized", "trained", "merged"} <= stored
    assert not list(launch_dir.rglob("manifest.json"))  # the launching machine keeps no artifact
