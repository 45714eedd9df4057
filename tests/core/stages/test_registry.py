"""The registry's checks of the training-loop keys: asked of a kind that does not read them, or unable to work."""

from __future__ import annotations

import pytest

from tuneline.core.errors import ConfigError
from tuneline.core.stages.registry import build_stage_config

EVALUATING = {"eval_strategy": "steps", "eval_steps": 5, "val_size": 0.1, "dataset": "demo_alpaca", "metric_for_best_model": "eval_loss"}


@pytest.mark.parametrize(("keys", "fragment"), [
    ({"stage": "dpo", "compute_accuracy": True}, "'compute_accuracy' is a key of stage pt or sft, which stage 'dpo' does not read"),
    ({"compute_accuracy": True, "predict_with_generate": True, "do_predict": True, "val_size": 0.1, "dataset": "demo_alpaca"},
     "'compute_accuracy: true' scores the logits of each position and 'predict_with_generate: true'"),
    ({"stage": "ppo", "reward_model": "rm", "disable_shuffling": True}, "'disable_shuffling: True' is a key of the trainer-based stages"),
    ({"stage": "ppo", "reward_model": "rm", "include_effective_tokens_per_second": True},
     "'include_effective_tokens_per_second: True' is a key of the trainer-based stages"),
    ({**EVALUATING, "early_stopping_steps": 0}, "'early_stopping_steps' must be a positive number of evaluations"),
    ({**EVALUATING, "eval_strategy": "no", "early_stopping_steps": 2},
     "'early_stopping_steps: 2' counts evaluations during training, and 'eval_strategy' is 'no'"),
    ({**EVALUATING, "val_size": 0, "early_stopping_steps": 2}, "needs held-out rows to evaluate"),
    ({**EVALUATING, "metric_for_best_model": None, "early_stopping_steps": 2}, "watches 'metric_for_best_model'"),
])
def test_training_loop_keys_that_cannot_work_are_named(keys: dict, fragment: str) -> None:
    with pytest.raises(ConfigError) as error:
        build_stage_config({"stage": "sft", **keys})
    assert any(fragment in problem for problem in error.value.problems), error.value.problems


@pytest.mark.parametrize("keys", [
    {"compute_accuracy": True},
    {"stage": "pt", "compute_accuracy": True, "disable_shuffling": True},
    {"stage": "dpo", "disable_shuffling": True, "include_effective_tokens_per_second": True},
    {**EVALUATING, "early_stopping_steps": 3},
    {**EVALUATING, "metric_for_best_model": None, "load_best_model_at_end": True, "save_strategy": "steps",
     "save_steps": 5, "early_stopping_steps": 3},
])
def test_training_loop_keys_are_read(keys: dict) -> None:
    config = build_stage_config({"stage": "sft", **keys})
    assert all(config.flat()[key] == value for key, value in keys.items())
