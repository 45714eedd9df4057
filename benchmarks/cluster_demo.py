"""The demo pipeline on a local cluster of two workers, against itself run again and on one machine.

    python benchmarks/cluster_demo.py [--skip-one-machine] [--skip-twice]

Starts on 127.0.0.1 what tests/cluster_services.py starts (the `cluster` extra): SeaweedFS, `mlflow
server` with its artifacts in it, `prefect server start`, and two process workers, worker-a and
worker-b, each in a folder of its own (HOME, TMPDIR, TUNELINE_CACHE, working directory) sharing no
path. Every tuneline command runs from an empty folder of its own, with the store's AWS_* variables
and the tracking server's MLFLOW_TRACKING_URI, and prints what it printed last. Then:

1. `tuneline deploy` and `tuneline demo --work-pool demo --workspace s3://BUCKET/demo`: the worker each
   stage's MLflow run names, how long rm and dpo trained side by side, which artifact kinds the bucket
   holds and what the launching folder holds.
2. The champion answers through `mlflow.pyfunc.load_model("models:/tuneline-demo@champion")` and through
   `tuneline api models:/tuneline-demo@champion`, each from a folder with no workspace, a HOME of its
   own and no object-store credentials.
3. The same demo command again: its time over the first run's (goal <= 0.25) and what the launching
   machine's cache fetched (goal: nothing but manifests, which are read, not kept).
4. Two demos started at once on a new workspace with another seed: how many times each stage was
   computed (goal: once; the other pipeline waits for its lease and is served).
5. The demo on one machine, in its own process, with a local workspace: its champion's key and the
   largest difference of its weights from the cluster's champion.

Every process started is stopped by its process group when the script ends, also on failure.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
# benchmarks/tokenize.py would shadow the standard library's `tokenize`: this folder leaves the
# import path, and the tests' folder (the service starters) joins it.
sys.path[:] = [str(REPO_ROOT / "tests")] + [p for p in sys.path if os.path.abspath(p or ".") != str(REPO_ROOT / "benchmarks")]

from cluster_services import start_mlflow_server, start_prefect_server, start_prefect_worker, start_process, stop_process
from object_store_server import free_port, start_object_store

POOL = "demo"
MODEL = "tuneline-demo"
EXPERIMENT = "tuneline-demo"
TUNELINE = str(Path(sys.executable).with_name("tuneline"))
QUIET = {"HF_HUB_OFFLINE": "1", "DO_NOT_TRACK": "true", "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
         "MLFLOW_DISABLE_TELEMETRY": "true"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--skip-one-machine", action="store_true", help="leave out step 5")
    parser.add_argument("--skip-twice", action="store_true", help="leave out step 4")
    args = parser.parse_args()
    os.environ.update(QUIET)
    with tempfile.TemporaryDirectory(prefix="tuneline-cluster-demo-") as scratch:
        root = Path(scratch)
        stoppers = []
        try:
            cluster = start_cluster(root, stoppers)
            run_checks(root, cluster, skip_one_machine=args.skip_one_machine, skip_twice=args.skip_twice)
        finally:
            for stop in reversed(stoppers):
                stop()


def start_cluster(root: Path, stoppers: list) -> dict[str, str]:
    store = start_object_store(root / "seaweedfs")
    stoppers.append(store.stop)
    (root / "prefect").mkdir()
    server, api = start_prefect_server(root / "prefect", dict(os.environ))
    stoppers.append(lambda: stop_process(server))
    mlflow = start_mlflow_server(root / "mlflow", store=store, bucket=store.make_bucket("mlflow"))
    stoppers.append(mlflow.stop)
    services = {**store.env(), "MLFLOW_TRACKING_URI": mlflow.uri, "PREFECT_API_URL": api}
    for name in ("worker-a", "worker-b"):
        # one thread each: the two workers share this machine's cores when they train side by side
        worker = start_prefect_worker(POOL, folder=root / name, api=api, name=name,
                                      env={**os.environ, **services, "OMP_NUM_THREADS": "1"})
        stoppers.append(worker.kill)
    print(f"cluster: SeaweedFS {store.endpoint_url}, MLflow {mlflow.uri}, Prefect {api}, workers worker-a and worker-b "
          f"of pool {POOL}", flush=True)
    return {**services, "BUCKET": store.make_bucket("demo"), "_filesystem": store}


def run_checks(root: Path, cluster: dict, *, skip_one_machine: bool, skip_twice: bool) -> None:
    store = cluster.pop("_filesystem")
    bucket = cluster.pop("BUCKET")
    launcher = {**os.environ, **cluster, "TUNELINE_CACHE": str(root / "launcher-cache"), "OMP_NUM_THREADS": "1"}
    workspace = f"{bucket}/demo"
    demo = ["demo", "--work-pool", POOL, "--workspace", workspace]

    deployed = tuneline(["deploy", str(REPO_ROOT / "data" / "demo_pipeline.yaml"), f"work_pool={POOL}"], root / "deploy", launcher)
    print(f"$ tuneline deploy data/demo_pipeline.yaml work_pool={POOL}\n{deployed.stdout.strip()}", flush=True)

    first, first_s = timed(lambda: tuneline(demo, root / "launch-1", launcher))
    print(f"\n1. $ tuneline {' '.join(demo)}\n   exit {first.returncode} in {first_s:.0f} s; {tail(first.stdout, 'stage(s) computed')}")
    runs = child_runs(cluster["MLFLOW_TRACKING_URI"], parent_run(first.stdout))
    workers = {name: run.data.tags.get("tuneline.worker") for name, run in runs.items()}
    print(f"   stage -> worker: {json.dumps(workers)}")
    print(f"   workers seen: {sorted(set(workers.values()))}")
    rm, dpo = runs["rm"].info, runs["dpo"].info
    overlap = (min(rm.end_time, dpo.end_time) - max(rm.start_time, dpo.start_time)) / 1000
    print(f"   rm on {workers['rm']} and dpo on {workers['dpo']} trained side by side for {overlap:.1f} s")
    filesystem = store.filesystem()
    kinds = sorted({Path(path).parent.parent.name for path in filesystem.find(workspace) if path.endswith("/manifest.json")})
    print(f"   the bucket holds artifacts of kinds {kinds}")
    print(f"   the launching folder holds {sorted(p.name for p in (root / 'launch-1').rglob('*')) or 'nothing'}")

    print("\n2. the champion, from folders with no workspace and no object-store credentials:")
    print(f"   mlflow.pyfunc: {pyfunc_answer(root / 'third-pyfunc', cluster)}")
    print(f"   tuneline api:  {api_answer(root / 'third-api', cluster)}")

    fetched_before = cached_files(root / "launcher-cache")
    again, again_s = timed(lambda: tuneline(demo, root / "launch-2", launcher))
    fetched = sorted(set(cached_files(root / "launcher-cache")) - set(fetched_before))
    print(f"\n3. the same command again: exit {again.returncode} in {again_s:.1f} s; {tail(again.stdout, 'stage(s) computed')}")
    print(f"   time over the first run's: {again_s / first_s:.3f} (goal <= 0.25)")
    print(f"   files the launching machine fetched for it: {fetched or 'none'}")

    if not skip_twice:
        # another seed: keys no machine's cache holds yet (a worker publishes what its cache holds)
        twice = [*demo[:-1], f"{bucket}/twice", "seed=7"]
        started = [start_tuneline(twice, root / f"twice-{n}", launcher) for n in (1, 2)]
        outputs = [(process.wait(), (root / f"twice-{n}" / "out.log").read_text()) for n, process in enumerate(started, 1)]
        print(f"\n4. two demos at once on {bucket}/twice: exits {[code for code, _ in outputs]}")
        computed: Counter[str] = Counter()
        for _, output in outputs:
            for name, run in child_runs(cluster["MLFLOW_TRACKING_URI"], parent_run(output)).items():
                computed[name] += run.data.tags.get("tuneline.cache_hit") == "false"
        print(f"   times each stage was computed: {dict(sorted(computed.items()))}")
        print(f"   every stage computed once: {set(computed.values()) == {1}}")

    if not skip_one_machine:
        local_workspace = root / "one-machine" / "workspace"
        alone, alone_s = timed(lambda: tuneline(["demo", "--workspace", str(local_workspace)], root / "one-machine",
                                                {**os.environ, "OMP_NUM_THREADS": "1"}))
        print(f"\n5. the demo on one machine: exit {alone.returncode} in {alone_s:.0f} s")
        compare_champions(filesystem, workspace, local_workspace, first.stdout, alone.stdout)


def compare_champions(filesystem, workspace: str, local_workspace: Path, cluster_output: str, local_output: str) -> None:
    import torch
    from safetensors.torch import load_file

    cluster_export, local_export = exported(cluster_output), exported(local_output)
    print(f"   champion on the cluster: {cluster_export}\n   champion on one machine: {local_export}")
    print(f"   same key: {Path(cluster_export).name == Path(local_export).name}")
    with tempfile.TemporaryDirectory() as fetched:
        weights = {}
        for path in filesystem.find(cluster_export):
            if path.endswith(".safetensors"):
                filesystem.get_file(path, f"{fetched}/{Path(path).name}")
                weights.update(load_file(f"{fetched}/{Path(path).name}"))
        local = {}
        for path in Path(local_export).glob("*.safetensors"):
            local.update(load_file(path))
    assert set(weights) == set(local), (sorted(weights), sorted(local))
    difference = max((weights[name].float() - local[name].float()).abs().max().item() for name in weights)
    print(f"   largest weight difference over {len(weights)} tensors: {difference:.3g} ({torch.__version__})")


# -- helpers ----------------------------------------------------------------------------------------

def tuneline(args: list[str], folder: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    folder.mkdir(parents=True, exist_ok=True)
    done = subprocess.run([TUNELINE, *args], cwd=folder, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"tuneline {' '.join(args)} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return done


def start_tuneline(args: list[str], folder: Path, env: dict[str, str]) -> subprocess.Popen:
    folder.mkdir(parents=True, exist_ok=True)
    return start_process([TUNELINE, *args], env, folder / "out.log", cwd=folder)


def timed(run):
    started = time.monotonic()
    result = run()
    return result, time.monotonic() - started


def tail(output: str, marker: str) -> str:
    return next((line.strip() for line in output.splitlines() if marker in line), "")


def parent_run(output: str) -> str:
    found = re.search(r"\(parent run ([0-9a-f]+)\)", output)
    assert found, output[-2000:]
    return found.group(1)


def exported(output: str) -> str:
    found = re.search(r"exported model:\s+(\S+)", output)
    assert found, output[-2000:]
    return found.group(1)


def child_runs(uri: str, parent_run_id: str) -> dict:
    """The pipeline run's stage runs by name (`sft`, `rm/tokenize`, ...)."""
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name(EXPERIMENT)
    found = client.search_runs([experiment.experiment_id], f"tags.mlflow.parentRunId = '{parent_run_id}'", max_results=500)
    return {run.info.run_name: run for run in found if "tuneline.stage" in run.data.tags}


def cached_files(cache: Path) -> list[str]:
    return sorted(str(path.relative_to(cache)) for path in cache.rglob("*") if path.is_file()) if cache.is_dir() else []


def third_machine(folder: Path, cluster: dict[str, str]) -> dict[str, str]:
    """A machine that knows only the tracking server: no store credentials, nothing cached."""
    (folder / "home").mkdir(parents=True, exist_ok=True)
    env = {key: value for key, value in os.environ.items() if not key.startswith("AWS_") and key != "TUNELINE_CACHE"}
    return {**env, "HOME": str(folder / "home"), "MLFLOW_TRACKING_URI": cluster["MLFLOW_TRACKING_URI"]}


QUESTION = "What is the capital of France?"


def pyfunc_answer(folder: Path, cluster: dict[str, str]) -> str:
    script = ("import json, mlflow\n"
              f"model = mlflow.pyfunc.load_model('models:/{MODEL}@champion')\n"
              f"answer = model.predict({{'messages': [{{'role': 'user', 'content': {QUESTION!r}}}], 'max_tokens': 16}})\n"
              "print(json.dumps(answer[0]['choices'][0]['message']['content']))\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=folder, env=third_machine(folder, cluster),
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"mlflow.pyfunc failed:\n{done.stderr[-3000:]}")
    return f"{QUESTION!r} -> {done.stdout.strip().splitlines()[-1]}"


def api_answer(folder: Path, cluster: dict[str, str]) -> str:
    import httpx

    port = free_port()
    server = start_process([TUNELINE, "api", f"models:/{MODEL}@champion", "--port", str(port)], third_machine(folder, cluster),
                           folder / "api.log", cwd=folder)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            assert server.poll() is None, (folder / "api.log").read_text()[-3000:]
            try:
                if httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.5)
        reply = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", timeout=60, json={
            "model": f"{MODEL}@champion", "messages": [{"role": "user", "content": QUESTION}], "max_tokens": 16}).json()
        return f"{QUESTION!r} -> {json.dumps(reply['choices'][0]['message']['content'])} (model {reply['model']})"
    finally:
        stop_process(server)


if __name__ == "__main__":
    main()
