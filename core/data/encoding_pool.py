"""Encode a stage's batches in order: in this process, overlapping the tokenizer with rendering, or in a
pool of `preprocessing_num_workers` processes that each hold the tokenizer.

A row that a check refuses while its batch is encoded comes out as `RowRefused` at its place in its
split, for the caller to name by its dataset, file and row (`core.data.provenance`).
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
from collections import Counter, deque
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from typing import Any

from tuneline.core.data.encoding import Batch, Encoded, EncodingSpec, PreparedBatch, encode_batch, encode_texts, finish_batch, prepare_batch
from tuneline.core.data.provenance import RowRefused
from tuneline.core.errors import DataError

_WORKER_STATE: dict[str, Any] = {}


def _init_worker(spec: EncodingSpec, tokenizer) -> None:
    # A forked worker inherits its parent's SIGTERM handler, and one that does not end the process kept a
    # worker alive through Pool.terminate(), so that the pool's exit waited for it forever
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _WORKER_STATE.update(spec=spec, tokenizer=tokenizer)


def _encode_in_worker(batch: Batch) -> tuple[str, Encoded]:
    split, rows = batch
    return split, encode_batch(rows, spec=_WORKER_STATE["spec"], tokenizer=_WORKER_STATE["tokenizer"])


def pool_map(batches: Iterable[Batch], *, spec: EncodingSpec, tokenizer, workers: int) -> Iterator[tuple[str, Encoded]]:
    """Encode `batches` in order, in `workers` processes when more than one is asked for."""
    if workers <= 1:
        yield from _overlapped(batches, spec=spec, tokenizer=tokenizer)
        return
    # Each worker encodes single-threaded; the Rust tokenizer's own threads would oversubscribe.
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    context = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn")
    starts = _SplitStarts()
    with context.Pool(workers, initializer=_init_worker, initargs=(spec, tokenizer)) as pool:
        # A window of 2 batches per worker: Pool.imap would read the whole input ahead.
        in_flight: deque = deque()
        for batch in batches:
            in_flight.append((batch, starts.take(batch), pool.apply_async(_encode_in_worker, (batch,))))
            if len(in_flight) >= 2 * workers:
                yield _result(*in_flight.popleft(), spec=spec, tokenizer=tokenizer)
        while in_flight:
            yield _result(*in_flight.popleft(), spec=spec, tokenizer=tokenizer)


def _result(batch: Batch, start: int, pending, *, spec: EncodingSpec, tokenizer) -> tuple[str, Encoded]:
    try:
        return pending.get()
    except DataError as e:
        raise refused_row(e, batch, start=start, spec=spec, tokenizer=tokenizer) from None


def _overlapped(batches: Iterable[Batch], *, spec: EncodingSpec, tokenizer) -> Iterator[tuple[str, Encoded]]:
    """Encode in this process: the Rust tokenizer encodes one batch in a thread (without the GIL)
    while this thread finishes the batch before it, hands it on, and reads and renders the next."""
    lock = threading.Lock()  # the tokenizer is used by one thread at a time, except lock-free reads
    starts = _SplitStarts()
    pending = None
    with ThreadPoolExecutor(1, thread_name_prefix="tuneline-encode") as executor:
        for batch in batches:
            start = starts.take(batch)
            try:
                prepared = prepare_batch(batch[1], spec=spec, tokenizer=tokenizer)
            except DataError as e:
                raise refused_row(e, batch, start=start, spec=spec, tokenizer=tokenizer, lock=lock) from None
            future = executor.submit(encode_texts, tokenizer, prepared.texts, lock)
            if pending is not None:
                yield _finished(*pending, spec=spec, tokenizer=tokenizer, lock=lock)
            pending = (batch, start, prepared, future)
        if pending is not None:
            yield _finished(*pending, spec=spec, tokenizer=tokenizer, lock=lock)


def _finished(batch: Batch, start: int, prepared: PreparedBatch, encoded, *, spec: EncodingSpec, tokenizer,
              lock: threading.Lock) -> tuple[str, Encoded]:
    try:
        return batch[0], finish_batch(prepared, encoded.result(), spec=spec, tokenizer=tokenizer, lock=lock)
    except DataError as e:
        raise refused_row(e, batch, start=start, spec=spec, tokenizer=tokenizer, lock=lock) from None


class _SplitStarts:
    """The position in its split of each batch's first row, batches taken in order."""

    def __init__(self) -> None:
        self.seen: Counter = Counter()

    def take(self, batch: Batch) -> int:
        split, rows = batch
        start = self.seen[split]
        self.seen[split] += len(rows)
        return start


def refused_row(error: DataError, batch: Batch, *, start: int, spec: EncodingSpec, tokenizer,
                lock: threading.Lock | None = None) -> DataError:
    """`error`, raised while encoding `batch`, as `RowRefused` at the place in its split of the first row that
    is refused when encoded alone; `error` itself when no row is (a problem of the batch, not of a row).
    `lock`, held meanwhile, keeps the thread that encodes the next batch off the tokenizer.

    Checks raise where they stand, without the row's index; finding the row again here, once, keeps every
    check, present and future, free of bookkeeping and the encoders' loops free of it."""
    if isinstance(error, RowRefused):
        return error
    split, rows = batch
    with lock or nullcontext():
        for offset, row in enumerate(rows):
            try:
                encode_batch([row], spec=spec, tokenizer=tokenizer)
            except DataError as e:
                return RowRefused(str(e), split, start + offset)
    return error
