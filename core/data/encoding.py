"""Encode batches of standard rows into examples for one stage, in this process or a pool.

`encode_batch` is a pure function of (rows, spec, tokenizer); `pool_map` runs it over batches
in `workers` processes that each hold the tokenizer, and yields results in input order.
"""

from __future__ import annotations

import multiprocessing
import os
from collections import Counter, deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from tuneline.core.config import StageConfig
from tuneline.core.data.packing import encode_packed_supervised_rows
from tuneline.core.data.processors import (
    encode_feedback_rows,
    encode_pairwise_row,
    encode_pretrain_texts,
    encode_supervised_row,
    encode_unsupervised_row,
)
from tuneline.core.errors import TunelineError
from tuneline.core.template_encode import message_pieces
from tuneline.core.templates import Template, encode_turns

Batch = tuple[str, list[dict[str, Any]]]
Encoded = tuple[list[dict[str, Any]], Counter]


@dataclass(frozen=True)
class EncodingSpec:
    """What decides how rows become examples (picklable, sent once to each worker)."""

    stage: str
    template: Template
    cutoff_len: int
    train_on_prompt: bool
    mask_history: bool
    packing: bool | None
    neat_packing: bool
    predict: bool  # prompts for generation (do_predict without do_train)
    batch_size: int  # the trainer's per-device batch, for the padding ratio

    @classmethod
    def from_config(cls, config: StageConfig, *, template: Template) -> EncodingSpec:
        training = config.training
        return cls(
            stage=config.finetuning.stage,
            template=template,
            cutoff_len=config.data.cutoff_len,
            train_on_prompt=config.data.train_on_prompt,
            mask_history=config.data.mask_history,
            packing=config.data.packing,
            neat_packing=config.data.neat_packing,
            predict=bool(training.get("do_predict")) and not training.get("do_train", True),
            batch_size=int(training.get("per_device_train_batch_size", 8)),
        )


def encode_batch(rows: list[dict[str, Any]], *, spec: EncodingSpec, tokenizer) -> Encoded:
    """Examples of one batch of rows and the counters describing what happened to them."""
    kind = "predict" if spec.predict else spec.stage
    if kind != "pt":
        tokenizer = PrefetchedTokenizer(tokenizer, _batch_texts(rows, spec, tokenizer))
    examples, counters = _ENCODERS[kind](rows, spec, tokenizer)
    counters["rows_in"] += len(rows)
    counters["examples"] += len(examples)
    ids_key = "chosen_input_ids" if kind in ("rm", "dpo") else "input_ids"
    labels_key = "chosen_labels" if kind in ("rm", "dpo") else "labels"
    counters["total_tokens"] += sum(len(e[ids_key]) for e in examples) - (counters["pad_positions"] if spec.packing else 0)
    counters["trained_tokens"] += sum(len(e[labels_key]) - e[labels_key].count(-100) for e in examples)
    if not spec.packing and kind != "pt":
        _count_padding([len(e[ids_key]) for e in examples], spec.batch_size, counters)
    return examples, counters


class PrefetchedTokenizer:
    """The tokenizer, answering `tokenizer(texts, add_special_tokens=False)` from one batched call
    made beforehand for a whole preprocessing batch.

    Templates encode each message on its own (token-exactness), so rows are encoded a few strings
    at a time; one call over the batch's strings lets the Rust tokenizer use every core and cuts
    the per-call overhead. Every other attribute is the tokenizer's own.
    """

    def __init__(self, tokenizer, texts: Iterable[str]) -> None:
        self.tokenizer = tokenizer
        unique = list(dict.fromkeys(texts))
        # The Rust tokenizer directly: the same ids as tokenizer(unique), without wrapping each result.
        encoded = tokenizer.backend_tokenizer.encode_batch(unique, add_special_tokens=False) if unique else []
        self.cache = {text: encoding.ids for text, encoding in zip(unique, encoded)}

    def __call__(self, text, add_special_tokens: bool = True, **kwargs):
        cache = self.cache
        if not add_special_tokens and not kwargs and isinstance(text, list) and all(t in cache for t in text):
            return {"input_ids": [list(cache[t]) for t in text]}
        return self.tokenizer(text, add_special_tokens=add_special_tokens, **kwargs)

    def __len__(self) -> int:
        return len(self.tokenizer)

    def __getattr__(self, name: str):
        return getattr(self.tokenizer, name)


def _batch_texts(rows: list[dict[str, Any]], spec: EncodingSpec, tokenizer) -> Iterator[str]:
    """Every string the template will encode for `rows` (a row it cannot render is left to the
    processor, which reports it properly)."""
    for row in rows:
        for response in row["response"] or [None]:
            messages = [*row["prompt"], *([response] if response else [])]
            try:
                pieces = message_pieces(spec.template, tokenizer, messages=messages, system=row.get("system") or None,
                                        tools=row.get("tools") or None)
            except TunelineError:
                continue
            yield from (piece for message in pieces for piece in message if isinstance(piece, str))


def _encode_pretrain(rows, spec: EncodingSpec, tokenizer) -> Encoded:
    texts = [row["prompt"][0]["content"] for row in rows]
    examples = encode_pretrain_texts(texts, tokenizer=tokenizer, template=spec.template, cutoff_len=spec.cutoff_len,
                                     packing=spec.packing, batch_size=len(rows) or 1)
    counters: Counter = Counter()
    if spec.packing is False:
        _count_padding([len(e["input_ids"]) for e in examples], spec.batch_size, counters)
    return examples, counters


def _encode_supervised(rows, spec: EncodingSpec, tokenizer) -> Encoded:
    if spec.packing or spec.neat_packing:
        packed = encode_packed_supervised_rows(
            rows, template=spec.template, tokenizer=tokenizer, cutoff_len=spec.cutoff_len, neat_packing=spec.neat_packing,
            train_on_prompt=spec.train_on_prompt, mask_history=spec.mask_history, batch_size=len(rows) or 1,
        )
        counters = Counter()
        for example in packed:
            counters["padded_positions"] += len(example["input_ids"])
            counters["pad_positions"] += _trailing_padding(example, tokenizer.pad_token_id)
        return packed, counters
    counters: Counter = Counter()

    def encode(row):
        example = encode_supervised_row(
            row, template=spec.template, tokenizer=tokenizer, cutoff_len=spec.cutoff_len,
            train_on_prompt=spec.train_on_prompt, mask_history=spec.mask_history,
        )
        # Truncation fills the budget, so only a full-length example can have been cut.
        if example is not None and len(example["input_ids"]) >= spec.cutoff_len:
            _count_truncation(row, example, spec, tokenizer, counters)
        return example

    examples, dropped = _per_row(rows, encode)
    return examples, counters + dropped


def _count_truncation(row: dict[str, Any], example: dict[str, list[int]], spec: EncodingSpec, tokenizer, counters: Counter) -> None:
    """Count a row whose tokens were cut to fit cutoff_len, and one whose trained reply lost tokens."""
    pairs = encode_turns(spec.template, tokenizer, prompt=row["prompt"], response=row["response"],
                         system=row.get("system") or None, tools=row.get("tools") or None)
    full = sum(len(source) + len(target) for source, target in pairs)
    if len(example["input_ids"]) >= full:
        return
    counters["rows_truncated"] += 1
    if spec.train_on_prompt:
        expected = full
    else:
        expected = len(pairs[-1][1]) if spec.mask_history else sum(len(target) for _, target in pairs)
    if len(example["labels"]) - example["labels"].count(-100) < expected:
        counters["responses_cut"] += 1


def _encode_pairwise(rows, spec: EncodingSpec, tokenizer) -> Encoded:
    return _per_row(rows, lambda row: encode_pairwise_row(row, template=spec.template, tokenizer=tokenizer, cutoff_len=spec.cutoff_len))


def _encode_unsupervised(rows, spec: EncodingSpec, tokenizer) -> Encoded:
    return _per_row(rows, lambda row: encode_unsupervised_row(row, template=spec.template, tokenizer=tokenizer, cutoff_len=spec.cutoff_len))


def _encode_feedback(rows, spec: EncodingSpec, tokenizer) -> Encoded:
    encoded = encode_feedback_rows(rows, template=spec.template, tokenizer=tokenizer, cutoff_len=spec.cutoff_len,
                                   batch_size=len(rows) or 1)
    examples = [e for e in encoded if e is not None]
    return examples, Counter({"rows_dropped_no_trained_token": len(encoded) - len(examples)})


def _trailing_padding(example: dict[str, list[int]], pad_token_id: int) -> int:
    """Pad positions at the end of a pack (pad id, not trained)."""
    count = 0
    for token, label in zip(reversed(example["input_ids"]), reversed(example["labels"])):
        if token != pad_token_id or label != -100:
            break
        count += 1
    return count


def _per_row(rows, encode) -> Encoded:
    counters: Counter = Counter()
    examples = []
    for row in rows:
        example = encode(row)
        if example is None:
            counters["rows_dropped_no_trained_token"] += 1
        else:
            examples.append(example)
    return examples, counters


_ENCODERS = {
    "pt": _encode_pretrain,
    "sft": _encode_supervised,
    "rm": _encode_pairwise,
    "dpo": _encode_pairwise,
    "kto": _encode_feedback,
    "ppo": _encode_unsupervised,
    "predict": _encode_unsupervised,
}


def _count_padding(all_lengths: list[int], batch_size: int, counters: Counter) -> None:
    """Pad positions if the examples were batched in order with dynamic padding."""
    for start in range(0, len(all_lengths), batch_size):
        lengths = all_lengths[start : start + batch_size]
        counters["padded_positions"] += max(lengths) * len(lengths)
        counters["pad_positions"] += max(lengths) * len(lengths) - sum(lengths)


# -- worker pool -------------------------------------------------------------------------------

_WORKER_STATE: dict[str, Any] = {}


def _init_worker(spec: EncodingSpec, tokenizer) -> None:
    _WORKER_STATE.update(spec=spec, tokenizer=tokenizer)


def _encode_in_worker(batch: Batch) -> tuple[str, Encoded]:
    split, rows = batch
    return split, encode_batch(rows, spec=_WORKER_STATE["spec"], tokenizer=_WORKER_STATE["tokenizer"])


def pool_map(batches: Iterable[Batch], *, spec: EncodingSpec, tokenizer, workers: int) -> Iterator[tuple[str, Encoded]]:
    """Encode `batches` in order, in `workers` processes when more than one is asked for."""
    if workers <= 1:
        for split, rows in batches:
            yield split, encode_batch(rows, spec=spec, tokenizer=tokenizer)
        return
    # Each worker encodes single-threaded; the Rust tokenizer's own threads would oversubscribe.
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    context = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn")
    with context.Pool(workers, initializer=_init_worker, initargs=(spec, tokenizer)) as pool:
        # A window of 2 batches per worker: Pool.imap would read the whole input ahead.
        in_flight: deque = deque()
        for batch in batches:
            in_flight.append(pool.apply_async(_encode_in_worker, (batch,)))
            if len(in_flight) >= 2 * workers:
                yield in_flight.popleft().get()
        while in_flight:
            yield in_flight.popleft().get()
