"""The registry of stage kinds: the one list of the stage names, and the checks that depend on them.

Every other part of tuneline asks here what a stage kind is (`stage_kind`), never compares a stage
name itself. `build_stage_config` is where a stage's YAML becomes a checked `StageConfig`: the
config layer's own checks, then the method's, then the kind's, all problems reported at once.
Adding a kind is one module under `core/stages/` and one entry in `KINDS`
(docs/ARCHITECTURE.md, "Adding a stage kind").
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tuneline.core.config import StageConfig, parse_overrides, read_stage_config, read_yaml, trains
from tuneline.core.data.tokenization import dataset_names
from tuneline.core.errors import ConfigError, listed, nearest
from tuneline.core.models.loading import method_problems
from tuneline.core.stages.dpo import DPO
from tuneline.core.stages.grpo import GRPO, RLOO, online_key_problems
from tuneline.core.stages.kind import StageKind
from tuneline.core.stages.kto import KTO
from tuneline.core.stages.ppo.stage import PPO
from tuneline.core.stages.pt import PT
from tuneline.core.stages.rm import RM
from tuneline.core.stages.sft import LOSS_VARIANTS, SFT
from tuneline.core.templates.catalog import AUTO
from tuneline.core.templates.options import template_key_problems
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
    if config.finetuning.stage in NOT_OFFERED:
        problems.append(f"'stage: {config.finetuning.stage}': {NOT_OFFERED[config.finetuning.stage]}.")
    elif config.finetuning.stage not in KINDS:
        guess = nearest(config.finetuning.stage, KINDS)
        problems.append(f"'stage': got {config.finetuning.stage!r}; choose one of {', '.join(STAGE_NAMES)}"
                        + (f" (did you mean '{guess}'?)" if guess else ""))
    else:
        kind = KINDS[config.finetuning.stage]
        problems.extend(method_problems(config.model, config.finetuning))
        problems.extend(optimizer_problems(config))
        problems.extend(predict_problems(config, kind))
        problems.extend(stage_option_problems(config, kind))
        problems.extend(data_key_problems(config, kind))
        problems.extend(training_loop_problems(config, kind))
        problems.extend(online_key_problems(config, online=kind in (GRPO, RLOO)))
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
    profiled = [key for key in ("enable_torch_profiler", "profile_modules") if getattr(config.runtime, key)]
    if not trains(config.training) and do_predict and profiled:
        problems.extend(f"'{key}: {getattr(config.runtime, key)}' profiles training steps, and this config only predicts "
                        "(do_predict without do_train); remove it." for key in profiled)
    if not trains(config.training) and not do_predict and kind.train_loop is None:
        problems.append("'do_train: false' without 'do_predict: true' leaves the stage nothing to do; remove do_train, or "
                        "set 'do_predict: true' (with 'predict_with_generate: true') to only predict.")
    if do_predict and with_generate and config.data.train_on_prompt:
        problems.append("'do_predict: true' finds where each prompt ends from the label mask, which 'train_on_prompt: true' "
                        "removes; remove one of the two.")
    return problems


def stage_option_problems(config: StageConfig, kind: StageKind) -> list[str]:
    """LLaMA-Factory's rules on keys that only some stage kinds take."""
    data = config.data
    problems = []
    if kind.examples != "supervised":
        problems.extend(f"'{key}: true' shapes the labels of supervised conversations, which stage '{kind.name}' does not "
                        "train on; remove it." for key in ("train_on_prompt", "mask_history", "neat_packing")
                        if getattr(data, key))
    if config.training.get("load_best_model_at_end") and (kind.train_loop is not None or kind.output == "reward_model"):
        problems.append(f"'load_best_model_at_end: true' is not supported by stage '{kind.name}' (LLaMA-Factory refuses it "
                        "for rm and ppo too); remove it.")
    return problems


def data_key_problems(config: StageConfig, kind: StageKind) -> list[str]:
    """The template keys that cannot apply, and evaluation keys asked of data or stages they do not fit."""
    data = config.data
    problems = template_key_problems(data.template, tool_format=data.tool_format, enable_thinking=data.enable_thinking,
                                     preserve_thinking=data.preserve_thinking, auto=data.template == AUTO)
    if data.eval_num_beams is not None and data.eval_num_beams < 1:
        problems.append(f"'eval_num_beams' must be at least 1, got {data.eval_num_beams}.")
    if not data.ignore_pad_token_for_loss and kind is not SFT:
        problems.append(f"'ignore_pad_token_for_loss: false' trains the padding of sft's labels; stage '{kind.name}' pads "
                        "its own way here (LLaMA-Factory also reads it for dpo and kto), so remove the key.")
    if data.eval_on_each_dataset and data.eval_dataset:
        if kind.train_loop is not None:
            problems.append(f"'eval_on_each_dataset: true' names the trainer's metrics per dataset; stage '{kind.name}' "
                            "runs its own loop and scores all held-out rows together; remove the key.")
        odd = [name for name in dataset_names(data.eval_dataset) if not re.fullmatch(r"[\w.-]+", name)]
        if odd:
            problems.append(f"'eval_on_each_dataset: true' names a split and metrics after each dataset of 'eval_dataset', "
                            f"and {', '.join(map(repr, odd))} holds other characters than letters, digits, '_', '.' and "
                            "'-'; rename the entry in dataset_info.json.")
    return problems


LANGUAGE_MODEL_KINDS = (PT, SFT)  # the kinds whose trainer scores next-token predictions (compute_accuracy)


def training_loop_problems(config: StageConfig, kind: StageKind) -> list[str]:
    """Loss-variant and training-loop keys asked of a kind that does not read them, or that could not work."""
    ft, training = config.finetuning, config.training
    problems = [f"'{key}: true' is a loss of stage sft, not '{kind.name}'; remove it."
                for key in LOSS_VARIANTS if getattr(ft, key) and kind is not SFT]
    if ft.compute_accuracy and kind not in LANGUAGE_MODEL_KINDS:
        problems.append(f"'compute_accuracy: true' measures next-token predictions of stage "
                        f"{listed(k.name for k in LANGUAGE_MODEL_KINDS)}, not '{kind.name}'; remove it.")
    if ft.compute_accuracy and training.get("predict_with_generate"):
        problems.append("'compute_accuracy: true' scores the logits of each position and 'predict_with_generate: true' "
                        "generates answers instead; they cannot go together, remove one of them.")
    if kind.train_loop is not None:
        asked = {key: getattr(ft, key) for key in ("disable_shuffling", "include_effective_tokens_per_second") if getattr(ft, key)}
        asked.update({"early_stopping_steps": ft.early_stopping_steps} if ft.early_stopping_steps is not None else {})
        asked.update({key: getattr(config.runtime, key) for key in ("enable_torch_profiler", "profile_modules")
                      if getattr(config.runtime, key)})  # the profiler hooks into the transformers Trainer
        problems.extend(f"'{key}: {value}' is a key of the trainer-based stages; stage '{kind.name}' runs its "
                        "own loop and does not read it; remove it." for key, value in asked.items())
    elif ft.early_stopping_steps is not None:
        problems.extend(early_stopping_problems(config))
    return problems


def early_stopping_problems(config: StageConfig) -> list[str]:
    """What `early_stopping_steps` needs: evaluations during training, on held-out rows, of a named metric."""
    steps, training = config.finetuning.early_stopping_steps, config.training
    problems = []
    if steps is not None and steps <= 0:
        problems.append(f"'early_stopping_steps' must be a positive number of evaluations, got {steps}.")
    asked = f"'early_stopping_steps: {steps}'"
    if training.get("eval_strategy", "no") == "no":
        problems.append(f"{asked} counts evaluations during training, and 'eval_strategy' is 'no'; set "
                        "'eval_strategy: steps' (with 'eval_steps') or 'eval_strategy: epoch'.")
    if not (config.data.eval_dataset or config.data.val_size):
        problems.append(f"{asked} needs held-out rows to evaluate: name 'eval_dataset' or set 'val_size'.")
    if not (training.get("metric_for_best_model") or training.get("load_best_model_at_end")):
        problems.append(f"{asked} watches 'metric_for_best_model', which is unset; set it (e.g. 'metric_for_best_model: "
                        "eval_loss'), or 'load_best_model_at_end: true', which watches the loss.")
    return problems


def tokenize_stage_data(config: StageConfig, *, tokenizer_path: str | Path, output_dir: str | Path) -> dict[str, Any]:
    """The stage's datasets tokenized to `output_dir` in the shape its kind trains on; the counters."""
    from tuneline.core.data.tokenization import media_datasets, tokenize_dataset

    kind = stage_kind(config.finetuning.stage)
    if not kind.trains_images:
        with_media = media_datasets(config)
        if with_media:
            raise ConfigError(f"dataset {', '.join(repr(n) for n in with_media)} maps images, videos or audio, and 'stage: "
                              f"{kind.name}' does not train on media rows yet (sft, dpo, kto and rm do); train it on a text dataset.")
    return tokenize_dataset(config, examples=kind.examples, tokenizer_path=tokenizer_path, output_dir=output_dir)
