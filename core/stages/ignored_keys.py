"""Settings a stage kind ignores, said at the start of the run instead of silently dropped.

A key of `STAGE_KEYS` (packing, the preference and PPO keys, the generation keys, ...) set away from
its default in a stage whose kind does not read it (`StageKind.reads`, `StageKind.unread_keys`)
trains as LLaMA-Factory trains it, without effect, and gets one warning line naming the key, the stage
and why. `tuneline train` prints the lines; a pipeline's train stage prints them and records the keys
on its MLflow run as the tag `tuneline.ignored_keys` (comma-separated, in `STAGE_KEYS` order).
Combinations LLaMA-Factory refuses stay refused when the config is read (`core.stages.registry`).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from functools import cache
from typing import Any

from tuneline.core.config import GROUPS, StageConfig
from tuneline.core.errors import listed
from tuneline.core.stages.registry import KINDS, stage_kind
from tuneline.core.stages.stage_keys import READ_BY_NO_KIND, STAGE_KEYS, TRAINER_ARGUMENTS

IGNORED_KEYS_TAG = "tuneline.ignored_keys"
"""On a training stage's MLflow run: the keys its kind ignored, comma-separated."""


@dataclass(frozen=True)
class IgnoredKey:
    key: str
    value: Any
    stage: str
    why: str
    """Why the stage does not read it: which kinds do, or which of its settings leaves it unread."""

    @property
    def line(self) -> str:
        """The warning, one line."""
        return (f"'{self.key}: {shown(self.value)}' has no effect in stage '{self.stage}' and is ignored: {self.why}. "
                f"What it does: {field_help()[self.key]}")


def ignored_keys(config: StageConfig) -> list[IgnoredKey]:
    """The keys of `config` that its stage kind ignores although they are set away from their defaults."""
    kind = stage_kind(config.finetuning.stage)
    flat, defaults = config.flat(), field_defaults()
    unread_here = kind.unread_keys(config)
    found = []
    for key in STAGE_KEYS:
        value = flat.get(key, defaults[key])  # a trainer argument is in `training` only when set
        if value == defaults[key]:
            continue
        if key in unread_here:
            found.append(IgnoredKey(key, value, kind.name, unread_here[key]))
        elif key not in kind.reads:
            found.append(IgnoredKey(key, value, kind.name, readers(key)))
    return found


def readers(key: str) -> str:
    """Which stage kinds read `key`, as the warning says it."""
    names = [name for name, kind in KINDS.items() if key in kind.reads]
    if not names:
        return READ_BY_NO_KIND.get(key, "no stage kind reads it")
    return f"only stage{'s' if len(names) > 1 else ''} {listed(names, last='and')} read{'' if len(names) > 1 else 's'} it"


def tag_value(ignored: list[IgnoredKey]) -> str:
    """What the stage's MLflow run records as `IGNORED_KEYS_TAG`."""
    return ",".join(item.key for item in ignored)


def shown(value: Any) -> str:
    """A value as YAML writes it (true, 0.9, a string bare)."""
    return value if isinstance(value, str) else json.dumps(value)


@cache
def field_defaults() -> dict[str, Any]:
    fields = {f.name: f.default for group in GROUPS.values() for f in dataclasses.fields(group)}
    return {**fields, **{key: default for key, (default, _) in TRAINER_ARGUMENTS.items()}}


@cache
def field_help() -> dict[str, str]:
    fields = {f.name: f.metadata.get("help", "") for group in GROUPS.values() for f in dataclasses.fields(group)}
    return {**fields, **{key: does for key, (_, does) in TRAINER_ARGUMENTS.items()}}
