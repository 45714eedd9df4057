"""`tuneline train` for stage ppo: a run against a reward model the test trains first, its metrics,
its resume after a kill, and its configuration errors.

The runs of one process that are not killed go through the command's `main` in this process, the
worker's run without its start (`train_in_this_process`): a process per run would spend seconds
importing torch, transformers and TRL. The killed run and the torchrun run are commands of their own."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from conftest import assert_output_layout, run_cli_here, train_in_this_process
from tuneline.core.training.checkpoints import RECORD_FILE

REPO_DATA = Path(__file__).resolve().parents[2] / "data"
STEPS = 12
COMMON = {"dataset_dir": str(REPO_DATA), "template": "default", "cutoff_len": 64, "seed": 3, "report_to": "none",
          "finetuning_type": "lora", "lora_rank": 4, "per_device_train_batch_size": 2, "logging_steps": 1}


def train_here(config: Path, *overrides: str) -> subprocess.CompletedProcess:
    """`tuneline train CONFIG` in this process, the worker's run without its start."""
    with pytest.MonkeyPatch.context() as patch:
        train_in_this_process(patch)
        return run_cli_here("train", str(config), *overrides, cwd=config.parent)


def command(config: Path, *overrides: str) -> list[str]:
    return [sys.executable, "-m", "tuneline.flows.cli", "train", str(config), *overrides]


def environment(config: Path) -> dict[str, str]:
    return {**os.environ, "TUNELINE_CACHE": str(config.parent / "cache"), "OMP_NUM_THREADS": "1"}


def write_config(folder: Path, name: str, values: dict) -> Path:
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump({**COMMON, **values}))
    return path


@pytest.fixture(scope="module")
def ppo_config(tiny_base: Path, tmp_path_factory, one_torch_thread) -> Path:
    """A PPO config whose reward model (LoRA on the tiny base, 8 steps of demo pairs) is trained here;
    the reward model's config sets `packing`, which stage rm ignores (what it printed: rm.out)."""
    folder = tmp_path_factory.mktemp("ppo")
    reward = write_config(folder, "rm", {"model_name_or_path": str(tiny_base), "stage": "rm", "dataset": "demo_preference",
                                         "max_samples": 32, "max_steps": 8, "learning_rate": 5e-3, "output_dir": "rm",
                                         "packing": True})
    result = train_here(reward)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (folder / "rm.out").write_text(result.stdout)
    return write_config(folder, "ppo", {
        "model_name_or_path": str(tiny_base), "stage": "ppo", "reward_model": str(folder / "rm"),
        "dataset": "demo_preference", "eval_dataset": "demo_preference_heldout", "max_samples": 24,
        "max_steps": STEPS, "save_steps": 4, "learning_rate": 5e-3, "ppo_epochs": 2, "max_new_tokens": 8,
        "do_sample": True, "temperature": 0.7, "top_k": 50, "per_device_eval_batch_size": 8,
    })


@pytest.fixture(scope="module")
def uninterrupted(ppo_config: Path) -> Path:
    result = train_here(ppo_config, "output_dir=whole")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return ppo_config.parent / "whole"


def trained_weights(folder: Path) -> dict:
    from safetensors.torch import load_file

    return {**load_file(folder / "adapter_model.safetensors"), **load_file(folder / "value_head.safetensors")}


@pytest.mark.slow
def test_ppo_trains_logs_and_reports_reward_and_kl(uninterrupted: Path):
    log = [json.loads(line) for line in (uninterrupted / "trainer_log.jsonl").read_text().splitlines()]
    assert [record["current_steps"] for record in log] == list(range(1, STEPS + 1))
    assert {"loss", "reward", "lr", "epoch", "kl", "kl_coef", "policy_loss", "value_loss", "response_length"} <= set(log[0])
    results = json.loads((uninterrupted / "all_results.json").read_text())
    for key in ("eval_ppo_reward_before", "eval_ppo_reward", "eval_ppo_kl", "eval_ppo_reward_gain"):
        assert results[key] == results[key]  # present, not NaN
    assert results["eval_ppo_prompts"] > 0
    assert_output_layout(uninterrupted, "ppo")
    assert not list(uninterrupted.glob("checkpoint-*")) or all((c / RECORD_FILE).is_file()
                                                                for c in uninterrupted.glob("checkpoint-*"))
    # the value head is saved beside the adapter, and the adapter loads as a plain causal-LM adapter
    from peft import AutoPeftModelForCausalLM

    assert AutoPeftModelForCausalLM.from_pretrained(str(uninterrupted)) is not None


@pytest.mark.slow
def test_tuneline_train_warns_once_of_a_key_its_stage_ignores_and_trains(ppo_config: Path):
    printed = (ppo_config.parent / "rm.out").read_text()
    assert [line for line in printed.splitlines() if "has no effect in stage" in line] == [
        "warning: 'packing: true' has no effect in stage 'rm' and is ignored: only stages pt and sft read it. What it does: "
        "Pack examples into full-length sequences (default: on for pt)."]
    assert printed.index("has no effect in stage") < printed.index("train_loss=")  # before the run, which finished


@pytest.mark.slow
def test_a_killed_ppo_run_resumes_to_the_weights_of_an_uninterrupted_one(ppo_config: Path, uninterrupted: Path):
    folder = ppo_config.parent / "killed"
    process = subprocess.Popen(command(ppo_config, "output_dir=killed"), cwd=ppo_config.parent, env=environment(ppo_config),
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 240
    while process.poll() is None and time.monotonic() < deadline:
        if (folder / "checkpoint-4" / RECORD_FILE).exists():
            break
        time.sleep(0.002)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    assert process.returncode == -signal.SIGKILL, "the run ended before it could be killed"
    assert not (folder / "adapter_model.safetensors").exists()

    result = train_here(ppo_config, "output_dir=killed")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    resumed = [line for line in result.stdout.splitlines() if line.startswith("resuming from")]
    assert resumed and int(re.search(r"\(step (\d+)\)", resumed[0]).group(1)) >= 4, result.stdout[-2000:]
    whole, again = trained_weights(uninterrupted), trained_weights(folder)
    difference = max((whole[k] - again[k]).abs().max().item() for k in whole)
    print(f"PPO resumed from {resumed[0]!r}: max abs weight difference {difference:.3g} over {len(whole)} tensors")
    assert whole.keys() == again.keys()
    assert difference <= 1e-6
    steps = [json.loads(line)["current_steps"] for line in (folder / "trainer_log.jsonl").read_text().splitlines()]
    assert steps == list(range(1, STEPS + 1))


def test_ppo_without_a_reward_model_is_refused_before_loading_anything(tiny_base: Path, tmp_path: Path):
    config = write_config(tmp_path, "ppo", {"model_name_or_path": str(tiny_base), "stage": "ppo",
                                            "dataset": "demo_preference", "output_dir": "out"})
    result = run_cli_here("train", str(config), cwd=config.parent)
    assert result.returncode == 2
    assert "'stage: ppo' needs 'reward_model'" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_a_reward_model_with_another_tokenizer_is_refused(ppo_config: Path, tmp_path: Path, shared_dir: Path):
    """Replies are scored as the policy's token ids: a reward model reading other ids would score noise."""
    import shutil

    foreign = tmp_path / "rm"
    shutil.copytree(ppo_config.parent / "rm", foreign)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (foreign / name).unlink(missing_ok=True)
    shutil.copy(shared_dir / "tokenizers/qwen2.5/tokenizer.json", foreign)
    shutil.copy(shared_dir / "tokenizers/qwen2.5/tokenizer_config.json", foreign)
    result = run_cli_here("train", str(ppo_config), f"reward_model={foreign}", "output_dir=foreign", "max_steps=1",
                          cwd=ppo_config.parent)
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-2000:]
    assert "uses another tokenizer than the policy" in result.stderr


@pytest.mark.slow
def test_ppo_runs_in_two_processes_each_with_its_own_prompts(ppo_config: Path):
    """Through torchrun on the CPU (gloo): each process samples its own share of the prompts, the
    updates are averaged, and rank 0 alone evaluates and saves."""
    result = subprocess.run(command(ppo_config, "output_dir=two", "max_steps=2", "save_steps=1"), cwd=ppo_config.parent,
                            capture_output=True, text=True, timeout=300,
                            env={**environment(ppo_config), "FORCE_TORCHRUN": "1", "NPROC_PER_NODE": "2"})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    folder = ppo_config.parent / "two"
    log = [json.loads(line) for line in (folder / "trainer_log.jsonl").read_text().splitlines()]
    assert [record["current_steps"] for record in log] == [1, 2]
    assert {"rng_state_0.pth", "rng_state_1.pth"} <= {f.name for f in (folder / "checkpoint-1").iterdir()}
    results = json.loads((folder / "all_results.json").read_text())
    assert "eval_ppo_reward" in results
