"""Keys of training on a Ray cluster (Ray Train), with LLaMA-Factory's names and defaults.

A stage trains on Ray when `USE_RAY=1` is in the environment (as LLaMA-Factory reads it) or
`ray_num_workers` is above 1; every other key then means what it means under torchrun.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tuneline.core.config.fields import documented as _doc

PLACEMENT_STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")
STORAGE_FILESYSTEMS = ("s3", "gs", "gcs")
_TRUE = ("1", "true", "yes", "y")


@dataclass(frozen=True)
class RayConfig:
    ray_num_workers: int = _doc("Ray Train workers (training processes) across the cluster.", default=1)
    ray_init_kwargs: dict | str | None = _doc("Arguments of ray.init, a mapping or its JSON.", default=None)
    ray_run_name: str | None = _doc("Name of the Ray Train run (its folder under ray_storage_path).", default=None)
    ray_storage_path: str | None = _doc("Where Ray keeps the run's results and final checkpoint: a local path or "
                                        "s3://bucket/prefix (default: Ray's own, ~/ray_results).", default=None)
    ray_storage_filesystem: str | None = _doc("Filesystem of ray_storage_path: s3, gs or gcs (default: from its URL).",
                                              default=None)
    resources_per_worker: dict | str | None = _doc("Resources each worker holds, e.g. {GPU: 1} (default: one GPU "
                                                   "where the cluster has GPUs, else one CPU).", default=None)
    placement_strategy: str = _doc("How the workers spread over nodes: PACK, SPREAD, STRICT_PACK, STRICT_SPREAD.",
                                   default="PACK")
    ray_max_failures: int | None = _doc("Worker failures Ray Train recovers from by restarting the workers from the "
                                        "newest checkpoint (default: 1 when save_steps is set, else 0).", default=None)


def trains_on_ray(config: Mapping[str, Any], env: Mapping[str, str]) -> bool:
    """Whether a stage with RayConfig values `config` trains on Ray in environment `env`."""
    return env.get("USE_RAY", "").lower() in _TRUE or int(config.get("ray_num_workers") or 1) > 1


def mapping_value(key: str, value: dict | str | None) -> dict[str, Any]:
    """A mapping key (`resources_per_worker`, `ray_init_kwargs`), given as a mapping or its JSON, as a dict;
    ValueError naming the key otherwise."""
    if value is None:
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise ValueError(f"'{key}: {value}' is neither a mapping nor its JSON ({e}); write it as, for example, "
                             f"{key}: {{CPU: 1}}.") from e
    if not isinstance(value, dict):
        raise ValueError(f"'{key}' must be a mapping, got {value!r}.")
    return value


def ray_problems(config: RayConfig) -> list[str]:
    """Every Ray key's problem, each naming the key, the value and the fix."""
    problems = []
    if config.ray_num_workers < 1:
        problems.append(f"'ray_num_workers' must be 1 or more, got {config.ray_num_workers}.")
    if config.placement_strategy not in PLACEMENT_STRATEGIES:
        problems.append(f"'placement_strategy: {config.placement_strategy}' is not one of Ray's strategies; choose one of "
                        f"{', '.join(PLACEMENT_STRATEGIES)}.")
    if config.ray_storage_filesystem is not None and config.ray_storage_filesystem not in STORAGE_FILESYSTEMS:
        problems.append(f"'ray_storage_filesystem: {config.ray_storage_filesystem}' is not one of "
                        f"{', '.join(STORAGE_FILESYSTEMS)}; remove it for a local ray_storage_path.")
    if config.ray_max_failures is not None and config.ray_max_failures < 0:
        problems.append(f"'ray_max_failures' must be 0 or more, got {config.ray_max_failures}.")
    for key in ("resources_per_worker", "ray_init_kwargs"):
        try:
            values = mapping_value(key, getattr(config, key))
        except ValueError as e:
            problems.append(str(e))
            continue
        if key == "resources_per_worker" and any(not isinstance(n, int | float) or n < 0 for n in values.values()):
            problems.append(f"'resources_per_worker: {values}' must map resource names to amounts of 0 or more, "
                            "e.g. {GPU: 1}.")
    return problems
