"""How a policy does on held-out prompts under an online RL stage's rewards.

Each prompt gets one greedy completion. Its reward is the weighted sum of the stage's rewards, as in
training; it passes when every reward that has a best score (the built-in verifiable ones) gives
that score: the right answer, in the right shape, not too long. The mean reward and the pass rate
are what `promote_metric: eval_pass_rate` compares.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from tuneline.core.config import GeneratingConfig
from tuneline.core.evaluation.predict import generate_answers
from tuneline.core.evaluation.reward_functions import CheckedReward

if TYPE_CHECKING:
    from datasets import Dataset
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


def weighted_scores(rewards: Sequence[CheckedReward], weights: Sequence[float], *, prompts: Sequence[Any],
                    completions: Sequence[str], completion_ids: Sequence[Sequence[int]],
                    columns: Mapping[str, Sequence[Any]]) -> tuple[list[float], list[bool], dict[str, list[float | None]]]:
    """Per completion: the weighted reward (a reward that does not apply counts 0), whether it passes,
    and each reward's own scores by name."""
    by_name: dict[str, list[float | None]] = {}
    totals = [0.0] * len(completions)
    passes = [True] * len(completions)
    for reward, weight in zip(rewards, weights):
        scores = reward(prompts=list(prompts), completions=list(completions), completion_ids=[list(i) for i in completion_ids],
                        **{key: list(values) for key, values in columns.items()})
        by_name[reward.name] = scores
        for row, value in enumerate(scores):
            totals[row] += weight * (value or 0.0)
            if reward.best is not None and (value is None or value < reward.best):
                passes[row] = False
    return totals, passes, by_name


def held_out_rewards(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, rows: Dataset, *,
                     rewards: Sequence[CheckedReward], weights: Sequence[float], max_new_tokens: int,
                     batch_size: int = 16) -> dict[str, float]:
    """`mean_reward`, `pass_rate` (when some reward has a best score) and each reward's mean, over
    greedy completions of `rows` (`prompt`, `prompt_ids` and the reward columns, as `prompt_rows` gives)."""
    was_training = model.training
    generating = GeneratingConfig(do_sample=False, max_new_tokens=max_new_tokens)
    completion_ids = generate_answers(model, tokenizer, list(rows["prompt_ids"]), generating=generating, batch_size=batch_size,
                                     keep_stop=True)  # as the trainer's completions end
    model.train(was_training)
    completions = tokenizer.batch_decode(completion_ids, skip_special_tokens=True)
    columns = {name: rows[name] for name in rows.column_names if name != "prompt"}  # prompt_ids: the reward model reads them
    totals, passes, by_name = weighted_scores(rewards, weights, prompts=rows["prompt"], completions=completions,
                                              completion_ids=completion_ids, columns=columns)
    count = max(len(totals), 1)
    metrics = {"mean_reward": sum(totals) / count}
    if any(reward.best is not None for reward in rewards):
        metrics["pass_rate"] = sum(passes) / count
    for name, scores in by_name.items():
        applied = [s for s in scores if s is not None]
        if applied:
            metrics[f"reward_{_metric_name(name)}"] = sum(applied) / len(applied)
    return metrics


def _metric_name(reward: str) -> str:
    """A reward's name as a metric name part ('my.module:score' -> 'my_module_score')."""
    return "".join(c if c.isalnum() or c == "_" else "_" for c in reward)
