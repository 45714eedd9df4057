"""A stage's rows on their way from the registry to the encoder: which datasets, mixed how, and which
split each row lands in.

`routed_rows` gives (row, split) in the order the encoder sees them: the training datasets' rows
(concatenated, or mixed by `mix_strategy`; shuffled by the buffer when streaming) with `val_size`
drawn off to validation, then the evaluation datasets' rows. The same steps run over each row's
`RowOrigin` instead of the row (`origins=True`) give every position's origin, which is how a refused
row is named by its dataset, file and row number (`origin_at`, see `core.data.provenance`).
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from tuneline.core.config import StageConfig
from tuneline.core.data.dataset_info import LoadReport, get_dataset_attrs, load_rows_with_report
from tuneline.core.data.dataset_info import iter_rows as registry_iter_rows
from tuneline.core.data.eval_splits import VALIDATION, split_name
from tuneline.core.data.mixing import mix_rows
from tuneline.core.data.provenance import RowOrigin
from tuneline.core.data.streaming import shuffled_stream, take_validation
from tuneline.core.errors import ConfigError


def dataset_names(value: str | None) -> list[str]:
    return [name.strip() for name in (value or "").split(",") if name.strip()]


def read_rows(names: Sequence[str], config: StageConfig) -> list[dict[str, Any]]:
    """All rows of the named datasets, `max_samples` of each, mixed as configured."""
    return list(iter_rows(names, config))


def iter_rows(names: Sequence[str], config: StageConfig, *, reports: list[LoadReport] | None = None,
              origins: bool = False) -> Iterator[Any]:
    """Rows of the named datasets: streamed one after another (concat), or mixed in memory; with
    `origins`, each row's `RowOrigin` in its place. `reports` gets each dataset's `LoadReport`."""
    data = config.data
    attrs = get_dataset_attrs(names, data.dataset_dir)
    reports = reports if reports is not None else []
    media_dir = data.media_dir or data.dataset_dir
    if data.mix_strategy == "concat" or len(attrs) == 1:
        for attr in attrs:
            reports.append(LoadReport(dataset=attr.name))
            yield from registry_iter_rows(attr, data.dataset_dir, on_bad_row=data.on_bad_row, max_samples=data.max_samples,
                                          report=reports[-1], token=config.model.hf_hub_token, media_dir=media_dir,
                                          origins=origins)
        return
    per_dataset = []
    for attr in attrs:
        rows, report = load_rows_with_report(attr, data.dataset_dir, on_bad_row=data.on_bad_row, max_samples=data.max_samples,
                                             token=config.model.hf_hub_token, media_dir=media_dir, origins=origins)
        per_dataset.append(rows)
        reports.append(report)
    probs = [float(p) for p in data.interleave_probs.split(",")] if data.interleave_probs else None
    yield from mix_rows(per_dataset, strategy=data.mix_strategy, probs=probs, seed=int(config.training.get("seed", 42)))


def routed_rows(config: StageConfig, *, reports: list[LoadReport], origins: bool = False) -> Iterator[tuple[Any, str]]:
    """(row, split) of every row the stage tokenizes, in the order they reach the encoder (with
    `origins`, each row's `RowOrigin` in its place)."""
    data, seed = config.data, int(config.training.get("seed", 42))
    train = iter_rows(dataset_names(data.dataset), config, reports=reports, origins=origins)
    if data.streaming:
        routed = take_validation(shuffled_stream(train, buffer_size=data.buffer_size, seed=seed), count=int(data.val_size))
    else:
        routed = route_validation(train, val_size=data.val_size, seed=seed, total=_count_if_needed(config))
    if data.eval_dataset:
        routed = itertools.chain(routed, _eval_rows(config, reports=reports, origins=origins))
    return routed


def origin_at(config: StageConfig, *, split: str, position: int) -> RowOrigin | None:
    """The origin of the row at `position` (from 0) among the rows `routed_rows` sends to `split`."""
    in_split = (origin for origin, routed in routed_rows(config, reports=[], origins=True) if routed == split)
    return next(itertools.islice(in_split, position, None), None)


def _eval_rows(config: StageConfig, *, reports: list[LoadReport], origins: bool) -> Iterator[tuple[Any, str]]:
    """(row, split) of the evaluation datasets: mixed into `validation`, or each into its own split."""
    names, data = dataset_names(config.data.eval_dataset), config.data
    if not data.eval_on_each_dataset:
        rows: Iterable[Any] = iter_rows(names, config, reports=reports, origins=origins)
        if data.streaming:  # LLaMA-Factory shuffles a streamed evaluation set too, unless split per dataset
            rows = shuffled_stream(rows, buffer_size=data.buffer_size, seed=int(config.training.get("seed", 42)))
        yield from ((row, VALIDATION) for row in rows)
        return
    for name in names:
        yield from ((row, split_name(name)) for row in iter_rows([name], config, reports=reports, origins=origins))


def route_validation(rows: Iterable[Any], *, val_size: float, seed: int, total: int | None) -> Iterator[tuple[Any, str]]:
    """(row, split) pairs: a seeded draw holds out `val_size` (a share, or a count of `total` rows)."""
    if not val_size:
        yield from ((row, "train") for row in rows)
        return
    if val_size >= 1:
        assert total is not None
        if int(val_size) >= total:
            raise ConfigError(f"'val_size: {val_size}' leaves no training rows out of {total}.")
        held = set(random.Random(seed).sample(range(total), int(val_size)))
        yield from ((row, "validation" if i in held else "train") for i, row in enumerate(rows))
        return
    draw = random.Random(seed)
    yield from ((row, "validation" if draw.random() < val_size else "train") for row in rows)


def _count_if_needed(config: StageConfig) -> int | None:
    if config.data.val_size < 1:
        return None
    return sum(1 for _ in iter_rows(dataset_names(config.data.dataset), config))
