"""Batches of packed examples whose packed segments do not attend to each other.

`pack_examples(..., neat_packing=True)` numbers the examples of a pack 1, 2, ... in
`attention_mask` (0 for padding) and restarts `position_ids` at 0 for each. A model reads a 2D
mask as padding only, so the collator turns the numbering into what the attention
implementation understands:

- `eager`, `sdpa`: a 4D mask `[batch, 1, seq, seq]`, causal within a segment and closed between
  segments (float 0 / dtype minimum for eager, bool for sdpa). transformers passes a 4D mask to
  the attention layers unchanged (`masking_utils._preprocess_mask_arguments`). A padding token
  attends only to itself, so no row of the mask is empty (an empty row gives NaN under sdpa).
- `flash_attention_2`/`_3`: no mask; the batch is flattened into one row without its padding,
  with `position_ids` and the varlen kwargs `cu_seq_lens_q`/`cu_seq_lens_k`/`max_length_q`/
  `max_length_k` that transformers hands to `flash_attn_varlen_func`. The first label of each
  flattened row is set to -100: it is never a target in the unflattened batch, and would
  otherwise become the target of the previous row's last token.

Packs made without `neat_packing` (mask all ones) are one segment per row here, so their examples
attend to each other, as in LLaMA-Factory's plain packing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from tuneline.core.data.processors import IGNORE_INDEX
from tuneline.core.errors import ConfigError, unknown_name_message

MASKED_IMPLEMENTATIONS = ("eager", "sdpa")
VARLEN_IMPLEMENTATIONS = ("flash_attention_2", "flash_attention_3")
Features = Sequence[Mapping[str, Sequence[int]]]


def pad_packed_features(features: Features, *, pad_token_id: int) -> dict[str, torch.Tensor]:
    """`input_ids`, `attention_mask` (segment numbers), `position_ids` and `labels` as [batch, seq] tensors.

    Rows shorter than the longest are padded on the right (pad id, segment 0, position 0, -100).
    """
    if not features:
        raise ValueError("cannot collate an empty batch")
    seq_len = max(len(feature["input_ids"]) for feature in features)
    pad_values = {"input_ids": pad_token_id, "attention_mask": 0, "position_ids": 0, "labels": IGNORE_INDEX}
    batch = {}
    for key, pad in pad_values.items():
        rows = [list(feature[key]) + [pad] * (seq_len - len(feature[key])) for feature in features]
        batch[key] = torch.tensor(rows, dtype=torch.long)
    return batch


def block_causal_mask(segment_ids: torch.Tensor, *, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A `[batch, 1, seq, seq]` mask from `[batch, seq]` segment numbers (0 for padding).

    Query q may attend to key k when k <= q and both are in the same segment; a padding token
    attends to itself only. Bool (True = attend) when `dtype` is None, else 0 where attended and
    the dtype's minimum elsewhere (the additive form eager attention needs).
    """
    seq_len = segment_ids.shape[-1]
    device = segment_ids.device
    same_segment = segment_ids[:, :, None] == segment_ids[:, None, :]
    real_key = (segment_ids != 0)[:, None, :]
    causal = torch.ones(seq_len, seq_len, dtype=torch.bool, device=device).tril()
    itself = torch.eye(seq_len, dtype=torch.bool, device=device)
    allowed = ((same_segment & real_key & causal) | itself)[:, None]
    if dtype is None:
        return allowed
    masked = torch.full(allowed.shape, torch.finfo(dtype).min, dtype=dtype, device=device)
    return masked.masked_fill(allowed, 0.0)


def flatten_for_varlen(batch: Mapping[str, torch.Tensor]) -> dict[str, Any]:
    """One row of all segments without padding, with the `cu_seq_lens_*`/`max_length_*` varlen kwargs."""
    segment_ids = batch["attention_mask"]
    keep = segment_ids != 0
    labels = batch["labels"].clone()
    labels[:, 0] = IGNORE_INDEX
    # a segment starts where the number changes, or at the start of a row
    starts = torch.ones_like(keep)
    starts[:, 1:] = segment_ids[:, 1:] != segment_ids[:, :-1]
    starts = starts[keep]
    boundaries = torch.cat([starts.nonzero().flatten(), torch.tensor([starts.numel()], device=starts.device)])
    cu_seq_lens = boundaries.to(torch.int32)
    max_length = int(cu_seq_lens.diff().max()) if cu_seq_lens.numel() > 1 else 0
    return {
        "input_ids": batch["input_ids"][keep][None],
        "position_ids": batch["position_ids"][keep][None],
        "labels": labels[keep][None],
        "cu_seq_lens_q": cu_seq_lens,
        "cu_seq_lens_k": cu_seq_lens,
        "max_length_q": max_length,
        "max_length_k": max_length,
    }


@dataclass(frozen=True)
class PackedCollator:
    """Collate packs from `pack_examples` for a model using `attn_implementation`.

    Call it with a list of packs; it returns the model's keyword arguments (with `labels`).
    """

    pad_token_id: int
    """Pads rows of unequal length (packs from `pack_examples` are all `cutoff_len` long)."""
    attn_implementation: str = "sdpa"
    """The model's `config._attn_implementation`: eager, sdpa, flash_attention_2 or flash_attention_3."""
    mask_dtype: torch.dtype = torch.float32
    """The model's compute dtype: eager attention adds the mask to scores of this dtype."""

    def __post_init__(self) -> None:
        valid = MASKED_IMPLEMENTATIONS + VARLEN_IMPLEMENTATIONS
        if self.attn_implementation not in valid:
            raise ConfigError(unknown_name_message("attn_implementation", self.attn_implementation, valid))

    def __call__(self, features: Features) -> dict[str, Any]:
        batch = pad_packed_features(features, pad_token_id=self.pad_token_id)
        if self.attn_implementation in VARLEN_IMPLEMENTATIONS:
            return flatten_for_varlen(batch)
        dtype = None if self.attn_implementation == "sdpa" else self.mask_dtype
        return {**batch, "attention_mask": block_causal_mask(batch["attention_mask"], dtype=dtype)}


def build_collator(train_dataset, *, tokenizer, model, ignore_pad_token_for_loss: bool = True, media_rows=None):
    """Packed datasets (they carry position_ids) keep their examples apart; others pad per batch,
    the labels with -100, or with the pad token when padding trains (`ignore_pad_token_for_loss: false`);
    with `media_rows` (the tokenized data's `MediaRows`) the batch gains its images' and videos' pixels."""
    from transformers import DataCollatorForSeq2Seq

    if "position_ids" in train_dataset.column_names and media_rows is None:
        return PackedCollator(tokenizer.pad_token_id, attn_implementation=model.config._attn_implementation)
    # packs of media rows are plain packs (mask all ones, all cutoff_len long): padded as they are
    label_pad = IGNORE_INDEX if ignore_pad_token_for_loss else tokenizer.pad_token_id
    text = DataCollatorForSeq2Seq(tokenizer, padding=True, label_pad_token_id=label_pad)
    if media_rows is None:
        return text
    from tuneline.core.data.media.batching import MediaCollator

    return MediaCollator(text, media_rows, token_ids=media_rows.token_ids(tokenizer))
