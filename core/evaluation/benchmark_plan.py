"""The benchmarks a pipeline's `evaluate` section runs on a model it already holds: multiple-choice
benchmarks in LLaMA-Factory's layout (`multiple_choice.py`) and lm-evaluation-harness tasks
(`harness.py`), their scores merged into one flat dict of metrics for MLflow, the manifest and promotion."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tuneline.core.errors import ConfigError

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from tuneline.core.templates.spec import Template


@dataclass(frozen=True)
class BenchmarkPlan:
    """What to run; the pipeline's `evaluate` keys of the same names say what each means."""

    benchmarks: Sequence[str] = ()
    task_dir: str = "evaluation"
    n_shot: int = 5
    lang: str = "en"
    batch_size: int = 4
    harness_tasks: Sequence[str] = ()
    harness_include_path: str | None = None
    harness_num_fewshot: int | None = None
    harness_limit: int | None = None
    seed: int = 42

    def __bool__(self) -> bool:
        return bool(self.benchmarks or self.harness_tasks)


def run_benchmarks(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, *, template: Template,
                   plan: BenchmarkPlan) -> dict[str, float]:
    """Every benchmark and harness task of `plan` on `model`, as `<benchmark>_accuracy`, ... and `<task>_<metric>`."""
    from tuneline.core.evaluation.multiple_choice import evaluate_benchmark

    metrics: dict[str, float] = {}
    for task in plan.benchmarks:
        result = evaluate_benchmark(model, tokenizer, template=template, task_dir=plan.task_dir, task=task, lang=plan.lang,
                                    n_shot=plan.n_shot, batch_size=plan.batch_size, seed=plan.seed)
        metrics.update(result.metrics())
    if plan.harness_tasks:
        from tuneline.core.evaluation.harness import run_harness_tasks

        harness = run_harness_tasks(model, tokenizer, tasks=list(plan.harness_tasks), include_path=plan.harness_include_path,
                                    batch_size=plan.batch_size, limit=plan.harness_limit,
                                    num_fewshot=plan.harness_num_fewshot, seed=plan.seed)
        metrics.update(harness.metrics)
    return metrics


def plan_problems(plan: BenchmarkPlan) -> list[str]:
    """What cannot be read, found before any model loads: each benchmark read as `tuneline eval` reads it
    (its task name, folder, mapping and files), and the harness tasks' folder."""
    from tuneline.core.evaluation.benchmark_data import read_benchmark

    problems = []
    for task in plan.benchmarks:
        try:
            read_benchmark(task_dir=plan.task_dir, task=task, with_examples=plan.n_shot > 0)
        except ConfigError as e:
            problems += [f"'evaluate.benchmarks': {problem}" for problem in e.problems]
    if plan.harness_include_path and not Path(plan.harness_include_path).is_dir():
        problems.append(f"'evaluate.harness_include_path': {Path(plan.harness_include_path).resolve()} is not a folder; "
                        "point it at the folder of your lm-evaluation-harness task YAMLs.")
    return problems


def benchmark_folders(plan: BenchmarkPlan) -> dict[str, Path]:
    """The folders the plan's benchmarks and harness tasks read, by lineage name (`benchmark:mmlu`, `harness_tasks`)."""
    from tuneline.core.evaluation.benchmark_data import parse_task

    names = [parse_task(task)[0] for task in plan.benchmarks]
    folders = {f"benchmark:{name}": Path(plan.task_dir) / name for name in names}
    if plan.harness_include_path:
        folders["harness_tasks"] = Path(plan.harness_include_path)
    return folders


def check_plan(plan: BenchmarkPlan, *, source: str | None = None) -> None:
    problems = plan_problems(plan)
    if problems:
        raise ConfigError(problems, source=source)
