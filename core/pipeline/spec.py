"""Pipeline YAML (docs/ARCHITECTURE.md, "Pipelines"): a workspace, shared defaults and a DAG of stages.

```yaml
name: demo
workspace: workspace
defaults: {dataset_dir: data, template: default}
stages:
  - {name: base, stage: build_base, corpus: demo_pretrain}
  - {name: pt, stage: pt, from: base, dataset: demo_pretrain, finetuning_type: full}
  - {name: sft, stage: sft, from: pt, dataset: demo_alpaca}
  - {name: dpo, stage: dpo, from: sft, ref_model: sft, dataset: demo_preference}
evaluate: {stage: sft, baseline: pt, dataset: demo_heldout}
export: {stage: sft}
register: {model_name: demo, alias: champion, promote_metric: answer_f1}
```
Overrides: `key=value` sets a key in every stage it applies to, `stage.key=value` in one stage;
both win over the file.

Placement (docs/ARCHITECTURE.md, "Scheduling"): `work_pool: NAME` at the top or in a stage runs
the stage as a flow run on a worker of that Prefect work pool, with the stage's `job_variables:`
(a mapping, e.g. `{env: {CUDA_VISIBLE_DEVICES: "1"}}`); a crashed flow run is submitted again up
to the stage's `retries` (default 1). Without a pool the stage runs in the pipeline's process,
beside the stages it does not depend on, at most `parallel_training` training stages at a time.
`task_runner: ray` at the top runs every stage as a Ray task on the cluster at RAY_ADDRESS instead,
holding the Ray resources its `resources:` names (`{CPU: 1, GPU: 1}`; default one CPU).

References: `from` always names a stage (the full-weight model the stage starts from). `ref_model`
and `reward_model` name a stage when their value is a bare name (no `/`) that is not a path on
disk; otherwise they are a model path or hub id, as in a single-stage config. References form a
DAG that is checked at once (dangling names, cycles, a reward model where a policy belongs); the
stages then run in a topological order, file order where the references leave a choice.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tuneline.core.config import (
    StageConfig,
    coerce_fields,
    parse_overrides,
    read_yaml,
)
from tuneline.core.errors import ConfigError, listed, nearest
from tuneline.core.evaluation.benchmark_plan import BenchmarkPlan
from tuneline.core.models.tiny.text import BaseModelConfig
from tuneline.core.pipeline.placement import (
    PLACEMENT_KEYS,
    RAY_RUNNER,
    Placement,
    parallel_training_value,
    placed,
    task_runner_value,
    top_pool,
)
from tuneline.core.stages.registry import DEFAULT_STAGE, STAGE_NAMES, build_stage_config, kinds_with, stage_kind
from tuneline.core.store.location import parse_workspace
from tuneline.core.tracking.promotion import CHALLENGER_ALIAS, load_promote_function, settings_problems

BASE_KIND = "build_base"  # the pipeline's own stage: the project's tiny base model, built from a corpus
REFERENCE_KEYS = ("ref_model", "reward_model")
_TOP_SETTINGS = ("work_pool", "parallel_training", "task_runner")  # top-level keys that `key=value` overrides too
_TOP_KEYS = ("name", "workspace", "defaults", "stages", "evaluate", "export", "register", *_TOP_SETTINGS)
_STAGE_META_KEYS = ("name", "from", "stage", *PLACEMENT_KEYS)


@dataclass(frozen=True)
class BaseStage:
    name: str
    build: BaseModelConfig
    corpus: tuple[str, ...]
    dataset_dir: str
    placement: Placement = field(default_factory=Placement)


@dataclass(frozen=True)
class TrainingStage:
    name: str
    parent: str | None
    config: StageConfig
    references: dict[str, str] = field(default_factory=dict)  # `ref_model`/`reward_model` -> stage name
    placement: Placement = field(default_factory=Placement)

    @property
    def kind(self) -> str:
        return self.config.finetuning.stage

    @property
    def produces_policy(self) -> bool:
        """Whether its output is a causal LM (to start from, merge, evaluate, export), not a reward model."""
        return stage_kind(self.kind).produces_policy

    def links(self) -> dict[str, str]:
        """Every stage this one needs, by the key that names it (`from`, `ref_model`, `reward_model`)."""
        return {**({"from": self.parent} if self.parent else {}), **self.references}


@dataclass(frozen=True)
class EvaluateSettings:
    stage: str
    baseline: str | None = None
    dataset: str | None = None
    max_new_tokens: int = 32
    max_samples: int | None = None
    benchmarks: str | None = None
    """Multiple-choice benchmarks in LLaMA-Factory's evaluation layout under `task_dir`, comma-separated
    as its `task` key names them (`mmlu_test`, `cmmlu_test`, `ceval_validation`); scored as
    `<benchmark>_accuracy` and `<benchmark>_<category>_accuracy` (e.g. `mmlu_accuracy`, `mmlu_stem_accuracy`)."""
    task_dir: str = "evaluation"
    """The folder holding one folder per benchmark (LLaMA-Factory's `task_dir`)."""
    n_shot: int = 5
    """Examples of each subject's dev split put before each question."""
    lang: str = "en"
    """The prompt language of the benchmarks: en or zh."""
    batch_size: int = 4
    """Questions scored per forward pass."""
    harness_tasks: str | None = None
    """lm-evaluation-harness tasks, comma-separated, from `harness_include_path` or the harness's own
    (with their data on disk); scored as `<task>_<metric>` (e.g. `arith_mc_acc`)."""
    harness_include_path: str | None = None
    """A folder of the user's lm-evaluation-harness task YAMLs."""
    harness_num_fewshot: int | None = None
    """Few-shot examples for the harness tasks; unset: each task's own setting."""
    harness_limit: int | None = None
    """At most this many documents of each harness task."""
    seed: int = 42
    """Seeds the benchmarks' few-shot draws."""

    def benchmark_names(self) -> list[str]:
        return [name.strip() for name in (self.benchmarks or "").split(",") if name.strip()]

    def harness_task_names(self) -> list[str]:
        return [name.strip() for name in (self.harness_tasks or "").split(",") if name.strip()]

    def benchmark_plan(self) -> BenchmarkPlan:
        return BenchmarkPlan(benchmarks=tuple(self.benchmark_names()), task_dir=self.task_dir, n_shot=self.n_shot,
                             lang=self.lang, batch_size=self.batch_size, harness_tasks=tuple(self.harness_task_names()),
                             harness_include_path=self.harness_include_path, harness_num_fewshot=self.harness_num_fewshot,
                             harness_limit=self.harness_limit, seed=self.seed)


@dataclass(frozen=True)
class ExportSettings:
    stage: str
    export_dir: str = "export"
    export_size: int = 5
    parity_probes: int = 4
    """Conversations of the stage's dataset the train/serve parity gate renders (and, for a merged
    adapter, answers) both ways before the export is kept; 0 turns the gate off."""


@dataclass(frozen=True)
class RegisterSettings:
    model_name: str
    """Registered model that each export becomes a new version of."""
    alias: str = "champion"
    """Alias of the best version; a version that does not beat it gets the alias `challenger` instead."""
    promote_metric: str | None = None
    """Metric the candidate must beat the champion on, read from the exported stage's manifest or the
    `evaluate` section (e.g. eval_loss, answer_f1). Unset: the alias always moves to the newest version."""
    greater_is_better: bool | None = None
    """Direction of `promote_metric`; unset: lower is better for names with loss, perplexity or kl."""
    min_improvement: float = 0.0
    """How much better than the champion the candidate must be; a negative value tolerates a small regression."""
    promote_function: str | None = None
    """`module:function` deciding instead of `promote_metric`: function(candidate: dict, champion: dict) -> bool,
    both dicts of metric name -> value; the module is looked for beside the pipeline YAML first."""


@dataclass(frozen=True)
class Pipeline:
    name: str
    workspace: Path | str
    """A local folder (resolved), or an object-store URL (`s3://bucket/prefix`) as text."""
    stages: tuple[BaseStage | TrainingStage, ...]
    evaluate: EvaluateSettings | None
    export: ExportSettings | None
    register: RegisterSettings | None
    source: str | None = field(default=None, compare=False)
    parallel_training: int = 1
    """Training stages run at the same time in the pipeline's own process (stages on a work pool not counted)."""
    task_runner: str = "local"
    """What runs the stages: `local` (the pipeline's process, and work pools) or `ray` (a Ray cluster)."""

    @property
    def on_ray(self) -> bool:
        return self.task_runner == RAY_RUNNER

    def stage(self, name: str) -> BaseStage | TrainingStage:
        return next(s for s in self.stages if s.name == name)

    def root(self, name: str) -> BaseStage | TrainingStage:
        """The stage at the start of `name`'s chain: it provides the tokenizer."""
        stage = self.stage(name)
        while isinstance(stage, TrainingStage) and stage.parent:
            stage = self.stage(stage.parent)
        return stage


def _workspace(text: str | Path, *, source: str | None) -> Path | str:
    location = parse_workspace(text if isinstance(text, Path) else str(text), source=source)
    return location.path.resolve() if location.path is not None else str(location.url)


def load_pipeline(path: str | Path, overrides: list[str] | None = None, *, workspace: str | Path | None = None) -> Pipeline:
    raw = read_yaml(path)
    return build_pipeline(raw, overrides=parse_overrides(overrides or []), workspace=workspace, source=str(path))


def build_pipeline(
    raw: Mapping[str, Any], *, overrides: Mapping[str, Any], workspace: str | Path | None = None, source: str | None = None
) -> Pipeline:
    problems: list[str] = []
    for key in raw:
        if key not in _TOP_KEYS:
            guess = nearest(key, _TOP_KEYS)
            hint = f"; did you mean '{guess}'?" if guess else f"; valid: {', '.join(_TOP_KEYS)}."
            problems.append(f"unknown top-level key '{key}'{hint}")
    defaults = dict(raw.get("defaults") or {})
    everywhere: dict[str, Any] = {}
    per_stage: dict[str, dict[str, Any]] = {}
    top = {key: raw[key] for key in _TOP_SETTINGS if key in raw}
    for key, value in overrides.items():
        stage_name, dot, stage_key = key.partition(".")
        if dot:
            per_stage.setdefault(stage_name, {})[stage_key] = value
        elif key in _TOP_SETTINGS:
            top[key] = value
        else:
            everywhere[key] = value
    parallel_training = parallel_training_value(top.get("parallel_training", 1), problems)
    task_runner = task_runner_value(top.get("task_runner", "local"), problems)
    inherited = {"work_pool": top_pool(top.get("work_pool"), problems), **{k: v for k, v in defaults.items() if k in PLACEMENT_KEYS}}
    if task_runner == RAY_RUNNER and inherited["work_pool"] is not None:
        problems.append(f"'task_runner: ray' and 'work_pool: {inherited['work_pool']}' both place every stage: a stage runs "
                        "as a Ray task or as a flow run on a work pool, not both; keep one of them.")
        inherited["work_pool"] = None
    defaults = {k: v for k, v in defaults.items() if k not in PLACEMENT_KEYS}
    raw_stages = raw.get("stages") or []
    if not raw_stages:
        problems.append("'stages' is empty; list at least one stage.")
    stages = [placed(_build_stage(entry, i, defaults, everywhere, per_stage, problems), entry, inherited,
                      everywhere, per_stage, problems, on_ray=task_runner == RAY_RUNNER) for i, entry in enumerate(raw_stages)]
    stages = [s for s in stages if s is not None]
    names = [s.name for s in stages]
    for name in per_stage:
        if name not in names:
            problems.append(f"override for stage '{name}', which the pipeline does not have; stages: {', '.join(names)}.")
    problems.extend(_dag_problems(stages))
    problems.extend(_section_kind_problems(stages, raw))
    settings = {
        "evaluate": _settings(EvaluateSettings, raw.get("evaluate"), "evaluate", problems),
        "export": _settings(ExportSettings, raw.get("export"), "export", problems),
        "register": _settings(RegisterSettings, raw.get("register"), "register", problems),
    }
    for section in ("evaluate", "export"):
        chosen = settings[section]
        for ref in (chosen.stage, getattr(chosen, "baseline", None)) if chosen else ():
            if ref is not None and ref not in names:
                problems.append(f"'{section}' refers to stage '{ref}', which the pipeline does not have; stages: {', '.join(names)}.")
    if settings["register"] and not settings["export"]:
        problems.append("'register' needs an 'export' section naming the stage to export.")
    if settings["register"]:
        problems.extend(_register_problems(settings["register"], source))
    if problems:
        raise ConfigError(problems, source=source)
    return Pipeline(
        name=str(raw.get("name") or "tuneline"),
        workspace=_workspace(workspace or raw.get("workspace") or "workspace", source=source),
        stages=tuple(_ordered(stages)),
        source=source,
        parallel_training=parallel_training,
        task_runner=task_runner,
        **settings,
    )




def _build_stage(
    entry: Any, index: int, defaults: dict, everywhere: dict, per_stage: dict, problems: list[str]
) -> BaseStage | TrainingStage | None:
    """Values in rising precedence: defaults, the stage entry, `key=value`, `stage.key=value`."""
    if not isinstance(entry, Mapping) or not entry.get("name"):
        problems.append(f"stage #{index + 1} must be a mapping with a 'name'.")
        return None
    name = str(entry["name"])
    kind = entry.get("stage", DEFAULT_STAGE)
    if kind == BASE_KIND:
        shared = {k: v for k, v in everywhere.items() if k in BASE_KEYS or k == "dataset_dir"}
        return _build_base(name, {**entry, **shared, **per_stage.get(name, {})}, defaults, problems)
    shared = {k: v for k, v in everywhere.items() if k not in BASE_ONLY_KEYS}
    values = {k: v for k, v in {**entry, **shared, **per_stage.get(name, {})}.items() if k not in PLACEMENT_KEYS}
    if kind not in STAGE_NAMES:
        problems.append(f"stage '{name}': 'stage: {kind}' is not supported; choose one of {', '.join((BASE_KIND, *STAGE_NAMES))}.")
        return None
    flat = {**{k: v for k, v in defaults.items() if k not in BASE_ONLY_KEYS},
            **{k: v for k, v in values.items() if k not in ("name", "from")}}
    try:
        config = build_stage_config(flat)
    except ConfigError as e:
        problems.extend(f"stage '{name}': {p}" for p in e.problems)
        return None
    export = config.export
    problems.extend(f"stage '{name}': '{key}: {value}' is a key of `tuneline export`; a pipeline writes its model with "
                    "its 'export' section, which does not quantize or push; remove it, or run `tuneline export` on the "
                    "exported folder." for key, value in (("export_hub_model_id", export.export_hub_model_id),
                                                           ("export_quantization_bit", export.export_quantization_bit))
                    if value is not None)
    if config.data.tokenized_path:
        problems.append(f"stage '{name}': 'tokenized_path: {config.data.tokenized_path}' is a key of `tuneline train`; a "
                        "pipeline keeps each stage's tokenized data in its workspace, keyed by content, and reuses it "
                        "there; remove the key.")
    parent = values.get("from")
    return TrainingStage(name=name, parent=None if parent is None else str(parent), config=config,
                         references=stage_references(config))


def stage_references(config: StageConfig) -> dict[str, str]:
    """The `ref_model`/`reward_model` values that name a stage: bare names that are not paths on disk."""
    found = {"ref_model": config.finetuning.ref_model, "reward_model": config.finetuning.reward_model}
    return {key: value for key, value in found.items() if value and "/" not in value and not Path(value).exists()}


BASE_KEYS = frozenset(f.name for f in dataclasses.fields(BaseModelConfig)) | {"corpus"}
# `seed` is also a training key: set in defaults or as `seed=N`, it seeds the training stages too
BASE_ONLY_KEYS = BASE_KEYS - {"seed"}


def _build_base(name: str, values: Mapping[str, Any], defaults: Mapping[str, Any], problems: list[str]) -> BaseStage | None:
    build_values = {k: v for k, v in values.items() if k not in (*_STAGE_META_KEYS, "corpus", "dataset_dir")}
    unknown = [k for k in build_values if k not in BASE_KEYS]
    for key in unknown:
        guess = nearest(key, BASE_KEYS)
        problems.append(f"stage '{name}': unknown key '{key}' for a build_base stage" + (f"; did you mean '{guess}'?" if guess else "."))
    if "from" in values:
        problems.append(f"stage '{name}': a build_base stage starts from nothing; remove 'from'.")
    build = BaseModelConfig(**coerce_fields(BaseModelConfig, {k: v for k, v in build_values.items() if k in BASE_KEYS}, problems))
    corpus = tuple(c.strip() for c in str(values.get("corpus", "")).split(",") if c.strip())
    if not corpus:
        problems.append(f"stage '{name}': 'corpus' must name the datasets the tokenizer is trained on.")
    dataset_dir = str(values.get("dataset_dir") or defaults.get("dataset_dir") or "data")
    return BaseStage(name=name, build=build, corpus=corpus, dataset_dir=dataset_dir)


def _settings(cls: type, values: Any, section: str, problems: list[str]) -> Any:
    if values is None:
        return None
    allowed = [f.name for f in dataclasses.fields(cls)]
    bad = [k for k in values if k not in allowed]
    for key in bad:
        guess = nearest(key, allowed)
        hint = f"; did you mean '{guess}'?" if guess else f"; valid: {', '.join(allowed)}."
        problems.append(f"'{section}': unknown key '{key}'{hint}")
    required = [f.name for f in dataclasses.fields(cls) if f.default is dataclasses.MISSING]
    missing = [k for k in required if k not in values]
    if missing:
        problems.append(f"'{section}' needs {', '.join(missing)}.")
    if bad or missing:
        return None
    return cls(**coerce_fields(cls, dict(values), problems))


def _register_problems(register: RegisterSettings, source: str | None) -> list[str]:
    """Promotion keys checked before any work; a `promote_function` must import (beside the YAML first)."""
    problems = settings_problems(metric=register.promote_metric, function=register.promote_function,
                                 min_improvement=register.min_improvement)
    if register.alias == CHALLENGER_ALIAS:
        problems.append(f"'register.alias: {CHALLENGER_ALIAS}' is the alias of versions that lose; name the winners' "
                        f"alias something else (default champion).")
    if register.promote_function and not problems:
        try:
            load_promote_function(register.promote_function, search_dir=Path(source).parent if source else None)
        except ConfigError as e:
            problems.extend(e.problems)
    return problems


def _dag_problems(stages: list[BaseStage | TrainingStage]) -> list[str]:
    """Duplicate names, dangling references, references of the wrong kind and cycles, all at once."""
    problems = []
    by_name: dict[str, BaseStage | TrainingStage] = {}
    for stage in stages:
        if stage.name in by_name:
            problems.append(f"two stages are named '{stage.name}'; names must be unique.")
        by_name[stage.name] = stage
    for stage in stages:
        if not isinstance(stage, TrainingStage):
            continue
        for key, target in stage.links().items():
            if target not in by_name:
                problems.append(f"stage '{stage.name}' has '{key}: {target}', which names no stage; stages: {', '.join(by_name)}"
                                + (f"; did you mean '{nearest(target, by_name)}'?" if nearest(target, by_name) else "."))
            else:
                problems.extend(_link_kind_problems(stage, key, by_name[target]))
        if not stage.parent and not stage.config.model.model_name_or_path:
            problems.append(f"stage '{stage.name}' needs 'from: <stage>' or 'model_name_or_path'.")
    problems.extend(_cycle_problems(by_name))
    return sorted(set(problems))


def _link_kind_problems(stage: TrainingStage, key: str, target: BaseStage | TrainingStage) -> list[str]:
    """`reward_model` must name an rm stage; `from` and `ref_model` a policy (an rm output is no causal LM)."""
    is_reward = isinstance(target, TrainingStage) and not target.produces_policy
    rewarders = listed(kinds_with(output="reward_model"))
    if key == "reward_model" and not is_reward:
        kind = target.kind if isinstance(target, TrainingStage) else BASE_KIND
        return [f"stage '{stage.name}' has 'reward_model: {target.name}', but stage '{target.name}' is a {kind} stage; "
                f"'reward_model' must name an {rewarders} stage."]
    if key != "reward_model" and is_reward:
        policies = listed((BASE_KIND, *kinds_with(output="policy")))
        return [f"stage '{stage.name}' has '{key}: {target.name}', but stage '{target.name}' is an {target.kind} stage: a "
                f"reward model is no policy (not a causal LM); name a {policies} stage instead."]
    if key == "ref_model" and key not in stage_kind(stage.kind).references:
        readers = kinds_with(reference=key)
        return [f"stage '{stage.name}' has '{key}: {target.name}', but only {listed(readers, last='and')} stages use a "
                f"reference model; remove '{key}' or make the stage {listed(readers)}."]
    return []


def _cycle_problems(by_name: Mapping[str, BaseStage | TrainingStage]) -> list[str]:
    """One problem per cycle through `from`, `ref_model` and `reward_model`, naming its stages."""
    problems: list[str] = []
    done: set[str] = set()

    def visit(name: str, path: list[str]) -> None:
        if name in path:
            cycle = path[path.index(name):] + [name]
            problems.append(f"stages {' -> '.join(cycle)} form a cycle (through 'from', 'ref_model' or 'reward_model'); "
                            f"a stage can only refer to stages that do not depend on it.")
            return
        stage = by_name.get(name)
        if name in done or not isinstance(stage, TrainingStage):
            return
        for target in stage.links().values():
            visit(target, [*path, name])
        done.add(name)

    for name in by_name:
        visit(name, [])
    return problems


def _section_kind_problems(stages: list[BaseStage | TrainingStage], raw: Mapping[str, Any]) -> list[str]:
    """`evaluate` and `export` generate from or merge a causal LM, which an rm stage does not produce."""
    reward = {s.name for s in stages if isinstance(s, TrainingStage) and not s.produces_policy}
    problems = []
    for section, keys in (("evaluate", ("stage", "baseline")), ("export", ("stage",))):
        values = raw.get(section)
        for key in keys if isinstance(values, Mapping) else ():
            if values.get(key) in reward:
                problems.append(f"'{section}.{key}: {values[key]}' names an rm stage, whose reward model is not a "
                                f"causal LM; name a {listed(kinds_with(output='policy'))} stage.")
    return problems


def _ordered(stages: list[BaseStage | TrainingStage]) -> list[BaseStage | TrainingStage]:
    """Every stage after the stages it refers to, otherwise in file order (the DAG is checked first)."""
    ordered: list[BaseStage | TrainingStage] = []
    placed: set[str] = set()
    remaining = list(stages)
    while remaining:
        ready = next(s for s in remaining if not isinstance(s, TrainingStage) or set(s.links().values()) <= placed)
        ordered.append(ready)
        placed.add(ready.name)
        remaining.remove(ready)
    return ordered
