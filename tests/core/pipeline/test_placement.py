"""Where each stage runs: `work_pool`, `job_variables` and `retries` from the YAML and the command line."""

from __future__ import annotations

import pytest

from tuneline.core.config import parse_overrides
from tuneline.core.errors import ConfigError
from tuneline.core.pipeline.spec import Placement, build_pipeline

STAGES = [
    {"name": "base", "stage": "build_base", "corpus": "c"},
    {"name": "sft", "stage": "sft", "from": "base", "work_pool": "gpu", "job_variables": {"env": {"CUDA_VISIBLE_DEVICES": "0"}}},
    {"name": "rm", "stage": "rm", "from": "sft", "retries": 3},
]


def build(overrides: list[str], **top):
    return build_pipeline({"name": "p", "stages": STAGES, **top}, overrides=parse_overrides(overrides))


def test_top_level_pool_places_every_stage_and_a_stage_or_override_wins():
    pipeline = build([], work_pool="cpu")
    assert pipeline.stage("base").placement == Placement(work_pool="cpu")
    assert pipeline.stage("sft").placement == Placement(work_pool="gpu", job_variables={"env": {"CUDA_VISIBLE_DEVICES": "0"}})
    assert pipeline.stage("rm").placement == Placement(work_pool="cpu", retries=3)
    pipeline = build(["work_pool=big", "sft.job_variables={env: {CUDA_VISIBLE_DEVICES: '1'}}", "rm.work_pool=small",
                      "parallel_training=2"], work_pool="cpu")
    assert [pipeline.stage(name).placement.work_pool for name in ("base", "sft", "rm")] == ["big", "gpu", "small"]
    assert pipeline.stage("sft").placement.job_variables == {"env": {"CUDA_VISIBLE_DEVICES": "1"}}
    assert pipeline.parallel_training == 2


def test_without_a_pool_every_stage_runs_in_the_pipelines_process():
    pipeline = build_pipeline({"name": "p", "stages": [STAGES[0], {"name": "sft", "stage": "sft", "from": "base"}]}, overrides={})
    assert {stage.placement.work_pool for stage in pipeline.stages} == {None}
    assert pipeline.parallel_training == 1


@pytest.mark.parametrize(("overrides", "message"), [
    (["work_pool=3"], r"'work_pool: 3' must name a Prefect work pool"),
    (["sft.job_variables=5"], r"stage 'sft': 'job_variables: 5' must be a mapping"),
    (["rm.retries=-1"], r"stage 'rm': 'retries: -1' must be a whole number of 0 or more"),
    (["parallel_training=0"], r"'parallel_training: 0' must be a whole number of at least 1"),
    (["sft.work_pool=", "rm.job_variables={env: {}}"],
     r"stage 'rm': 'job_variables' are a work pool's settings, but the stage names no 'work_pool'"),
])
def test_bad_placement_is_refused_by_key(overrides, message):
    with pytest.raises(ConfigError, match=message):
        build(overrides)


RAY_STAGES = [STAGES[0], {"name": "sft", "stage": "sft", "from": "base", "resources": {"CPU": 2, "GPU": 1}},
              {"name": "rm", "stage": "rm", "from": "sft"}]


def test_task_runner_ray_gives_every_stage_its_resources_one_cpu_by_default():
    pipeline = build_pipeline({"name": "p", "stages": RAY_STAGES},
                              overrides=parse_overrides(["task_runner=ray", "rm.resources={CPU: 0.5}"]))
    assert pipeline.on_ray
    assert [pipeline.stage(name).placement.ray_resources for name in ("base", "sft", "rm")] == \
        [{"CPU": 1.0}, {"CPU": 2.0, "GPU": 1.0}, {"CPU": 0.5}]
    assert build([]).stage("rm").placement.ray_resources is None


@pytest.mark.parametrize(("top", "overrides", "message"), [
    ({"task_runner": "rey"}, [], r"'task_runner: rey' is not a task runner; choose local or ray \(did you mean 'ray'\?\)"),
    ({}, ["sft.resources={CPU: 1}"], r"stage 'sft': 'resources: \{'CPU': 1\}' are the Ray resources .* add 'task_runner: ray'"),
    ({"task_runner": "ray"}, ["rm.resources={CPU: many}"],
     r"stage 'rm': 'resources: \{'CPU': 'many'\}' must be a mapping of Ray resource names to amounts"),
    ({"task_runner": "ray"}, ["rm.resources=2"], r"stage 'rm': 'resources: 2' must be a mapping"),
    ({"task_runner": "ray"}, [], r"stage 'sft': 'work_pool: gpu' puts the stage on a work pool, and 'task_runner: ray'"),
    ({"task_runner": "ray", "work_pool": "cpu"}, [], r"'task_runner: ray' and 'work_pool: cpu' both place every stage"),
])
def test_bad_ray_placement_is_refused_by_key(top, overrides, message):
    with pytest.raises(ConfigError, match=message):
        build(overrides, **top)
