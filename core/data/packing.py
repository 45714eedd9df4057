"""SFT packing: several supervised examples per fixed-length sequence, as LLaMA-Factory 0.9.5 packs them.

Within each preprocessing batch of rows, examples are grouped by a greedy knapsack (the longest
example that fits goes in first, then the longest that still fits, ...) into packs of at most
`cutoff_len - 1` tokens, each padded to `cutoff_len`. Every pack ends with at least one padding
token. `position_ids` restart at 0 for each packed example. With `neat_packing` the
`attention_mask` numbers the packed examples 1, 2, ... (0 for padding) so that the collator
(`tuneline.core.training.collators`) can keep them from attending to each other; without it the mask is
all ones, padding included, and packed examples see each other.

Examples of media rows pack whole (each was already dropped if cutoff_len cut into its media tokens),
their image, video and audio files concatenated in the pack's order, as LLaMA-Factory packs them.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from tuneline.core.data.media.columns import MEDIA_COLUMNS
from tuneline.core.data.processors import IGNORE_INDEX, PREPROCESSING_BATCH_SIZE, RowEncoding, encode_supervised_row
from tuneline.core.errors import ConfigError, DataError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

Example = Mapping[str, Sequence[int]]


def pack_room(cutoff_len: int) -> int:
    """The tokens a pack holds before its padding, `cutoff_len - 1`: LLaMA-Factory cuts `cutoff_len`
    by one whenever packing is on, so every pack ends with at least one padding token."""
    if cutoff_len < 2:
        raise ConfigError(f"packing needs cutoff_len of at least 2, got {cutoff_len}")
    return cutoff_len - 1


def knapsack_groups(lengths: Sequence[int], capacity: int) -> list[list[int]]:
    """Indices into `lengths`, grouped so that each group's lengths sum to at most `capacity`.

    Each group takes the longest remaining length that fits, then the longest that still fits,
    until none does. Among equal lengths the later index goes first, as in LLaMA-Factory (which
    pops the last index recorded for a length).
    """
    too_long = [n for n in lengths if n > capacity]
    if too_long:
        raise ValueError(f"lengths {too_long} exceed the knapsack capacity {capacity}")
    remaining = sorted(lengths)
    indices_by_length: dict[int, list[int]] = defaultdict(list)
    for index, length in enumerate(lengths):
        indices_by_length[length].append(index)
    groups = []
    while remaining:
        group, room = [], capacity
        while (fit := bisect_right(remaining, room)) > 0:
            length = remaining.pop(fit - 1)
            room -= length
            group.append(indices_by_length[length].pop())
        groups.append(group)
    return groups


def _pack(
    examples: Sequence[Example], *, cutoff_len: int, pad_token_id: int, neat_packing: bool
) -> dict[str, list[int]]:
    input_ids: list[int] = []
    labels: list[int] = []
    attention_mask: list[int] = []
    position_ids: list[int] = []
    for segment, example in enumerate(examples, start=1):
        length = len(example["input_ids"])
        input_ids += example["input_ids"]
        labels += example["labels"]
        attention_mask += [segment if neat_packing else 1] * length
        position_ids += range(length)
    pad = cutoff_len - len(input_ids)
    # examples of media rows bring their files, which the pack holds in the order of its tokens
    media = {column: [path for example in examples for path in example[column]] for column in MEDIA_COLUMNS
             if column in examples[0]}
    return {
        "input_ids": input_ids + [pad_token_id] * pad,
        "attention_mask": attention_mask + [0 if neat_packing else 1] * pad,
        "position_ids": position_ids + [0] * pad,
        "labels": labels + [IGNORE_INDEX] * pad,
        **media,
    }


def pack_examples(
    examples: Sequence[Example | None],
    *,
    cutoff_len: int,
    pad_token_id: int,
    neat_packing: bool,
    batch_size: int = PREPROCESSING_BATCH_SIZE,
) -> list[dict[str, list[int]]]:
    """Packs of exactly `cutoff_len` tokens: `input_ids`, `attention_mask`, `position_ids`, `labels`.

    `examples` are supervised examples in row order, already truncated to `cutoff_len - 1`
    (`encode_packed_supervised_rows` does both steps); None stands for a row that gave no example
    and keeps the batches of `batch_size` rows aligned with LLaMA-Factory's. Packs never mix
    batches. Padding is `pad_token_id` with label -100, position 0 and attention_mask 1 (0 with
    `neat_packing`).
    """
    room = pack_room(cutoff_len)
    too_long = [i for i, e in enumerate(examples) if e is not None and len(e["input_ids"]) > room]
    if too_long:
        raise DataError(
            f"examples {too_long[:5]} are longer than cutoff_len - 1 = {room} tokens, the room in a "
            "pack; encode the rows with cutoff_len - 1 (encode_packed_supervised_rows does)"
        )
    packs = []
    for start in range(0, len(examples), batch_size):
        batch = [example for example in examples[start : start + batch_size] if example is not None]
        for group in knapsack_groups([len(example["input_ids"]) for example in batch], room):
            packed = [batch[index] for index in group]
            packs.append(_pack(packed, cutoff_len=cutoff_len, pad_token_id=pad_token_id, neat_packing=neat_packing))
    return packs


def encode_packed_supervised_rows(
    rows: Sequence[dict[str, Any]],
    *,
    tokenizer: PreTrainedTokenizerBase,
    encoding: RowEncoding,
    neat_packing: bool,
    batch_size: int = PREPROCESSING_BATCH_SIZE,
) -> list[dict[str, list[int]]]:
    """Encode supervised rows truncated to `cutoff_len - 1` and pack them into `cutoff_len` tokens.

    LLaMA-Factory cuts `cutoff_len` by one whenever packing is on, then pads each pack back to
    the configured length. Rows left with nothing to train give no example (see
    `encode_supervised_row`).
    """
    within_room = replace(encoding, cutoff_len=pack_room(encoding.cutoff_len))
    examples = [encode_supervised_row(row, tokenizer=tokenizer, encoding=within_room) for row in rows]
    return pack_examples(examples, cutoff_len=encoding.cutoff_len, pad_token_id=tokenizer.pad_token_id,
                         neat_packing=neat_packing, batch_size=batch_size)
