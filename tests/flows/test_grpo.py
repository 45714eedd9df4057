"""`tuneline train` for the online RL stages (grpo, rloo) on the reasoning demo's prompts: what a run logs
and writes, each fine-tuning method, a reward model from an rm stage, two processes, and the errors a
reward, a reward name or `use_vllm` stop the stage with.

The runs of one process go through the command's `main` in this process, the worker's run without its
start (`train_in_this_process`): a process per run would spend seconds importing torch, transformers and
TRL. The QLoRA run, which needs bitsandbytes, and the torchrun run are commands of their own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import assert_output_layout, run_cli_here, train_in_this_process

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # as the commands' OMP_NUM_THREADS=1

REPO = Path(__file__).resolve().parents[2]
REWARDS_MODULE = '''
def raises(prompts, completions, **columns):
    raise ValueError("the checker is broken")


def one_score(prompts, completions, **columns):
    return [1.0]


def characters(prompts, completions, **columns):
    return [len(completion) / 32 for completion in completions]
'''


def write_config(folder: Path, name: str, values: dict) -> Path:
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump({
        "stage": "grpo", "finetuning_type": "lora", "lora_rank": 4, "dataset_dir": str(REPO / "data/reasoning_demo"),
        "dataset": "reasoning_prompts", "template": "chatml", "cutoff_len": 48, "max_samples": 16,
        "reward_funcs": "answer_match,think_answer_format", "num_generations": 4, "max_completion_length": 8,
        "per_device_train_batch_size": 8, "max_steps": 2, "logging_steps": 1, "learning_rate": 1e-3, "seed": 5,
        "report_to": "none", "output_dir": name, **values,
    }))
    return path


def train(config: Path, *overrides: str, **env: str) -> subprocess.CompletedProcess:
    """`tuneline train CONFIG` as a command of its own, its rewards module importable."""
    environment = {**os.environ, "TUNELINE_CACHE": str(config.parent / "cache"), "OMP_NUM_THREADS": "1",
                   "PYTHONPATH": str(config.parent), **env}
    return subprocess.run([sys.executable, "-m", "tuneline.flows.cli", "train", str(config), *overrides], cwd=config.parent,
                          capture_output=True, text=True, timeout=300, env=environment)


def train_here(config: Path, *overrides: str) -> subprocess.CompletedProcess:
    """`tuneline train CONFIG` as `train` runs it, in this process (its rewards module importable from here)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(config.parent))
        train_in_this_process(patch)
        return run_cli_here("train", str(config), *overrides, cwd=config.parent)


def log_records(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "trainer_log.jsonl").read_text().splitlines()]


def completions(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "completions.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("grpo")
    (path / "my_rewards.py").write_text(REWARDS_MODULE)
    return path


@pytest.fixture(scope="module")
def lora_run(tiny_base: Path, folder: Path, one_torch_thread) -> Path:
    config = write_config(folder, "lora", {"model_name_or_path": str(tiny_base), "eval_dataset": "reasoning_heldout",
                                           "max_steps": 3, "beta": 0.1, "per_device_eval_batch_size": 16,
                                           "reward_funcs": "answer_match,think_answer_format,overlong_penalty",
                                           "reward_weights": "1.0,0.2,0.5"})
    result = train_here(config)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return folder / "lora"


@pytest.mark.slow
def test_grpo_logs_each_reward_kl_and_a_sample_of_completions(lora_run: Path):
    log = log_records(lora_run)
    assert [record["current_steps"] for record in log] == [1, 2, 3]
    for name in ("answer_match", "think_answer_format", "overlong_penalty"):
        assert {f"rewards/{name}/mean", f"rewards/{name}/std"} <= set(log[0])
    assert {"reward", "reward_std", "kl", "completions/mean_length", "completions/clipped_ratio",
            "clip_ratio/region_mean"} <= set(log[0])
    rows = completions(lora_run)
    assert sorted({row["step"] for row in rows}) == [1, 2, 3]
    first = rows[0]
    assert first["prompt"].startswith("<|im_start|>user\nWhat is ") and first["prompt"].endswith("<|im_start|>assistant\n")
    assert {"completion", "reward_answer_match", "reward_think_answer_format", "reward_overlong_penalty", "advantage"} <= set(first)
    results = json.loads((lora_run / "all_results.json").read_text())
    for name in ("eval_pass_rate", "eval_pass_rate_before", "eval_mean_reward", "eval_mean_reward_before",
                 "eval_reward_answer_match", "eval_reward_overlong_penalty_before"):
        assert 0.0 <= abs(results[name]) <= 1.2, name
    assert_output_layout(lora_run, "grpo")
    assert not (lora_run / "ref").exists()  # TRL's copy of a fresh adapter is dropped (the adapter off is the reference)


@pytest.mark.slow
@pytest.mark.parametrize("method", ["freeze", "qlora", "gspo"])
def test_grpo_trains_with_each_method_against_its_reference(method: str, tiny_base: Path, folder: Path):
    """beta > 0: a freeze policy compares with a frozen copy of its start (full tuning takes the same path,
    in the reasoning chain), QLoRA with its adapter off; and GSPO (sequence-level ratios, unscaled rewards).

    The KL a step logs is computed before that step's update: 0 at the first step, where the policy is
    its reference, and above 0 at the second, once the first update has moved it. The reward is the
    completion's length, which differs between completions (the random tiny model earns no verifiable
    reward, and equal rewards give no advantage, so nothing would move)."""
    values = {"freeze": {"finetuning_type": "freeze", "freeze_trainable_layers": 1}, "qlora": {"quantization_bit": 4},
              "gspo": {"loss_type": "grpo", "importance_sampling_level": "sequence", "epsilon": 3e-4, "epsilon_high": 4e-4,
                       "scale_rewards": False}}[method]
    config = write_config(folder, method, {"model_name_or_path": str(tiny_base), "reward_funcs": "my_rewards:characters",
                                           "beta": 0.2, "max_steps": 2, **values})
    result = train(config) if method == "qlora" else train_here(config)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    first, second = log_records(folder / method)
    assert first["reward_std"] > 0  # the first update has advantages to follow
    assert first["kl"] == 0.0 and second["kl"] > 0.0, (first["kl"], second["kl"])


@pytest.mark.slow
def test_rloo_trains_on_the_same_prompts(tiny_base: Path, folder: Path):
    config = write_config(folder, "rloo", {"model_name_or_path": str(tiny_base), "stage": "rloo", "beta": 0.05})
    result = train_here(config)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    log = log_records(folder / "rloo")
    assert [record["current_steps"] for record in log] == [1, 2] and "rewards/answer_match/mean" in log[0]
    assert_output_layout(folder / "rloo", "rloo")


@pytest.mark.slow
def test_a_reward_model_from_an_rm_stage_scores_the_completions(tiny_base: Path, folder: Path):
    reward = folder / "rm.yaml"
    reward.write_text(yaml.safe_dump({
        "model_name_or_path": str(tiny_base), "stage": "rm", "finetuning_type": "lora", "lora_rank": 4,
        "dataset_dir": str(REPO / "data"), "dataset": "demo_preference", "template": "chatml", "cutoff_len": 64,
        "max_samples": 16, "per_device_train_batch_size": 4, "max_steps": 2, "report_to": "none", "output_dir": "rm"}))
    assert train_here(reward).returncode == 0
    config = write_config(folder, "scored", {"model_name_or_path": str(tiny_base), "reward_funcs": "think_answer_format",
                                              "reward_model": str(folder / "rm"), "reward_weights": [0.5, 1.0],
                                              "eval_dataset": "reasoning_heldout", "max_steps": 1})
    result = train_here(config)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    log = log_records(folder / "scored")
    assert log[0]["rewards/reward_model/std"] > 0  # a score per completion, not one per batch
    results = json.loads((folder / "scored" / "all_results.json").read_text())
    assert "eval_reward_reward_model" in results and "eval_pass_rate" in results


@pytest.mark.slow
def test_two_processes_sample_the_prompts_one_process_with_accumulation_samples(tiny_base: Path, folder: Path):
    """Through torchrun on the CPU (gloo). The weights cannot match one process with accumulation: each
    process samples its completions from its own random stream (TRL seeds each process apart, so that
    the completions of a group differ), so the two runs train on other completions. What must match is
    everything before sampling: every step's prompts, in groups of num_generations, the same global batch."""
    config = write_config(folder, "distributed", {"model_name_or_path": str(tiny_base), "per_device_train_batch_size": 4,
                                                  "save_steps": 1})
    two = train(config, "output_dir=two", FORCE_TORCHRUN="1", NPROC_PER_NODE="2")
    assert two.returncode == 0, two.stdout[-3000:] + two.stderr[-3000:]
    one = train_here(config, "output_dir=one", "gradient_accumulation_steps=2")
    assert one.returncode == 0, one.stdout[-3000:] + one.stderr[-3000:]

    def prompts_by_step(name: str) -> dict[int, list[str]]:
        steps: dict[int, list[str]] = {}
        for row in completions(folder / name):
            steps.setdefault(row["step"], []).append(row["prompt"])
        return {step: sorted(prompts) for step, prompts in steps.items()}

    assert prompts_by_step("two") == prompts_by_step("one")
    assert all(len(prompts) == 8 and len(set(prompts)) == 2 for prompts in prompts_by_step("two").values())
    assert {"rng_state_0.pth", "rng_state_1.pth"} <= {f.name for f in (folder / "two" / "checkpoint-1").iterdir()}
    assert [r["current_steps"] for r in log_records(folder / "two")] == [r["current_steps"] for r in log_records(folder / "one")]


@pytest.mark.slow
@pytest.mark.parametrize("reward, message", [
    ("my_rewards:raises", "reward 'my_rewards:raises' raised ValueError: the checker is broken"),
    ("my_rewards:one_score", "reward 'my_rewards:one_score' returned a list of 1 for 8 completions"),
])
def test_a_reward_that_fails_stops_the_stage_naming_it(reward: str, message: str, tiny_base: Path, folder: Path):
    name = reward.split(":")[1]
    config = write_config(folder, name, {"model_name_or_path": str(tiny_base), "reward_funcs": reward, "max_steps": 1})
    result = train_here(config)
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-2000:]
    assert message in result.stderr and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert not (folder / name / "adapter_model.safetensors").exists()


@pytest.mark.parametrize("values, message", [
    ({"reward_funcs": "answer_macth"}, "unknown reward 'answer_macth'; did you mean 'answer_match'?"),
    ({"reward_funcs": "no_such_module:score"}, "reward 'no_such_module:score': module 'no_such_module' cannot be imported"),
    ({"reward_weights": "1.0"}, "'reward_weights' gives 1 weights for 2 rewards"),
    ({"use_vllm": True}, "'use_vllm: true' generates with vLLM, which needs the vllm package"),
    ({"reward_funcs": None}, "'stage: grpo' needs rewards"),
    ({"num_generations": 3}, "must be a multiple of 'num_generations' (3)"),
    ({"loss_type": "ppo"}, "'loss_type: ppo' is not a GRPO loss"),
    ({"stage": "rloo", "loss_type": "grpo"}, "'loss_type' is a key of stage grpo, which stage 'rloo' does not read"),
    ({"stage": "sft", "num_generations": 4, "dataset": "reasoning_sft"},
     "'num_generations' is a key of stage grpo or rloo, which stage 'sft' does not read"),
])
def test_online_rl_settings_that_cannot_run_are_refused_before_any_work(values: dict, message: str, tiny_base: Path,
                                                                        tmp_path: Path):
    config = write_config(tmp_path, "refused", {"model_name_or_path": str(tiny_base), **values})
    result = run_cli_here("train", str(config), cwd=tmp_path)
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-2000:]
    assert message in result.stderr and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert not (tmp_path / "refused").exists()
