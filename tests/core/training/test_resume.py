"""Resume after a kill: from the newest complete checkpoint, to the same weights, each step logged once.

The runs that are not killed go through the command's `main` in this process, the worker's run without
its start (`train_here`); the killed runs are commands of their own, killed with their process group."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tuneline.core.training.checkpoints import RECORD_FILE, incomplete_reason, newest_complete, trim_log

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # as the commands' OMP_NUM_THREADS=1

STEPS = 20  # 2.5 epochs of 8 steps: the resumed run crosses epoch boundaries
RUN = (f"max_steps={STEPS}", "save_steps=4")


def train_here(small_sft, *overrides: str) -> subprocess.CompletedProcess:
    """`small_sft.train(*overrides)` through the command's `main` in this process: a process of one would
    spend seconds importing torch and transformers."""
    from conftest import run_cli_here, train_in_this_process

    with pytest.MonkeyPatch.context() as patch:
        train_in_this_process(patch)
        return run_cli_here("train", str(small_sft.config), *overrides, cwd=small_sft.config.parent)


def adapter(folder: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(folder / "adapter_model.safetensors")


def max_difference(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max((a[k] - b[k]).abs().max().item() for k in a)


def resume_line(output: str) -> str:
    return next(line for line in output.splitlines() if line.startswith(("resuming from", "training from step 0")))


def logged_steps(folder: Path) -> list[int]:
    return [json.loads(line)["current_steps"] for line in (folder / "trainer_log.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def uninterrupted(small_sft) -> Path:
    result = train_here(small_sft, "output_dir=whole", *RUN)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return small_sft.config.parent / "whole"


def kill_after_checkpoint(small_sft, output_dir: str, *, step: int) -> list[int]:
    """Start a run and SIGKILL its whole process group once checkpoint `step` is complete and a
    later step is logged; return the steps its log held then."""
    folder = small_sft.config.parent / output_dir
    process = subprocess.Popen(small_sft.command(f"output_dir={output_dir}", *RUN), cwd=small_sft.config.parent,
                               env=small_sft.env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               start_new_session=True)
    deadline = time.monotonic() + 240
    while process.poll() is None and time.monotonic() < deadline:
        if (folder / f"checkpoint-{step}" / RECORD_FILE).exists() and max(steps_in_log(folder), default=0) > step:
            break
        time.sleep(0.005)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    assert process.returncode == -signal.SIGKILL, "the run ended before it could be killed"
    return steps_in_log(folder)


def steps_in_log(folder: Path) -> list[int]:
    """Steps of a log being written: a line cut short does not count."""
    log = folder / "trainer_log.jsonl"
    lines = log.read_text().splitlines() if log.is_file() else []
    return [json.loads(line)["current_steps"] for line in lines if line.endswith("}")]


@pytest.mark.slow
def test_a_killed_run_resumes_to_the_weights_of_an_uninterrupted_one(small_sft, uninterrupted: Path):
    logged_at_kill = kill_after_checkpoint(small_sft, "killed", step=8)
    killed = small_sft.config.parent / "killed"
    assert not (killed / "adapter_model.safetensors").exists()
    resumed_from = newest_complete(killed, log=lambda _: None)
    resumed_step = int(resumed_from.name.split("-")[1])
    assert resumed_step >= 8 and max(logged_at_kill) > resumed_step  # steps that the rerun logs again

    result = train_here(small_sft, "output_dir=killed", *RUN)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert resume_line(result.stdout).endswith(f"{resumed_from.name} (step {resumed_step})")
    difference = max_difference(adapter(killed), adapter(uninterrupted))
    print(f"killed and resumed vs uninterrupted: max abs weight difference {difference}")
    assert difference <= 1e-5
    assert logged_steps(killed) == logged_steps(uninterrupted) == list(range(1, STEPS + 1))
    state = json.loads((killed / "trainer_state.json").read_text())
    assert state["global_step"] == STEPS


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["missing weights", "optimizer cut short"])
def test_an_incomplete_newest_checkpoint_is_skipped_for_the_one_before(small_sft, uninterrupted: Path, damage: str):
    """A run 'killed' at step 10 while saving checkpoint-8: the rerun must resume from checkpoint-4."""
    folder = small_sft.config.parent / f"damaged-{damage.split()[0]}"
    folder.mkdir()
    for name in ("checkpoint-4", "checkpoint-8"):
        shutil.copytree(uninterrupted / name, folder / name)
    lines = (uninterrupted / "trainer_log.jsonl").read_text().splitlines()[:10]
    (folder / "trainer_log.jsonl").write_text("\n".join(lines) + '\n{"current_steps": 11, "lo')  # cut short too
    if damage == "missing weights":
        (folder / "checkpoint-8" / "adapter_model.safetensors").unlink()
    else:
        optimizer = folder / "checkpoint-8" / "optimizer.pt"
        optimizer.write_bytes(optimizer.read_bytes()[:100])

    result = train_here(small_sft, f"output_dir={folder.name}", *RUN)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "skipping checkpoint-8" in result.stdout
    assert resume_line(result.stdout).endswith("checkpoint-4 (step 4)")
    assert max_difference(adapter(folder), adapter(uninterrupted)) <= 1e-5
    assert logged_steps(folder) == list(range(1, STEPS + 1))


@pytest.mark.slow
def test_completeness_needs_state_weights_and_every_recorded_file(uninterrupted: Path, tmp_path: Path):
    def damaged(name: str, harm) -> Path:
        copy = tmp_path / name / "checkpoint-8"
        shutil.copytree(uninterrupted / "checkpoint-8", copy)
        harm(copy)
        return copy

    assert incomplete_reason(uninterrupted / "checkpoint-8") is None
    assert "trainer_state.json is missing" in incomplete_reason(damaged("a", lambda c: (c / "trainer_state.json").unlink()))
    cut = damaged("b", lambda c: (c / "trainer_state.json").write_text('{"global_step": 8, "lo'))
    assert "cut short" in incomplete_reason(cut)
    assert "no model weights" in incomplete_reason(damaged("c", lambda c: (c / "adapter_model.safetensors").unlink()))
    assert "rng_state.pth missing" in incomplete_reason(damaged("d", lambda c: (c / "rng_state.pth").unlink()))
    assert "scheduler.pt missing or changed" in incomplete_reason(
        damaged("e", lambda c: (c / "scheduler.pt").write_bytes(b"short")))
    # a checkpoint written without the record (plain transformers): every torch archive must be whole
    unrecorded = damaged("f", lambda c: (c / RECORD_FILE).unlink())
    assert incomplete_reason(unrecorded) is None
    (unrecorded / "optimizer.pt").write_bytes((unrecorded / "optimizer.pt").read_bytes()[:-30])
    assert "optimizer.pt cut short" in incomplete_reason(unrecorded)


def test_trim_log_keeps_each_step_up_to_the_checkpoint(tmp_path: Path):
    log = tmp_path / "trainer_log.jsonl"
    lines = [json.dumps({"current_steps": s, "loss": 1.0}) for s in (1, 2, 3, 4)]
    lines.append(json.dumps({"current_steps": 4, "eval_loss": 2.0}))
    log.write_text("\n".join(lines) + '\n{"current_st')
    trim_log(log, last_step=3)
    assert [json.loads(line)["current_steps"] for line in log.read_text().splitlines()] == [1, 2, 3]
    trim_log(log, last_step=0)
    assert log.read_text() == ""


@pytest.mark.slow
def test_train_restarts_a_run_killed_before_its_first_checkpoint_but_refuses_other_files(small_sft):
    folder = small_sft.config.parent / "early"
    folder.mkdir()
    (folder / "trainer_log.jsonl").write_text('{"current_steps": 1, "loss": 7.0}\n')
    (folder / "notes.txt").write_text("mine")
    refused = train_here(small_sft, "output_dir=early", "max_steps=2")
    assert refused.returncode == 2 and "notes.txt" in refused.stderr and "overwrite_output_dir" in refused.stderr
    (folder / "notes.txt").unlink()
    result = train_here(small_sft, "output_dir=early", "max_steps=2")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert resume_line(result.stdout) == "training from step 0"
    assert logged_steps(folder) == [1, 2]


@pytest.mark.slow
def test_overwrite_output_dir_starts_over_instead_of_resuming(small_sft, uninterrupted: Path):
    folder = small_sft.config.parent / "again"
    folder.mkdir()
    shutil.copytree(uninterrupted / "checkpoint-8", folder / "checkpoint-8")
    shutil.copy(uninterrupted / "trainer_log.jsonl", folder / "trainer_log.jsonl")
    (folder / "notes.txt").write_text("mine")
    result = train_here(small_sft, "output_dir=again", "max_steps=2", "overwrite_output_dir=true")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert resume_line(result.stdout) == "training from step 0"
    assert not (folder / "checkpoint-8").exists() and (folder / "notes.txt").read_text() == "mine"
    assert logged_steps(folder) == [1, 2]
