"""The artifact store's life cycle through the CLI, on a tiny base -> sft pipeline: real
Prefect (ephemeral API), real MLflow (SQLite), real training (2 steps).

`tuneline verify` finds one changed byte and marks the artifact; `tuneline gc` lists and removes
exactly what no recent run references; a rerun recomputes a truncated and a half-deleted artifact,
says so, and tags the MLflow runs with the reason. The checks that change files work on copies of
the workspace, except the last test, which reruns in it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_server")]

REPO_ROOT = Path(__file__).resolve().parents[2]
PIPELINE = {
    "name": "tuneline-lifecycle",
    "defaults": {"dataset_dir": str(REPO_ROOT / "data"), "template": "default", "cutoff_len": 64, "seed": 42, "logging_steps": 1},
    "stages": [
        {"name": "base", "stage": "build_base", "corpus": "demo_pretrain", "vocab_size": 512, "hidden_size": 32,
         "intermediate_size": 64, "num_hidden_layers": 2},
        {"name": "sft", "stage": "sft", "from": "base", "finetuning_type": "lora", "lora_rank": 4, "lora_target": "all",
         "dataset": "demo_alpaca", "max_samples": 16, "per_device_train_batch_size": 4, "max_steps": 2},
    ],
}
STAGES = ["base", "sft/tokenize", "sft"]


def tuneline(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PREFECT_HOME": str(cwd / "prefect_home"), "OMP_NUM_THREADS": "1",
           "TUNELINE_CACHE": str(cwd / "cache")}  # verify and gc cover the tokenized-data cache too: an empty one
    for name in ("PREFECT_PROFILE", "MLFLOW_TRACKING_URI"):  # the session's PREFECT_API_URL stays
        env.pop(name, None)
    return subprocess.run([sys.executable, "-m", "tuneline.flows.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300, env=env)


def here(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """`tuneline ARGS` as `tuneline` runs them, in this process: no interpreter start and imports for each.
    The first run and `verify` and `gc` go this way; the rerun, whose Prefect log the last test reads, is a
    process of its own."""
    from conftest import run_cli_here

    return run_cli_here(*args, cwd=cwd)


def stage_rows(stdout: str) -> dict[str, tuple[str, Path]]:
    rows = re.findall(r"^  (\S+)\s+(computed|served from cache)\s+(?:\S+ s)?\s+(\S+)$", stdout, flags=re.M)
    return {name: (status, Path(path)) for name, status, path in rows}


@pytest.fixture(scope="module")
def first_run(tmp_path_factory) -> dict:
    from tuneline.core.worker.warm import stop_warm_worker

    root = tmp_path_factory.mktemp("lifecycle")
    (root / "pipeline.yaml").write_text(yaml.safe_dump(PIPELINE, sort_keys=False))
    result = here("run", "pipeline.yaml", "--workspace", "ws", cwd=root)  # on the session's Prefect server
    stop_warm_worker()  # the run's warm worker: the later commands are processes of their own
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    rows = stage_rows(result.stdout)
    assert list(rows) == STAGES and {status for status, _ in rows.values()} == {"computed"}
    return {"root": root, "workspace": root / "ws", "paths": {name: path for name, (_, path) in rows.items()}}


def copy_of(first_run: dict, tmp_path: Path) -> tuple[Path, dict[str, Path]]:
    """The workspace copied to tmp_path, and each stage's artifact in the copy."""
    workspace = tmp_path / "ws"
    shutil.copytree(first_run["workspace"], workspace)
    return workspace, {name: workspace / path.relative_to(first_run["workspace"].resolve())
                       for name, path in first_run["paths"].items()}


def test_verify_finds_one_changed_byte_of_the_same_size_and_exits_1(first_run, tmp_path: Path):
    workspace, paths = copy_of(first_run, tmp_path)
    clean = here("verify", "--workspace", str(workspace), cwd=tmp_path)
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert f"{len(STAGES)} artifact(s) verified, 0 damaged" in clean.stdout

    weights = paths["sft"] / "adapter_model.safetensors"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0xFF
    weights.write_bytes(bytes(data))
    damaged = here("verify", "--workspace", str(workspace), cwd=tmp_path)
    assert damaged.returncode == 1, damaged.stdout + damaged.stderr
    assert f"damaged: {paths['sft']}" in damaged.stdout
    assert "adapter_model.safetensors: content changed (same size" in damaged.stdout
    assert f"{len(STAGES)} artifact(s) verified, 1 damaged" in damaged.stdout
    assert not (paths["sft"] / "manifest.json").exists()  # marked: the next run recomputes it
    assert json.loads((paths["sft"] / "damage.json").read_text())["problems"][0].startswith("adapter_model.safetensors")


def gc_listing(stdout: str) -> set[Path]:
    return {Path(path) for path in re.findall(r"^\s*[\d.]+ [KMGT]?B  (\S+)  \(", stdout, flags=re.M)}


def test_gc_lists_and_removes_exactly_the_unreferenced_artifacts_and_stale_drafts(first_run, tmp_path: Path):
    from tuneline.core.store.artifacts import artifact_path, partial_path, write_artifact

    workspace, paths = copy_of(first_run, tmp_path)
    with write_artifact(workspace, "trained", "sft-unused", config={}) as draft:
        (draft.path / "adapter_model.safetensors").write_bytes(b"0" * 64)
    stale = partial_path(workspace, "trained", "sft-abandoned")
    superseded = partial_path(workspace, "trained", paths["sft"].name)
    for folder in (stale, superseded):
        (folder / "checkpoint-1").mkdir(parents=True)
    garbage = {artifact_path(workspace, "trained", "sft-unused"), stale, superseded}

    listed = here("gc", "--workspace", str(workspace), cwd=tmp_path)
    assert listed.returncode == 0, listed.stdout + listed.stderr
    assert gc_listing(listed.stdout) == garbage
    assert "3 unreferenced folder(s)" in listed.stdout and all(path.exists() for path in garbage)

    removed = here("gc", "--workspace", str(workspace), "--yes", cwd=tmp_path)
    assert removed.returncode == 0, removed.stdout + removed.stderr
    assert "removed 3 folder(s)" in removed.stdout
    assert not any(path.exists() for path in garbage)
    assert all((path / "manifest.json").is_file() for path in paths.values())  # the run's artifacts stay

    nothing_kept = here("gc", "--workspace", str(workspace), "--keep-runs", "0", cwd=tmp_path)
    assert gc_listing(nothing_kept.stdout) == set(paths.values())  # no run kept, nothing registered


def test_a_rerun_recomputes_damaged_artifacts_and_says_so(first_run):
    from mlflow import MlflowClient

    paths = first_run["paths"]
    weights = paths["sft"] / "adapter_model.safetensors"
    recorded = json.loads((paths["sft"] / "manifest.json").read_text())["files"]["adapter_model.safetensors"]["size"]
    with weights.open("r+b") as handle:
        handle.truncate(1000)
    deleted = next(p for p in sorted((paths["sft/tokenize"] / "train").iterdir()) if p.suffix == ".arrow")
    deleted.unlink()

    result = tuneline("-v", "run", "pipeline.yaml", "--workspace", "ws", cwd=first_run["root"])  # -v: Prefect's log too
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    print(result.stdout)
    sft_reason = f"adapter_model.safetensors: 1000 bytes, manifest says {recorded}"
    tokenize_reason = f"train/{deleted.name}: missing"
    assert f"sft: cached artifact {paths['sft']} is damaged ({sft_reason}); recomputing" in result.stdout
    assert f"sft/tokenize: cached artifact {paths['sft/tokenize']} is damaged ({tokenize_reason}); recomputing" in result.stdout
    status = {name: status for name, (status, _) in stage_rows(result.stdout).items()}
    assert status == {"base": "served from cache", "sft/tokenize": "computed", "sft": "computed"}
    # Prefect shows the hit: the task run is named after the stage key and ends in a state named Cached
    assert f"Task run '{paths['base'].name}' - Finished in state Cached(type=COMPLETED)" in result.stdout + result.stderr
    assert weights.stat().st_size == recorded and (paths["sft/tokenize"] / "train" / deleted.name).is_file()

    uri = f"sqlite:///{first_run['workspace'] / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    runs = client.search_runs([client.get_experiment_by_name("tuneline-lifecycle").experiment_id],
                              "tags.`tuneline.recomputed_damaged` LIKE '%'")
    assert {r.info.run_name: r.data.tags["tuneline.recomputed_damaged"] for r in runs} == {
        "sft": sft_reason, "sft/tokenize": tokenize_reason}
