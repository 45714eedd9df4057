"""Two `tuneline run` processes on one workspace at once, on a new PREFECT_HOME and a new MLflow store.

Both succeed; each stage is computed by one of them while the other waits for it and serves it from
cache (tokenization runs once); every artifact's manifest lists exactly the files it holds, no draft
is left behind, the export both reach is registered as one model version, and MLflow's and Prefect's
new databases are owner-only under umask 022. A third run with nothing changed trains nothing and says so.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tuneline.flows.report import NOTHING_CHANGED

pytestmark = pytest.mark.slow

REPO_ROOT = Path(__file__).resolve().parents[2]
PIPELINE = {
    "name": "tuneline-concurrency",
    "defaults": {"dataset_dir": str(REPO_ROOT / "data"), "template": "default", "cutoff_len": 64, "seed": 42, "logging_steps": 1},
    "stages": [
        {"name": "base", "stage": "build_base", "corpus": "demo_pretrain,demo_alpaca", "vocab_size": 512, "hidden_size": 32,
         "intermediate_size": 64, "num_hidden_layers": 2},
        {"name": "sft", "stage": "sft", "from": "base", "finetuning_type": "lora", "lora_rank": 4, "lora_target": "all",
         "dataset": "demo_alpaca", "max_samples": 16, "per_device_train_batch_size": 4, "max_steps": 2},
    ],
    "export": {"stage": "sft"},
    "register": {"model_name": "tuneline-concurrency"},
}
STAGES = ("base", "sft/tokenize", "sft", "sft/merge", "sft/export")


def stage_status(stdout: str) -> dict[str, str]:
    return dict(re.findall(r"^  (\S+)\s+(computed|served from cache)\s", stdout, flags=re.M))


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("concurrency")
    (root / "pipeline.yaml").write_text(yaml.safe_dump(PIPELINE, sort_keys=False))
    env = {**os.environ, "PREFECT_HOME": str(root / "prefect_home"), "OMP_NUM_THREADS": "1"}
    for name in ("PREFECT_API_URL", "PREFECT_PROFILE", "MLFLOW_TRACKING_URI"):
        env.pop(name, None)
    command = [sys.executable, "-m", "tuneline.flows.cli", "run", str(root / "pipeline.yaml"), "--workspace", str(root / "ws")]
    return {"root": root, "env": env, "command": command}


def test_two_runs_at_once_compute_each_stage_once_and_leave_whole_artifacts(setup):
    workspace = setup["root"] / "ws"
    runs = [subprocess.Popen(setup["command"], env=setup["env"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             umask=0o022) for _ in range(2)]
    outputs = [run.communicate(timeout=420) for run in runs]
    for run, (stdout, stderr) in zip(runs, outputs):
        assert run.returncode == 0, stdout[-3000:] + stderr[-3000:]
        assert "Application startup failed" not in stderr  # the temporary Prefect servers started one at a time
    statuses = [stage_status(stdout) for stdout, _ in outputs]
    print(*(stdout for stdout, _ in outputs), sep="\n")
    for name in STAGES:
        assert sorted(status[name] for status in statuses) == ["computed", "served from cache"], (name, statuses)
    assert any("another run is computing" in stdout for stdout, _ in outputs)

    for database in (workspace / "mlflow.db", setup["root"] / "prefect_home" / "prefect.db"):
        assert database.stat().st_mode & 0o777 == 0o600, database  # owner-only, though the umask lets others read
    artifacts = workspace / "artifacts"
    assert len([p for p in (artifacts / "tokenized").iterdir() if not p.name.startswith(".")]) == 1
    assert not list(artifacts.glob("*/.*.partial"))
    for manifest_file in artifacts.glob("*/*/manifest.json"):
        folder = manifest_file.parent
        manifest = json.loads(manifest_file.read_text())
        on_disk = {p.relative_to(folder).as_posix(): p.stat().st_size for p in folder.rglob("*")
                   if p.is_file() and p.name != "manifest.json"}
        assert {name: record["size"] for name, record in manifest["files"].items()} == on_disk, folder
        assert manifest["key"] == folder.name
    export, = (artifacts / "export").glob("export-*")  # its Ollama Modelfile is part of the artifact
    assert "Modelfile" in json.loads((export / "manifest.json").read_text())["files"]
    assert 'PARAMETER stop "</s>"' in (export / "Modelfile").read_text(encoding="utf-8")

    from mlflow import MlflowClient

    uri = f"sqlite:///{workspace / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    runs = client.search_runs([client.get_experiment_by_name("tuneline-concurrency").experiment_id])
    tokenize_runs = [r for r in runs if r.info.run_name == "sft/tokenize"]
    assert sorted(r.data.tags["tuneline.cache_hit"] for r in tokenize_runs) == ["false", "true"]
    assert {r.info.status for r in runs} == {"FINISHED"} and len(runs) == 2 * (2 + len(STAGES))  # parent, stages, register
    versions = client.search_model_versions("name='tuneline-concurrency'")
    assert [str(v.version) for v in versions] == ["1"]  # the export both runs reached is registered once


def test_a_third_run_with_nothing_changed_trains_nothing_and_says_so(setup, prefect_server):
    if not (setup["root"] / "ws" / "artifacts").is_dir():  # run alone: make the run it repeats first
        subprocess.run(setup["command"], env=setup["env"], capture_output=True, text=True, timeout=300, check=True)
    # on the session's Prefect server: this run is about the cache, not the temporary servers' start
    result = subprocess.run(setup["command"], env={**setup["env"], "PREFECT_API_URL": prefect_server}, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert set(stage_status(result.stdout).values()) == {"served from cache"}
    assert NOTHING_CHANGED in result.stdout
