"""Verifiable rewards: scores a program computes from a completion and the row's reference answer.

Each reward has TRL's reward-function signature, `reward(prompts, completions, **columns) -> list[float]`
(one score per completion; the dataset's columns arrive as lists beside them, `answer` among them), so
the same functions score GRPO's rollouts and the held-out pass rate.

- `answer_match`: 1.0 when the completion's final answer equals the row's `answer` after normalisation
  (case, spaces, surrounding punctuation, thousands separators, a number's trailing zeros), else 0.0.
- `math_equivalence`: 1.0 when the final answer and `answer` are the same mathematical object, as the
  math-verify package decides (1/2 = 0.5 = \\frac{1}{2}); the `rl` extra installs it.
- `think_answer_format`: 1.0 for a completion shaped `<think>...</think><answer>...</answer>` and nothing
  else, else 0.0.
- `overlong_penalty`: 0 up to `max_completion_length - cache` tokens, then falling linearly to -1 at
  `max_completion_length` (DAPO's soft overlong punishment); needs the completions' token ids.

The final answer is the text of the last `<answer>...</answer>` when there is one, else the last
`\\boxed{...}`, else the completion's last line.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from tuneline.core.errors import ConfigError

ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
BOXED = re.compile(r"\\boxed\{((?:[^{}]|\{[^{}]*\})*)\}")
THINK_ANSWER = re.compile(r"\s*<think>.*?</think>\s*<answer>.*?</answer>\s*", re.DOTALL)
NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?")


def final_answer(completion: str) -> str:
    """The answer a completion gives: its last `<answer>` tag's text, else its last `\\boxed{}`, else its last line."""
    tagged = ANSWER_TAG.findall(completion)
    if tagged:
        return tagged[-1].strip()
    boxed = BOXED.findall(completion)
    if boxed:
        return boxed[-1].strip()
    lines = [line.strip() for line in completion.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


def normalised(answer: str) -> str:
    """`answer` compared loosely: lower case, single spaces, no surrounding punctuation or `$`, and a
    number written plainly (no thousands separators, no trailing zeros after the point)."""
    text = " ".join(str(answer).strip().lower().split()).strip(" .,;:!?$")
    plain = text.replace(",", "")
    if NUMBER.fullmatch(plain):
        if "." in plain:
            plain = plain.rstrip("0").rstrip(".")
        return plain.lstrip("+") if plain not in ("-0", "+0") else "0"
    return text


def _text(completion: Any) -> str:
    """A completion's text: TRL gives a string, or for conversational prompts a list of messages."""
    if isinstance(completion, str):
        return completion
    return "".join(message.get("content") or "" for message in completion)


def _answers(columns: dict[str, Any], count: int, *, reward: str) -> list[Any]:
    answers = columns.get("answer")
    if answers is None:
        raise ConfigError(f"reward '{reward}' compares each completion with the row's 'answer' column, which the dataset "
                          "does not give; map the reference answers to 'answer' in dataset_info.json's columns.")
    if len(answers) != count:
        raise ConfigError(f"reward '{reward}' got {count} completions and {len(answers)} answers.")
    return list(answers)


def answer_match(prompts: Sequence[Any], completions: Sequence[Any], **columns: Any) -> list[float]:
    """1.0 where the final answer equals the row's `answer` once both are normalised, else 0.0."""
    answers = _answers(columns, len(completions), reward="answer_match")
    return [float(normalised(final_answer(_text(completion))) == normalised(answer))
            for completion, answer in zip(completions, answers)]


def math_equivalence(prompts: Sequence[Any], completions: Sequence[Any], **columns: Any) -> list[float]:
    """1.0 where math-verify finds the final answer and the row's `answer` equal, else 0.0."""
    try:
        from math_verify import parse, verify
    except ImportError as e:
        raise ConfigError("reward 'math_equivalence' needs the math-verify package; install tuneline's 'rl' extra "
                          "(pip install -e '.[rl]') or use 'answer_match'.") from e
    answers = _answers(columns, len(completions), reward="math_equivalence")
    scores = []
    for completion, answer in zip(completions, answers):
        given = final_answer(_text(completion))
        reference = parse(f"${answer}$") or parse(str(answer))
        found = parse(f"${given}$") or parse(given)
        scores.append(float(bool(reference) and bool(found) and verify(reference, found)))
    return scores


def think_answer_format(prompts: Sequence[Any], completions: Sequence[Any], **columns: Any) -> list[float]:
    """1.0 for `<think>...</think><answer>...</answer>` and nothing around it but spaces, else 0.0."""
    return [float(THINK_ANSWER.fullmatch(_text(completion)) is not None) for completion in completions]


def overlong_penalty(max_completion_length: int, *, cache: int | None = None):
    """A reward that is 0 up to `max_completion_length - cache` tokens and falls linearly to -1 at
    `max_completion_length` (`cache`: a quarter of it unless given)."""
    soft = cache if cache is not None else max(1, max_completion_length // 4)
    if not 0 < soft <= max_completion_length:
        raise ConfigError(f"the overlong penalty's cache must be between 1 and max_completion_length "
                          f"({max_completion_length}), got {soft}.")
    start = max_completion_length - soft

    def overlong(prompts: Sequence[Any], completions: Sequence[Any], completion_ids: Sequence[Sequence[int]] | None = None,
                 **columns: Any) -> list[float]:
        if completion_ids is None:
            raise ConfigError("reward 'overlong_penalty' counts each completion's tokens, which the trainer did not pass.")
        return [-min(1.0, max(0, len(ids) - start) / soft) for ids in completion_ids]

    overlong.__name__ = "overlong_penalty"
    return overlong
