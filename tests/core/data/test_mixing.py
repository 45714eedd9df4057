"""mix_rows: LLaMA-Factory's mix_strategy and interleave_probs on plain row lists."""

from __future__ import annotations

import pytest

from tuneline.core.data.mixing import mix_rows
from tuneline.core.errors import ConfigError, DataError

LENGTHS = {"a": 3, "b": 4, "c": 5}


def rows(tag: str, count: int) -> list[dict]:
    return [{"id": f"{tag}{i}"} for i in range(count)]


def mixed(strategy: str, probs: list[float] | None = None, seed: int = 42) -> str:
    per_dataset = [rows(tag, count) for tag, count in LENGTHS.items()]
    return " ".join(r["id"] for r in mix_rows(per_dataset, strategy=strategy, probs=probs,
                                                seed=seed))


def test_concat_keeps_dataset_order() -> None:
    assert mixed("concat") == "a0 a1 a2 b0 b1 b2 b3 c0 c1 c2 c3 c4"


def test_interleave_without_probs_takes_turns() -> None:
    assert mixed("interleave_under") == "a0 b0 c0 a1 b1 c1 a2 b2 c2"
    assert mixed("interleave_over") == "a0 b0 c0 a1 b1 c1 a2 b2 c2 a0 b3 c3 a1 b0 c4"


def test_interleave_with_probs_exact_order_for_seed() -> None:
    # Orders produced by datasets.interleave_datasets (what LLaMA-Factory calls) for seed 42.
    assert mixed("interleave_under", [0.2, 0.5, 0.3]) == "c0 b0 c1 b1 a0 c2 c3 c4"
    assert mixed("interleave_over", [0.2, 0.5, 0.3]) == (
        "c0 b0 c1 b1 a0 c2 c3 c4 a1 b2 b3 c0 b0 c1 b1 b2 b3 a2")
    assert mixed("interleave_under", [0.7, 0.2, 0.1]) == "b0 a0 b1 a1 a2"
    assert mixed("interleave_under", [0.2, 0.5, 0.3], seed=0) == "b0 b1 a0 a1 c0 c1 b2 c2 b3"


CASES = [(strategy, probs) for strategy in ("interleave_under", "interleave_over")
         for probs in (None, [0.7, 0.2, 0.1], [0.25, 0.25, 0.5], [0.0, 0.6, 0.4])
         if not (strategy == "interleave_over" and probs and 0.0 in probs)]


@pytest.mark.parametrize(("strategy", "probs"), CASES)
@pytest.mark.parametrize("seed", [0, 7, 42])
def test_interleave_matches_datasets(strategy: str, probs: list[float] | None,
                                     seed: int) -> None:
    from datasets import Dataset, interleave_datasets

    sources = [Dataset.from_dict({"id": [r["id"] for r in rows(tag, count)]})
               for tag, count in LENGTHS.items()]
    stop = "first_exhausted" if strategy == "interleave_under" else "all_exhausted"
    expected = interleave_datasets(sources, probabilities=probs, seed=seed,
                                   stopping_strategy=stop)["id"]
    assert mixed(strategy, probs, seed).split() == expected


def test_one_dataset_is_returned_unchanged() -> None:
    only = rows("a", 3)
    for strategy in ("concat", "interleave_under", "interleave_over"):
        assert mix_rows([only], strategy=strategy, probs=None, seed=1) == only


def test_rows_are_the_same_objects_not_copies() -> None:
    a, b = rows("a", 1), rows("b", 2)
    out = mix_rows([a, b], strategy="interleave_over", probs=None, seed=1)
    assert out[0] is a[0] and out[2] is a[0]


@pytest.mark.parametrize(("strategy", "probs", "match"), [
    ("interleave", None, "unknown mix_strategy 'interleave'"),
    ("concat", [0.5, 0.5], "mix_strategy is 'concat'"),
    ("interleave_under", [0.5, 0.5, 0.5], "has 3 value"),
    ("interleave_under", [0.6, 0.6], "sum to 1"),
    ("interleave_under", [1.5, -0.5], "non-negative"),
    ("interleave_over", [1.0, 0.0], "has probability 0"),
])
def test_bad_mix_settings_are_config_errors(strategy: str, probs: list[float] | None,
                                            match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        mix_rows([rows("a", 2), rows("b", 2)], strategy=strategy, probs=probs, seed=1)


def test_empty_dataset_cannot_be_interleaved() -> None:
    with pytest.raises(DataError, match=r"dataset\(s\) \[2\] of 2 have no rows"):
        mix_rows([rows("a", 2), []], strategy="interleave_over", probs=None, seed=1)
    with pytest.raises(DataError, match="dataset 2 of 2 has no rows"):
        mix_rows([rows("a", 2), []], strategy="interleave_under", probs=[0.5, 0.5], seed=1)
