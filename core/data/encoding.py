"""Encode batches of standard rows into examples for one stage.

`encode_batch` is a pure function of (rows, spec, tokenizer); `encoding_pool.pool_map` runs it over
a stage's batches in order, in this process or in several.
"""

from __future__ import annotations

import re
import threading
import weakref
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from contextlib import nullcontext
from dataclasses import dataclass, replace
from typing import Any

from tuneline.core.config import StageConfig, trains
from tuneline.core.data.media.columns import MEDIA_COLUMNS, MEDIA_TOKENS
from tuneline.core.data.packing import pack_examples, pack_room
from tuneline.core.data.processors import (
    RowEncoding,
    check_supervised_options,
    check_supervised_row,
    encode_feedback_rows,
    encode_pairwise_row,
    encode_pretrain_texts,
    encode_unsupervised_row,
    image_prefix_ids,
    supervised_example,
)
from tuneline.core.errors import TunelineError
from tuneline.core.templates.conversation import Conversation, Template, encode_turns, pair_turns, turn_pieces
from tuneline.core.templates.encode import merge_starts, message_pieces

Batch = tuple[str, list[dict[str, Any]]]
PACKED_SHAPES = ("pretrain", "supervised")  # the shapes `packing` applies to
Encoded = tuple[list[dict[str, Any]], Counter]


@dataclass(frozen=True)
class EncodingSpec:
    """What decides how rows become examples (picklable, sent once to each worker)."""

    examples: str  # the shape of the examples, one of ENCODERS (a stage kind's `examples`)
    encoding: RowEncoding  # the template, cutoff_len and which tokens train
    packing: bool | None
    neat_packing: bool
    predict: bool  # prompts for generation (do_predict without do_train)
    batch_size: int  # the trainer's per-device batch, for the padding ratio
    # with media rows: every example keeps its `images`, `videos`, `audios`, and one that lost media tokens drops
    media_token_ids: tuple[int, ...] = ()

    @classmethod
    def from_config(cls, config: StageConfig, *, template: Template, examples: str,
                    media_token_ids: tuple[int, ...] = ()) -> EncodingSpec:
        training = config.training
        return cls(
            examples=examples,
            encoding=RowEncoding(template=template, cutoff_len=config.data.cutoff_len,
                                 train_on_prompt=config.data.train_on_prompt, mask_history=config.data.mask_history),
            # pairs, feedback rows and prompts are never packed: `packing` is ignored for them (and warned of)
            packing=config.data.packing if examples in PACKED_SHAPES else None,
            neat_packing=config.data.neat_packing,
            predict=predicts_only(training),
            batch_size=int(training.get("per_device_train_batch_size", 8)),
            media_token_ids=media_token_ids,
        )


def predicts_only(training: Mapping[str, Any]) -> bool:
    """Whether the rows are prompts for generation (`do_predict` without training), whatever the stage."""
    return bool(training.get("do_predict")) and not trains(training)


@dataclass
class PreparedBatch:
    """A batch of rows rendered to pieces, with the texts still to encode (all unique)."""

    rows: list[dict[str, Any]]
    texts: list[str]
    pieces: list[list[list[str | int]] | None] | None  # SFT: each row's message pieces, None for a bad row
    split: dict[str, list[str]] | None = None  # SFT: each text piece's parts, encoded apart (see `_segmenter`)


def encode_batch(rows: list[dict[str, Any]], *, spec: EncodingSpec, tokenizer) -> Encoded:
    """Examples of one batch of rows and the counters describing what happened to them."""
    prepared = prepare_batch(rows, spec=spec, tokenizer=tokenizer)
    return finish_batch(prepared, encode_texts(tokenizer, prepared.texts), spec=spec, tokenizer=tokenizer)


def prepare_batch(rows: list[dict[str, Any]], *, spec: EncodingSpec, tokenizer) -> PreparedBatch:
    """Render `rows` to the pieces their template encodes (pure Python; see `encode_texts`)."""
    kind = _kind(spec)
    if kind == "pretrain":
        return PreparedBatch(rows, [], None)
    if kind == "supervised":
        pieces = [_supervised_pieces(row, spec, tokenizer) for row in rows]
        texts = dict.fromkeys(piece for row in pieces if row for message in row for piece in message if isinstance(piece, str))
        segments = _segmenter(spec.encoding.template, tokenizer)
        split = {text: segments(text) for text in texts}
        return PreparedBatch(rows, list(dict.fromkeys(s for parts in split.values() for s in parts)), pieces, split)
    return PreparedBatch(rows, list(dict.fromkeys(_batch_texts(rows, spec, tokenizer))), None)


def encode_texts(tokenizer, texts: list[str], lock: threading.Lock | None = None) -> dict[str, list[int]]:
    """Ids of each text as `tokenizer(text, add_special_tokens=False)` gives them, in one call.

    The Rust tokenizer is called directly (without offsets, which nothing here reads): the same
    ids without wrapping each result, and it releases the GIL, so rendering can go on meanwhile.
    """
    if not texts:
        return {}
    backend = getattr(tokenizer, "backend_tokenizer", None)
    with lock or nullcontext():
        if backend is None:
            return dict(zip(texts, tokenizer(texts, add_special_tokens=False)["input_ids"]))
        encode = getattr(backend, "encode_batch_fast", backend.encode_batch)
        encodings = encode(texts, add_special_tokens=False)
    return {text: encoding.ids for text, encoding in zip(texts, encodings)}


def finish_batch(prepared: PreparedBatch, encoded: dict[str, list[int]], *, spec: EncodingSpec, tokenizer,
                 lock: threading.Lock | None = None) -> Encoded:
    """Examples and counters of a prepared batch, given the ids of its texts."""
    kind = _kind(spec)
    rows = prepared.rows
    if kind == "pretrain":
        with lock or nullcontext():
            examples, counters = _encode_pretrain(rows, spec, tokenizer)
    elif kind == "supervised":
        examples, counters = _encode_supervised(prepared, encoded, spec, PrefetchedTokenizer(tokenizer, encoded, lock))
    else:
        examples, counters = _ENCODERS[kind](rows, spec, PrefetchedTokenizer(tokenizer, encoded, lock))
    counters["rows_in"] += len(rows)
    counters["examples"] += len(examples)
    ids_key = "chosen_input_ids" if kind == "pairwise" else "input_ids"
    labels_key = "chosen_labels" if kind == "pairwise" else "labels"
    counters["total_tokens"] += sum(len(e[ids_key]) for e in examples) - (counters["pad_positions"] if spec.packing else 0)
    counters["trained_tokens"] += sum(len(e[labels_key]) - e[labels_key].count(-100) for e in examples)
    if not spec.packing and kind != "pretrain":
        _count_padding([len(e[ids_key]) for e in examples], spec.batch_size, counters)
    return examples, counters


def _kind(spec: EncodingSpec) -> str:
    """The encoder to use: prompts alone when predicting without training, else the spec's shape."""
    return "unsupervised" if spec.predict else spec.examples


class PrefetchedTokenizer:
    """The tokenizer, answering `tokenizer(texts, add_special_tokens=False)` from ids encoded
    beforehand for a whole preprocessing batch (`encode_texts`).

    Templates encode each message on its own (token-exactness), so rows are encoded a few strings
    at a time; one call over the batch's strings lets the Rust tokenizer use every core and cuts
    the per-call overhead. A text not encoded beforehand goes to the tokenizer, under `lock` when
    another thread may be encoding. Every other attribute is the tokenizer's own.
    """

    def __init__(self, tokenizer, encoded: dict[str, list[int]], lock: threading.Lock | None = None) -> None:
        self.tokenizer = tokenizer
        self.cache = encoded
        self.lock = lock

    def __call__(self, text, add_special_tokens: bool = True, **kwargs):
        cache = self.cache
        if not add_special_tokens and not kwargs and isinstance(text, list) and all(t in cache for t in text):
            return {"input_ids": [list(cache[t]) for t in text]}
        with self.lock or nullcontext():
            return self.tokenizer(text, add_special_tokens=add_special_tokens, **kwargs)

    def __len__(self) -> int:
        return len(self.tokenizer)

    def __getattr__(self, name: str):
        return getattr(self.tokenizer, name)


def _supervised_pieces(row: dict[str, Any], spec: EncodingSpec, tokenizer) -> list[list[str | int]] | None:
    """The row's message pieces, or None for a row the checked path must report."""
    try:
        check_supervised_row(row)
        return turn_pieces(spec.encoding.template, tokenizer, Conversation.from_row(row),
                           mask_history=spec.encoding.mask_history)
    except TunelineError:
        return None


def _batch_texts(rows: list[dict[str, Any]], spec: EncodingSpec, tokenizer) -> Iterator[str]:
    """Every string the template will encode for `rows` (a row it cannot render is left to the
    processor, which reports it properly)."""
    for row in rows:
        for response in row["response"] or [None]:
            messages = [*row["prompt"], *([response] if response else [])]
            try:
                pieces = message_pieces(spec.encoding.template, tokenizer, messages=messages,
                                        system=row.get("system") or None, tools=row.get("tools") or None, oneturn=True)
            except TunelineError:
                continue
            yield from (piece for message in pieces for piece in message if isinstance(piece, str))


def _encode_pretrain(rows, spec: EncodingSpec, tokenizer) -> Encoded:
    texts = [row["prompt"][0]["content"] for row in rows]
    encoding = spec.encoding
    examples = encode_pretrain_texts(texts, tokenizer=tokenizer, template=encoding.template, cutoff_len=encoding.cutoff_len,
                                     packing=spec.packing, batch_size=len(rows) or 1)
    counters: Counter = Counter()
    if spec.packing is False:
        _count_padding([len(e["input_ids"]) for e in examples], spec.batch_size, counters)
    return examples, counters


def _encode_supervised(prepared: PreparedBatch, encoded: dict[str, list[int]], spec: EncodingSpec, tokenizer) -> Encoded:
    """Supervised examples (packed when asked), counting rows cut to fit and replies that lost tokens."""
    check_supervised_options(spec.encoding)
    packed = bool(spec.packing or spec.neat_packing)
    cutoff_len = spec.encoding.cutoff_len
    encoding = replace(spec.encoding, cutoff_len=pack_room(cutoff_len)) if packed else spec.encoding  # rows fit a pack
    counters: Counter = Counter()
    eos_id = tokenizer.eos_token_id
    examples: list[dict[str, list[int]] | None] = []
    for row, pieces in zip(prepared.rows, prepared.pieces or [None] * len(prepared.rows)):
        if pieces is None:  # the checked path raises the row's error
            check_supervised_row(row)
            pairs = encode_turns(encoding.template, tokenizer, Conversation.from_row(row), mask_history=encoding.mask_history)
        else:
            pairs = pair_turns(_pieces_ids(pieces, encoded, prepared.split))
        prefix_ids = image_prefix_ids(row, tokenizer=tokenizer, encoding=encoding)
        example = supervised_example(pairs, encoding=encoding, eos_id=eos_id, prefix_ids=prefix_ids)
        # Truncation fills the budget, so only a full-length example can have been cut.
        if example is not None and len(example["input_ids"]) >= encoding.cutoff_len:
            _count_truncation(pairs, example, encoding, counters, prefix=len(prefix_ids))
        if example is not None and spec.media_token_ids:
            example = _with_media(example, row, spec.media_token_ids, counters)
        examples.append(example)
    counters["rows_dropped_no_trained_token"] += examples.count(None)
    if not packed:
        return [e for e in examples if e is not None], counters
    packs = pack_examples(examples, cutoff_len=cutoff_len, pad_token_id=tokenizer.pad_token_id,
                          neat_packing=spec.neat_packing, batch_size=len(examples) or 1)
    for pack in packs:
        counters["padded_positions"] += len(pack["input_ids"])
        counters["pad_positions"] += _trailing_padding(pack, tokenizer.pad_token_id)
    return packs, counters


def _with_media(example: dict[str, Any], row: dict[str, Any], token_ids: tuple[int, ...], counters: Counter, *,
                ids: str = "input_ids") -> dict[str, Any] | None:
    """`example` with the row's image, video and audio files, or None (counted) when cutoff_len cut into their tokens."""
    if sum(example[ids].count(token_id) for token_id in token_ids) != row[MEDIA_TOKENS]:
        counters["rows_dropped_media_tokens_cut"] += 1
        return None
    return {**example, **{column: row[column] for column in MEDIA_COLUMNS}}


def _pieces_ids(pieces: list[list[str | int]], encoded: dict[str, list[int]], split: dict[str, list[str]]) -> list[list[int]]:
    ids = []
    for message in pieces:
        message_ids: list[int] = []
        for piece in message:
            if isinstance(piece, int):
                message_ids.append(piece)
            else:
                for part in split[piece]:
                    message_ids += encoded[part]
        ids.append(message_ids)
    return ids


_SEGMENTERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _segmenter(template: Template, tokenizer) -> Callable[[str], list[str]]:
    """Split a text before each added token of the template's own turn markup.

    A text encodes the same whole or cut before such a token (see `merge_starts`), and the cut
    lets the parts every row repeats (the default system prompt, role headers, turn ends) be
    encoded once per batch instead of once per row.
    """
    cached = _SEGMENTERS.get(tokenizer)
    if cached is not None and cached[0] == (template, len(tokenizer)):
        return cached[1]
    probe = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    try:
        markup = "".join(piece for message in message_pieces(template, tokenizer, messages=probe, system="sys")
                         for piece in message if isinstance(piece, str))
    except TunelineError:
        markup = ""
    tokens = sorted((token for token in merge_starts(tokenizer) if token in markup), key=len, reverse=True)
    if tokens:
        pattern = re.compile("(?=" + "|".join(map(re.escape, tokens)) + ")")
        segments = lambda text: [part for part in pattern.split(text) if part]  # noqa: E731
    else:
        segments = lambda text: [text]  # noqa: E731
    _SEGMENTERS[tokenizer] = ((template, len(tokenizer)), segments)
    return segments


def _count_truncation(pairs: list[tuple[list[int], list[int]]], example: dict[str, list[int]], encoding: RowEncoding,
                      counters: Counter, *, prefix: int = 0) -> None:
    """Count a row whose tokens were cut to fit cutoff_len, and one whose trained reply lost tokens."""
    full = prefix + sum(len(source) + len(target) for source, target in pairs) + (1 if encoding.template.efficient_eos else 0)
    if len(example["input_ids"]) >= full:
        return
    counters["rows_truncated"] += 1
    if encoding.train_on_prompt:
        expected = full
    else:
        expected = len(pairs[-1][1]) if encoding.mask_history else sum(len(target) for _, target in pairs)
    if len(example["labels"]) - example["labels"].count(-100) < expected:
        counters["responses_cut"] += 1


def _encode_pairwise(rows, spec: EncodingSpec, tokenizer) -> Encoded:
    counters: Counter = Counter()
    examples = []
    for row in rows:
        example = encode_pairwise_row(row, tokenizer=tokenizer, encoding=spec.encoding)
        if example is None:
            counters["rows_dropped_no_trained_token"] += 1
            continue
        if spec.media_token_ids:  # chosen and rejected share the prompt that holds the media
            example = _with_media(example, row, spec.media_token_ids, counters, ids="chosen_input_ids")
        if example is not None:
            examples.append(example)
    return examples, counters


def _encode_unsupervised(rows, spec: EncodingSpec, tokenizer) -> Encoded:
    return _per_row(rows, lambda row: encode_unsupervised_row(row, tokenizer=tokenizer, encoding=spec.encoding))


def _encode_feedback(rows, spec: EncodingSpec, tokenizer) -> Encoded:
    encoded = encode_feedback_rows(rows, tokenizer=tokenizer, encoding=spec.encoding, batch_size=len(rows) or 1)
    counters = Counter({"rows_dropped_no_trained_token": encoded.count(None)})
    examples = []
    for row, example in zip(rows, encoded):
        if example is not None and spec.media_token_ids:  # the KL sequence shares the prompt: both must keep its media
            kept = _with_media(example, row, spec.media_token_ids, counters)
            example = kept and _with_media(kept, row, spec.media_token_ids, Counter(), ids="kl_input_ids")
            if kept and example is None:
                counters["rows_dropped_media_tokens_cut"] += 1
        if example is not None:
            examples.append(example)
    return examples, counters


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
    "pretrain": _encode_pretrain,
    "pairwise": _encode_pairwise,
    "feedback": _encode_feedback,
    "unsupervised": _encode_unsupervised,
}
ENCODERS = ("supervised", *_ENCODERS)  # every example shape (supervised rows are encoded with prefetched pieces)


def _count_padding(all_lengths: list[int], batch_size: int, counters: Counter) -> None:
    """Pad positions if the examples were batched in order with dynamic padding."""
    for start in range(0, len(all_lengths), batch_size):
        lengths = all_lengths[start : start + batch_size]
        counters["padded_positions"] += max(lengths) * len(lengths)
        counters["pad_positions"] += max(lengths) * len(lengths) - sum(lengths)
