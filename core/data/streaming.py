"""`streaming: true`: rows pass through a seeded shuffle buffer of `buffer_size` rows, as
LLaMA-Factory shuffles a streamed dataset before `val_size` takes its evaluation rows off the
front. The buffer is `datasets`' own (`IterableDataset.shuffle`), fed the live stream of rows, so
memory holds `buffer_size` rows at most.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator


def shuffled_stream(rows: Iterable[dict], *, buffer_size: int, seed: int) -> Iterator[dict]:
    """`rows` in the order `datasets`' shuffle buffer gives them."""
    from datasets import IterableDataset
    from datasets.iterable_dataset import ExamplesIterable

    # an ExamplesIterable over the stream itself: `from_generator` would pickle its source to hash it
    source = ExamplesIterable(_keyed, {"rows": iter(rows)})
    return iter(IterableDataset(source).shuffle(seed=seed, buffer_size=buffer_size))


def _keyed(rows: Iterator[dict]) -> Iterator[tuple[int, dict]]:
    yield from enumerate(rows)


def take_validation(rows: Iterable[dict], *, count: int) -> Iterator[tuple[dict, str]]:
    """(row, split): the first `count` rows are held out for validation, as LLaMA-Factory's
    `take`/`skip` split a stream."""
    yield from ((row, "validation" if i < count else "train") for i, row in enumerate(rows))
