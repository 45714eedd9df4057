"""The reward functions an online RL stage scores its completions with, by name, weighted.

`reward_funcs` lists built-in verifiable rewards (`core.evaluation.verifiable`) and user functions
written `module:function` (TRL's reward-function signature: `f(prompts, completions, **columns)` returning
one float, or None for "does not apply", per completion), comma-separated; `reward_weights` weighs them
(1.0 each unless given). Every function is wrapped so that one that raises, or returns anything but one
number per completion, stops the stage with an error naming the reward and the row, rather than a
traceback from inside the trainer.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from tuneline.core.errors import ConfigError, TunelineError, unknown_name_message
from tuneline.core.evaluation.verifiable import answer_match, math_equivalence, overlong_penalty, think_answer_format

RewardFunction = Callable[..., list[float | None]]
BUILT_IN: dict[str, Callable[[int], RewardFunction]] = {
    "answer_match": lambda max_completion_length: answer_match,
    "math_equivalence": lambda max_completion_length: math_equivalence,
    "think_answer_format": lambda max_completion_length: think_answer_format,
    "overlong_penalty": overlong_penalty,
}
"""Built-in rewards by name, each made for the stage's `max_completion_length`."""
BEST_SCORES = {"answer_match": 1.0, "math_equivalence": 1.0, "think_answer_format": 1.0, "overlong_penalty": 0.0}
"""The score of a completion that fully satisfies each built-in reward (what the pass rate counts)."""


class RewardError(TunelineError):
    """A reward function that failed or answered in the wrong shape: the stage stops (exit 2)."""


@dataclass(frozen=True)
class CheckedReward:
    """A reward function whose every call is checked: one float or None per completion."""

    name: str
    function: RewardFunction
    best: float | None = None
    """The score of a completion that fully satisfies it; None where there is none (user functions, reward models)."""

    @property
    def __name__(self) -> str:  # TRL names a reward's logged metrics by its function's name
        return self.name

    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], **columns: Any) -> list[float | None]:
        try:
            scores = self.function(prompts=prompts, completions=completions, **columns)
        except TunelineError:
            raise
        except Exception as e:
            raise RewardError(f"reward '{self.name}' raised {type(e).__name__}: {e} (scoring {len(completions)} completions, "
                              f"the first for prompt {_start(prompts[0] if prompts else '')}); fix the function, or "
                              "remove it from reward_funcs.") from e
        if not isinstance(scores, (list, tuple)) or len(scores) != len(completions):
            shape = f"a {type(scores).__name__}" + (f" of {len(scores)}" if isinstance(scores, (list, tuple)) else "")
            raise RewardError(f"reward '{self.name}' returned {shape} for {len(completions)} completions; it must return a "
                              "list with one float (or None) per completion.")
        for row, score in enumerate(scores):
            if score is not None and (isinstance(score, bool) or not isinstance(score, (int, float)) or not math.isfinite(score)):
                raise RewardError(f"reward '{self.name}' returned {score!r} for completion {row} (prompt "
                                  f"{_start(prompts[row] if row < len(prompts) else '')}); each score must be a finite "
                                  "float, or None where the reward does not apply.")
        return [None if score is None else float(score) for score in scores]


def _start(prompt: Any) -> str:
    text = prompt if isinstance(prompt, str) else " ".join(str(m.get("content", "")) for m in prompt)
    return repr(text[:80])


def names_of(value: str | Sequence[str] | None) -> list[str]:
    """The names a `reward_funcs` value lists (a comma-separated string or a list)."""
    items = value.split(",") if isinstance(value, str) else list(value or [])
    return [item.strip() for item in items if item.strip()]


def user_function(spec: str) -> RewardFunction:
    """The function a `module:function` spec names, imported; a ConfigError says what is missing."""
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise ConfigError(f"reward '{spec}' is no built-in reward and not written 'module:function'; built-in rewards: "
                          f"{', '.join(BUILT_IN)}.")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ConfigError(f"reward '{spec}': module '{module_name}' cannot be imported ({e}); put it on PYTHONPATH or "
                          "install its package.") from e
    function = getattr(module, attribute, None)
    if not callable(function):
        raise ConfigError(f"reward '{spec}': module '{module_name}' has no function '{attribute}'.")
    return function


def reward_functions(value: str | Sequence[str] | None, *, max_completion_length: int) -> list[CheckedReward]:
    """The checked reward functions `reward_funcs` names, in order (at least one)."""
    names = names_of(value)
    if not names:
        raise ConfigError("an online RL stage needs 'reward_funcs': built-in rewards "
                          f"({', '.join(BUILT_IN)}), user functions 'module:function', or 'reward_model'.")
    rewards = []
    for name in names:
        if name in BUILT_IN:
            rewards.append(CheckedReward(name, BUILT_IN[name](max_completion_length), best=BEST_SCORES[name]))
        elif ":" in name:
            rewards.append(CheckedReward(name, user_function(name)))
        else:
            raise ConfigError(unknown_name_message("reward", name, [*BUILT_IN, "module:function"]))
    return rewards


@dataclass(frozen=True)
class RewardModelScore:
    """A trained reward model (an rm stage output) as a reward function: it scores each prompt's ids
    followed by the completion's ids, the sequence its training saw, not a re-tokenized text."""

    model: Any
    tokenizer: Any
    batch_size: int = 8

    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], completion_ids: Sequence[Sequence[int]] | None = None,
                 prompt_ids: Sequence[Sequence[int]] | None = None, **columns: Any) -> list[float]:
        from tuneline.core.evaluation.reward import score

        if completion_ids is None or prompt_ids is None:
            raise ConfigError("the reward model scores token ids, and the trainer passed no 'prompt_ids' or 'completion_ids'.")
        sequences = [list(prompt) + list(completion) for prompt, completion in zip(prompt_ids, completion_ids)]
        return score(self.model, self.tokenizer, sequences, batch_size=self.batch_size).tolist()


def reward_weights(value: str | Sequence[float] | None, *, count: int) -> list[float]:
    """`reward_weights` as floats, one per reward (1.0 each when unset)."""
    if value is None or value == "":
        return [1.0] * count
    items = value.split(",") if isinstance(value, str) else list(value)
    try:
        weights = [float(item) for item in items]
    except (TypeError, ValueError) as e:
        raise ConfigError(f"'reward_weights' must be numbers, one per reward, got {value!r}.") from e
    if len(weights) != count:
        raise ConfigError(f"'reward_weights' gives {len(weights)} weights for {count} rewards; give one per reward_funcs entry.")
    return weights
