"""The online RL stages' pieces that need no training: the prompt rows the trainers read, how rewards
combine into the pass rate, the completions table of a resumed run, and the config checks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tuneline.core.errors import ConfigError
from tuneline.core.evaluation.pass_rate import weighted_scores
from tuneline.core.evaluation.reward_functions import CheckedReward, RewardModelScore, reward_functions
from tuneline.core.stages.registry import build_stage_config
from tuneline.core.training.completions_log import append_completions, completions_table


def test_prompt_rows_carry_the_rendered_prompt_its_ids_and_the_reference_answer(load):
    from datasets import Dataset

    from tuneline.core.stages.online_rl_trainers import prompt_rows

    tokenizer = load("qwen2.5")
    prompt = tokenizer("<|im_start|>user\nWhat is 7 + 5?<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)["input_ids"]
    reply = tokenizer("12<|im_end|>\n", add_special_tokens=False)["input_ids"]
    rows = prompt_rows(Dataset.from_dict({"input_ids": [prompt], "attention_mask": [[1] * len(prompt)], "labels": [reply]}),
                       tokenizer)
    assert rows.column_names == ["prompt", "prompt_ids", "answer"]
    assert rows[0] == {"prompt": "<|im_start|>user\nWhat is 7 + 5?<|im_end|>\n<|im_start|>assistant\n", "prompt_ids": prompt,
                       "answer": "12"}


def test_a_completion_passes_when_every_reward_with_a_best_score_gives_it():
    rewards = reward_functions("answer_match,think_answer_format", max_completion_length=16)
    rewards.append(CheckedReward("length", lambda prompts, completions, **columns: [len(c) / 100 for c in completions]))
    completions = ["<think>7 + 5 = 12</think><answer>12</answer>", "<think>7 + 5 = 13</think><answer>13</answer>",
                   "12, so the answer is 12."]
    totals, passes, by_name = weighted_scores(rewards, [1.0, 0.5, 0.0], prompts=["q"] * 3, completions=completions,
                                              completion_ids=[[1]] * 3, columns={"answer": ["12"] * 3})
    assert passes == [True, False, False]  # the user reward has no best score, so it does not decide
    assert totals == [1.5, 0.5, 0.0]
    assert by_name["answer_match"] == [1.0, 0.0, 0.0] and by_name["length"] == [0.44, 0.44, 0.24]


def test_the_reward_model_reads_token_ids_not_text():
    scorer = CheckedReward("reward_model", RewardModelScore(model=None, tokenizer=None))
    with pytest.raises(ConfigError, match="scores token ids"):
        scorer(prompts=["q"], completions=["a"])


def test_the_completions_table_keeps_the_last_attempt_at_each_step(tmp_path: Path):
    append_completions(tmp_path, [{"step": 1, "prompt": "p", "completion": "first try", "reward_x": 0.0}])
    append_completions(tmp_path, [{"step": 2, "prompt": "p", "completion": "killed after this", "reward_x": 0.0}])
    append_completions(tmp_path, [{"step": 2, "prompt": "p", "completion": "resumed", "reward_x": 1.0},
                                  {"step": 2, "prompt": "q", "completion": "resumed too", "reward_x": 1.0}])
    table = completions_table(tmp_path)
    assert table == {"step": [1, 2, 2], "prompt": ["p", "p", "q"], "completion": ["first try", "resumed", "resumed too"],
                     "reward_x": [0.0, 1.0, 1.0]}
    assert completions_table(tmp_path / "none") is None
    assert all(json.loads(line) for line in (tmp_path / "completions.jsonl").read_text().splitlines())


def grpo(**values) -> dict:
    return {"stage": "grpo", "dataset": "prompts", "template": "chatml", "reward_funcs": "answer_match", **values}


def test_grpo_settings_reach_the_config_with_trl_names():
    config = build_stage_config(grpo(num_generations=4, per_device_train_batch_size=8, beta=0.04, epsilon_high=0.28,
                                     loss_type="dr_grpo", importance_sampling_level="sequence", scale_rewards=False,
                                     reward_funcs=["answer_match", "think_answer_format"], reward_weights="1, 0.5"))
    ft = config.finetuning
    assert (ft.num_generations, ft.beta, ft.epsilon_high, ft.loss_type, ft.importance_sampling_level) == (4, 0.04, 0.28,
                                                                                                         "dr_grpo", "sequence")
    assert ft.scale_rewards is False and ft.reward_funcs == ["answer_match", "think_answer_format"]


@pytest.mark.parametrize("values, message", [
    ({"scale_rewards": "always"}, "'scale_rewards': got 'always'"),
    ({"epsilon": 0.2, "epsilon_high": 0.1}, "'epsilon_high' (when set) at least epsilon"),
    ({"num_generations": 1}, "'num_generations' must be at least 2"),
    ({"do_sample": False}, "'do_sample: false' cannot train stage 'grpo'"),
    ({"pissa_init": True, "beta": 0.1}, "'pissa_init: true' cannot train stage 'grpo' against a reference model"),
    ({"reward_model_type": "api", "reward_model": "rm"}, "'reward_model_type: api' is not supported"),
    ({"do_train": False, "do_predict": True}, "'do_train: false' leaves stage grpo nothing to do"),
])
def test_grpo_settings_that_cannot_train_are_named(values: dict, message: str):
    with pytest.raises(ConfigError) as error:
        build_stage_config(grpo(**values))
    assert message in str(error.value)


def test_the_prompt_order_of_each_epoch_does_not_depend_on_where_a_run_started():
    """A run resumed in its third epoch reads the order an uninterrupted run reads there (TRL's own
    sampler would start again from the first epoch's order)."""
    from trl.trainer.utils import RepeatSampler

    from tuneline.core.stages.online_rl_trainers import EpochRepeatSampler

    def sampler(kind):
        return kind(data_source=list(range(12)), mini_repeat_count=2, batch_size=3, repeat_count=1, shuffle=True, seed=7)

    stateful = sampler(RepeatSampler)
    uninterrupted = [list(stateful) for _ in range(3)]
    resumed = sampler(EpochRepeatSampler)
    resumed.set_epoch(2)
    assert list(resumed) == uninterrupted[2] != uninterrupted[0]
    again = sampler(EpochRepeatSampler)
    orders = []
    for epoch in range(3):
        again.set_epoch(epoch)
        orders.append(list(again))
    assert orders == uninterrupted


def test_online_dpo_is_refused_with_the_reason():
    with pytest.raises(ConfigError, match="TRL 1.16 keeps its OnlineDPOTrainer under trl.experimental"):
        build_stage_config(grpo(stage="online_dpo"))
    with pytest.raises(ConfigError, match="scores all held-out prompts together"):
        build_stage_config(grpo(eval_on_each_dataset=True, eval_dataset="a,b"))
