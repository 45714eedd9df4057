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
    """What is missing on disk, found before any model loads (the layout itself is checked as it is read)."""
    problems = []
    for task in plan.benchmarks:
        folder = Path(plan.task_dir) / task.split("_")[0]
        if not folder.is_dir():
            problems.append(f"'evaluate.benchmarks': benchmark '{task}' reads the folder {folder.resolve()}, which does not "
                            "exist; set 'evaluate.task_dir' to the folder holding LLaMA-Factory's evaluation layout "
                            "(mmlu/, cmmlu/, ceval/ with mapping.json).")
    if plan.harness_include_path and not Path(plan.harness_include_path).is_dir():
        problems.append(f"'evaluate.harness_include_path': {Path(plan.harness_include_path).resolve()} is not a folder; "
                        "point it at the folder of your lm-evaluation-harness task YAMLs.")
    return problems


def check_plan(plan: BenchmarkPlan, *, source: str | None = None) -> None:
    problems = plan_problems(plan)
    if problems:
        raise ConfigError(problems, source=source)
