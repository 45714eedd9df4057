"""An alignment chain through `tuneline run`: base -> pt -> sft -> rm, dpo (`ref_model: sft`) and ppo
(`reward_model: rm`).

Real Prefect (ephemeral API), real MLflow (SQLite), real training, as small as the chain allows.
The first run computes every stage; a second run serves every stage from cache.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

CHAIN = Path(__file__).resolve().parents[2] / "data/chain_pipeline.yaml"
SMALL = ("max_steps=3", "max_samples=24", "logging_steps=1", "cutoff_len=64", "per_device_train_batch_size=4",
         "hidden_size=32", "intermediate_size=64", "vocab_size=512", "dataset_dir=" + str(CHAIN.parent))
STAGES = ["base", "pt/tokenize", "pt", "sft/tokenize", "sft", "sft/merge", "rm/tokenize", "rm", "dpo/tokenize", "dpo",
          "ppo/tokenize", "ppo"]


def run_chain(workspace: Path) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "tuneline.flows.cli", "run", str(CHAIN), *SMALL, "--workspace", str(workspace)],
        capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout


def stage_rows(stdout: str) -> dict[str, tuple[str, str]]:
    """{stage: (status, artifact path)} from the printed summary."""
    rows = re.findall(r"^  (\S+)\s+(computed|served from cache)\s+(?:\S+ s)?\s+(\S+)$", stdout, flags=re.M)
    return {name: (status, path) for name, status, path in rows}


@pytest.fixture(scope="module")
def first_run(tmp_path_factory) -> dict:
    workspace = tmp_path_factory.mktemp("chain") / "workspace"
    stdout = run_chain(workspace)
    print(stdout)
    return {"workspace": workspace, "stdout": stdout}


def manifest(rows: dict[str, tuple[str, str]], name: str) -> dict:
    return json.loads((Path(rows[name][1]) / "manifest.json").read_text())


def test_chain_computes_every_stage_with_its_held_out_metrics(first_run):
    rows = stage_rows(first_run["stdout"])
    assert list(rows) == STAGES
    assert {status for status, _ in rows.values()} == {"computed"}
    rm_metrics, dpo_metrics = manifest(rows, "rm")["metrics"], manifest(rows, "dpo")["metrics"]
    assert 0.0 <= rm_metrics["eval_rm_accuracy"] <= 1.0
    assert any(name.startswith("eval_pref_") for name in dpo_metrics), sorted(dpo_metrics)


def test_dpo_compares_with_the_merged_sft_model_it_starts_from(first_run):
    rows = stage_rows(first_run["stdout"])
    dpo, merged = manifest(rows, "dpo"), manifest(rows, "sft/merge")
    assert dpo["config"]["ref_model"] == rows["sft/merge"][1] == dpo["start_model"]
    assert dpo["inputs"]["ref_model"] == merged["key"]
    assert "ref_model" not in manifest(rows, "rm")["inputs"]


def test_ppo_scores_with_the_rm_stage_and_reports_reward_before_and_after(first_run):
    rows = stage_rows(first_run["stdout"])
    ppo, rm = manifest(rows, "ppo"), manifest(rows, "rm")
    assert ppo["config"]["reward_model"] == rows["rm"][1]
    assert ppo["inputs"]["reward_model"] == rm["key"]
    assert ppo["start_model"] == rows["sft/merge"][1]
    metrics = ppo["metrics"]
    assert {"eval_ppo_reward_before", "eval_ppo_reward", "eval_ppo_kl", "train_reward", "train_kl"} <= set(metrics)


def test_second_run_serves_every_stage_from_cache(first_run):
    rows = stage_rows(run_chain(first_run["workspace"]))
    assert list(rows) == STAGES
    assert {status for status, _ in rows.values()} == {"served from cache"}
