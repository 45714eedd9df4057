"""Start the training worker in child processes and stream their output (docs/ARCHITECTURE.md, "Training runs in a worker").

One process by default; several through torchrun when the environment asks for them as it does
for LLaMA-Factory (`FORCE_TORCHRUN=1 NPROC_PER_NODE=N`, see `distributed.py`). A single worker
may be started ahead of its job (`worker_started_ahead`), so that its imports overlap the
tokenizing that comes before the job exists. Other single-process jobs are forked from the
process's warm worker (`warm.py`), which has done those imports once for every stage.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from tuneline.core.config import OptimizerConfig
from tuneline.core.config.ray import trains_on_ray
from tuneline.core.errors import ConfigError, TunelineError
from tuneline.core.training.distributed import (
    WORKER_MODULE,
    LaunchPlan,
    check_parallel_settings,
    plan_from_env,
    resolve_parallel_settings,
    visible_gpus,
    worker_command,
    worker_env,
)
from tuneline.core.training.job import TrainJob
from tuneline.core.training.optimizers.rules import parallel_problems
from tuneline.core.worker.preload import job_needs_bitsandbytes
from tuneline.core.worker.protocol import ERROR_PREFIX, RESULT_PREFIX, WAIT_FOR_JOB, WITHOUT_BITSANDBYTES
from tuneline.core.worker.warm import WarmChild, warm_worker

JOB_FILE = "job.json"


class WorkerFailed(RuntimeError):
    """The worker process ended with an error that is not a configuration problem."""


@contextmanager
def worker_started_ahead(stage: str, *, without_bitsandbytes: bool, env: Mapping[str, str] | None = None
                         ) -> Iterator[subprocess.Popen | None]:
    """A single worker for stage `stage`, importing what it trains with until `launch_training`
    hands it its job; None when the launch needs torchrun. Ended if the job never comes."""
    env = os.environ if env is None else env
    plan = launch_plan(env)
    if plan.torchrun:
        yield None
        return
    command = [sys.executable, "-m", WORKER_MODULE, WAIT_FOR_JOB, stage, *([WITHOUT_BITSANDBYTES] if without_bitsandbytes else [])]
    process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env=worker_env(plan, env))
    try:
        yield process
    finally:
        assert process.stdin is not None
        if not process.stdin.closed:  # no job was handed over: the worker has nothing to do
            process.kill()
            process.wait()


def warm_up(env: Mapping[str, str] | None = None) -> bool:
    """Start this process's warm worker now, so that its imports run while the caller prepares the job;
    False where the launch needs torchrun or the warm worker is off (start a worker ahead instead)."""
    env = os.environ if env is None else env
    plan = launch_plan(env)
    return not plan.torchrun and warm_worker(worker_env(plan, env)) is not None


def launch_training(
    job: TrainJob, *, log: Callable[[str], None] = print, env: Mapping[str, str] | None = None,
    started: subprocess.Popen | None = None, plan: LaunchPlan | None = None,
) -> dict[str, float]:
    """Run `job` in worker processes, passing each output line to `log`; return rank 0's metrics.
    `started`, a worker from `worker_started_ahead`, gets the job instead of a new process. With
    `plan`, `job` is one `prepare_job` already checked and resolved for it (`tuneline train` does
    so before it tokenizes); without, the job is prepared here."""
    env = os.environ if env is None else env
    if plan is None:
        plan = launch_plan(env)
        job = prepare_job(job, plan)
    output_dir = Path(job.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    job_path = job.write(output_dir / JOB_FILE)
    if trains_on_ray(job.ray, env):
        from tuneline.core.worker.ray_launch import train_on_ray

        return train_on_ray(job, job_path, log=log, env=env)
    if plan.torchrun:
        log(f"starting {plan.nproc_per_node} training process(es) on node {plan.node_rank} of {plan.nnodes} through torchrun")
    secrets = job.secret_env()
    # a worker started ahead has the environment of before the job, so a job with secrets gets its own
    process: subprocess.Popen | WarmChild | None = None
    if started is not None and not plan.torchrun and not secrets:
        process = started
        assert process.stdin is not None
        try:
            process.stdin.write(f"{job_path}\n")
            process.stdin.close()
        except BrokenPipeError:  # it ended while importing; its output says why
            pass
    elif not plan.torchrun and not secrets and not job_needs_bitsandbytes(job):
        warm = warm_worker(worker_env(plan, env))
        process = warm.start(str(job_path)) if warm is not None else None
    if process is None:
        process = subprocess.Popen(worker_command(plan, job_path), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                   env={**worker_env(plan, env), **secrets})
    return _follow(process, log=log)


def _follow(process: subprocess.Popen | WarmChild, *, log: Callable[[str], None]) -> dict[str, float]:
    """Stream the worker's output to `log` until it ends; its metrics, or its error raised."""
    metrics: dict[str, float] = {}
    errors: list[str] = []
    tail: list[str] = []
    assert process.stdout is not None
    for line in process.stdout:
        line = line.rstrip("\n")
        if line.startswith(RESULT_PREFIX):
            metrics = json.loads(line[len(RESULT_PREFIX) :])
        elif line.startswith(ERROR_PREFIX):
            errors.append(_error_message(line[len(ERROR_PREFIX) :]))
        else:
            tail = (tail + [line])[-20:]
            log(line)
    code = process.wait()
    if errors:  # a problem the user can fix, whatever status torchrun made of it
        raise TunelineError(errors[0])
    if code != 0:
        raise WorkerFailed(f"training worker exited with status {code}; last output:\n" + "\n".join(tail))
    return metrics


def _error_message(text: str) -> str:
    """The message of one error line; processes print at once, so another's output may follow it."""
    try:
        return str(json.JSONDecoder().raw_decode(text)[0])
    except json.JSONDecodeError:
        return text


def launch_plan(env: Mapping[str, str]) -> LaunchPlan:
    """How many worker processes `env` asks for on this node's GPUs (its launch variables checked)."""
    return plan_from_env(env, visible_gpus=visible_gpus(env))


def prepare_job(job: TrainJob, plan: LaunchPlan, env: Mapping[str, str] | None = None) -> TrainJob:
    """`job` with its DeepSpeed/FSDP settings checked and resolved and the world size `plan` starts;
    on Ray (`ray_launch.py`), the world size of its workers, once the cluster is known to hold them."""
    env = os.environ if env is None else env
    on_ray = trains_on_ray(job.ray, env)
    world_size = int(job.ray.get("ray_num_workers") or 1) if on_ray else plan.world_size
    problems = check_parallel_settings(job.training, pure_bf16=job.finetuning.get("pure_bf16", False))
    problems += parallel_problems(OptimizerConfig(**job.optimizer), job.training, world_size=world_size)
    if on_ray and (env.get("FORCE_TORCHRUN", "").lower() in ("1", "true", "yes", "y") or plan.nnodes > 1
                   or (env.get("NPROC_PER_NODE") and plan.nproc_per_node > 1)):
        problems.append("the stage is to train on Ray (USE_RAY=1 or ray_num_workers above 1) and through torchrun "
                        "(FORCE_TORCHRUN, NPROC_PER_NODE or NNODES); keep one launcher: unset the torchrun variables "
                        "to train on Ray, or unset USE_RAY and set ray_num_workers: 1.")
    if problems:
        raise ConfigError(problems)
    if on_ray:
        from tuneline.core.worker.ray_launch import connect

        connect(job, env)
    return dataclasses.replace(job, training=resolve_parallel_settings(job.training), world_size=world_size)


def on_ray(job: TrainJob, env: Mapping[str, str] | None = None) -> bool:
    """Whether `job` trains on Ray (no worker of this machine is started ahead for it)."""
    return trains_on_ray(job.ray, os.environ if env is None else env)
