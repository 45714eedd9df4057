"""The warm worker: jobs forked from one process that imported once train as a new process does,
report errors and deaths as a new process does, and a job with another environment gets another."""

from __future__ import annotations

import dataclasses
import os
import signal
from pathlib import Path

import pytest

from tuneline.core.errors import TunelineError
from tuneline.core.training.job import TrainJob
from tuneline.core.worker.launch import JOB_FILE, WorkerFailed, launch_training
from tuneline.core.worker.warm import DISABLE_ENV, KILLED, stop_warm_worker, warm_worker

pytestmark = pytest.mark.slow
WORKER_ADDITIONS = {"PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"}  # what `worker_env` adds


def adapter(folder: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(folder / "adapter_model.safetensors")


@pytest.fixture(scope="module")
def cold_job(small_sft) -> tuple[TrainJob, Path]:
    """A job that `tuneline train` ran in a new process, and the folder it trained."""
    result = small_sft.train("output_dir=cold")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    folder = small_sft.config.parent / "cold"
    return TrainJob.read(folder / JOB_FILE), folder


@pytest.fixture(scope="module")
def worker_environment(small_sft):
    """This process's environment as `tuneline train` gave its worker (one thread), for the module;
    its warm worker serves every test and ends with the module."""
    with pytest.MonkeyPatch.context() as patch:
        for name, value in small_sft.env().items():
            patch.setenv(name, value)
        yield
        stop_warm_worker()


def test_jobs_forked_from_the_warm_worker_train_as_a_new_process_does(cold_job, tmp_path, worker_environment):
    job, cold = cold_job
    lines: list[str] = []
    metrics = [launch_training(dataclasses.replace(job, output_dir=str(tmp_path / name)), log=lines.append)
               for name in ("first", "second")]
    warm = warm_worker(os.environ | WORKER_ADDITIONS)
    assert warm is not None and warm.process.poll() is None  # one warm worker served both jobs and waits for more
    assert any("eval_loss" in line or "step 4/4" in line for line in lines)
    expected = adapter(cold)
    for name, result in zip(("first", "second"), metrics):
        assert result["train_loss"] > 0
        trained = adapter(tmp_path / name)
        difference = max((trained[k] - expected[k]).abs().max().item() for k in expected)
        print(f"{name} warm job vs a new process: max abs weight difference {difference}")
        assert trained.keys() == expected.keys() and difference == 0.0


def test_a_users_mistake_is_reported_as_from_a_new_process(cold_job, tmp_path, worker_environment):
    job, _ = cold_job
    broken = dataclasses.replace(job, output_dir=str(tmp_path / "out"), dataset_path=str(tmp_path / "no-such-data"))
    with pytest.raises(TunelineError, match="no-such-data"):  # the worker's error line, not a traceback
        launch_training(broken, log=lambda line: None)


def test_a_killed_job_fails_and_the_warm_worker_serves_the_next(cold_job, tmp_path, worker_environment):
    from tuneline.core.worker.launch import _follow

    job, _ = cold_job
    warm = warm_worker(os.environ | WORKER_ADDITIONS)
    endless = dataclasses.replace(job, output_dir=str(tmp_path / "killed"), training={**job.training, "max_steps": 10_000})
    (tmp_path / "killed").mkdir()
    child = warm.start(str(endless.write(tmp_path / "killed" / JOB_FILE)))
    assert child is not None and child.pid != warm.process.pid
    next(child.stdout)  # it runs
    os.kill(child.pid, signal.SIGKILL)
    with pytest.raises(WorkerFailed, match=f"exited with status {KILLED}"):
        _follow(child, log=lambda line: None)
    after = launch_training(dataclasses.replace(job, output_dir=str(tmp_path / "after")), log=lambda line: None)
    assert warm_worker(os.environ | WORKER_ADDITIONS) is warm and after["train_loss"] > 0


def test_a_job_with_another_environment_gets_a_warm_worker_of_its_own(worker_environment):
    env = os.environ | WORKER_ADDITIONS
    first = warm_worker(env)
    assert first is not None and warm_worker(env) is first
    other = warm_worker({**env, "HF_HOME": "/elsewhere"})  # read as modules import: the old one's is another
    assert other is not first and other.env["HF_HOME"] == "/elsewhere"
    assert first.process.poll() is not None  # replaced, it ended
    assert warm_worker({**env, DISABLE_ENV: "0"}) is None


def test_a_warm_worker_whose_orchestrator_ends_during_its_imports_ends_too(tmp_path):
    """Closing its standard input (what an orchestrator's exit does) ends it at once, not after the
    imports of torch, transformers and TRL it would otherwise finish for nothing."""
    import subprocess
    import sys
    import time

    process = subprocess.Popen([sys.executable, "-m", "tuneline.core.worker.warm", str(tmp_path / "worker.sock")],
                               stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(200):  # the socket is bound before the imports start
            if (tmp_path / "worker.sock").exists():
                break
            time.sleep(0.05)
        assert (tmp_path / "worker.sock").exists()
        process.stdin.close()
        process.wait(timeout=3)  # the imports alone take several seconds
    finally:
        process.kill()
        process.wait()
