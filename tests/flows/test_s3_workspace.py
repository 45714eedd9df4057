"""A pipeline whose workspace is a bucket: `tuneline run --workspace s3://...` against SeaweedFS
(tests/object_store_server.py) and a real `mlflow server` (tests/cluster_services.py).

One LoRA SFT of the tiny base, a checkpoint every step. Run uninterrupted, the bucket holds its
artifacts and the launching folder nothing; run again from an empty cache, while the store is
stopped the command ends with the store's URL named, and once it is back every stage is served from
its manifest alone (one GET each). In a second bucket the same pipeline runs on a work pool of two
process workers; the worker running sft is SIGKILLed with its flow run once the stage has uploaded a
checkpoint, the pipeline finds that flow run dead, and the other worker resumes the stage from the
uploaded checkpoint and ends with the uninterrupted run's weights. Last, the store is stopped while sft
uploads a checkpoint: the run ends naming the store's URL, and once the store is back the same command
finishes.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from conftest import run_cli_here
from object_store_server import RequestCounter
from pipeline_runs import max_difference, stage_rows, weights

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_server")]

REPO_DATA = Path(__file__).resolve().parents[2] / "data"
STEPS = 20  # enough steps after the first uploaded checkpoint for the test to see it and kill the run
STAGES = ["sft/tokenize", "sft"]
POOL = "resume-pool"
# a store that does not answer is given up on after 2 tries 0.2 s apart (core/store/remote.py)
QUICK_STORE_RETRIES = {"TUNELINE_STORE_ATTEMPTS": "2", "TUNELINE_STORE_RETRY_WAIT_S": "0.2"}


def pipeline(tiny_base: Path) -> dict:
    return {
        "name": "s3-workspace",
        "defaults": {"dataset_dir": str(REPO_DATA), "template": "default", "cutoff_len": 64, "seed": 7, "logging_steps": 1},
        "stages": [{"name": "sft", "stage": "sft", "model_name_or_path": str(tiny_base), "finetuning_type": "lora",
                    "lora_rank": 4, "lora_target": "all", "dataset": "demo_alpaca", "max_samples": 16,
                    "per_device_train_batch_size": 2, "max_steps": STEPS, "save_steps": 1}],
    }


@pytest.fixture(scope="module")
def setting(tiny_base: Path, s3_store, mlflow_server, tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("s3_workspace")
    (folder / "pipeline.yaml").write_text(yaml.safe_dump(pipeline(tiny_base)))
    env = {**os.environ, **s3_store.env(), "MLFLOW_TRACKING_URI": mlflow_server.uri, "OMP_NUM_THREADS": "1",
           "TUNELINE_LEASE_TTL_S": "2"}  # a killed run's lease is taken over after 2 s, not 30
    return {"folder": folder, "pipeline": folder / "pipeline.yaml", "env": env, "store": s3_store, "tracking": mlflow_server.uri}


def command(setting: dict, workspace: str) -> list[str]:
    return [sys.executable, "-m", "tuneline.flows.cli", "-v", "run", str(setting["pipeline"]), "--workspace", workspace]


def machine(setting: dict, name: str) -> tuple[Path, dict]:
    """A launching folder and an environment whose cache no other run shares: another machine."""
    here = setting["folder"] / name
    (here / "launch").mkdir(parents=True)
    return here / "launch", {**setting["env"], "TUNELINE_CACHE": str(here / "cache")}


def run(setting: dict, workspace: str, name: str) -> subprocess.CompletedProcess:
    launch, env = machine(setting, name)
    return subprocess.run(command(setting, workspace), cwd=launch, env=env, capture_output=True, text=True, timeout=600)


def objects(setting: dict, bucket: str, fs: object = None) -> dict[str, int]:
    fs = fs or setting["store"].filesystem()
    fs.invalidate_cache()  # a listing as the store has it now
    root = bucket.removeprefix("s3://")
    return {path.removeprefix(f"{root}/"): info["size"] for path, info in fs.find(root, detail=True).items()}


@pytest.fixture(scope="module")
def uninterrupted(setting: dict) -> dict:
    bucket = setting["store"].make_bucket()
    result = run(setting, f"{bucket}/team", "uninterrupted")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return {"bucket": bucket, "workspace": f"{bucket}/team", "output": result.stdout,
            "launch": setting["folder"] / "uninterrupted" / "launch", "cache": setting["folder"] / "uninterrupted" / "cache"}


def test_the_bucket_holds_the_artifacts_and_the_launching_folder_nothing(uninterrupted, setting):
    rows = stage_rows(uninterrupted["output"])
    assert {name: status for name, (status, _) in rows.items()} == dict.fromkeys(STAGES, "computed")
    assert rows["sft"][1].startswith(f"{uninterrupted['workspace']}/artifacts/trained/sft-")
    stored = objects(setting, uninterrupted["bucket"])
    trained = rows["sft"][1].removeprefix(f"{uninterrupted['bucket']}/")
    assert f"{trained}/manifest.json" in stored and f"{trained}/adapter_model.safetensors" in stored
    assert not [path for path in stored if ".partial/" in path]  # the uploaded checkpoints go once it is published
    assert list(uninterrupted["launch"].iterdir()) == []


def test_a_rerun_from_an_empty_cache_reads_only_the_manifests(uninterrupted, setting, monkeypatch, tmp_path):
    from tuneline.core.store.remote import RemoteWorkspace

    for name, value in setting["env"].items():
        monkeypatch.setenv(name, value)
    counters: list[RequestCounter] = []
    opened = RemoteWorkspace.filesystem.fget

    def counted(self):  # every filesystem the run opens, its requests counted as they are sent
        filesystem = opened(self)
        if not any(c.filesystem is filesystem for c in counters):
            counter = RequestCounter(filesystem).__enter__()
            counter.filesystem = filesystem
            counters.append(counter)
        return filesystem

    monkeypatch.setattr(RemoteWorkspace, "filesystem", property(counted))
    result = run_cli_here("run", str(setting["pipeline"]), "--workspace", uninterrupted["workspace"], cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    rows = stage_rows(result.stdout)
    assert {name: status for name, (status, _) in rows.items()} == dict.fromkeys(STAGES, "served from cache")
    requests = [request for counter in counters for request in counter.requests]
    assert [method for method, _ in requests] == ["GET"] * len(STAGES), requests
    assert all(url.endswith("/manifest.json") for _, url in requests), requests
    assert not (tmp_path / "cache" / "artifacts").exists()  # nothing was fetched
    assert {path.name for path in tmp_path.iterdir()} <= {"cache"}  # and nothing written where it ran (the cache's own folder aside)


def uploaded_checkpoints(setting: dict, bucket: str, fs: object = None) -> list[str]:
    return [path for path in objects(setting, bucket, fs) if ".partial/checkpoint-" in path and path.endswith("/checkpoint.json")]


def running_worker(api: str, stage: str) -> str | None:
    """The worker whose flow run of `stage` is running now (its `prefect.worker.name` label)."""
    import httpx

    answer = httpx.post(f"{api}/flow_runs/filter", json={"flow_runs": {"state": {"type": {"any_": ["RUNNING"]}}}}, timeout=10)
    answer.raise_for_status()
    return next((run["labels"].get("prefect.worker.name") for run in answer.json() if run["name"].startswith(f"{stage}-")), None)


def test_a_stage_whose_worker_dies_resumes_on_the_other_worker_from_its_uploaded_checkpoint(uninterrupted, setting, prefect_server,
                                                                                           prefect_workers, monkeypatch, tmp_path):
    from mlflow.tracking import MlflowClient

    # a heartbeat every 2 s: a dead worker's flow run is found dead 6 s after its last one, not 90
    worker_env = {**setting["env"], "PREFECT_WORKER_HEARTBEAT_SECONDS": "2"}
    workers = {name: prefect_workers(POOL, name, env=worker_env) for name in ("machine-a", "machine-b")}
    for name, value in setting["env"].items():
        monkeypatch.setenv(name, value)
    deployed = run_cli_here("deploy", str(setting["pipeline"]), f"work_pool={POOL}", cwd=tmp_path)
    assert deployed.returncode == 0, deployed.stdout + deployed.stderr
    bucket = setting["store"].make_bucket()
    workspace = f"{bucket}/team"
    # the tokenized dataset is there already (served from its manifest): the test pays for the flow runs of sft alone
    tokenized = "artifacts/tokenized"
    setting["store"].filesystem().copy(f"{uninterrupted['workspace']}/{tokenized}", f"{workspace}/{tokenized}", recursive=True)
    killed: dict = {}
    ended = threading.Event()

    def kill_sft_at_its_first_uploaded_checkpoint() -> None:
        watching = setting["store"].filesystem()  # one client, so that each look is one listing request
        while not ended.is_set() and not uploaded_checkpoints(setting, bucket, watching):
            time.sleep(0.05)
        if not ended.is_set() and (name := running_worker(prefect_server, "sft")) in workers:
            workers[name].kill()
            killed.update(worker=name, uploaded=uploaded_checkpoints(setting, bucket))

    killer = threading.Thread(target=kill_sft_at_its_first_uploaded_checkpoint, daemon=True)
    killer.start()
    try:
        result = run_cli_here("run", str(setting["pipeline"]), "--workspace", workspace, f"work_pool={POOL}", cwd=tmp_path)
    finally:
        ended.set()
        killer.join()
    logs = "".join(worker.log.read_text()[-3000:] for worker in workers.values())
    assert killed.get("uploaded"), f"sft ended before its worker could be killed:\n{result.stdout[-3000:]}"
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:] + logs
    assert f"found dead: its worker {killed['worker']} has sent pool {POOL} no heartbeat" in result.stdout, result.stdout[-3000:]
    [survivor] = set(workers) - {killed["worker"]}

    trained = stage_rows(result.stdout)["sft"][1]
    below = trained.split("/artifacts/", 1)[1]
    fetched = workers[survivor].cache / "artifacts" / below
    assert max_difference(weights(fetched), weights(uninterrupted["cache"] / "artifacts" / below)) < 1e-5

    client = MlflowClient(setting["tracking"])
    step = max(int(path.split("checkpoint-")[1].split("/")[0]) for path in killed["uploaded"])
    resumed = client.search_runs(client.get_experiment_by_name("s3-workspace").experiment_id,
                                 "tags.`tuneline.resumed_from_step` != ''")
    assert [run.info.run_name for run in resumed] == ["sft"]
    assert resumed[0].data.tags["tuneline.resumed_from_step"] == str(step)
    assert resumed[0].data.tags["tuneline.worker"] == survivor


def test_the_store_stopped_mid_upload_ends_the_run_naming_its_url_and_the_same_command_then_finishes(uninterrupted, setting,
                                                                                                    monkeypatch, tmp_path):
    """The store (the workspace's, and the tracking server's artifacts') is stopped as sft uploads its
    first checkpoint: the run ends within seconds, the store's URL named, its MLflow run FAILED and
    nothing of it committed; once the store is back, the same command computes sft and publishes it
    whole, and `tuneline verify` finds nothing damaged."""
    from mlflow.tracking import MlflowClient

    from object_store_server import restart_object_store
    from tuneline.core.store.remote import RemoteWorkspace

    store = setting["store"]
    for name, value in setting["env"].items():
        monkeypatch.setenv(name, value)
    bucket = store.make_bucket()
    workspace = f"{bucket}/team"
    tokenized = "artifacts/tokenized"  # served from its manifest: the run computes sft alone
    store.filesystem().copy(f"{uninterrupted['workspace']}/{tokenized}", f"{workspace}/{tokenized}", recursive=True)
    stopped: dict = {}

    def stop_the_store_at_the_first_checkpoint_upload(request, **_):
        path = request.url.split("?", 1)[0]
        if request.method == "PUT" and ".partial/checkpoint-" in path and not stopped:
            stopped.update(at=time.monotonic(), url=path)
            store.stop()

    opened = RemoteWorkspace.filesystem.fget

    def hooked(self):  # every filesystem the run opens sends its requests past the hook
        filesystem = opened(self)
        if not getattr(filesystem, "stops_the_store", False):
            filesystem.connect()
            filesystem.s3.meta.events.register("before-send.s3", stop_the_store_at_the_first_checkpoint_upload)
            filesystem.stops_the_store = True
        return filesystem

    arguments = ("run", str(setting["pipeline"]), "--workspace", workspace, "sft.max_steps=8")
    try:
        with monkeypatch.context() as patched:
            patched.setattr(RemoteWorkspace, "filesystem", property(hooked))
            for name, value in QUICK_STORE_RETRIES.items():  # the run that meets the stopped store alone: the rerun
                patched.setenv(name, value)  # keeps the default retries, which a store just restarted may need
            failed = run_cli_here(*arguments, cwd=tmp_path)
        ended = time.monotonic()
    finally:
        if not store.running():
            restart_object_store(store)
    assert stopped, f"sft uploaded no checkpoint:\n{failed.stdout[-3000:]}{failed.stderr[-3000:]}"
    assert failed.returncode == 2, failed.stdout[-3000:] + failed.stderr[-3000:]
    assert ended - stopped["at"] < 60  # MLflow's own retries would have taken minutes
    errors = [line for line in failed.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in failed.stderr, failed.stderr[-3000:]
    assert errors[0].startswith("error: the object store did not answer: ") and f"{workspace}/artifacts/" in errors[0], errors[0]
    key = stopped["url"].split("/.", 1)[1].split(".partial/", 1)[0]  # sft-<key>
    stored = objects(setting, bucket)
    assert not [path for path in stored if path.endswith(("manifest.json", "checkpoint.json")) and key in path], stored

    client = MlflowClient(setting["tracking"])
    experiment = client.get_experiment_by_name("s3-workspace").experiment_id
    [attempt] = client.search_runs(experiment, f"tags.`tuneline.key` = '{key}'")
    assert attempt.info.status == "FAILED"

    result = run_cli_here(*arguments, cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    trained = stage_rows(result.stdout)["sft"]
    assert trained == ("computed", f"{workspace}/artifacts/trained/{key}")
    stored = objects(setting, bucket)
    assert f"team/artifacts/trained/{key}/manifest.json" in stored
    assert not [path for path in stored if path.endswith(".lease") or ".partial/" in path], stored
    verified = run_cli_here("verify", "--workspace", workspace, cwd=tmp_path)
    assert verified.returncode == 0 and "2 artifact(s) verified, 0 damaged" in verified.stdout, verified.stdout + verified.stderr
