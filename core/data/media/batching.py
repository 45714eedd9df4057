"""Batches of media examples: the text padded as for any example, the pixels cut in the data loader.

An example of tokenized media rows holds its image, video and audio files (`images`, `videos`, `audios`,
each in the order of its tokens) beside its ids. The collator pads the ids with the text collator, opens and
sizes the batch's images and decodes its videos' sampled frames, and runs the processor the tokenized data
was counted with (`MediaRows.read`), so the model gets `pixel_values` and `image_grid_thw` (and
`pixel_values_videos`, `video_grid_thw`; for audio `input_features`, `feature_attention_mask`) that fill
exactly the media tokens the batch holds, in order (and Qwen2-VL's `mm_token_type_ids`). A pack of media
rows (`packing`) keeps its position_ids, restarting at each example, except for the Qwen-VL families, whose
3D rotary positions the model computes over the whole pack from its media tokens, as LLaMA-Factory's
collator does for plain packing; `PairedMediaCollator` does the same for DPO's pairs, and
`FeedbackMediaCollator` for KTO's examples and their KL sequences; `ConcatenatedPairMedia` feeds ORPO's and
SimPO's pairs, whose trainers concatenate them inside their forward pass. `RowMedia` cuts the same inputs
for the evaluation and prediction code that runs a model on rows outside the training loop.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tuneline.core.data.media.columns import AUDIOS, IMAGES, MEDIA_COLUMNS, PAIR_FILE_COLUMNS, VIDEOS
from tuneline.core.data.media.rows import SETTINGS_FILE, MediaRows
from tuneline.core.templates.spec import QWEN_PLUGINS

TEXT_COLUMNS = ("input_ids", "attention_mask", "labels", "position_ids")  # position_ids: packs only
PAIR_FILES = tuple(PAIR_FILE_COLUMNS[column] for column in MEDIA_COLUMNS)


def media_files(rows: Sequence[Mapping[str, Any]], column: str) -> list[str]:
    """The files of `column` (a media column) of each row, one list in row order."""
    return [path for row in rows for path in row.get(column) or ()]


def _text_and_files(text_collator: Callable[[list[dict[str, Any]]], dict[str, Any]], features: Sequence[Mapping[str, Any]]
                    ) -> tuple[dict[str, Any], tuple[list[str], list[str], list[str]]]:
    """A preference trainer's batch of `features` without their media file columns, and those files
    (images, videos, sounds), each in the order of the examples."""
    batch = dict(text_collator([{key: value for key, value in feature.items() if key not in PAIR_FILES} for feature in features]))
    return batch, tuple(media_files(features, column) for column in PAIR_FILES)  # type: ignore[return-value]


@dataclass(frozen=True)
class MediaCollator:
    text_collator: Callable[[list[dict[str, Any]]], dict[str, Any]]
    media: MediaRows
    token_ids: dict[str, int]

    def __call__(self, features: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        batch = dict(self.text_collator([{key: feature[key] for key in TEXT_COLUMNS if key in feature} for feature in features]))
        if self.media.media.plugin in QWEN_PLUGINS:  # a pack's rotary positions are the model's own, over the whole pack
            batch.pop("position_ids", None)
        inputs = self.media.model_inputs(batch["input_ids"], media_files(features, IMAGES), media_files(features, VIDEOS),
                                         media_files(features, AUDIOS), token_ids=self.token_ids,
                                         attention_mask=batch.get("attention_mask"))
        return {**batch, **inputs}


@dataclass(frozen=True)
class PairedMediaCollator:
    """TRL's preference collator, whose batch is every pair's chosen sequence and then every pair's
    rejected one, with each pair's images, videos and audio (`image_files`, `video_files`, `audio_files`) fed for both of its
    sequences, in that order."""

    text_collator: Callable[[list[dict[str, Any]]], dict[str, Any]]
    media: MediaRows
    token_ids: dict[str, int]

    def __call__(self, features: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        batch, (images, videos, audios) = _text_and_files(self.text_collator, features)
        pixels = self.media.model_inputs(batch["input_ids"], images + images, videos + videos, audios + audios,
                                         token_ids=self.token_ids, attention_mask=batch.get("attention_mask"))
        return {**batch, **pixels}  # the chosen half's media, then the rejected half's


@dataclass(frozen=True)
class FeedbackMediaCollator:
    """TRL's KTO collator with each example's images, videos and sounds: fed for its sequence and, the
    same pixels, for its KL sequence (its prompt, which holds the media, with another row's reply), with
    each sequence's own token types (`KL_mm_token_type_ids`, `KL_token_type_ids`, which TRL passes for
    the KL pass)."""

    text_collator: Callable[[list[dict[str, Any]]], dict[str, Any]]
    media: MediaRows
    token_ids: dict[str, int]

    def __call__(self, features: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        batch, (images, videos, audios) = _text_and_files(self.text_collator, features)
        inputs = self.media.model_inputs(batch["input_ids"], images, videos, audios, token_ids=self.token_ids,
                                         attention_mask=batch.get("attention_mask"))
        types = self.media.model_inputs(batch["KL_input_ids"], (), token_ids=self.token_ids,
                                        attention_mask=batch.get("KL_attention_mask"))  # no media: the token types alone
        return {**batch, **inputs, **{f"KL_{key}": value for key, value in types.items()
                                      if key in ("mm_token_type_ids", "token_type_ids")}}


@dataclass(frozen=True)
class ConcatenatedPairMedia:
    """The media of a batch of pairs for a trainer whose forward pass takes ids and mask alone (TRL's ORPO
    and CPO trainers concatenate chosen and rejected inside their `concatenated_forward`): `feeding`
    takes the pairs' files out of the batch and, for that one pass, hands the model each pair's media for
    its chosen and its rejected sequence, cut for the concatenated ids it is called with."""

    media: MediaRows
    token_ids: dict[str, int]

    @contextmanager
    def feeding(self, model: Any, batch: dict[str, Any]) -> Iterator[None]:
        images, videos, audios = ([path for paths in batch.pop(column, None) or () for path in paths or ()]
                                  for column in PAIR_FILES)

        def with_media(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
            input_ids = args[0] if args else kwargs["input_ids"]
            inputs = self.media.model_inputs(input_ids, images + images, videos + videos, audios + audios,
                                             token_ids=self.token_ids, attention_mask=kwargs.get("attention_mask"))
            return args, {**kwargs, **{key: value.to(input_ids.device) if hasattr(value, "to") else value
                                       for key, value in inputs.items()}}

        handle = model.register_forward_pre_hook(with_media, with_kwargs=True)
        try:
            yield
        finally:
            handle.remove()


@dataclass(frozen=True)
class RowMedia:
    """The media of tokenized rows, cut for a batch of their ids outside the training loop (the held-out
    pairs' log-probabilities, the answers `do_predict` generates)."""

    media: MediaRows
    token_ids: dict[str, int]

    def inputs(self, input_ids: Any, rows: Sequence[Mapping[str, Any]], *, attention_mask: Any = None) -> dict[str, Any]:
        """What the model takes beside `input_ids` (a [batch, n] tensor) for the media of `rows`, one row a line."""
        device = input_ids.device
        inputs = self.media.model_inputs(input_ids.cpu(), media_files(rows, IMAGES), media_files(rows, VIDEOS),
                                         media_files(rows, AUDIOS), token_ids=self.token_ids,
                                         attention_mask=None if attention_mask is None else attention_mask.cpu())
        return {key: value.to(device) if hasattr(value, "to") else value for key, value in inputs.items()}

    @classmethod
    def of_tokenized(cls, tokenized_path: str | Path, tokenizer: Any) -> RowMedia | None:
        """The media of a tokenized dataset's rows, as its tokenization saved them; None for a text dataset."""
        from tuneline.core.data.tokenization import TOKENIZER_DIR

        folder = Path(tokenized_path) / TOKENIZER_DIR
        if not (folder / SETTINGS_FILE).is_file():
            return None
        media = MediaRows.read(folder)
        return cls(media, token_ids=media.token_ids(tokenizer))

    @staticmethod
    def files_of(dataset: Any) -> list[dict[str, Any]]:
        """Each row's media columns, those the dataset has."""
        columns = [column for column in MEDIA_COLUMNS if column in dataset.column_names]
        return list(dataset.select_columns(columns)) if columns else [{} for _ in range(len(dataset))]


def row_media(trainer: Any) -> RowMedia | None:
    """The `RowMedia` of a trainer on media rows (its collator's media, or ORPO's and SimPO's own), else None."""
    collator = trainer.data_collator
    if isinstance(collator, (MediaCollator, PairedMediaCollator, FeedbackMediaCollator)):
        return RowMedia(collator.media, token_ids=collator.token_ids)
    pair_media = getattr(trainer, "pair_media", None)  # TokenizedORPOTrainer's and TokenizedCPOTrainer's
    return RowMedia(pair_media.media, token_ids=pair_media.token_ids) if pair_media is not None else None
