"""What `tuneline api`, `webchat` and `chat` serve: TARGET read into a `ServedModel`.

TARGET is a LLaMA-Factory inference YAML (`model_name_or_path`, `adapter_name_or_path`, `template`,
`infer_backend`, and the generation keys, which become the request defaults), a model, adapter or
artifact folder (`core/inference/chat.py: resolve_source`), or a registered version,
`models:/NAME@ALIAS` or `models:/NAME/VERSION` (`core/tracking/model_uris.py`). `key=value`
overrides and `--template` apply on top of either, as they do to a training YAML.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tuneline.core.config import (
    DataConfig,
    GeneratingConfig,
    InferenceConfig,
    ModelConfig,
    cache_root,
    parse_overrides,
    read_stage_config,
    read_yaml,
)
from tuneline.core.config.llamafactory import refused_value
from tuneline.core.errors import ConfigError
from tuneline.core.inference.chat import ADAPTER_CONFIG, TOKENIZER_CONFIG, ModelSource, resolve_source
from tuneline.core.serving.backends import BACKENDS, backend_problems
from tuneline.core.tracking.model_uris import is_model_uri, resolve_model_uri

YAML_SUFFIXES = (".yaml", ".yml")
SOURCE_KEYS = ("model_name_or_path", "adapter_name_or_path", "adapter_folder")


@dataclass(frozen=True)
class ServedModel:
    """A model to serve: where it loads from and the settings it is served with."""

    source: ModelSource
    name: str
    """How clients see it (/v1/models), unless API_MODEL_NAME says otherwise."""
    template: str | None = None
    """A tuneline template to render with (None: the tokenizer's saved chat template)."""
    keys: DataConfig = field(default_factory=DataConfig)
    model_config: ModelConfig = field(default_factory=ModelConfig)
    generating: GeneratingConfig = field(default_factory=GeneratingConfig)
    inference: InferenceConfig = field(default_factory=InferenceConfig)
    origin: str | None = None
    """Where a registered version's files came from, for the announcement (None: TARGET is a path)."""


def served_model(target: str, *, template: str | None = None, overrides: Sequence[str] = (),
                 tracking_uri: Callable[[], str] | None = None, command: str = "tuneline api") -> ServedModel:
    """TARGET resolved; `tracking_uri()` gives the registry a `models:/` TARGET is looked up in."""
    is_yaml = Path(target).suffix.lower() in YAML_SUFFIXES
    raw: dict[str, Any] = read_yaml(target) if is_yaml else {}
    given = parse_overrides(list(overrides))
    if not is_yaml and (clash := sorted(set(given) & set(SOURCE_KEYS))):
        raise ConfigError(f"{', '.join(clash)} set as an override, but TARGET '{target}' already names the model; pass "
                          "an inference YAML as TARGET to name the model by key.", source=command)
    raw.update(given)
    if template is not None:
        raw["template"] = template
    config = _inference_config(raw, source=target if is_yaml else command)
    origin = None
    if is_yaml:
        source, name = _yaml_source(config.model, yaml=target), _yaml_name(config.model)
    elif is_model_uri(target):
        if tracking_uri is None:
            raise ConfigError(f"'{target}' names a registered model, and no MLflow registry was given.", source=command)
        found = resolve_model_uri(target, uri=tracking_uri(), download_dir=cache_root() / "registry")
        source = ModelSource(model=str(found.model), adapter=None, tokenizer=str(found.tokenizer))
        name = target.removeprefix("models:/")
        origin = f"version {found.version}, from its {found.origin} {found.model}"
    else:
        source, name = resolve_source(target, what=f"{command.split()[-1]} TARGET"), Path(target).resolve().name
    return ServedModel(source=source, name=name, template=config.data.template, keys=config.data,
                       model_config=config.model, generating=config.generating, inference=config.inference, origin=origin)


def _inference_config(raw: Mapping[str, Any], *, source: str) -> Any:
    """The stage config of an inference mapping (every LLaMA-Factory key read and checked as a training
    YAML's are), the backend checked for serving rather than for training."""
    backend = raw.get("infer_backend", "huggingface")
    refused = refused_value("infer_backend", backend) is not None  # named in the refusal of its feature (KTransformers)
    config, problems = read_stage_config({key: value for key, value in raw.items() if key != "infer_backend" or refused})
    if backend not in BACKENDS and not refused:
        problems.append(f"'infer_backend: {backend}' is not an engine tuneline serves with; use one of "
                        f"{', '.join(BACKENDS)} (huggingface runs everywhere).")
    elif backend in BACKENDS:
        problems += backend_problems(backend)
    if problems:
        raise ConfigError(problems, source=source)
    return dataclasses.replace(config, inference=dataclasses.replace(config.inference, infer_backend=backend))


def _yaml_source(model: ModelConfig, *, yaml: str) -> ModelSource:
    """The base (hub id, model folder or artifact) and the adapter the YAML names."""
    if not model.model_name_or_path:
        raise ConfigError("'model_name_or_path' is not set; name the model folder or hub id to serve.", source=yaml)
    adapters = [a.strip() for a in (model.adapter_name_or_path or "").split(",") if a.strip()]
    if len(adapters) > 1:
        raise ConfigError(f"'adapter_name_or_path' names {len(adapters)} adapters; serving applies one. Merge them "
                          "first (tuneline export with export_dir) and serve the merged folder.", source=yaml)
    local = Path(model.model_name_or_path).is_dir()
    base = resolve_source(model.model_name_or_path, what="model_name_or_path") if local else None
    if not adapters:
        return base or ModelSource(model=model.model_name_or_path, adapter=None, tokenizer=model.model_name_or_path)
    folder = Path(adapters[0]) / model.adapter_folder if model.adapter_folder else Path(adapters[0])
    if not (folder / ADAPTER_CONFIG).is_file():
        raise ConfigError(f"'adapter_name_or_path: {folder}' holds no {ADAPTER_CONFIG}; name the folder a LoRA run "
                          "saved (its output_dir).", source=yaml)
    if base is not None and base.adapter is not None:
        raise ConfigError(f"'model_name_or_path: {model.model_name_or_path}' is itself an adapter; name its base "
                          "model there.", source=yaml)
    model_path = base.model if base is not None else model.model_name_or_path
    tokenizer = str(folder) if (folder / TOKENIZER_CONFIG).is_file() else (base.tokenizer if base else model_path)
    return ModelSource(model=model_path, adapter=folder, tokenizer=tokenizer)


def _yaml_name(model: ModelConfig) -> str:
    named = model.adapter_name_or_path or model.model_name_or_path or "model"
    return Path(named.rstrip("/")).name or named
