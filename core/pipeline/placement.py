"""Where a pipeline's stages run: `work_pool`, `job_variables`, `retries` and, on Ray, `resources`
(docs/ARCHITECTURE.md, "Pipelines"), read from the pipeline YAML's top, its defaults, each stage and
the `key=value` overrides, and checked there (core/pipeline/spec.py builds the stages)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from tuneline.core.errors import listed, nearest

PLACEMENT_KEYS = ("work_pool", "job_variables", "retries", "resources")
TASK_RUNNERS = ("local", "ray")  # the stages' runner: this process (and work pools), or a Ray cluster
RAY_RUNNER = "ray"
DEFAULT_RAY_RESOURCES = {"CPU": 1.0}


@dataclass(frozen=True)
class Placement:
    """Where a stage runs and how often a crashed run of it is submitted again."""

    work_pool: str | None = None
    """The Prefect work pool whose worker runs the stage; None: the pipeline's own process."""
    job_variables: Mapping[str, Any] = field(default_factory=dict)
    """The flow run's job variables on that pool (a process pool's `env`, a Kubernetes pool's fields)."""
    retries: int = 1
    """Flow runs of the stage submitted again after one crashed or was found dead."""
    ray_resources: Mapping[str, float] | None = None
    """The Ray resources each of the stage's tasks holds (`resources:`, e.g. {CPU: 1, GPU: 1}) when the
    pipeline runs on Ray (`task_runner: ray`); None: it does not."""

    @property
    def elsewhere(self) -> str | None:
        """Where the stage runs when not in the pipeline's own process, in words; None when it does."""
        if self.work_pool is not None:
            return f"work pool '{self.work_pool}'"
        return "the Ray cluster" if self.ray_resources is not None else None


class PlacedStage(Protocol):
    """A stage of spec.py (BaseStage, TrainingStage): a frozen dataclass with a name and a placement."""

    name: str
    placement: Placement


Stage = TypeVar("Stage", bound=PlacedStage)


def parallel_training_value(value: Any, problems: list[str]) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        problems.append(f"'parallel_training: {value}' must be a whole number of at least 1: how many training stages "
                        "run at the same time in the pipeline's own process (default 1, since one training stage uses "
                        "every core and GPU of the machine).")
        return 1
    return value


def task_runner_value(value: Any, problems: list[str]) -> str:
    if value not in TASK_RUNNERS:
        guess = nearest(str(value), TASK_RUNNERS)
        problems.append(f"'task_runner: {value}' is not a task runner; choose {listed(TASK_RUNNERS)}"
                        + (f" (did you mean '{guess}'?)" if guess else "") + ": `local` runs the stages in the pipeline's "
                        "process (and on work pools), `ray` as Ray tasks on the cluster at RAY_ADDRESS.")
        return "local"
    return value


def top_pool(pool: Any, problems: list[str]) -> str | None:
    if pool is not None and (not isinstance(pool, str) or not pool.strip()):
        problems.append(f"'work_pool: {pool}' must name a Prefect work pool (a non-empty string) that runs every stage, "
                        "e.g. work_pool=gpu; remove it to run the stages in the pipeline's process.")
        return None
    return pool


def placed(stage: Stage | None, entry: Any, inherited: Mapping[str, Any], everywhere: Mapping[str, Any],
           per_stage: Mapping[str, Mapping[str, Any]], problems: list[str], *, on_ray: bool) -> Stage | None:
    """`stage` with its placement: the top-level `work_pool` and `defaults`, then the stage entry, then
    `key=value`, then `stage.key=value`."""
    if stage is None:
        return None
    values = {k: v for k, v in inherited.items() if v is not None}
    for source in (entry, everywhere, per_stage.get(stage.name, {})):
        values.update({k: v for k, v in source.items() if k in PLACEMENT_KEYS})
    before = len(problems)
    pool, variables, retries = values.get("work_pool"), values.get("job_variables") or {}, values.get("retries", 1)
    if pool is not None and (not isinstance(pool, str) or not pool.strip()):
        problems.append(f"stage '{stage.name}': 'work_pool: {pool}' must name a Prefect work pool (a non-empty string), "
                        f"e.g. {stage.name}.work_pool=gpu; remove it to run the stage in the pipeline's process.")
    if not isinstance(variables, Mapping) or not all(isinstance(k, str) for k in variables):
        problems.append(f"stage '{stage.name}': 'job_variables: {variables}' must be a mapping of the work pool's job "
                        f"variables, e.g. {stage.name}.job_variables='{{env: {{CUDA_VISIBLE_DEVICES: \"1\"}}}}'.")
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        problems.append(f"stage '{stage.name}': 'retries: {retries}' must be a whole number of 0 or more: how many times a "
                        "crashed flow run of the stage is submitted again (default 1).")
    if variables and pool is None and len(problems) == before:
        problems.append(f"stage '{stage.name}': 'job_variables' are a work pool's settings, but the stage names no "
                        "'work_pool'; add work_pool: NAME (at the top or in the stage), or remove job_variables.")
    resources = ray_resources(stage.name, values.get("resources"), pool=pool, on_ray=on_ray, problems=problems)
    if len(problems) > before:
        return stage
    return dataclasses.replace(stage, placement=Placement(work_pool=pool, job_variables=dict(variables), retries=retries,
                                                          ray_resources=resources))


def ray_resources(name: str, resources: Any, *, pool: Any, on_ray: bool, problems: list[str]) -> dict[str, float] | None:
    """A stage's `resources` on Ray ({CPU: 1} unless it names them); None when the pipeline is not on Ray."""
    if resources is not None and (not isinstance(resources, Mapping) or not resources or any(
            not isinstance(k, str) or isinstance(v, bool) or not isinstance(v, int | float) or v < 0 for k, v in resources.items())):
        problems.append(f"stage '{name}': 'resources: {resources}' must be a mapping of Ray resource names to amounts of 0 "
                        f"or more, e.g. {name}.resources='{{CPU: 2, GPU: 1}}'.")
        return None
    if not on_ray:
        if resources is not None:
            problems.append(f"stage '{name}': 'resources: {resources}' are the Ray resources a stage's tasks hold, but the "
                            "pipeline does not run on Ray; add 'task_runner: ray' at the top (or pass task_runner=ray), "
                            "or remove resources.")
        return None
    if pool is not None:
        problems.append(f"stage '{name}': 'work_pool: {pool}' puts the stage on a work pool, and 'task_runner: ray' runs "
                        f"every stage as a Ray task; a stage runs in one place: remove {name}'s work_pool, or the "
                        "task_runner.")
        return None
    return {str(k): float(v) for k, v in (resources or DEFAULT_RAY_RESOURCES).items()}
