"""`run_harness_tasks`: EleutherAI's lm-evaluation-harness tasks on a model already in memory.

    from tuneline.core.evaluation.harness import run_harness_tasks
    result = run_harness_tasks(model, tokenizer, tasks=["arith_mc"], include_path="data/harness_tasks",
                               batch_size=8, limit=None, num_fewshot=None, seed=0)
    result.metrics  # {"arith_mc_acc": 0.4, "arith_mc_acc_stderr": 0.11, "arith_mc_acc_norm": 0.3, ...}

Needs the `harness` extra (`pip install -e ".[harness]"`); lm_eval is imported only here, when called.

- The model (a transformers `PreTrainedModel`, or a peft model on one) and its tokenizer are handed
  to lm_eval's `HFLM` as they are, on the model's own device: nothing is loaded again. lm_eval puts
  the model in eval mode; its train/eval mode is restored afterwards. A tokenizer without a pad
  token is copied first, since lm_eval sets one on the tokenizer it is given.
- A task name is looked up among the YAML files under `include_path` first, and only if it is not
  there among lm_eval's ~15,000 built-in tasks (indexing those takes seconds).
- Data files: in a task YAML of `include_path`, relative paths in `dataset_kwargs.data_files` and
  `dataset_kwargs.data_dir` (and a `dataset_path` starting with `.`) are read from the YAML's own
  folder. lm_eval would hand them to `datasets.load_dataset` as written, which reads them from the
  working directory. So such a task is loaded with lm_eval's own YAML loader (includes and
  `!function`s resolved, as lm_eval's command line does for a YAML path) and given to lm_eval as a
  config with those paths made absolute; the YAML file itself is neither changed nor copied. Tasks
  named through a group or tag of `include_path` get no such help: name the tasks themselves.
- No network: the Hugging Face Hub is switched off for the call, so a built-in task runs only if its
  data set is already in the local `datasets` cache; a local file that is missing is reported first.
- Metrics (`HarnessResult.metrics`) are named `{task}_{metric}` for lm_eval's default filter
  ("acc,none" -> `arith_mc_acc`), `{task}_{metric}_{filter}` for any other filter, and standard
  errors `{task}_{metric}[_{filter}]_stderr`; characters MLflow refuses become `_`. Metrics lm_eval
  gives no number for ("N/A") are left out. Standard errors that need bootstrapping (f1, bleu, ...)
  take 1,000 resamples in this process rather than lm_eval's 100,000 in a process pool.
- Deterministic: `seed` seeds Python, NumPy, torch and the few-shot sampler as lm_eval does, and the
  caller's random states are put back afterwards.
- Quiet: lm_eval's warnings about being handed a model object (expected here) and the `datasets`
  progress bars of loading the task data are silenced; lm_eval's own progress bars stay.
- lm_eval's `evaluate` runs the tasks, set up as its `simple_evaluate` sets them up (see `_evaluate`
  for why not `simple_evaluate` itself). Two internals of lm_eval are used, as its own command line
  uses them: `lm_eval.tasks._yaml_loader.load_yaml` and `lm_eval.tasks._index.Kind`.
"""

from __future__ import annotations

import copy
import difflib
import glob
import logging
import os
import random
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from tuneline.core.errors import ConfigError, listed

if TYPE_CHECKING:
    from types import ModuleType

    from lm_eval.api.task import Task
    from lm_eval.tasks import TaskManager
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

INSTALL_HINT = 'pip install -e ".[harness]"'
BOOTSTRAP_ITERS = 1000  # resamples of a bootstrapped standard error (lm_eval's default: 100,000)
DEFAULT_FILTER = "none"  # the filter lm_eval names when a task sets none
UNSAFE_NAME_CHARACTERS = re.compile(r"[^A-Za-z0-9_.\-]")
GLOB_CHARACTERS = re.compile(r"[*?\[]")
OFFLINE_ENVIRONMENT = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "DISABLE_MULTIPROC")  # set to 1 for the call


@dataclass(frozen=True)
class HarnessResult:
    """What a harness run measured, as plain Python values (JSON-ready with `dataclasses.asdict`)."""

    metrics: dict[str, float]
    """Every number lm_eval reported, flattened to MLflow-safe names (see the module docstring)."""
    results: dict[str, dict[str, Any]]
    """lm_eval's own `results` section: per task or group, keys as lm_eval writes them ("acc,none")."""
    samples: dict[str, int]
    """Documents each task was evaluated on (after `limit`)."""
    num_fewshot: dict[str, int]
    """The few-shot examples each task's prompts held (lm_eval's `n-shot`)."""
    versions: dict[str, Any]
    """Each task's `metadata.version`, so scores of different task versions are not compared."""
    lm_eval_version: str


def run_harness_tasks(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    *,
    tasks: Sequence[str],
    include_path: str | Path | None,
    batch_size: int,
    limit: int | None,
    num_fewshot: int | None,
    seed: int,
) -> HarnessResult:
    """lm-evaluation-harness `tasks` on `model`, with task YAMLs from `include_path` besides lm_eval's
    built-in ones; `limit` keeps the first documents of each task, `num_fewshot` overrides the tasks'
    own number of examples (None: as each task says). Raises ConfigError for bad arguments, unknown
    tasks and data that cannot be read locally."""
    problems = _argument_problems(tasks=tasks, include_path=include_path, batch_size=batch_size, limit=limit,
                                  num_fewshot=num_fewshot)
    if problems:
        raise ConfigError(problems)
    lm_eval = _import_lm_eval()
    folder = Path(include_path).resolve() if include_path is not None else None
    manager = _task_manager(list(tasks), folder=folder)
    specs = _task_specs(list(tasks), manager=manager, folder=folder)
    with _caller_state_kept(model), _quiet_and_offline():
        output = _evaluate(model, tokenizer, specs=specs, manager=manager, batch_size=batch_size,
                           limit=limit, num_fewshot=num_fewshot, seed=seed)
    return _harness_result(output, version=lm_eval.__version__)


def flatten_metrics(results: Mapping[str, Mapping[str, Any]]) -> dict[str, float]:
    """lm_eval's per-task results ({"arith_mc": {"acc,none": 0.4, "acc_stderr,none": 0.1}}) as
    {"arith_mc_acc": 0.4, "arith_mc_acc_stderr": 0.1}; keys without a filter (name, alias,
    sample_len) and values that are not numbers ("N/A") are left out."""
    flat = {}
    for task, values in results.items():
        for key, value in values.items():
            metric, comma, filter_name = key.partition(",")
            if not comma or isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            flat[_metric_name(task, metric, filter_name)] = float(value)
    return flat


def _metric_name(task: str, metric: str, filter_name: str) -> str:
    """`{task}_{metric}[_{filter}][_stderr]`, with characters MLflow refuses replaced by `_`."""
    base, stderr = (metric[: -len("_stderr")], "_stderr") if metric.endswith("_stderr") else (metric, "")
    filtered = "" if filter_name == DEFAULT_FILTER else f"_{filter_name}"
    return UNSAFE_NAME_CHARACTERS.sub("_", f"{task}_{base}{filtered}{stderr}")


def _argument_problems(*, tasks: Sequence[str], include_path: str | Path | None, batch_size: int,
                       limit: int | None, num_fewshot: int | None) -> list[str]:
    """Every argument problem at once."""
    problems = []
    if isinstance(tasks, str) or not tasks:
        problems.append(f"harness `tasks` must be a non-empty list of task names, got {tasks!r}.")
    if include_path is not None and not Path(include_path).is_dir():
        problems.append(f"harness `include_path: {include_path}` is not a folder; point it at the folder that holds "
                        "your task YAML files, or leave it out to run lm_eval's built-in tasks only.")
    if batch_size < 1:
        problems.append(f"harness `batch_size: {batch_size}` must be at least 1.")
    if limit is not None and limit < 1:
        problems.append(f"harness `limit: {limit}` must be at least 1 (or left out for every document).")
    if num_fewshot is not None and num_fewshot < 0:
        problems.append(f"harness `num_fewshot: {num_fewshot}` must be 0 or more (or left out for each task's own).")
    return problems


def _import_lm_eval() -> ModuleType:
    """The lm_eval package, or a ConfigError saying how to install it."""
    try:
        import lm_eval
    except ImportError as e:
        raise ConfigError(f"running lm-evaluation-harness tasks needs the `lm_eval` package, which is not installed "
                          f"({e}); install tuneline's harness extra: `{INSTALL_HINT}`.") from e
    return lm_eval


def _task_manager(names: list[str], *, folder: Path | None) -> TaskManager:
    """lm_eval's task index over `folder` alone when it defines every name (fast), else over
    `folder` and the built-in tasks; a name in neither is a ConfigError listing close matches."""
    from lm_eval.tasks import TaskManager

    if folder is not None:
        local = TaskManager(include_path=str(folder), include_defaults=False)
        if all(name in local.all_tasks for name in names):
            return local
    manager = TaskManager(include_path=str(folder) if folder is not None else None)
    unknown = [name for name in names if name not in manager.all_tasks]
    if unknown:
        raise ConfigError([_unknown_task_message(name, manager.all_tasks, folder=folder) for name in unknown])
    return manager


def _unknown_task_message(name: str, known: Sequence[str], *, folder: Path | None) -> str:
    where = f"in the YAML files under {folder} nor " if folder is not None else ""
    close = difflib.get_close_matches(name, known, n=5, cutoff=0.6)
    hint = f"; did you mean {listed([repr(c) for c in close])}?" if close else "."
    unreadable = _unreadable_yamls(folder) if folder is not None else []
    skipped = (f" lm_eval skipped these YAML files, which it cannot read: {', '.join(unreadable)}."
               if unreadable else "")
    return (f"harness task '{name}' is defined neither {where}among lm-evaluation-harness's built-in tasks "
            f"(a task's name is the `task:` value of its YAML file){hint}{skipped}")


def _unreadable_yamls(folder: Path) -> list[str]:
    """The YAML files under `folder` that lm_eval's loader cannot read (its index skips them silently)."""
    from lm_eval.tasks._yaml_loader import load_yaml

    unreadable = []
    for path in sorted(folder.rglob("*.yaml")):
        try:
            load_yaml(path, resolve_func=False)
        except Exception as e:  # yaml, include and shape errors alike: lm_eval skips the file for any of them
            unreadable.append(f"{path} ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})")
    return unreadable


def _task_specs(names: list[str], *, manager: TaskManager, folder: Path | None) -> list[str | dict[str, Any]]:
    """What lm_eval is asked to run: a task of `folder` as its config with local paths resolved
    (every missing file reported at once), anything else (built-ins, groups, tags) by name."""
    from lm_eval.tasks._index import Kind

    specs: list[str | dict[str, Any]] = []
    problems: list[str] = []
    for name in names:
        entry = manager.task_index[name]
        path = Path(entry.yaml_path).resolve() if entry.yaml_path is not None else None
        if entry.kind is not Kind.TASK or path is None or folder is None or not path.is_relative_to(folder):
            specs.append(name)
            continue
        config = _local_task_config(path)
        problems += _missing_data_problems(name, config, yaml_path=path)
        specs.append(config)
    if problems:
        raise ConfigError(problems)
    return specs


def _local_task_config(path: Path) -> dict[str, Any]:
    """The task YAML at `path` as lm_eval reads it, its relative data paths made absolute from its folder."""
    from lm_eval.tasks._yaml_loader import load_yaml

    config = load_yaml(path, resolve_func=True)
    kwargs = dict(config.get("dataset_kwargs") or {})
    if "data_files" in kwargs:
        kwargs["data_files"] = _resolved_files(kwargs["data_files"], folder=path.parent)
    if isinstance(kwargs.get("data_dir"), str):
        kwargs["data_dir"] = _resolved_path(kwargs["data_dir"], folder=path.parent)
    if kwargs:
        config["dataset_kwargs"] = kwargs
    dataset_path = config.get("dataset_path")
    if isinstance(dataset_path, str) and dataset_path.startswith("."):
        config["dataset_path"] = _resolved_path(dataset_path, folder=path.parent)
    return config


def _resolved_files(files: Any, *, folder: Path) -> Any:
    """`data_files` (a path, a list of them, or a split -> path(s) mapping) with relative paths resolved."""
    if isinstance(files, str):
        return _resolved_path(files, folder=folder)
    if isinstance(files, Mapping):
        return {split: _resolved_files(value, folder=folder) for split, value in files.items()}
    if isinstance(files, (list, tuple)):
        return [_resolved_files(value, folder=folder) for value in files]
    return files


def _resolved_path(value: str, *, folder: Path) -> str:
    """`value` read from `folder` if relative; absolute paths and URLs (`hf://`, `https://`) as they are."""
    if "://" in value:
        return value
    path = Path(value).expanduser()
    return str(path if path.is_absolute() else (folder / path).resolve())


def _missing_data_problems(task: str, config: Mapping[str, Any], *, yaml_path: Path) -> list[str]:
    """A problem for each local data file (or glob pattern) of `task` that is not there."""
    files = (config.get("dataset_kwargs") or {}).get("data_files")
    problems = []
    for file in _file_list(files):
        if "://" in file or (glob.glob(file) if GLOB_CHARACTERS.search(file) else Path(file).is_file()):
            continue
        problems.append(f"harness task '{task}' ({yaml_path}) reads the data file {file}, which does not exist; "
                        "put the file there or fix `dataset_kwargs.data_files` (relative paths are read from the "
                        "YAML file's folder).")
    return problems


def _file_list(files: Any) -> list[str]:
    """Every path of a `data_files` value, flattened."""
    if isinstance(files, str):
        return [files]
    values = files.values() if isinstance(files, Mapping) else files if isinstance(files, (list, tuple)) else []
    return [path for value in values for path in _file_list(value)]


def _evaluate(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, *,
              specs: list[str | dict[str, Any]], manager: TaskManager, batch_size: int, limit: int | None,
              num_fewshot: int | None, seed: int) -> dict[str, Any]:
    """lm_eval's `evaluate` on `model` wrapped in HFLM, seeded and with the tasks set up as
    `simple_evaluate` sets them up. `simple_evaluate` itself also gathers host information (a
    `git describe` in the working directory, which prints "fatal: not a git repository" outside one,
    torch's environment report, a hub look-up of the model's name) that a model in memory has no use for."""
    import torch
    from lm_eval.evaluator import evaluate
    from lm_eval.models.huggingface import HFLM

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    with _logger_level("lm_eval.models.huggingface", logging.ERROR):  # "not of type `str`": the object is the point
        lm = HFLM(pretrained=model, tokenizer=_unshared(tokenizer), batch_size=batch_size)
    loaded = _load_tasks(manager, specs)
    _set_fewshot(loaded["tasks"].values(), num_fewshot=num_fewshot, seed=seed)
    output = evaluate(lm=lm, task_dict=loaded, limit=limit, bootstrap_iters=BOOTSTRAP_ITERS, log_samples=False)
    if output is None:  # lm_eval returns nothing on ranks other than 0, which a model object never has
        raise RuntimeError("lm_eval's evaluate returned no results for a single-process run")
    return output


def _unshared(tokenizer: PreTrainedTokenizerBase) -> PreTrainedTokenizerBase:
    """`tokenizer`, or a copy of it where lm_eval would change it: HFLM gives a tokenizer without a
    pad token one (copying a large tokenizer takes up to a second, so the others are not copied)."""
    return tokenizer if tokenizer.pad_token is not None else copy.deepcopy(tokenizer)


def _load_tasks(manager: TaskManager, specs: list[str | dict[str, Any]]) -> dict[str, Any]:
    """The tasks built, their data sets loaded; data that cannot be had (offline) is a ConfigError."""
    from datasets.exceptions import DatasetNotFoundError
    from huggingface_hub.errors import OfflineModeIsEnabled

    names = [spec if isinstance(spec, str) else spec["task"] for spec in specs]
    tasks = f"harness task{'s' if len(names) > 1 else ''} {listed(names, last='and')}"
    try:
        return manager.load(specs)
    except (DatasetNotFoundError, OfflineModeIsEnabled, ConnectionError) as e:  # before FileNotFoundError, a base
        raise ConfigError(f"the data of {tasks} cannot be read without the network ({type(e).__name__}: {e}); "
                          "tuneline runs harness tasks offline: give each task local `dataset_kwargs.data_files` "
                          "(as data/harness_tasks/arith_mc.yaml does), or download a built-in task's data set into "
                          "the Hugging Face datasets cache beforehand.") from e
    except FileNotFoundError as e:
        raise ConfigError(f"a data file of {tasks} is missing ({e}); relative `dataset_kwargs.data_files` are read "
                          "from the YAML file's folder only for tasks named in `tasks`, not for those a group or tag "
                          "brings in: name those tasks instead, or give their data files as absolute paths.") from e


def _set_fewshot(tasks: Iterable[Task], *, num_fewshot: int | None, seed: int) -> None:
    """`num_fewshot` examples in each task's prompts (a task whose YAML says 0 keeps 0; None: each
    task's own number, 0 where it gives none), drawn with `seed`: what `simple_evaluate` does."""
    for task in tasks:
        own = task.get_config("num_fewshot")
        if num_fewshot is not None and own != 0:
            task.set_config(key="num_fewshot", value=num_fewshot)
        elif own is None:
            task.set_config(key="num_fewshot", value=0)
        task.set_fewshot_seed(seed=seed)


def _harness_result(output: Mapping[str, Any], *, version: str) -> HarnessResult:
    reported = {**output["results"], **output.get("groups", {})}  # a group's aggregate under its own name
    results = {name: {key: _plain(value) for key, value in values.items()} for name, values in reported.items()}
    return HarnessResult(
        metrics=flatten_metrics(results),
        results=results,
        samples={task: int(counts["effective"]) for task, counts in output.get("n-samples", {}).items()},
        num_fewshot={task: int(shots) for task, shots in output.get("n-shot", {}).items()},
        versions={task: _plain(v) for task, v in output.get("versions", {}).items()},
        lm_eval_version=version,
    )


def _plain(value: Any) -> Any:
    """NumPy scalars as Python numbers (lm_eval reports some metrics as np.float64)."""
    return value.item() if isinstance(value, np.generic) else value


@contextmanager
def _caller_state_kept(model: PreTrainedModel) -> Iterator[None]:
    """The model's train/eval mode and the Python, NumPy and torch random states as they were:
    lm_eval seeds all three globally and puts the model in eval mode."""
    import torch

    training, python_state, numpy_state = model.training, random.getstate(), np.random.get_state()
    devices = [model.device] if model.device.type == "cuda" else []
    try:
        with torch.random.fork_rng(devices=devices):
            yield
    finally:
        random.setstate(python_state)
        np.random.set_state(numpy_state)
        model.train(training)


@contextmanager
def _quiet_and_offline() -> Iterator[None]:
    """For the call: no Hugging Face Hub access, no `datasets` progress bars, and bootstrapped
    standard errors computed in this process (lm_eval's DISABLE_MULTIPROC).

    `datasets` and `huggingface_hub` read HF_HUB_OFFLINE once, when imported, so setting the
    variable now would not reach them: their module flags are set for the call and restored (so a
    download another thread makes meanwhile is refused too)."""
    import datasets
    import datasets.config
    import huggingface_hub.constants

    bars = datasets.is_progress_bar_enabled()
    flags = (huggingface_hub.constants.HF_HUB_OFFLINE, datasets.config.HF_HUB_OFFLINE)
    environment = {name: os.environ.get(name) for name in OFFLINE_ENVIRONMENT}
    datasets.disable_progress_bars()
    huggingface_hub.constants.HF_HUB_OFFLINE = datasets.config.HF_HUB_OFFLINE = True
    os.environ.update({name: "1" for name in environment})
    try:
        yield
    finally:
        huggingface_hub.constants.HF_HUB_OFFLINE, datasets.config.HF_HUB_OFFLINE = flags
        for name, value in environment.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        if bars:
            datasets.enable_progress_bars()


@contextmanager
def _logger_level(name: str, level: int) -> Iterator[None]:
    logger = logging.getLogger(name)
    previous = logger.level
    logger.setLevel(level)
    try:
        yield
    finally:
        logger.setLevel(previous)
