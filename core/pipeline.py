"""Pipeline YAML (DESIGN.md §3): a workspace, shared defaults and a DAG of stages.

```yaml
name: demo
workspace: workspace
defaults: {dataset_dir: data, template: default}
stages:
  - {name: base, stage: build_base, corpus: demo_pretrain}
  - {name: pt, stage: pt, from: base, dataset: demo_pretrain, finetuning_type: full}
  - {name: sft, stage: sft, from: pt, dataset: demo_alpaca}
evaluate: {stage: sft, baseline: pt, dataset: demo_heldout}
export: {stage: sft}
register: {model_name: demo, alias: champion}
```
Overrides: `key=value` sets a key in every stage it applies to, `stage.key=value` in one stage;
both win over the file.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tuneline.core.base_model import BaseModelConfig
from tuneline.core.config import (
    StageConfig,
    build_stage_config,
    coerce_fields,
    parse_overrides,
    read_yaml,
    unsupported_for_training,
)
from tuneline.core.errors import ConfigError, nearest

TRAINING_KINDS = ("pt", "sft")
BASE_KIND = "build_base"
_TOP_KEYS = ("name", "workspace", "defaults", "stages", "evaluate", "export", "register")
_STAGE_META_KEYS = ("name", "from", "stage")


@dataclass(frozen=True)
class BaseStage:
    name: str
    build: BaseModelConfig
    corpus: tuple[str, ...]
    dataset_dir: str


@dataclass(frozen=True)
class TrainingStage:
    name: str
    parent: str | None
    config: StageConfig


@dataclass(frozen=True)
class EvaluateSettings:
    stage: str
    baseline: str | None = None
    dataset: str | None = None
    max_new_tokens: int = 32
    max_samples: int | None = None


@dataclass(frozen=True)
class ExportSettings:
    stage: str
    export_dir: str = "export"
    export_size: int = 5


@dataclass(frozen=True)
class RegisterSettings:
    model_name: str
    alias: str = "champion"


@dataclass(frozen=True)
class Pipeline:
    name: str
    workspace: Path
    stages: tuple[BaseStage | TrainingStage, ...]
    evaluate: EvaluateSettings | None
    export: ExportSettings | None
    register: RegisterSettings | None
    source: str | None = field(default=None, compare=False)

    def stage(self, name: str) -> BaseStage | TrainingStage:
        return next(s for s in self.stages if s.name == name)

    def root(self, name: str) -> BaseStage | TrainingStage:
        """The stage at the start of `name`'s chain: it provides the tokenizer."""
        stage = self.stage(name)
        while isinstance(stage, TrainingStage) and stage.parent:
            stage = self.stage(stage.parent)
        return stage


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
            problems.append(f"unknown top-level key '{key}'" + (f"; did you mean '{guess}'?" if guess else f"; valid: {', '.join(_TOP_KEYS)}."))
    defaults = dict(raw.get("defaults") or {})
    everywhere: dict[str, Any] = {}
    per_stage: dict[str, dict[str, Any]] = {}
    for key, value in overrides.items():
        stage_name, dot, stage_key = key.partition(".")
        if dot:
            per_stage.setdefault(stage_name, {})[stage_key] = value
        else:
            everywhere[key] = value
    raw_stages = raw.get("stages") or []
    if not raw_stages:
        problems.append("'stages' is empty; list at least one stage.")
    stages = [_build_stage(entry, i, defaults, everywhere, per_stage, problems) for i, entry in enumerate(raw_stages)]
    stages = [s for s in stages if s is not None]
    names = [s.name for s in stages]
    for name in per_stage:
        if name not in names:
            problems.append(f"override for stage '{name}', which the pipeline does not have; stages: {', '.join(names)}.")
    problems.extend(_dag_problems(stages))
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
    if problems:
        raise ConfigError(problems, source=source)
    return Pipeline(
        name=str(raw.get("name") or "tuneline"),
        workspace=Path(workspace or raw.get("workspace") or "workspace").resolve(),
        stages=tuple(_ordered(stages)),
        source=source,
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
    kind = entry.get("stage", "sft")
    if kind == BASE_KIND:
        shared = {k: v for k, v in everywhere.items() if k in BASE_KEYS or k == "dataset_dir"}
        return _build_base(name, {**entry, **shared, **per_stage.get(name, {})}, defaults, problems)
    shared = {k: v for k, v in everywhere.items() if k not in BASE_KEYS}
    values = {**entry, **shared, **per_stage.get(name, {})}
    if kind not in TRAINING_KINDS:
        problems.append(f"stage '{name}': 'stage: {kind}' is not supported; choose one of {', '.join((BASE_KIND, *TRAINING_KINDS))}.")
        return None
    flat = {**{k: v for k, v in defaults.items() if k not in BASE_KEYS}, **{k: v for k, v in values.items() if k not in ("name", "from")}}
    try:
        config = build_stage_config(flat)
    except ConfigError as e:
        problems.extend(f"stage '{name}': {p}" for p in e.problems)
        return None
    problems.extend(f"stage '{name}': {p}" for p in unsupported_for_training(config) if "stage '" not in p)
    return TrainingStage(name=name, parent=values.get("from"), config=config)


BASE_KEYS = frozenset(f.name for f in dataclasses.fields(BaseModelConfig)) | {"corpus"}


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
        problems.append(f"'{section}': unknown key '{key}'" + (f"; did you mean '{guess}'?" if guess else f"; valid: {', '.join(allowed)}."))
    required = [f.name for f in dataclasses.fields(cls) if f.default is dataclasses.MISSING]
    missing = [k for k in required if k not in values]
    if missing:
        problems.append(f"'{section}' needs {', '.join(missing)}.")
    if bad or missing:
        return None
    return cls(**coerce_fields(cls, dict(values), problems))


def _dag_problems(stages: list[BaseStage | TrainingStage]) -> list[str]:
    problems = []
    by_name: dict[str, BaseStage | TrainingStage] = {}
    for stage in stages:
        if stage.name in by_name:
            problems.append(f"two stages are named '{stage.name}'; names must be unique.")
        by_name[stage.name] = stage
    for stage in stages:
        if isinstance(stage, TrainingStage):
            if stage.parent and stage.parent not in by_name:
                problems.append(f"stage '{stage.name}' has 'from: {stage.parent}', which names no stage; stages: {', '.join(by_name)}.")
            elif not stage.parent and not stage.config.model.model_name_or_path:
                problems.append(f"stage '{stage.name}' needs 'from: <stage>' or 'model_name_or_path'.")
    for stage in stages:
        seen, current = [stage.name], stage
        while isinstance(current, TrainingStage) and current.parent in by_name:
            current = by_name[current.parent]
            if current.name in seen:
                problems.append(f"stages {' -> '.join(seen + [current.name])} form a cycle.")
                break
            seen.append(current.name)
    return sorted(set(problems))


def _ordered(stages: list[BaseStage | TrainingStage]) -> list[BaseStage | TrainingStage]:
    """Parents before children, otherwise in file order."""
    ordered: list[BaseStage | TrainingStage] = []
    remaining = list(stages)
    while remaining:
        ready = next(s for s in remaining if not isinstance(s, TrainingStage) or not s.parent or s.parent in {o.name for o in ordered})
        ordered.append(ready)
        remaining.remove(ready)
    return ordered
