"""A stage YAML, a flat mapping as LLaMA-Factory writes it, read into a `StageConfig`.

Its keys are split into one frozen dataclass per concern; the rest must be arguments of
`transformers.Seq2SeqTrainingArguments`, which keep their own names and meaning. Every problem is
collected and raised at once, with the nearest valid key for typos; LLaMA-Factory's keys that
cannot run here are named with the reason (`llamafactory.py`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from tuneline.core.config.coercion import coerce_all, coerce_fields
from tuneline.core.config.llamafactory import REFUSED_KEYS, refusal_problems, refused_value, unavailable_problems
from tuneline.core.config.rules import conflicts
from tuneline.core.config.stage import GROUPS, StageConfig
from tuneline.core.config.trainer_fields import training_fields
from tuneline.core.errors import ConfigError, nearest

# Trainer keys that LLaMA-Factory YAMLs carry but that only steer its own launcher.
_IGNORED_TRAINING_KEYS = frozenset({"ddp_timeout"})
# Trainer keys that transformers 5 renamed: old name -> new name (same meaning).
_RENAMED_TRAINING_KEYS = {"warmup_ratio": "warmup_steps", "logging_dir": None}
# Trainer keys that transformers 5 moved into `fsdp_config` (LLaMA-Factory's FSDP examples still set them):
# old key -> its name inside fsdp_config.
_FSDP_CONFIG_KEYS = {"fsdp_transformer_layer_cls_to_wrap": "transformer_layer_cls_to_wrap",
                     "fsdp_min_num_params": "min_num_params"}


def valid_keys() -> set[str]:
    """Every key a stage YAML may hold: the config fields, the trainer's arguments and the refused keys."""
    keys = {f.name for group in GROUPS.values() for f in dataclasses.fields(group)}
    return keys | set(training_fields()) | set(REFUSED_KEYS)


def read_yaml(path: str | Path) -> dict[str, Any]:
    """A YAML mapping from `path`, or a ConfigError naming the file and the problem."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"the file {path} does not exist; pass the path of a YAML config.")
    try:
        loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        raise ConfigError(f"{path} is not valid YAML: {e}") from e
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise ConfigError(f"{path} must hold a mapping of keys to values, not a {type(loaded).__name__}.")
    return loaded


def parse_overrides(pairs: list[str]) -> dict[str, Any]:
    """`key=value` strings from the command line; values are read as YAML scalars."""
    overrides: dict[str, Any] = {}
    problems = []
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            problems.append(f"override '{pair}' is not of the form key=value (for example learning_rate=1e-4).")
            continue
        overrides[key.strip()] = yaml.safe_load(value) if value.strip() else None
    if problems:
        raise ConfigError(problems)
    return overrides


def read_stage_config(raw: Mapping[str, Any]) -> tuple[StageConfig, list[str]]:
    """Split, type-check and cross-check a flat LLaMA-Factory mapping: the config and every problem found.

    The checks of a stage kind come on top (`core.stages.registry.build_stage_config` adds them and
    raises one ConfigError with all problems); this layer knows no kind.
    """
    problems: list[str] = refusal_problems(raw)
    grouped: dict[str, dict[str, Any]] = {name: {} for name in GROUPS}
    training: dict[str, Any] = {}
    group_of = {f.name: name for name, group in GROUPS.items() for f in dataclasses.fields(group)}
    for key, value in raw.items():
        if refused_value(key, value) is not None:  # named in its feature's refusal, not as a field's unknown choice
            continue
        if key in group_of:
            grouped[group_of[key]][key] = value
        elif key in REFUSED_KEYS or key in _IGNORED_TRAINING_KEYS or (key in _RENAMED_TRAINING_KEYS and not _RENAMED_TRAINING_KEYS[key]):
            continue
        elif key in _RENAMED_TRAINING_KEYS:
            if _RENAMED_TRAINING_KEYS[key] in raw:
                problems.append(f"'{key}' and '{_RENAMED_TRAINING_KEYS[key]}' both set; keep one.")
            training[_RENAMED_TRAINING_KEYS[key]] = value
        elif key in _FSDP_CONFIG_KEYS:
            continue
        elif key in training_fields():
            training[key] = " ".join(map(str, value)) if key == "fsdp" and isinstance(value, list) else value
        else:
            guess = nearest(key, valid_keys())
            hint = f"; did you mean '{guess}'?" if guess else " (neither a tuneline/LLaMA-Factory key nor a transformers trainer argument)."
            problems.append(f"unknown key '{key}'{hint}")
    _move_into_fsdp_config(raw, training, problems)
    built = {name: group(**coerce_fields(group, grouped[name], problems)) for name, group in GROUPS.items()}
    config = StageConfig(training=coerce_all(training, training_fields(), problems), **built)
    problems.extend(conflicts(config))
    problems.extend(unavailable_problems(config, has_cuda=_has_cuda))
    if config.finetuning.pure_bf16 and not _computes_bf16():
        problems.append("'pure_bf16: true' trains in bfloat16, which this machine's GPU does not compute; remove the key "
                        "(the trainer then keeps float32 weights), or run on a GPU with bfloat16 (Ampere or newer).")
    return config, problems


def _move_into_fsdp_config(raw: Mapping[str, Any], training: dict[str, Any], problems: list[str]) -> None:
    """Put the FSDP keys that transformers 4 took on their own into `training['fsdp_config']`, where
    transformers 5 reads them (`fsdp` itself takes LLaMA-Factory's list as transformers' space-separated string)."""
    moved = {inner: raw[key] for key, inner in _FSDP_CONFIG_KEYS.items() if key in raw}
    if not moved:
        return
    fsdp_config = training.get("fsdp_config") or {}
    if not isinstance(fsdp_config, dict):
        problems.append(f"{', '.join(repr(k) for k in _FSDP_CONFIG_KEYS if k in raw)} and 'fsdp_config: {fsdp_config}' "
                        "(a file) are both set; put " + ", ".join(moved) + " into that file, which transformers 5 reads.")
        return
    if layers := moved.get("transformer_layer_cls_to_wrap"):
        moved["transformer_layer_cls_to_wrap"] = [layers] if isinstance(layers, str) else layers
    clashes = sorted(set(moved) & set(fsdp_config))
    if clashes:
        named = ", ".join(f"'{old}'" for old, inner in _FSDP_CONFIG_KEYS.items() if inner in clashes)
        problems.append(f"{named} set both as a key and inside 'fsdp_config'; keep the one in fsdp_config.")
    training["fsdp_config"] = {**moved, **fsdp_config}


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _computes_bf16() -> bool:
    """The CPU always does (torch has bfloat16 kernels there); a CUDA GPU from Ampere on."""
    import torch

    return not torch.cuda.is_available() or torch.cuda.is_bf16_supported()
