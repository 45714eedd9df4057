"""A pipeline's stages as Ray tasks (`task_runner: ray`): the cluster checked first, each unit run on a node.

`connect_cluster` connects this process to the cluster at RAY_ADDRESS (unset: a local Ray started
for the run) and checks that every stage's `resources` fit on one of its nodes, since Ray waits
without a word for a task no node can hold. Each unit then travels as a `RayUnit` (plain values and
the checked pipeline) and runs on whichever node Ray picks (`run_ray_unit`): the dataset folders come
from the store, as on a work pool's worker (`shipped_datasets.py`), and the stage's MLflow run is
tagged with the Ray id of that node. The orchestrator that submits the tasks lives in flows/.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tuneline.core.errors import ConfigError
from tuneline.core.pipeline.keys import PipelineFingerprints
from tuneline.core.pipeline.references import ArtifactRef, ModelInput
from tuneline.core.pipeline.spec import Pipeline
from tuneline.core.pipeline.stage_unit import WORKER_ENV, Announcer, RunContext, run_stage_unit
from tuneline.core.pipeline.train_unit import TrainUnit, warm_up_training
from tuneline.core.pipeline.unit_plan import UnitAddress, rebuild_sent_unit
from tuneline.core.worker.ray_launch import FORWARDED_ENV_PREFIXES, RAY_EXTRA, unanswered_address

_ASKED = "the pipeline runs its stages on Ray ('task_runner: ray')"


@dataclass(frozen=True)
class RayUnit:
    """What a Ray task is sent to run one unit: the unit's address in the checked pipeline, and its key."""

    pipeline: Pipeline
    fingerprints: PipelineFingerprints
    address: UnitAddress
    key: str
    """The key the pipeline gave the unit; the node must key it the same (the same tuneline code)."""
    datasets: Mapping[str, str] = field(default_factory=dict)
    """The `datasets` artifact of each dataset folder (`shipped_datasets.ship_datasets`)."""
    env: Mapping[str, str] = field(default_factory=dict)
    """The launching process's hub, tuneline, MLflow and object-store variables, set on the node."""


def forwarded_env(env: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith(FORWARDED_ENV_PREFIXES) and k != WORKER_ENV}


def ray_remote_options(resources: Mapping[str, float]) -> dict[str, Any]:
    """`resources` ({CPU: 2, GPU: 1, custom: 1}) as the arguments of `ray.remote`. Tasks are spread
    over the nodes that have them free: Ray's default fills the launching machine's node first."""
    custom = {k: v for k, v in resources.items() if k not in ("CPU", "GPU")}
    return {"num_cpus": resources.get("CPU", 0), "num_gpus": resources.get("GPU", 0), "scheduling_strategy": "SPREAD",
            **({"resources": custom} if custom else {})}


def connect_cluster(pipeline: Pipeline, env: Mapping[str, str]) -> str | None:
    """Connect to the Ray cluster the stages run on and check it holds each stage's resources; the
    address (None: a local Ray started here). Every problem is a ConfigError before any work."""
    try:
        import ray
    except ImportError as e:
        raise ConfigError(f"{_ASKED}, and Ray is not installed in this environment ({e}); install the ray extra with "
                          f"`{RAY_EXTRA}`, or remove task_runner to run the stages in this process.") from e
    address = env.get("RAY_ADDRESS") or None
    if (unanswered := unanswered_address(address)) is not None:
        raise ConfigError(f"{_ASKED}, and no Ray cluster answers at RAY_ADDRESS={address} ({unanswered}); start one there "
                          "(`ray start --head`), point RAY_ADDRESS at its head node (host:port of its GCS), or "
                          "unset RAY_ADDRESS to run the stages on a local Ray.") from unanswered
    if not ray.is_initialized():
        try:
            ray.init(address=address, logging_level="WARNING", namespace="tuneline")
        except (ConnectionError, RuntimeError, ValueError) as e:
            raise ConfigError(f"{_ASKED}, and connecting to the Ray cluster at RAY_ADDRESS={address} failed: {e}; check "
                              "RAY_ADDRESS.") from e
    nodes = [dict(node["Resources"]) for node in ray.nodes() if node.get("Alive")]
    problems = resource_problems(pipeline, nodes, where=f"the Ray cluster at {address}" if address else "the local Ray")
    if problems:
        ray.shutdown()
        raise ConfigError(problems)
    return address


def resource_problems(pipeline: Pipeline, nodes: list[Mapping[str, float]], *, where: str) -> list[str]:
    """A problem for each stage whose `resources` no single node of the cluster holds."""
    problems = []
    for stage in pipeline.stages:
        asked = stage.placement.ray_resources or {}
        if any(all(node.get(name, 0) >= amount for name, amount in asked.items()) for node in nodes):
            continue
        most = {name: max((node.get(name, 0) for node in nodes), default=0) for name in asked}
        short = ", ".join(f"{amount:g} {name} (the largest node has {most[name]:g})"
                          for name, amount in asked.items() if amount > most[name])
        problems.append(f"stage '{stage.name}': 'resources: {dict(asked)}' asks for "
                        f"{short or 'more than any one node holds at once'}, and a stage's task runs on one node of "
                        f"{where} ({len(nodes)} node(s)), so Ray would wait for it forever; lower "
                        f"{stage.name}.resources, or add a node that has them.")
    return problems


def run_ray_unit(sent: RayUnit, inputs: Mapping[str, ModelInput], *, context: RunContext,
                 announcer: Announcer) -> ArtifactRef:
    """Run the unit on this Ray node: its MLflow run tagged with the node's Ray id."""
    import ray

    os.environ.update(sent.env)
    os.environ[WORKER_ENV] = ray.get_runtime_context().get_node_id()
    if sent.address.kind == TrainUnit.kind:  # the trainer's imports run while the stage's inputs are fetched
        warm_up_training(sent.pipeline.stage(sent.address.stage))
    unit = rebuild_sent_unit(sent.pipeline, sent.fingerprints, sent.address, inputs, key=sent.key, datasets=sent.datasets,
                             workspace=context.workspace, machine=f"the Ray node {os.environ[WORKER_ENV]}")
    return run_stage_unit(unit, inputs, context=context, announcer=announcer)
