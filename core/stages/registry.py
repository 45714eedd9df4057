"""The registry of stage kinds: the table of the kinds by their name, and its lookup.

`KINDS` is the one place that lists the kinds; every other part of tuneline asks `stage_kind` (or a
kind's fields) and never compares a stage name itself. `build_stage_config` is where a stage's YAML
becomes a checked `StageConfig`: the config layer's own checks, then the method's and the
optimizer's, then the rules across kinds (`core.stages.rules`), then the kind's own, all problems
reported at once. Adding a kind is one module under `core/stages/`, one entry in `KINDS` and its
tests (docs/ARCHITECTURE.md, "Adding a stage kind").
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tuneline.core.config import StageConfig, parse_overrides, read_stage_config, read_yaml
from tuneline.core.errors import ConfigError, listed, nearest
from tuneline.core.models.loading import method_problems
from tuneline.core.stages.dpo import DPO
from tuneline.core.stages.grpo import GRPO, RLOO
from tuneline.core.stages.kind import StageKind
from tuneline.core.stages.kto import KTO
from tuneline.core.stages.ppo.stage import PPO
from tuneline.core.stages.pt import PT
from tuneline.core.stages.rm import RM
from tuneline.core.stages.rules import kind_problems
from tuneline.core.stages.sft import SFT
from tuneline.core.training.optimizers.rules import optimizer_problems

KINDS: dict[str, StageKind] = {kind.name: kind for kind in (PT, SFT, RM, DPO, KTO, PPO, GRPO, RLOO)}
NOT_OFFERED = {
    "online_dpo": "online DPO is not offered: TRL 1.16 keeps its OnlineDPOTrainer under trl.experimental, whose API may "
                  "change without notice; train 'stage: grpo' or 'stage: rloo' on prompts, or 'stage: dpo' on pairs",
}
"""Stage names that users of TRL or LLaMA-Factory may try, refused with the reason."""
STAGE_NAMES = tuple(KINDS)
DEFAULT_STAGE = SFT.name  # what `stage` means when a config leaves it out


def stage_kind(name: str | None) -> StageKind:
    """The kind called `name` (None: the default kind, as for a config without `stage`), or a
    ConfigError listing the kinds there are."""
    name = DEFAULT_STAGE if name is None else name
    if name in KINDS:
        return KINDS[name]
    if name in NOT_OFFERED:
        raise ConfigError(f"'stage: {name}': {NOT_OFFERED[name]}.")
    guess = nearest(name, KINDS)
    raise ConfigError(f"'stage: {name}' is not a stage kind" + (f"; did you mean '{guess}'?" if guess else ".")
                      + f" Choose one of {', '.join(STAGE_NAMES)}.")


def kinds_with(*, output: str | None = None, reference: str | None = None) -> tuple[str, ...]:
    """Names of the kinds that produce `output` and/or read `reference`, for messages and checks."""
    return tuple(name for name, kind in KINDS.items()
                 if (output is None or kind.output == output) and (reference is None or reference in kind.references))


def build_stage_config(raw: Mapping[str, Any], *, source: str | None = None) -> StageConfig:
    """Split, type-check and cross-check a flat LLaMA-Factory mapping; all problems at once."""
    config, problems = read_stage_config(raw)
    if config.finetuning.stage is None:
        config = dataclasses.replace(config, finetuning=dataclasses.replace(config.finetuning, stage=DEFAULT_STAGE))
    try:
        kind = stage_kind(config.finetuning.stage)
    except ConfigError as e:
        problems.extend(e.problems)
    else:
        problems.extend(method_problems(config.model, config.finetuning))
        problems.extend(optimizer_problems(config))
        problems.extend(kind_problems(config, kind, kinds=KINDS))
        problems.extend(kind.config_problems(config))
    if problems:
        raise ConfigError(problems, source=source)
    return config


def load_stage_config(path: str | Path, overrides: list[str] | None = None) -> StageConfig:
    raw = read_yaml(path)
    raw.update(parse_overrides(overrides or []))
    return build_stage_config(raw, source=str(path))


def tokenize_stage_data(config: StageConfig, *, tokenizer_path: str | Path, output_dir: str | Path) -> dict[str, Any]:
    """The stage's datasets tokenized to `output_dir` in the shape its kind trains on; the counters."""
    from tuneline.core.data.tokenization import media_datasets, tokenize_dataset

    kind = stage_kind(config.finetuning.stage)
    if not kind.trains_images:
        with_media = media_datasets(config)
        if with_media:
            kinds_training_media = [name for name, k in KINDS.items() if k.trains_images]
            raise ConfigError(f"dataset {', '.join(repr(n) for n in with_media)} maps images, videos or audio, and 'stage: "
                              f"{kind.name}' does not train on media rows yet ({listed(kinds_training_media, last='and')} do); "
                              "train it on a text dataset.")
    return tokenize_dataset(config, examples=kind.examples, tokenizer_path=tokenizer_path, output_dir=output_dir)
