"""tuneline on a real two-node Ray cluster (`ray_cluster`, started once for the module).

Training on Ray: LLaMA-Factory's own example YAMLs with `ray_num_workers: 2` end where one process with
gradient accumulation 2 ends, the sft run although one of its workers is killed after a checkpoint
and the gang restarts from it; what Ray cannot run is refused first. The Ray runs are `tuneline train`
commands with RAY_ADDRESS naming the cluster; the one-process runs go through the command's `main` in
this process (`train_here`), the worker's run without its start.

Stages on Ray: a pipeline with `task_runner: ray` runs the fork pipeline of test_parallel_stages (a tiny
base, sft, then rm and dpo from sft, two steps each) as Ray tasks on both nodes, each stage's MLflow run
naming the node, rm and dpo at the same time; what the cluster cannot run is refused before anything is
written."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import assert_refused, run_cli_here, train_in_this_process
from test_parallel_stages import overlap_seconds, stage_runs, write_fork
from tuneline.core.config import read_stage_config
from tuneline.core.config.ray import RayConfig, ray_problems
from tuneline.core.training.checkpoints import RECORD_FILE

STEPS = 16  # sft: 2 rows a step (1 per worker), a checkpoint every 4 steps
DPO_STEPS = 4


def example(shared_dir: Path, name: str) -> Path:
    return shared_dir / "llamafactory" / "examples" / "train_lora" / name


def small(tiny_base: Path, shared_dir: Path, *, accumulation: int, **keys) -> list[str]:
    """Overrides that make an 8B example small: the tiny model and its template, 16 rows of 64 tokens, no
    bf16 on the CPU, a learning rate that moves the tiny LoRA weights, every step logged; `keys` on top."""
    values = {"model_name_or_path": tiny_base, "template": "chatml", "dataset_dir": shared_dir / "llamafactory" / "data",
              "cutoff_len": 64, "max_samples": 16, "preprocessing_num_workers": 1, "dataloader_num_workers": 0,
              "bf16": False, "learning_rate": 5e-3, "logging_steps": 1, "lora_rank": 4, "seed": 7,
              "gradient_accumulation_steps": accumulation, **keys}
    return [f"{key}={value}" for key, value in values.items()]


def ray_train(config: Path, overrides: list[str], *, cwd: Path, address: str, **env: str) -> subprocess.Popen:
    """`USE_RAY=1 tuneline train CONFIG ...` against the cluster at `address`, output captured (each run
    names a ray_storage_path in the test's folder: Ray's default is ~/ray_results)."""
    env = {**os.environ, "RAY_ADDRESS": address, "USE_RAY": "1", "OMP_NUM_THREADS": "1", "RAY_DEDUP_LOGS": "0",
           "TUNELINE_CACHE": str(cwd / "cache"), **env}
    return subprocess.Popen([sys.executable, "-m", "tuneline.flows.cli", "train", str(config), *overrides], cwd=cwd,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)


def finished(process: subprocess.Popen) -> str:
    output, _ = process.communicate(timeout=300)
    assert process.returncode == 0, output[-5000:]
    return output


def train_here(config: Path, overrides: list[str], *, cwd: Path) -> subprocess.CompletedProcess:
    with pytest.MonkeyPatch.context() as patch:
        train_in_this_process(patch)
        result = run_cli_here("train", str(config), *overrides, cwd=cwd)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


def adapter(folder: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(folder / "adapter_model.safetensors")


def max_difference(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max((a[k] - b[k]).abs().max().item() for k in a)


def logged_steps(folder: Path) -> list[int]:
    log = folder / "trainer_log.jsonl"
    lines = log.read_text().splitlines() if log.is_file() else []
    return [json.loads(line)["current_steps"] for line in lines if line.endswith("}")]


def worker_nodes(output: str) -> set[str]:
    return {line.rsplit(" on node ", 1)[1].split()[0] for line in output.splitlines() if "Ray Train worker " in line}


def ray_train_workers(ray_cluster) -> list:
    """The Ray Train worker processes of this cluster's nodes (not of any other Ray on the machine)."""
    import psutil

    nodes = {node.pid for node in ray_cluster.nodes}
    found = []
    for process in psutil.process_iter(["cmdline"]):
        try:
            if (process.info["cmdline"] or [""])[0].startswith("ray::RayTrainWorker") and \
                    any(parent.pid in nodes for parent in process.parents()):
                found.append(process)
        except psutil.Error:  # it ended while being looked at
            continue
    return found


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("ray_runs")


@pytest.fixture(scope="module")
def sft_on_ray(ray_cluster, runs: Path, tiny_base: Path, shared_dir: Path) -> dict:
    """LLaMA-Factory's LoRA SFT example on 2 Ray workers, its results and final folder kept in
    ray_storage_path; one of its workers is killed once checkpoint-4 is saved and a later step logged,
    so the run restarts its gang from that checkpoint (one run shows both: it must still end where one
    process ends)."""
    folder = runs / "sft_ray"
    overrides = small(tiny_base, shared_dir, accumulation=1, output_dir=folder.name, max_steps=STEPS, save_steps=4,
                      ray_num_workers=2, resources_per_worker='{"CPU": 1}', ray_storage_path=runs / "ray_results",
                      ray_run_name="sft_run")
    process = ray_train(example(shared_dir, "llama3_lora_sft.yaml"), overrides, cwd=runs, address=ray_cluster.address)
    try:
        deadline = time.monotonic() + 240
        while process.poll() is None and time.monotonic() < deadline:
            if (folder / "checkpoint-4" / RECORD_FILE).exists() and max(logged_steps(folder), default=0) > 4:
                break
            time.sleep(0.005)
        victims = ray_train_workers(ray_cluster)
        assert len(victims) == 2 and process.poll() is None, "the run ended before a worker could be killed"
        logged_at_kill = logged_steps(folder)
        victims[-1].send_signal(signal.SIGKILL)
        output = finished(process)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    return {"folder": folder, "output": output, "logged_at_kill": logged_at_kill}


@pytest.mark.slow
def test_sft_on_two_ray_workers_ends_where_one_process_with_accumulation_ends(sft_on_ray, runs: Path, tiny_base: Path,
                                                                             shared_dir: Path, one_torch_thread):
    ray_folder, output = sft_on_ray["folder"], sft_on_ray["output"]
    one = train_here(example(shared_dir, "llama3_lora_sft.yaml"),
                     small(tiny_base, shared_dir, accumulation=2, output_dir="sft_one", max_steps=STEPS, save_steps=4),
                     cwd=runs)
    assert "global batch size 2 = 1 per device x 2 worker(s) x 1 accumulation step(s)" in output
    assert "global batch size 2 = 1 per device x 1 process(es) x 2 accumulation step(s)" in one.stdout
    assert len(worker_nodes(output)) == 2, output[-3000:]  # one worker on each node
    assert json.loads((ray_folder / "all_results.json").read_text())["global_batch_size"] == 2
    assert json.loads((ray_folder / "job.json").read_text())["world_size"] == 2
    assert logged_steps(ray_folder) == logged_steps(runs / "sft_one") == list(range(1, STEPS + 1))  # rank 0's log alone
    difference = max_difference(adapter(ray_folder), adapter(runs / "sft_one"))
    print(f"sft, 2 Ray workers vs 1 process x accumulation 2: max abs weight difference {difference}")
    assert difference <= 1e-5
    assert any(t.abs().sum() > 0 for k, t in adapter(ray_folder).items() if "lora_B" in k)  # B starts at zero: it trained
    kept = list((runs / "ray_results" / "sft_run").glob("checkpoint_*/adapter_model.safetensors"))
    assert len(kept) == 1 and max_difference(adapter(kept[0].parent), adapter(ray_folder)) == 0


@pytest.mark.slow
def test_dpo_on_two_ray_workers_ends_where_one_process_with_accumulation_ends(ray_cluster, s3_store, runs: Path, tiny_base: Path,
                                                                             shared_dir: Path, one_torch_thread):
    """Its Ray results kept in an S3 bucket (ray_storage_path: s3://..., the store of AWS_ENDPOINT_URL)."""
    config, bucket = example(shared_dir, "llama3_lora_dpo.yaml"), s3_store.make_bucket()
    output = finished(ray_train(config, small(tiny_base, shared_dir, accumulation=1, output_dir="dpo_ray", max_steps=DPO_STEPS,
                                              ray_num_workers=2, resources_per_worker='{"CPU": 1}',
                                              ray_storage_path=f"{bucket}/results", ray_run_name="dpo_run"),
                                cwd=runs, address=ray_cluster.address, **s3_store.env()))
    train_here(config, small(tiny_base, shared_dir, accumulation=2, output_dir="dpo_one", max_steps=DPO_STEPS), cwd=runs)
    assert len(worker_nodes(output)) == 2, output[-3000:]
    assert logged_steps(runs / "dpo_ray") == logged_steps(runs / "dpo_one") == list(range(1, DPO_STEPS + 1))
    difference = max_difference(adapter(runs / "dpo_ray"), adapter(runs / "dpo_one"))
    print(f"dpo, 2 Ray workers vs 1 process x accumulation 2: max abs weight difference {difference}")
    assert difference <= 1e-5
    assert any(t.abs().sum() > 0 for k, t in adapter(runs / "dpo_ray").items() if "lora_B" in k)
    kept = s3_store.filesystem().glob(f"{bucket}/results/dpo_run/checkpoint_*/adapter_model.safetensors")
    assert len(kept) == 1
    assert s3_store.filesystem().cat_file(kept[0]) == (runs / "dpo_ray" / "adapter_model.safetensors").read_bytes()


@pytest.mark.slow
def test_a_killed_ray_worker_restarts_the_gang_from_its_checkpoint(sft_on_ray):
    """The sft run's worker killed after step 4's checkpoint: the gang restarts from it and logs each step
    once; that it still ends at the weights of one process is the test above."""
    output, logged_at_kill = sft_on_ray["output"], sft_on_ray["logged_at_kill"]
    assert 4 < max(logged_at_kill) < STEPS
    assert "resuming from" in output and "checkpoint-" in output, output[-3000:]
    assert logged_steps(sft_on_ray["folder"]) == list(range(1, STEPS + 1))  # each step once, though steps after the checkpoint ran twice
    print(f"a Ray worker killed after step {max(logged_at_kill)}; the gang resumed from its checkpoint")


# -- what Ray cannot run, refused before anything is written ---------------------------------------

def refused_here(small_sft, *overrides: str, **env: str) -> subprocess.CompletedProcess:
    with pytest.MonkeyPatch.context() as patch:
        for name, value in env.items():
            patch.setenv(name, value)
        result = run_cli_here("train", str(small_sft.config), "output_dir=refused", *overrides, cwd=small_sft.config.parent)
    assert not (small_sft.config.parent / "refused").exists()
    return result


def test_without_ray_installed_the_extra_to_install_is_named(two_row_stage):
    config = two_row_stage(output_dir="refused", ray_num_workers=2)
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(sys.modules, "ray", None)  # what Python makes of an import of a package that is not installed
        result = run_cli_here("train", str(config), cwd=config.parent)
    assert_refused(result, "'ray_num_workers: 2'", "pip install 'tuneline[ray]'")
    assert not (config.parent / "refused").exists()


@pytest.mark.slow
def test_no_cluster_at_ray_address_is_named(small_sft):
    from cluster_services import free_port

    address = f"127.0.0.1:{free_port()}"
    assert_refused(refused_here(small_sft, "ray_num_workers=2", RAY_ADDRESS=address), f"no Ray cluster answers at RAY_ADDRESS={address}")


@pytest.mark.slow
@pytest.mark.parametrize(("overrides", "missing"), [
    (("ray_num_workers=3",), "needs 3 CPU in all, and the Ray cluster at {address} has 2 CPU"),
    (("ray_num_workers=2", 'resources_per_worker={"GPU": 1}'), "needs 2 GPU in all, and the Ray cluster at {address} has 0 GPU"),
    (("ray_num_workers=3", "placement_strategy=STRICT_SPREAD", 'resources_per_worker={"CPU": 0.5}'),
     "with 'placement_strategy: STRICT_SPREAD' needs 3 nodes that each hold one worker, and the Ray cluster at {address} has 2"),
])
def test_more_workers_or_gpus_than_the_cluster_has_are_named(ray_cluster, small_sft, overrides, missing):
    result = refused_here(small_sft, *overrides, RAY_ADDRESS=ray_cluster.address)
    assert_refused(result, "'resources_per_worker:", missing.format(address=ray_cluster.address))


@pytest.mark.slow
def test_a_ray_storage_path_that_cannot_be_written_or_reached_is_named(small_sft, tmp_path):
    from cluster_services import free_port

    a_file = tmp_path / "a_file"
    a_file.write_text("")
    assert_refused(refused_here(small_sft, "ray_num_workers=2", f"ray_storage_path={a_file}/results"),
                   f"'ray_storage_path: {a_file}/results' cannot be written")
    endpoint = f"http://127.0.0.1:{free_port()}"
    result = refused_here(small_sft, "ray_num_workers=2", "ray_storage_path=s3://nobody/results", AWS_ENDPOINT_URL=endpoint,
                          AWS_ACCESS_KEY_ID="x", AWS_SECRET_ACCESS_KEY="x")
    assert_refused(result, "'ray_storage_path: s3://nobody/results' cannot be reached", f"AWS_ENDPOINT_URL={endpoint}")


def test_the_ray_keys_are_read_and_checked_not_refused():
    config, problems = read_stage_config({"ray_num_workers": 4, "ray_run_name": "r", "ray_storage_path": "./saves",
                                          "placement_strategy": "SPREAD", "resources_per_worker": {"GPU": 1},
                                          "ray_init_kwargs": '{"namespace": "tuning"}', "ray_max_failures": 2})
    assert problems == [] and config.ray.ray_num_workers == 4 and config.ray.resources_per_worker == {"GPU": 1}
    assert ray_problems(RayConfig(placement_strategy="EVERYWHERE", resources_per_worker="{GPU: 1}", ray_num_workers=0)) == [
        "'ray_num_workers' must be 1 or more, got 0.",
        "'placement_strategy: EVERYWHERE' is not one of Ray's strategies; choose one of PACK, SPREAD, STRICT_PACK, STRICT_SPREAD.",
        "'resources_per_worker: {GPU: 1}' is neither a mapping nor its JSON (Expecting property name enclosed in double "
        "quotes: line 1 column 2 (char 1)); write it as, for example, resources_per_worker: {CPU: 1}.",
    ]


# -- a pipeline's stages as Ray tasks --------------------------------------------------------------


def cluster_node_ids(address: str) -> set[str]:
    import ray

    ray.init(address=address, logging_level="ERROR", log_to_driver=False)
    try:
        return {node["NodeID"] for node in ray.nodes() if node["Alive"]}
    finally:
        ray.shutdown()


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_server")
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


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_server")
def test_more_cpus_or_gpus_than_a_node_has_are_named(ray_cluster, tmp_path: Path, monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", ray_cluster.address)
    result = refused(tmp_path, "rm.resources={CPU: 2}", "dpo.resources={GPU: 1}")
    assert_refused(result, "stage 'rm': 'resources: {'CPU': 2.0}' asks for 2 CPU (the largest node has 1)",
                   "stage 'dpo': 'resources: {'GPU': 1.0}' asks for 1 GPU (the largest node has 0)",
                   f"the Ray cluster at {ray_cluster.address} (2 node(s))")


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_server")
def test_no_cluster_at_ray_address_and_no_ray_installed_are_named(tmp_path: Path, monkeypatch):
    from cluster_services import free_port

    address = f"127.0.0.1:{free_port()}"
    monkeypatch.setenv("RAY_ADDRESS", address)
    assert_refused(refused(tmp_path), "'task_runner: ray'", f"no Ray cluster answers at RAY_ADDRESS={address}")
    monkeypatch.setitem(sys.modules, "ray", None)  # what Python makes of an import of a package that is not installed
    assert_refused(refused(tmp_path), "'task_runner: ray'", "Ray is not installed", "pip install 'tuneline[ray]'")
