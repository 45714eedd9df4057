"""Settings a stage kind ignores, said at the start of the run instead of silently dropped.

A key of `STAGE_KEYS` (packing, the preference and PPO keys, the generation keys, ...) set away from
its default in a stage whose kind does not read it (`StageKind.reads`, `StageKind.unread_keys`)
trains as LLaMA-Factory trains it, without effect, and gets one warning line naming the key, the stage
and why. So does a media key (`image_max_pixels`, `video_fps`, ...) when no dataset of the stage
maps images, videos or audio (`datasets_map_media`). `tuneline train` prints the lines; a pipeline's
train stage prints them and records the keys on its MLflow run as the tag `tuneline.ignored_keys`
(comma-separated, in `STAGE_KEYS` order, the media keys last).
Combinations LLaMA-Factory refuses stay refused when the config is read (`core.stages.rules`).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from functools import cache
from typing import Any

from tuneline.core.config import GROUPS, MediaConfig, StageConfig
from tuneline.core.data.tokenization import media_datasets
from tuneline.core.errors import listed
from tuneline.core.stages.registry import KINDS, stage_kind
from tuneline.core.stages.stage_keys import (
    CHECKPOINT_KEYS,
    LABEL_SMOOTHING_KEYS,
    LANGUAGE_MODEL_KEYS,
    PACKING_KEYS,
    PER_DATASET_EVALUATION_KEYS,
    PREDICTION_KEYS,
    READ_BY_NO_KIND,
    REFERENCE_KEYS,
    REWARD_MODEL_KEYS,
    SUPERVISED_LABEL_KEYS,
    TRAINER_ARGUMENTS,
    TRAINER_KEYS,
    TRAINER_LOOP_KEYS,
    TRAINER_SAMPLER_KEYS,
)

STAGE_KEYS: tuple[str, ...] = tuple(dict.fromkeys((
    *PACKING_KEYS, *SUPERVISED_LABEL_KEYS, *TRAINER_KEYS, *TRAINER_LOOP_KEYS, *CHECKPOINT_KEYS, *TRAINER_SAMPLER_KEYS,
    *LABEL_SMOOTHING_KEYS, *PER_DATASET_EVALUATION_KEYS, *LANGUAGE_MODEL_KEYS, *(key for kind in KINDS.values() for key in kind.own_keys),
    *REFERENCE_KEYS, *REWARD_MODEL_KEYS, *PREDICTION_KEYS, *READ_BY_NO_KIND,
)))
"""Every key whose reading depends on the stage kind, in the order warnings name them: the groups several
kinds share (`core.stages.stage_keys`) and each kind's own keys (`StageKind.own_keys`)."""

MEDIA_KEYS = tuple(f.name for f in dataclasses.fields(MediaConfig))
"""The image, video and audio processors' keys: read only when a dataset of the stage maps media."""
NO_MEDIA = "no dataset of this stage maps images, videos or audio, so no media processor runs"

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


def ignored_keys(config: StageConfig, *, maps_media: bool | None = None) -> list[IgnoredKey]:
    """The keys of `config` that its stage kind ignores although they are set away from their defaults;
    with `maps_media` False (`datasets_map_media`), also the media keys, which a text-only run does not read."""
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
    if maps_media is False:
        found.extend(IgnoredKey(key, flat[key], kind.name, NO_MEDIA) for key in MEDIA_KEYS if flat[key] != defaults[key])
    return found


def datasets_map_media(config: StageConfig) -> bool | None:
    """Whether a dataset the stage reads (to train or evaluate) maps images, videos or audio in its
    dataset_info.json entry; None when no media key is set away from its default (nothing to say, nothing read)."""
    flat, defaults = config.flat(), field_defaults()
    if all(flat[key] == defaults[key] for key in MEDIA_KEYS):
        return None
    return bool(media_datasets(config))


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
