"""Mix several datasets' rows into one list, as LLaMA-Factory's `mix_strategy` does.

LLaMA-Factory calls `datasets.concatenate_datasets` or `datasets.interleave_datasets`
(`interleave_under` stops at the first exhausted dataset, `interleave_over` at the last,
restarting the exhausted ones); this module makes the same row order on plain lists, without
building Arrow tables of the rows. With one dataset every strategy returns it unchanged, as
LLaMA-Factory does.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

from tuneline.core.errors import ConfigError, DataError, unknown_name_message

MixStrategy = Literal["concat", "interleave_under", "interleave_over"]
MIX_STRATEGIES = ("concat", "interleave_under", "interleave_over")
_DRAW_BLOCK = 1000  # `datasets` draws sources from its generator in blocks of this many
_PROBS_TOLERANCE = 1e-8


def mix_rows(per_dataset_rows: Sequence[Sequence[dict]], *, strategy: MixStrategy,
             probs: Sequence[float] | None, seed: int) -> list[dict]:
    """One list from the datasets' rows, in the order `datasets` would give them.

    Without `probs` the interleaving strategies take one row of each dataset in turn. With
    `probs` (one per dataset, summing to 1, LLaMA-Factory's `interleave_probs`) each row comes
    from a dataset drawn at random by numpy's `default_rng(seed)`. Rows are not copied.
    """
    _check_mix(per_dataset_rows, strategy=strategy, probs=probs)
    if len(per_dataset_rows) == 1:
        return list(per_dataset_rows[0])
    if strategy == "concat":
        return [row for rows in per_dataset_rows for row in rows]
    oversample = strategy == "interleave_over"
    if probs is None:
        return _round_robin(per_dataset_rows, oversample=oversample)
    return _random_interleave(per_dataset_rows, probs=probs, seed=seed, oversample=oversample)


def _round_robin(per_dataset_rows: Sequence[Sequence[dict]], *, oversample: bool) -> list[dict]:
    """Row i of every dataset, for i up to the shortest length (or the longest, cycling)."""
    lengths = [len(rows) for rows in per_dataset_rows]
    rounds = max(lengths) if oversample else min(lengths)
    return [rows[i % len(rows)] for i in range(rounds) for rows in per_dataset_rows]


def _random_interleave(per_dataset_rows: Sequence[Sequence[dict]], *, probs: Sequence[float],
                       seed: int, oversample: bool) -> list[dict]:
    """`datasets`' sampling loop: draw a source, take its next row (restarting it when
    exhausted), stop once any (under) or every (over) source has been exhausted."""
    import numpy as np

    rng = np.random.default_rng(seed)
    count = len(per_dataset_rows)
    lengths = [len(rows) for rows in per_dataset_rows]
    position = [0] * count
    exhausted = [False] * count
    done = all if oversample else any
    mixed: list[dict] = []
    while True:
        for source in rng.choice(count, size=_DRAW_BLOCK, p=list(probs)):
            if done(exhausted):
                return mixed
            mixed.append(per_dataset_rows[source][position[source]])
            position[source] += 1
            if position[source] >= lengths[source]:
                exhausted[source] = True
                position[source] = 0


def _check_mix(per_dataset_rows: Sequence[Sequence[dict]], *, strategy: str,
               probs: Sequence[float] | None) -> None:
    if strategy not in MIX_STRATEGIES:
        raise ConfigError(unknown_name_message("mix_strategy", strategy, MIX_STRATEGIES))
    if not per_dataset_rows:
        raise ConfigError("no datasets to mix; name at least one dataset.")
    count = len(per_dataset_rows)
    if probs is None:
        empty = [n + 1 for n, rows in enumerate(per_dataset_rows) if not rows]
        if empty and strategy != "concat" and count > 1:
            raise DataError(f"dataset(s) {empty} of {count} have no rows, so {strategy} has "
                            "nothing to take from them; give them rows or leave them out.")
        return
    if strategy == "concat":
        raise ConfigError("interleave_probs is set but mix_strategy is 'concat', which ignores "
                          "it; set mix_strategy to interleave_under or interleave_over, or "
                          "remove interleave_probs.")
    if len(probs) != count:
        raise ConfigError(f"interleave_probs has {len(probs)} value(s) for {count} datasets; "
                          "give one probability per dataset, in the order of 'dataset'.")
    if any(not math.isfinite(p) or p < 0 for p in probs) or not math.isclose(
        math.fsum(probs), 1.0, abs_tol=_PROBS_TOLERANCE
    ):
        raise ConfigError(f"interleave_probs {list(probs)} must be non-negative and sum to 1.")
    for number, (rows, p) in enumerate(zip(per_dataset_rows, probs)):
        if p > 0 and not rows:
            raise DataError(f"dataset {number + 1} of {count} has no rows but interleave_probs "
                              f"gives it {p}; give it rows or probability 0.")
        if p == 0 and strategy == "interleave_over":
            raise ConfigError(f"interleave_over needs every dataset to be drawn, but dataset "
                              f"{number + 1} of {count} has probability 0; raise it or use "
                              "interleave_under.")
