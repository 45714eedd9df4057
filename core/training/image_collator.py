"""Batches of image examples: the text padded as for any example, the pixels cut in the data loader.

An example of tokenized image rows holds its image files (`images`, in the order of its image tokens)
beside its ids. The collator pads the ids with the text collator, opens and sizes the batch's images
and runs the image processor the tokenized data was counted with (`ImageRows.read`), so the model gets
`pixel_values` and `image_grid_thw` that fill exactly the image tokens the batch holds, in order (and
Qwen2-VL's `mm_token_type_ids`); `PairedImageCollator` does the same for DPO's pairs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tuneline.core.data.image_rows import ImageRows

TEXT_COLUMNS = ("input_ids", "attention_mask", "labels")


@dataclass(frozen=True)
class ImageCollator:
    text_collator: Callable[[list[dict[str, Any]]], dict[str, Any]]
    images: ImageRows
    image_token_id: int

    def __call__(self, features: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        batch = dict(self.text_collator([{key: feature[key] for key in TEXT_COLUMNS if key in feature} for feature in features]))
        paths = [path for feature in features for path in feature.get("images") or ()]
        return {**batch, **self.images.model_inputs(batch["input_ids"], paths, image_token_id=self.image_token_id)}


@dataclass(frozen=True)
class PairedImageCollator:
    """TRL's preference collator, whose batch is every pair's chosen sequence and then every pair's
    rejected one, with each pair's images (`image_files`) fed for both of its sequences, in that order."""

    text_collator: Callable[[list[dict[str, Any]]], dict[str, Any]]
    images: ImageRows
    image_token_id: int

    def __call__(self, features: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        from tuneline.core.data.preference_columns import IMAGE_FILES

        batch = dict(self.text_collator([{key: value for key, value in feature.items() if key != IMAGE_FILES}
                                         for feature in features]))
        paths = [path for feature in features for path in feature.get(IMAGE_FILES) or ()]
        pixels = self.images.model_inputs(batch["input_ids"], paths + paths, image_token_id=self.image_token_id)
        return {**batch, **pixels}  # the chosen half's images, then the rejected half's
