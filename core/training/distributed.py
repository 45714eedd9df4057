"""Several training processes: how many, how they are started, and the settings they share.

LLaMA-Factory's launch contract (docs/ARCHITECTURE.md, "Interfaces"): `FORCE_TORCHRUN=1 NPROC_PER_NODE=N tuneline train
...`, with `NNODES`, `NODE_RANK`, `MASTER_ADDR` and `MASTER_PORT` for several nodes, starts the
worker through torchrun; more than one visible GPU does so too. DeepSpeed and FSDP are the
trainer's own `deepspeed`, `fsdp` and `fsdp_config` arguments, so torchrun is the only launcher:
transformers builds the accelerate plugins from those arguments inside each process.
"""

from __future__ import annotations

import importlib.util
import json
import socket
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tuneline.core.errors import ConfigError

WORKER_MODULE = "tuneline.core.worker"
# What an NVIDIA (CUDA) or AMD (ROCm) driver puts on a Linux machine; torch finds no GPU without one.
GPU_DRIVER_PATHS = ("/proc/driver/nvidia", "/dev/nvidiactl", "/dev/kfd")
_TRUE = ("1", "true", "yes", "y")


@dataclass(frozen=True)
class LaunchPlan:
    """How many worker processes to start on this node, and where they meet."""

    nproc_per_node: int = 1
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int | None = None
    torchrun: bool = False

    @property
    def world_size(self) -> int:
        return self.nproc_per_node * self.nnodes


def plan_from_env(env: Mapping[str, str], *, visible_gpus: int = 0) -> LaunchPlan:
    """The launch LLaMA-Factory's environment variables ask for; every bad value named at once."""
    problems: list[str] = []
    nproc = _positive(env, "NPROC_PER_NODE", max(visible_gpus, 1), problems)
    nnodes = _positive(env, "NNODES", 1, problems)
    node_rank = _positive(env, "NODE_RANK", 0, problems, minimum=0)
    port = _positive(env, "MASTER_PORT", 0, problems) if env.get("MASTER_PORT") else None
    if not problems and node_rank >= nnodes:
        problems.append(f"NODE_RANK={node_rank} must be below NNODES={nnodes}; number the nodes 0 to {nnodes - 1}.")
    if nnodes > 1 and not (env.get("MASTER_ADDR") and env.get("MASTER_PORT")):
        problems.append(f"NNODES={nnodes} needs MASTER_ADDR and MASTER_PORT: set both to the address of the node with "
                        "NODE_RANK=0 and a free port on it, the same on every node.")
    if problems:
        raise ConfigError(problems, source="the launch environment")
    torchrun = env.get("FORCE_TORCHRUN", "").lower() in _TRUE or nproc * nnodes > 1
    return LaunchPlan(nproc_per_node=nproc, nnodes=nnodes, node_rank=node_rank,
                      master_addr=env.get("MASTER_ADDR") or "127.0.0.1", master_port=port, torchrun=torchrun)


def visible_gpus(env: Mapping[str, str]) -> int:
    """CUDA devices this node sees (only counted when NPROC_PER_NODE leaves it to them). On Linux
    without a GPU driver none are counted without importing torch, which takes seconds."""
    if env.get("NPROC_PER_NODE"):
        return 0
    if sys.platform == "linux" and not any(Path(p).exists() for p in GPU_DRIVER_PATHS):
        return 0
    import torch

    return torch.cuda.device_count()


def _positive(env: Mapping[str, str], name: str, default: int, problems: list[str], *, minimum: int = 1) -> int:
    raw = env.get(name)
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = minimum - 1
    if value < minimum:
        problems.append(f"{name}={raw!r} must be a whole number of at least {minimum}, for example {name}={max(minimum, 2)}.")
        return default
    return value


def worker_command(plan: LaunchPlan, job_path: str | Path) -> list[str]:
    """`python -m tuneline.core.worker JOB`, through torchrun when the plan asks for it."""
    worker = ["-m", WORKER_MODULE, str(job_path)]
    if not plan.torchrun:
        return [sys.executable, *worker]
    port = plan.master_port or free_port()
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(plan.nnodes), "--node-rank", str(plan.node_rank),
            "--nproc-per-node", str(plan.nproc_per_node), "--master-addr", plan.master_addr, "--master-port", str(port), *worker]


def worker_env(plan: LaunchPlan, env: Mapping[str, str]) -> dict[str, str]:
    """The workers' environment: a single worker does not inherit another launcher's rank variables,
    which would make it wait for processes that never come."""
    inherited = dict(env)
    if not plan.torchrun:
        for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK"):
            inherited.pop(name, None)
    return {**inherited, "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"}


def free_port() -> int:
    """A TCP port nobody listens on now, for a single node's rendezvous (as LLaMA-Factory picks one)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def check_world_size(expected: int, *, seen: int) -> None:
    """Fail loudly when the processes training together are not the ones the job asked for.

    `accelerate launch --num_processes 2 --cpu`, for one, starts a single process without a word,
    and a trainer told `use_cpu: false` on a machine without GPUs trains each process on its own.
    """
    if seen != expected:
        raise ConfigError(
            f"the job asks for {expected} training process(es) (NPROC_PER_NODE x NNODES) but the worker sees a world "
            f"size of {seen} training together: either the launcher started another number of processes (launch with "
            f"`FORCE_TORCHRUN=1 NPROC_PER_NODE={expected} tuneline train ...`, NNODES and NODE_RANK for several "
            "nodes, rather than another launcher) or the trainer did not join them (on a machine without GPUs, "
            "leave 'use_cpu' and 'ddp_backend' unset)."
        )


def process_group_settings(training: Mapping[str, Any], *, world_size: int, accelerator: bool) -> dict[str, Any]:
    """Trainer arguments several processes need: on a machine without GPUs, CPU processes over gloo."""
    if world_size <= 1 or accelerator:
        return {}
    return {"use_cpu": training.get("use_cpu", True), "ddp_backend": training.get("ddp_backend") or "gloo"}


def check_parallel_settings(training: Mapping[str, Any], *, pure_bf16: bool = False) -> list[str]:
    """Problems with `deepspeed`, `fsdp` and `fsdp_config`, each naming key, value and fix; with
    `pure_bf16`, ZeRO-3 too (it keeps float32 shards of its own, as LLaMA-Factory says)."""
    problems: list[str] = []
    deepspeed, fsdp, fsdp_config = training.get("deepspeed"), fsdp_setting(training.get("fsdp")), training.get("fsdp_config")
    if deepspeed:
        problems += _check_deepspeed(deepspeed)
    if pure_bf16 and deepspeed_zero_stage(deepspeed) == 3:
        problems.append(f"'pure_bf16: true' cannot train with DeepSpeed ZeRO-3 ('deepspeed: {deepspeed}'), which "
                        "partitions float32 weights of its own; remove pure_bf16, or use a ZeRO stage below 3.")
    if fsdp and deepspeed:
        problems.append("'fsdp' and 'deepspeed' are both set; they are two ways of sharding the same model, keep one.")
    if fsdp and not _has_gpus():
        problems.append(f"'fsdp: {training.get('fsdp')}' shards the model across GPUs, and this machine has none (the trainer "
                        "would quietly fall back to plain data parallelism); remove 'fsdp' and 'fsdp_config' to train "
                        "with DDP here, or run on GPUs.")
    if fsdp_config and not fsdp:
        problems.append(f"'fsdp_config: {fsdp_config}' has no effect without 'fsdp: true'; set 'fsdp: true' or remove it.")
    if isinstance(fsdp_config, str):
        problems += _config_file_problems("fsdp_config", fsdp_config)
    return problems


def _has_gpus() -> bool:
    import torch

    return torch.cuda.is_available()


def _check_deepspeed(value: Any) -> list[str]:
    problems = _config_file_problems("deepspeed", value) if isinstance(value, str) else []
    if importlib.util.find_spec("deepspeed") is None:
        problems.append(
            f"'deepspeed: {value}' asks for DeepSpeed, which is not installed here; DeepSpeed needs CUDA GPUs and "
            "`pip install deepspeed` on that machine. Remove 'deepspeed' to train with plain data parallelism (DDP)."
        )
    return problems


def _config_file_problems(key: str, value: str) -> list[str]:
    """A JSON file (or, for fsdp_config, an accelerate YAML) that exists and parses."""
    path = Path(value)
    if not path.is_file():
        return [f"'{key}: {value}' names no file (looked in {path.resolve()}); give the path of an existing config file."]
    try:
        _read_config_file(path)
    except ValueError as e:
        return [f"'{key}: {value}' does not parse: {e}; fix the file or point '{key}' at another one."]
    return []


def resolve_parallel_settings(training: Mapping[str, Any]) -> dict[str, Any]:
    """`training` with its config files as absolute paths, an accelerate FSDP YAML read into a dict
    (transformers reads only JSON there), so every process and node reads the same settings."""
    resolved = dict(training)
    if "fsdp" in resolved:
        resolved["fsdp"] = fsdp_setting(resolved["fsdp"])
    if isinstance(resolved.get("deepspeed"), str):
        resolved["deepspeed"] = str(Path(resolved["deepspeed"]).resolve())
    if isinstance(resolved.get("fsdp_config"), str):
        path = Path(resolved["fsdp_config"])
        loaded = _read_config_file(path)
        resolved["fsdp_config"] = loaded.get("fsdp_config", loaded) if path.suffix in (".yaml", ".yml") else str(path.resolve())
    return resolved


def deepspeed_settings(value: Any) -> Mapping[str, Any]:
    """The settings a `deepspeed` value (a JSON file or a mapping) holds; empty when there are none
    or the file cannot be read (`check_parallel_settings` reports that)."""
    if not value:
        return {}
    try:
        return value if isinstance(value, Mapping) else _read_config_file(Path(value))
    except (OSError, ValueError):
        return {}


def deepspeed_zero_stage(value: Any) -> int | None:
    """The ZeRO stage a `deepspeed` setting names, or None."""
    stage = deepspeed_settings(value).get("zero_optimization", {}).get("stage")
    return int(stage) if isinstance(stage, int | str) and str(stage).isdigit() else None


def fsdp_setting(value: Any) -> bool | str | None:
    """`fsdp` as the trainer takes it: True, None (off) or a legacy option string ("full_shard auto_wrap").

    The config reads the trainer's `fsdp: str | None` field, so a YAML `true` arrives as "True",
    which the trainer would refuse as an unknown option.
    """
    if isinstance(value, str) and value.strip().lower() in ("true", "false", ""):
        value = value.strip().lower() == "true"
    return value or None


def _read_config_file(path: Path) -> dict[str, Any]:
    text = path.read_text(encoding="utf-8")
    if path.suffix in (".yaml", ".yml"):
        import yaml

        try:
            loaded = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise ValueError(str(e).splitlines()[0]) from e
    else:
        try:
            loaded = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(str(e)) from e
    if not isinstance(loaded, dict):
        raise ValueError(f"expected a mapping of settings, got {type(loaded).__name__}")
    if path.suffix in (".yaml", ".yml") and not isinstance(loaded.get("fsdp_config", {}), dict):
        raise ValueError("its 'fsdp_config' entry is not a mapping of settings")
    return loaded
