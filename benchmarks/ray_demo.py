"""The demo pipeline with `task_runner: ray` on a two-node Ray cluster on this machine.

    python benchmarks/ray_demo.py

Starts two Ray nodes of one CPU each on 127.0.0.1 as the tests do (tests/ray_cluster.py; the `ray`
extra), runs `tuneline demo --workspace workspace task_runner=ray` from an empty folder with
RAY_ADDRESS naming the head, and prints: its exit and summary lines, the Ray node id each stage's
MLflow run names (`tuneline.worker`), how long rm and dpo ran side by side, and the champion's answer
through `mlflow.pyfunc`. The nodes are stopped by their process groups at the end, also on failure.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
# benchmarks/tokenize.py would shadow the standard library's `tokenize`: this folder leaves the
# import path, and the tests' folder (the Ray node commands) joins it.
sys.path[:] = [str(REPO_ROOT / "tests")] + [p for p in sys.path if os.path.abspath(p or ".") != str(REPO_ROOT / "benchmarks")]

from cluster_services import free_port
from ray_cluster import node_command, stop_nodes, wait_for_nodes


def main() -> None:
    # a token a local Ray left in ~/.ray would otherwise turn on authentication for these nodes
    os.environ.update({"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0", "HF_HUB_OFFLINE": "1", "DO_NOT_TRACK": "true",
                       "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "MLFLOW_DISABLE_TELEMETRY": "true"})
    root = Path(tempfile.mkdtemp(prefix="raydemo"))
    temp = Path(tempfile.mkdtemp(prefix="tlr"))
    head_port = free_port()
    env = {**os.environ, "RAY_ADDRESS": ""}
    log = open(root / "nodes.log", "w")
    nodes = []
    try:
        for head in (True, False):
            nodes.append(subprocess.Popen(node_command(head_port=head_port, head=head, temp_dir=temp), env=env, stdout=log,
                                          stderr=subprocess.STDOUT, start_new_session=True))
            if head:
                wait_for_nodes(f"127.0.0.1:{head_port}", 1, nodes=nodes)
        wait_for_nodes(f"127.0.0.1:{head_port}", 2, nodes=nodes)
        address = f"127.0.0.1:{head_port}"
        launch = root / "launch"
        launch.mkdir()
        command = [str(Path(sys.executable).with_name("tuneline")), "demo", "--workspace", "workspace", "task_runner=ray"]
        print(f"$ RAY_ADDRESS={address} tuneline {' '.join(command[1:])}", flush=True)
        started = time.monotonic()
        done = subprocess.run(command, cwd=launch, env={**os.environ, "RAY_ADDRESS": address}, capture_output=True, text=True)
        print(f"exit {done.returncode} in {time.monotonic() - started:.0f} s")
        for line in done.stdout.splitlines():
            if re.search(r"stage\(s\) computed|registered model|^  answer_f1|^MLflow", line):
                print("  " + line.strip())
        if done.returncode:
            print(done.stdout[-3000:], done.stderr[-3000:])
            raise SystemExit(1)
        from mlflow import MlflowClient
        uri = f"sqlite:///{launch / 'workspace' / 'mlflow.db'}"
        client = MlflowClient(uri)
        experiment = client.get_experiment_by_name("tuneline-demo")
        runs = {r.info.run_name: r for r in client.search_runs([experiment.experiment_id], "tags.`tuneline.stage` LIKE '%'")}
        probe = ("import ray, sys; ray.init(address=sys.argv[1], logging_level='ERROR'); "
                 "print(' '.join(n['NodeID'] for n in ray.nodes() if n['Alive']))")
        ids = subprocess.run([sys.executable, "-c", probe, address], capture_output=True, text=True).stdout.split()
        by_stage = {name: run.data.tags.get("tuneline.worker", "")[:8] for name, run in runs.items()}
        print(f"  cluster node ids: {[i[:8] for i in ids]}")
        print(f"  stage -> tuneline.worker: {json.dumps(by_stage)}")
        print(f"  node ids among the tags: {sorted({t[:8] for t in by_stage.values()} & {i[:8] for i in ids})}")
        rm, dpo = runs["rm"].info, runs["dpo"].info
        print(f"  rm and dpo overlap: {(min(rm.end_time, dpo.end_time) - max(rm.start_time, dpo.start_time)) / 1000:.1f} s")
        answer = subprocess.run([sys.executable, "-c", "import mlflow, sys; mlflow.set_tracking_uri(sys.argv[1]); "
                                 "m = mlflow.pyfunc.load_model('models:/tuneline-demo@champion'); "
                                 "messages = [{'role': 'user', 'content': 'What is the capital of France?'}]; "
                                 "print(m.predict({'messages': messages, 'max_tokens': 16})[0]['choices'][0]['message']['content'])",
                                 uri],
                                cwd=launch, capture_output=True, text=True, env={**os.environ, "HOME": str(root)})
        said = answer.stdout.strip().splitlines()[-1] if answer.stdout.strip() else answer.stderr[-500:]
        print(f"  champion (mlflow.pyfunc): 'What is the capital of France?' -> {said!r}")
    finally:
        stop_nodes(nodes)
        log.close()
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(temp, ignore_errors=True)


if __name__ == "__main__":
    main()
