"""Keys of `tuneline eval`: LLaMA-Factory's multiple-choice benchmark evaluation (`llamafactory-cli eval`).

An eval YAML is flat, as LLaMA-Factory writes it: the benchmark keys below beside the model, adapter,
template and method keys of a stage (`model_name_or_path`, `adapter_name_or_path`, `template`,
`finetuning_type`, `infer_dtype`, ...). Trainer arguments are refused, as LLaMA-Factory's eval parser
refuses them. Only `tuneline eval` reads these keys; `tuneline train` and pipelines refuse them by name
(`llamafactory.py`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from tuneline.core.config.coercion import coerce_fields
from tuneline.core.config.fields import documented as _doc
from tuneline.core.config.llamafactory import REFUSED_KEYS
from tuneline.core.config.reading import parse_overrides, read_stage_config, read_yaml, training_fields
from tuneline.core.config.stage import GROUPS, StageConfig
from tuneline.core.errors import ConfigError, nearest

EVAL_COMMAND = "tuneline eval"


@dataclass(frozen=True)
class BenchmarkConfig:
    task: str | None = _doc("Benchmark and split, as <benchmark>_<split>: mmlu_test, mmlu_validation, cmmlu_test, "
                            "ceval_validation, ... (split: train, validation or test).", default=None)
    task_dir: str = _doc("Folder holding the benchmarks' folders (mmlu/, cmmlu/, ceval/), LLaMA-Factory's "
                         "`evaluation/`.", default="evaluation")
    lang: Literal["en", "zh"] = _doc("Language of the prompt's instruction and answer cue: en or zh.", default="en")
    n_shot: int = _doc("Solved examples from the subject's dev split put before each question.", default=5)
    save_dir: str | None = _doc("Folder to write results.json and results.log to; it must not exist yet "
                                "(None: print the scores only).", default=None)
    batch_size: int = _doc("Questions scored per forward pass.", default=4)
    seed: int = _doc("Seed of the draw of each question's n-shot examples.", default=42)
    download_mode: Literal["reuse_dataset_if_exists", "reuse_cache_if_exists", "force_redownload"] = _doc(
        "LLaMA-Factory's datasets download mode; read and checked, but tuneline reads benchmarks from task_dir "
        "only, so it changes nothing.", default="reuse_dataset_if_exists")


@dataclass(frozen=True)
class EvalConfig:
    """A `tuneline eval` YAML, read and checked: the benchmark keys, and the model, adapter, template
    and method keys as a stage reads them (`stage.training` is always empty)."""

    benchmark: BenchmarkConfig
    stage: StageConfig


BENCHMARK_KEYS = frozenset(f.name for f in dataclasses.fields(BenchmarkConfig))
_STAGE_FIELDS = frozenset(f.name for group in GROUPS.values() for f in dataclasses.fields(group))


def read_eval_config(raw: Mapping[str, Any]) -> tuple[EvalConfig, list[str]]:
    """Split a flat mapping into the benchmark keys and the stage's; the config and every problem found."""
    stage_raw = {key: value for key, value in raw.items()
                 if key not in BENCHMARK_KEYS and (key in _STAGE_FIELDS or key in REFUSED_KEYS)}
    problems = [_not_read(key, value) for key, value in raw.items() if key not in stage_raw and key not in BENCHMARK_KEYS]
    stage, stage_problems = read_stage_config(stage_raw)  # its `training` stays empty: no trainer key reaches it
    problems.extend(stage_problems)
    benchmark = BenchmarkConfig(**coerce_fields(BenchmarkConfig, {k: v for k, v in raw.items() if k in BENCHMARK_KEYS},
                                                problems))
    problems.extend(benchmark_problems(benchmark, stage))
    return EvalConfig(benchmark=benchmark, stage=stage), problems


def _not_read(key: str, value: Any) -> str:
    """A key that is neither a benchmark key nor a stage config's: a trainer argument (one transformers
    renamed, such as warmup_ratio, included), or unknown."""
    if key in training_fields() or read_stage_config({key: value})[0].training:
        return (f"'{key}' is a trainer argument; {EVAL_COMMAND} trains nothing and does not read it (LLaMA-Factory's eval "
                "refuses it too); remove it.")
    guess = nearest(key, BENCHMARK_KEYS | _STAGE_FIELDS)
    if guess:
        return f"unknown key '{key}'; did you mean '{guess}'?"
    return (f"unknown key '{key}': {EVAL_COMMAND} reads the benchmark keys ({', '.join(sorted(BENCHMARK_KEYS))}) and "
            "a stage's model, adapter, template and method keys; remove it.")


def benchmark_problems(benchmark: BenchmarkConfig, stage: StageConfig) -> list[str]:
    """What the values of the benchmark keys cannot do (the benchmark's files are checked when read)."""
    problems = []
    if not stage.model.model_name_or_path:
        problems.append("'model_name_or_path' is required: the model (folder or hub id) to evaluate.")
    if not benchmark.task:
        problems.append("'task' is required: the benchmark and split to evaluate, such as mmlu_test, cmmlu_test or "
                        "ceval_validation.")
    if isinstance(benchmark.n_shot, int) and benchmark.n_shot < 0:
        problems.append(f"'n_shot: {benchmark.n_shot}' must be 0 or more: the number of solved examples shown before "
                        "each question (LLaMA-Factory's default is 5).")
    if isinstance(benchmark.batch_size, int) and benchmark.batch_size < 1:
        problems.append(f"'batch_size: {benchmark.batch_size}' must be 1 or more: the questions scored per forward pass.")
    if benchmark.save_dir and Path(benchmark.save_dir).exists():
        problems.append(save_dir_exists_message(benchmark.save_dir))
    return problems


def save_dir_exists_message(save_dir: str | Path) -> str:
    return (f"'save_dir: {save_dir}' already exists; {EVAL_COMMAND}, like LLaMA-Factory, writes its results only into a "
            "new folder and never over earlier ones: name a folder that does not exist yet, or move the old one away.")


def load_eval_config(path: str | Path, overrides: list[str] | None = None) -> EvalConfig:
    """The eval YAML at `path` with `key=value` overrides, or one ConfigError listing every problem."""
    raw = read_yaml(path)
    raw.update(parse_overrides(overrides or []))
    config, problems = read_eval_config(raw)
    if problems:
        raise ConfigError(problems, source=str(path))
    return config
