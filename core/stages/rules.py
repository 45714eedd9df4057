"""The rules that hold across stage kinds: which keys and settings a kind can take, decided from the
fields its `StageKind` declares (what it predicts, what its examples are, whether it trains through a
Trainer or its own loop, owns its optimizer, has a reward head, which keys are its own), never from
its name. `core.stages.registry.build_stage_config` applies them to the kind a config names, after the
config layer's checks and before the kind's own (`StageKind.config_problems`).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from functools import cache
from typing import Any

from tuneline.core.config import GROUPS, StageConfig, trains
from tuneline.core.data.tokenization import dataset_names
from tuneline.core.errors import listed
from tuneline.core.stages.kind import StageKind
from tuneline.core.templates.catalog import AUTO
from tuneline.core.templates.options import template_key_problems
from tuneline.core.training.optimizers.rules import chosen_optimizers


def kind_problems(config: StageConfig, kind: StageKind, *, kinds: Mapping[str, StageKind]) -> list[str]:
    """Every rule across kinds that `config`, read as stage `kind`, breaks; `kinds` is the registry's table."""
    return [*predict_problems(config, kind, kinds=kinds), *stage_option_problems(config, kind),
            *data_key_problems(config, kind, kinds=kinds), *training_loop_problems(config, kind),
            *exclusive_key_problems(config, kind, kinds=kinds), *own_optimizer_problems(config, kind, kinds=kinds),
            *reward_head_problems(config, kind)]


def predict_problems(config: StageConfig, kind: StageKind, *, kinds: Mapping[str, StageKind]) -> list[str]:
    """`do_predict` / `predict_with_generate` settings that could not work, found before any training."""
    do_predict, with_generate = config.training.get("do_predict"), config.training.get("predict_with_generate")
    problems = []
    if do_predict and not with_generate:
        problems.append("'do_predict: true' needs 'predict_with_generate: true' (answers are generated and scored); "
                        "set it or remove do_predict.")
    if with_generate and not kind.predicts:
        predicting = listed(name for name, k in kinds.items() if k.predicts)
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
    if config.training.get("load_best_model_at_end") and (kind.train_loop is not None or kind.has_reward_head):
        problems.append(f"'load_best_model_at_end: true' is not supported by stage '{kind.name}' (LLaMA-Factory refuses it "
                        "for reward models and for PPO too); remove it.")
    return problems


def data_key_problems(config: StageConfig, kind: StageKind, *, kinds: Mapping[str, StageKind]) -> list[str]:
    """The template keys that cannot apply, and evaluation keys asked of data or stages they do not fit."""
    data = config.data
    problems = template_key_problems(data.template, tool_format=data.tool_format, enable_thinking=data.enable_thinking,
                                     preserve_thinking=data.preserve_thinking, auto=data.template == AUTO)
    if data.eval_num_beams is not None and data.eval_num_beams < 1:
        problems.append(f"'eval_num_beams' must be at least 1, got {data.eval_num_beams}.")
    if not data.ignore_pad_token_for_loss and kind.examples != "supervised":
        supervised = listed(name for name, k in kinds.items() if k.examples == "supervised")
        problems.append(f"'ignore_pad_token_for_loss: false' trains the padding of {supervised}'s labels; stage '{kind.name}' "
                        "pads its own way here (LLaMA-Factory also reads it for its preference stages), so remove the key.")
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


def training_loop_problems(config: StageConfig, kind: StageKind) -> list[str]:
    """Trainer keys asked of a kind that trains in its own loop, and keys that could not work together."""
    ft, training = config.finetuning, config.training
    problems = []
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


def exclusive_key_problems(config: StageConfig, kind: StageKind, *, kinds: Mapping[str, StageKind]) -> list[str]:
    """The keys other kinds declare exclusive (`StageKind.exclusive_keys`) set away from their default here."""
    flat, defaults = config.flat(), field_defaults()
    owners: dict[str, list[str]] = {}
    for name, other in kinds.items():
        for key in other.exclusive_keys:
            owners.setdefault(key, []).append(name)
    return [f"'{key}' is a key of stage {listed(names)}, which stage '{kind.name}' does not read; remove it."
            for key, names in owners.items() if key not in kind.exclusive_keys and flat[key] != defaults[key]]


def own_optimizer_problems(config: StageConfig, kind: StageKind, *, kinds: Mapping[str, StageKind]) -> list[str]:
    """A memory-saving optimizer asked of a kind that builds its own optimizer (`StageKind.owns_optimizer`)."""
    chosen = chosen_optimizers(config.optimizer)
    if not (chosen and kind.owns_optimizer):
        return []
    trainer_kinds = listed((name for name, k in kinds.items() if not k.owns_optimizer), last="and")
    return [f"'{chosen[0]}: true' chooses the optimizer of a Trainer, and stage {kind.name} trains in a loop of its own "
            f"with its own optimizer; remove the key for {kind.name}, or use it in the {trainer_kinds} stages."]


def reward_head_problems(config: StageConfig, kind: StageKind) -> list[str]:
    """PiSSA's conversion rewrites the LoRA matrices only, so it would drop a reward head saved with the adapter."""
    if not (config.finetuning.pissa_convert and kind.has_reward_head):
        return []
    return [f"'pissa_convert: true' keeps only the LoRA matrices of the adapter, and 'stage: {kind.name}' adds a reward "
            "head it would drop; remove pissa_convert."]


@cache
def field_defaults() -> dict[str, Any]:
    """Each key of the config's dataclasses and its default."""
    return {f.name: f.default for group in GROUPS.values() for f in dataclasses.fields(group)}
