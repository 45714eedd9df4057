"""Several training processes: torchrun on the CPU (gloo), the world-size check, launch settings."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tuneline.core.errors import ConfigError
from tuneline.core.training.distributed import (
    LaunchPlan,
    check_parallel_settings,
    plan_from_env,
    resolve_parallel_settings,
    worker_command,
    worker_env,
)


def adapter(folder: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(folder / "adapter_model.safetensors")


def train_here(small_sft, *overrides: str) -> subprocess.CompletedProcess:
    """`small_sft.train(*overrides)` through the command's `main` in this process, the worker's run
    without its start: a process of one would spend seconds importing torch and transformers."""
    from conftest import run_cli_here, train_in_this_process

    with pytest.MonkeyPatch.context() as patch:
        train_in_this_process(patch)
        return run_cli_here("train", str(small_sft.config), *overrides, cwd=small_sft.config.parent)


def steps_and_losses(folder: Path) -> list[tuple[int, float]]:
    records = [json.loads(line) for line in (folder / "trainer_log.jsonl").read_text().splitlines()]
    return [(r["current_steps"], r["loss"]) for r in records]


@pytest.fixture(scope="module")
def two_processes(small_sft) -> tuple[Path, subprocess.CompletedProcess]:
    """4 steps of 2 examples on each of 2 CPU processes, checkpoint at step 4."""
    result = small_sft.train("output_dir=two", "save_steps=4", FORCE_TORCHRUN="1", NPROC_PER_NODE="2")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return small_sft.config.parent / "two", result


@pytest.mark.slow
def test_two_processes_end_where_one_process_with_accumulation_ends(small_sft, two_processes, one_torch_thread):
    two, result = two_processes
    one_result = train_here(small_sft, "output_dir=one", "save_steps=4", "gradient_accumulation_steps=2")
    assert one_result.returncode == 0, one_result.stderr[-3000:]
    one = small_sft.config.parent / "one"

    assert "starting 2 training process(es) on node 0 of 1 through torchrun" in result.stdout
    assert "global batch size 4 = 2 per device x 2 process(es) x 1 accumulation step(s)" in result.stdout
    assert "global batch size 4 = 2 per device x 1 process(es) x 2 accumulation step(s)" in one_result.stdout
    record = json.loads((two / "checkpoint-4" / "tuneline_checkpoint.json").read_text())
    assert record["world_size"] == 2 and {"rng_state_0.pth", "rng_state_1.pth"} <= set(record["files"])
    for folder in (one, two):
        assert json.loads((folder / "all_results.json").read_text())["global_batch_size"] == 4
        assert json.loads((folder / "all_results.json").read_text())["epoch"] == 1.0  # 16 rows in 4 steps of 4
    # rank 0 alone writes the log: each step once, the same losses as one process
    (two_steps, two_losses), (one_steps, one_losses) = zip(*steps_and_losses(two)), zip(*steps_and_losses(one))
    assert list(two_steps) == list(one_steps) == [1, 2, 3, 4]
    assert max(abs(a - b) for a, b in zip(two_losses, one_losses)) <= 1e-5
    weights_one, weights_two = adapter(one), adapter(two)
    assert weights_one.keys() == weights_two.keys()
    difference = max((weights_one[k] - weights_two[k]).abs().max().item() for k in weights_one)
    print(f"2 processes x batch 2 vs 1 process x batch 2 x accumulation 2: max abs weight difference {difference}")
    assert difference <= 1e-5
    assert any(t.abs().sum() > 0 for k, t in weights_two.items() if "lora_B" in k)  # B starts at zero: it trained


@pytest.mark.slow
def test_a_launcher_that_starts_fewer_processes_than_asked_fails_loudly(two_processes):
    """`accelerate launch --num_processes 2 --cpu` starts one process; the job asked for two."""
    two, _ = two_processes
    assert json.loads((two / "job.json").read_text())["world_size"] == 2
    result = subprocess.run(
        [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "2", "--cpu", "-m", "tuneline.core.worker",
         str(two / "job.json")], capture_output=True, text=True, timeout=300)
    assert result.returncode != 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "asks for 2 training process(es)" in result.stdout and "world size of 1" in result.stdout
    assert "returned non-zero exit status 2" in result.stderr  # the worker's own status, before any model loaded
    assert "trainable params" not in result.stdout


@pytest.mark.slow
def test_processes_that_train_apart_are_refused(small_sft):
    """Without `use_cpu` a trainer on a CPU trains each torchrun process alone: caught, exit 2."""
    result = small_sft.train("output_dir=apart", "use_cpu=false", FORCE_TORCHRUN="1", NPROC_PER_NODE="2")
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-2000:]
    assert "asks for 2 training process(es)" in result.stderr and "world size of 1" in result.stderr
    assert not (small_sft.config.parent / "apart" / "adapter_model.safetensors").exists()


def test_multi_node_settings_reach_torchrun():
    env = {"FORCE_TORCHRUN": "1", "NPROC_PER_NODE": "4", "NNODES": "2", "NODE_RANK": "1",
           "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}
    plan = plan_from_env(env)
    assert plan == LaunchPlan(nproc_per_node=4, nnodes=2, node_rank=1, master_addr="10.0.0.1", master_port=29500, torchrun=True)
    assert plan.world_size == 8
    command = worker_command(plan, "job.json")
    assert command[1:3] == ["-m", "torch.distributed.run"] and command[-3:] == ["-m", "tuneline.core.worker", "job.json"]
    flags = dict(zip(command[3:-3:2], command[4:-3:2]))
    assert flags == {"--nnodes": "2", "--node-rank": "1", "--nproc-per-node": "4", "--master-addr": "10.0.0.1",
                     "--master-port": "29500"}
    assert worker_command(plan_from_env({}), "job.json")[1:] == ["-m", "tuneline.core.worker", "job.json"]
    assert plan_from_env({}, visible_gpus=2).torchrun  # several GPUs: all of them, as LLaMA-Factory does
    alone = worker_env(plan_from_env({}), {"WORLD_SIZE": "4", "RANK": "1", "PATH": "/bin"})  # from an outer launcher
    assert "WORLD_SIZE" not in alone and "RANK" not in alone and alone["PATH"] == "/bin"


def test_bad_launch_settings_are_named_together():
    with pytest.raises(ConfigError) as caught:
        plan_from_env({"NPROC_PER_NODE": "two", "NNODES": "2", "NODE_RANK": "0"})
    message = str(caught.value)
    assert "NPROC_PER_NODE='two'" in message and "MASTER_ADDR and MASTER_PORT" in message
    with pytest.raises(ConfigError, match="NODE_RANK=2 must be below NNODES=2"):
        plan_from_env({"NNODES": "2", "NODE_RANK": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"})


def test_deepspeed_and_fsdp_files_are_checked(tmp_path: Path):
    import torch
    from transformers import Seq2SeqTrainingArguments

    ds = tmp_path / "ds_z3.json"
    ds.write_text(json.dumps({"zero_optimization": {"stage": 3}}))
    problems = check_parallel_settings({"deepspeed": str(ds)})
    assert len(problems) == 1 and "DeepSpeed, which is not installed" in problems[0] and "GPUs" in problems[0]
    assert any("'pure_bf16: true' cannot train with DeepSpeed ZeRO-3" in p
               for p in check_parallel_settings({"deepspeed": str(ds)}, pure_bf16=True))
    assert any("names no file" in p for p in check_parallel_settings({"deepspeed": str(tmp_path / "missing.json")}))
    (tmp_path / "broken.json").write_text("{zero")
    assert any("does not parse" in p for p in check_parallel_settings({"deepspeed": str(tmp_path / "broken.json")}))

    accelerate_yaml = tmp_path / "fsdp_config.yaml"  # LLaMA-Factory's examples/accelerate format
    accelerate_yaml.write_text("distributed_type: FSDP\nfsdp_config:\n"
                               "  fsdp_sharding_strategy: FULL_SHARD\n  fsdp_offload_params: false\n")
    fsdp_problems = check_parallel_settings({"fsdp": "True", "fsdp_config": str(accelerate_yaml)})  # YAML true, as read
    assert fsdp_problems == [] if torch.cuda.is_available() else (len(fsdp_problems) == 1 and "has none" in fsdp_problems[0])
    resolved = resolve_parallel_settings({"fsdp": "True", "fsdp_config": str(accelerate_yaml)})
    assert resolved["fsdp"] is True
    assert resolved["fsdp_config"] == {"fsdp_sharding_strategy": "FULL_SHARD", "fsdp_offload_params": False}
    args = Seq2SeqTrainingArguments(output_dir=str(tmp_path / "out"), report_to=[], **resolved)  # as the trainer reads it
    assert args.fsdp_plugin_args["state_dict_type"] == "FULL_STATE_DICT"
    assert any("without 'fsdp: true'" in p for p in check_parallel_settings({"fsdp_config": str(accelerate_yaml)}))
    both = check_parallel_settings({"fsdp": "true", "deepspeed": str(ds)})
    assert any("'fsdp' and 'deepspeed' are both set" in p for p in both)


def test_train_refuses_deepspeed_without_deepspeed_before_any_work(small_sft, tmp_path: Path):
    ds = tmp_path / "ds_z2.json"
    ds.write_text(json.dumps({"zero_optimization": {"stage": 2}}))
    result = train_here(small_sft, "output_dir=ds", f"deepspeed={ds}", "fsdp_config=nowhere.json")
    assert result.returncode == 2, result.stderr[-2000:]
    assert "'deepspeed: " in result.stderr and "not installed" in result.stderr
    assert "'fsdp_config: nowhere.json' has no effect without 'fsdp: true'" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (small_sft.config.parent / "ds").exists()
