"""The rules across stage kinds read what a kind declares, not its name: a kind the registry does not
hold gets a rule's problem exactly when it is given the field the rule reads; and the keys the kinds
declare their own are fields of the config, each one kind's (the online RL keys the two online kinds')."""

from __future__ import annotations

import dataclasses

import pytest

from tuneline.core.config import FinetuningConfig, read_stage_config
from tuneline.core.stages.registry import KINDS
from tuneline.core.stages.rules import kind_problems

# a kind of no particular name, given the fields each rule reads
LAB = dataclasses.replace(KINDS["sft"], name="lab", exclusive_keys=frozenset(), own_keys=())
LAB_KINDS = {**KINDS, "lab": LAB}


@pytest.mark.parametrize(("fields", "keys", "fragment"), [
    ({"owns_optimizer": True}, {"use_adam_mini": True}, "'use_adam_mini: true' chooses the optimizer of a Trainer, and stage lab"),
    ({"output": "reward_model"}, {"pissa_init": True, "pissa_convert": True}, "'stage: lab' adds a reward head it would drop"),
    ({"output": "reward_model"}, {"load_best_model_at_end": True}, "'load_best_model_at_end: true' is not supported by stage 'lab'"),
    ({"examples": "pairwise"}, {"train_on_prompt": True}, "which stage 'lab' does not train on"),
    ({"examples": "pairwise"}, {"ignore_pad_token_for_loss": False}, "pads its own way here"),
    ({"predicts": False}, {"predict_with_generate": True, "val_size": 0.1, "dataset": "d"}, "'predict_with_generate: true' is for stage"),
])
def test_a_rule_follows_the_fields_a_kind_declares(fields: dict, keys: dict, fragment: str) -> None:
    config, _ = read_stage_config({"stage": "sft", **keys})
    assert not any(fragment in problem for problem in kind_problems(config, LAB, kinds=LAB_KINDS))
    problems = kind_problems(config, dataclasses.replace(LAB, **fields), kinds=LAB_KINDS)
    assert any(fragment in problem for problem in problems), problems


def test_a_key_a_kind_declares_exclusive_is_refused_in_every_other_kind() -> None:
    config, _ = read_stage_config({"stage": "sft", "pref_beta": 0.3})  # which sft ignores, with a warning
    assert not kind_problems(config, KINDS["sft"], kinds=KINDS)
    claiming = {**KINDS, "lab": dataclasses.replace(LAB, exclusive_keys=frozenset({"pref_beta"}))}
    assert ("'pref_beta' is a key of stage lab, which stage 'sft' does not read; remove it."
            in kind_problems(config, KINDS["sft"], kinds=claiming))


def test_each_kind_declares_its_own_keys_and_only_fields_of_the_config():
    fields = {f.name for f in dataclasses.fields(FinetuningConfig)}
    owners: dict[str, list[str]] = {}
    for name, kind in KINDS.items():
        assert set(kind.own_keys) <= fields, (name, set(kind.own_keys) - fields)
        assert set(kind.own_keys) <= kind.reads and kind.exclusive_keys <= kind.reads, name
        for key in kind.own_keys:
            owners.setdefault(key, []).append(name)
    shared = {key: names for key, names in owners.items() if len(names) > 1}
    # the online RL keys are the two online kinds' (rloo reads all but grpo's own loss settings)
    assert all(names == ["grpo", "rloo"] for names in shared.values()), shared
    assert {"pref_beta", "kto_chosen_weight", "ppo_epochs", "use_dft_loss", "num_generations"} <= set(owners)
