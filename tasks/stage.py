"""The Prefect task around one stage unit (`core/pipeline/stage_unit.py: run_stage_unit`).

The artifact store is the only cache. Stage tasks keep no Prefect results and use no Prefect cache
policy: each task run executes the unit, which finds its key's artifact in the store (a manifest
read and a stat per file) or computes it, and records the outcome in an MLflow child run. A hit
ends the task run in a Completed state named "Cached", so Prefect's UI still shows which stages
were served; the task is named after what the unit does (`train`, `merge`), its run after the
stage key.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AbstractContextManager
from functools import cache
from typing import Any

from prefect import Task, get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.states import Completed, State

from tuneline.core.pipeline.references import ArtifactRef, ModelInput
from tuneline.core.pipeline.stage_unit import Announcer, RunContext, StageUnit, run_stage_unit, unit_key

# What a stage task returns: its reference, wrapped in a "Cached" state when the store served it.
StageOutcome = ArtifactRef | State


def named_after_key(parameters: dict[str, Any]) -> str:
    return unit_key(parameters["unit"], parameters["inputs"])


@task(name="stage", cache_policy=NO_CACHE, persist_result=False, task_run_name=named_after_key)
def stage_task(context: RunContext, unit: StageUnit, inputs: Mapping[str, ModelInput],
               computing_slot: AbstractContextManager[Any] | None = None) -> StageOutcome:
    result = run_stage_unit(unit, inputs, context=context, announcer=task_announcer(), computing_slot=computing_slot)
    return Completed(name="Cached", data=result) if result.cache_hit else result


def task_announcer() -> Announcer:
    """A stage's messages into the task run's Prefect log."""
    logger = get_run_logger()
    return Announcer(log=logger.info, warn=logger.warning)


def task_for(unit: StageUnit) -> Task[..., StageOutcome]:
    """The stage task, named after what `unit` does."""
    return _named_task(unit.action)


@cache
def _named_task(action: str) -> Task[..., StageOutcome]:
    return stage_task.with_options(name=action)
