"""Verifiable rewards and the reward functions an online RL stage is given by name: answers found and
normalised, math equivalence through math-verify, the think/answer shape, the overlong penalty, user
functions `module:function`, weights, and errors that name the reward and the row."""

from __future__ import annotations

import importlib.util
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import missing_asset
from tuneline.core.errors import ConfigError
from tuneline.core.evaluation.reward_functions import RewardError, reward_functions, reward_weights
from tuneline.core.evaluation.verifiable import (
    answer_match,
    final_answer,
    math_equivalence,
    normalised,
    overlong_penalty,
    think_answer_format,
)


@pytest.mark.parametrize("completion, answer", [
    ("<think>7 + 5 is twelve</think><answer>12</answer>", "12"),
    ("so the result is \\boxed{\\frac{1}{2}} indeed", "\\frac{1}{2}"),
    ("Let me see.\nThe answer:\n  Paris.  ", "The answer:"),  # no tag, no box: the last line
    ("<answer>3</answer> and later <answer>4</answer>", "4"),
])
def test_the_final_answer_is_the_last_tag_else_box_else_line(completion: str, answer: str):
    expected = "Paris." if answer == "The answer:" else answer
    assert final_answer(completion) == expected


def test_answers_are_compared_after_normalisation():
    assert normalised("  1,200.50 ") == normalised("1200.5") == "1200.5"
    assert normalised("-0.0") == "0" and normalised("+7") == "7"
    assert normalised("The  Eiffel Tower.") == normalised("the eiffel tower") == "the eiffel tower"
    completions = ["<answer> 1,200.50 </answer>", "<answer>1200.51</answer>", "Paris!", "<answer></answer>"]
    assert answer_match([""] * 4, completions, answer=["1200.5", "1200.5", "paris", "0"]) == [1.0, 0.0, 1.0, 0.0]


def test_math_equivalence_accepts_the_same_number_written_otherwise():
    if importlib.util.find_spec("math_verify") is None:
        missing_asset("math-verify is not installed: it is tuneline's 'rl' extra (pip install -e '.[rl]')")
    completions = ["<answer>0.5</answer>", "<answer>\\frac{2}{4}</answer>", "<answer>0.6</answer>", "\\boxed{12}"]
    assert math_equivalence([""] * 4, completions, answer=["\\frac{1}{2}", "0.5", "0.5", "12.0"]) == [1.0, 1.0, 0.0, 1.0]


def test_the_think_answer_shape_and_the_overlong_penalty():
    shaped = ["<think>a</think> <answer>b</answer>", "<think>a</think>b", "x <think>a</think><answer>b</answer>",
              "\n<think>\nmany\nlines\n</think>\n<answer>b</answer>\n"]
    assert think_answer_format([""] * 4, shaped) == [1.0, 0.0, 0.0, 1.0]
    penalty = overlong_penalty(100, cache=20)
    assert penalty([""] * 4, [""] * 4, completion_ids=[[0] * 80, [0] * 90, [0] * 100, [0] * 130]) == [0.0, -0.5, -1.0, -1.0]
    with pytest.raises(ConfigError, match="between 1 and max_completion_length"):
        overlong_penalty(10, cache=11)


def test_rewards_are_named_built_in_or_module_function_and_weighted(tmp_path: Path, monkeypatch):
    (tmp_path / "scored_rewards.py").write_text(textwrap.dedent('''
        def brevity(prompts, completions, **columns):
            return [1.0 / (1 + len(c)) for c in completions]

        def raises(prompts, completions, **columns):
            raise KeyError("score")

        def short(prompts, completions, **columns):
            return [1.0]

        def text(prompts, completions, **columns):
            return ["good" for c in completions]
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    rewards = reward_functions("answer_match, scored_rewards:brevity, overlong_penalty", max_completion_length=64)
    assert [r.__name__ for r in rewards] == ["answer_match", "scored_rewards:brevity", "overlong_penalty"]
    assert rewards[1](prompts=["q", "q"], completions=["a", "abc"]) == [0.5, 0.25]
    assert reward_weights("1, 0.5, 2", count=3) == [1.0, 0.5, 2.0] and reward_weights(None, count=2) == [1.0, 1.0]
    with pytest.raises(ConfigError, match="'reward_weights' gives 2 weights for 3 rewards"):
        reward_weights([1, 2], count=3)
    with pytest.raises(ConfigError, match="unknown reward 'answer_mach'; did you mean 'answer_match'"):
        reward_functions("answer_mach", max_completion_length=64)
    with pytest.raises(ConfigError, match="reward 'no_such_module:f': module 'no_such_module' cannot be imported"):
        reward_functions("no_such_module:f", max_completion_length=64)
    with pytest.raises(ConfigError, match="reward 'scored_rewards:missing': module 'scored_rewards' has no function 'missing'"):
        reward_functions("scored_rewards:missing", max_completion_length=64)
    with pytest.raises(ConfigError, match="needs 'reward_funcs'"):
        reward_functions("", max_completion_length=64)
    failing, short, text = reward_functions("scored_rewards:raises, scored_rewards:short, scored_rewards:text", max_completion_length=64)
    with pytest.raises(RewardError, match=r"reward 'scored_rewards:raises' raised KeyError: 'score' \(scoring 2 completions, the "
                                          r"first for prompt 'What is 2\+2\?'\)") as raised:
        failing(prompts=["What is 2+2?", "x"], completions=["4", "5"])
    assert raised.value.exit_code == 2
    with pytest.raises(RewardError, match="reward 'scored_rewards:short' returned a list of 1 for 2 completions"):
        short(prompts=["a", "b"], completions=["4", "5"])
    with pytest.raises(RewardError, match="reward 'scored_rewards:text' returned 'good' for completion 0 \\(prompt 'a'\\)"):
        text(prompts=["a", "b"], completions=["4", "5"])
    with pytest.raises(ConfigError, match="compares each completion with the row's 'answer' column"):
        reward_functions("answer_match", max_completion_length=64)[0](prompts=["a"], completions=["4"])
    sys.modules.pop("scored_rewards", None)
