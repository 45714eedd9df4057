"""The Prefect task that runs one stage unit on a Ray node (`task_runner: ray`; core/pipeline/ray_stages.py).

The pipeline submits it through prefect-ray's RayTaskRunner with the stage's Ray resources; like
the in-process stage task it keeps no Prefect result, and a unit the store served ends "Cached".
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache
from typing import Any

from prefect import Task, task
from prefect.cache_policies import NO_CACHE
from prefect.states import Completed

from tuneline.core.pipeline.ray_stages import RayUnit, run_ray_unit
from tuneline.core.pipeline.references import ModelInput
from tuneline.core.pipeline.stage_unit import RunContext
from tuneline.tasks.stage import StageOutcome, task_announcer


def named_after_key(parameters: dict[str, Any]) -> str:
    return parameters["sent"].key


@task(name="stage", cache_policy=NO_CACHE, persist_result=False, task_run_name=named_after_key)
def ray_stage_task(context: RunContext, sent: RayUnit, inputs: Mapping[str, ModelInput]) -> StageOutcome:
    result = run_ray_unit(sent, inputs, context=context, announcer=task_announcer())
    return Completed(name="Cached", data=result) if result.cache_hit else result


def ray_task_for(action: str) -> Task[..., StageOutcome]:
    """The Ray stage task, named after what the unit does (`train`, `merge`)."""
    return _named_task(action)


@cache
def _named_task(action: str) -> Task[..., StageOutcome]:
    return ray_stage_task.with_options(name=action)
