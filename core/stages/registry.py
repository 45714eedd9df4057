"""The registry of stage kinds: the one list of the stage names, and the checks that depend on them.

Every other part of tuneline asks here what a stage kind is (`stage_kind`), never compares a stage
name itself. `build_stage_config` is where a stage's YAML becomes a checked `StageConfig`: the
config layer's own checks, then the method's, then the kind's, all problems reported at once.
Adding a kind is one module under `core/stages/` and one entry in `KINDS`
(docs/ARCHITECTURE.md, "Adding a stage kind").
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
from tuneline.core.stages.kind import StageKind
from tuneline.core.stages.kto import KTO
from tuneline.core.stages.ppo.stage import PPO
from tuneline.core.stages.pt import PT
from tuneline.core.stages.rm import RM
from tuneline.core.stages.sft import SFT
from tuneline.core.training.optimizers.rules import optimizer_problems

KINDS: dict[str, StageKind] = {kind.name: kind for kind in (PT, SFT, RM, DPO, KTO, PPO)}
STAGE_NAMES = tuple(KINDS)
DEFAULT_STAGE = SFT.name  # what `stage` means when a config leaves it out


def stage_kind(name: str | None) -> StageKind:
    """The kind called `name` (None: the default kind, as for a config without `stage`), or a
    ConfigError listing the kinds there are."""
    name = DEFAULT_STAGE if name is None else name
    if name in KINDS:
        return KINDS[name]
    guess = nearest(name, KINDS)
    raise ConfigError(f"'stage: {name}' is not a stage kind" + (f"; did you mean '{guess}'?" if guess else "")
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
    if config.finetuning.stage not in KINDS:
        guess = nearest(config.finetuning.stage, KINDS)
        problems.append(f"'stage': got {config.finetuning.stage!r}; choose one of {', '.join(STAGE_NAMES)}"
                        + (f" (did you mean '{guess}'?)" if guess else ""))
    else:
        kind = KINDS[config.finetuning.stage]
        problems.extend(method_problems(config.model, config.finetuning))
        problems.extend(optimizer_problems(config))
        problems.extend(predict_problems(config, kind))
        problems.extend(kind.config_problems(config))
    if problems:
        raise ConfigError(problems, source=source)
    return config


def load_stage_config(path: str | Path, overrides: list[str] | None = None) -> StageConfig:
    raw = read_yaml(path)
    raw.update(parse_overrides(overrides or []))
    return build_stage_config(raw, source=str(path))


def predict_problems(config: StageConfig, kind: StageKind) -> list[str]:
    """`do_predict` / `predict_with_generate` settings that could not work, found before any training."""
    do_predict, with_generate = config.training.get("do_predict"), config.training.get("predict_with_generate")
    problems = []
    if do_predict and not with_generate:
        problems.append("'do_predict: true' needs 'predict_with_generate: true' (answers are generated and scored); set it or remove do_predict.")
    if with_generate and not kind.predicts:
        predicting = listed(name for name, k in KINDS.items() if k.predicts)
        problems.append(f"'predict_with_generate: true' is for stage {predicting}, not '{kind.name}'; remove it.")
    if do_predict and with_generate and not (config.data.eval_dataset or config.data.val_size):
        problems.append("'do_predict: true' needs a predict set: name 'eval_dataset' or hold rows out with 'val_size'.")
    if do_predict and with_generate and config.data.train_on_prompt:
        problems.append("'do_predict: true' finds where each prompt ends from the label mask, which 'train_on_prompt: true' "
                        "removes; remove one of the two.")
    return problems


def tokenize_stage_data(config: StageConfig, *, tokenizer_path: str | Path, output_dir: str | Path) -> dict[str, Any]:
    """The stage's datasets tokenized to `output_dir` in the shape its kind trains on; the counters."""
    from tuneline.core.data.tokenization import tokenize_dataset

    return tokenize_dataset(config, examples=stage_kind(config.finetuning.stage).examples, tokenizer_path=tokenizer_path,
                            output_dir=output_dir)
