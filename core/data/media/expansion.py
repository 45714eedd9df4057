"""A multimodal row's `<image>` placeholders expanded into the tokens its model family reads.

With LLaMA-Factory 0.9.5's `mm_plugin` semantics, each image is first sized as LLaMA-Factory sizes it
(`sizing`), then by family:

- Qwen2-VL, Qwen2.5-VL (`qwen2_vl` plugin) and Qwen3-VL (`qwen3_vl`, in patches of 16): each side
  at least 28 pixels and an aspect ratio within 200:1; the model's image processor cuts the image
  into patches, and the placeholder becomes `<|vision_start|>`, one `<|image_pad|>` per merged patch
  (t x h x w of its grid / merge_size^2) and `<|vision_end|>`.
- LLaVA-1.5 (`llava` plugin): the processor resizes and crops every image to one size, and the
  placeholder becomes one `<image>` per vision patch of that size, plus the processor's
  `num_additional_image_tokens` (the class token), less one under the `default` feature strategy
  (which drops it): 576 for 336 pixels in patches of 14.
- LLaVA-NeXT (`llava_next` plugin): the processor resizes an image to its best grid of tiles and also
  keeps it whole as a base tile; the placeholder becomes one `<image>` per feature LlavaNextProcessor
  counts for the image's size (the base tile's patches, the grid's patches less the padding, a newline
  a row), less one under the `default` feature strategy.
- InternVL (`intern_vl` plugin): every image is one tile of the processor's size or, with
  `crop_to_patches`, the tiles of its best grid (at most 12) and a thumbnail; the placeholder becomes
  `<img>`, the processor's `image_seq_length` (256) `<IMG_CONTEXT>` a tile, and `</img>`.
- PaliGemma (`paligemma` plugin): every image is resized to the processor's square, and its
  `image_seq_length` `<image>` tokens (256) are written before the whole conversation, BOS included,
  untrained; the placeholders are dropped from the text. Its token types are 0 on those tokens (which
  attend both ways) and 1 after them.
- Llama 3.2 Vision (`mllama` plugin): each placeholder becomes one `<|image|>`; the image processor cuts
  every image into tiles (at most its `max_image_tiles`), which the decoder reads by cross-attention from
  the tokens after the image (`cross_attention_inputs`).
- MiniCPM-V 4.6 (`minicpm_v_4_6` plugin): the image is not scaled to the pixel limits (LLaMA-Factory hands
  the file to the image processor as it is); the processor resizes it whole to about `scale_resolution`
  squared and, when larger, also cuts it into a grid of equal slices (at most `max_slice_nums`). The
  placeholder becomes `<image_id>n</image_id>` (n: the image's place in the row, from 0; with the
  processor's `use_image_id`), the whole image's tokens between `<image>` and `</image>`, and each row of
  the grid, `<slice>`, a slice's tokens and `</slice>` a slice, rows joined by a newline; a part takes one
  `<|image_pad|>` per 16 patches of 14 pixels (per 4 under `downsample_mode: 4x`).
- Gemma 3 (`gemma3` plugin): every image is resized to the processor's square and pooled to the
  processor's `image_seq_length` soft tokens (256), written as Gemma3Processor writes its full image
  sequence, `\n\n<start_of_image>`, the soft tokens, `<end_of_image>\n\n`. With
  `image_do_pan_and_scan` the image processor also cuts a wide or tall image into crops (at LLaMA-
  Factory's fixed settings), and the placeholder becomes "Here is the original image", its sequence,
  "and here are some crops to help you see better" and one sequence per crop.

Audio (`qwen2_audio` plugin, Qwen2-Audio): each clip, one channel at `audio_sampling_rate`, becomes
`<|audio_bos|>`, one `<|AUDIO|>` per feature of Qwen2-Audio's encoder and `<|audio_eos|>`. The folder's
Whisper feature extractor cuts the clip into mel frames (one a hop, at most its chunk: 30 seconds),
and the encoder's two stride-2 steps leave (((frames - 1) // 2 + 1) - 2) // 2 + 1 features.

The model's own image processor (transformers' class, loaded from the model folder) makes the
pixels from the same sizing in training, so the tokens and the features always agree.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tuneline.core.data.media.columns import AUDIOS, IMAGES, VIDEOS
from tuneline.core.data.media.sizing import MINICPM_V_4_6
from tuneline.core.templates.spec import MediaTokens

if TYPE_CHECKING:
    from PIL.Image import Image

IMAGE_PLACEHOLDER = "<image>"
VIDEO_PLACEHOLDER = "<video>"
AUDIO_PLACEHOLDER = "<audio>"
PLACEHOLDERS = {IMAGES: IMAGE_PLACEHOLDER, VIDEOS: VIDEO_PLACEHOLDER, AUDIOS: AUDIO_PLACEHOLDER}
"""Each media column's placeholder in the messages."""
SLICE_MARKERS = ("<slice>", "</slice>")
IMAGE_ID_MARKERS = ("<image_id>", "</image_id>")
"""MiniCPM-V 4.6's slice and image-number markers (its tokenizer's slice_start_token, image_id_start_token, ...)."""


PAN_AND_SCAN = {"do_pan_and_scan": True, "pan_and_scan_min_crop_size": 256, "pan_and_scan_max_num_crops": 4,
                "pan_and_scan_min_ratio_to_activate": 1.2}
"""Gemma 3's image processor settings under `image_do_pan_and_scan` (LLaMA-Factory fixes these numbers)."""
CROP_TO_PATCHES = {"crop_to_patches": True, "max_patches": 12, "min_patches": 1}
"""InternVL's image processor settings under `crop_to_patches` (LLaMA-Factory fixes these numbers)."""
# what an image processor returns that counts tokens rather than feeds the model
COUNT_ONLY = ("num_crops", "num_patches", "grids", "num_patches_per_image")


def image_features(images: Sequence[Image], image_processor: Any, **settings: Any) -> dict[str, Any]:
    """The image processor's model inputs for sized `images` (pixel_values, image_grid_thw), as numpy arrays."""
    features = dict(image_processor(list(images), return_tensors="np", **settings))
    return {name: value for name, value in features.items() if name not in COUNT_ONLY}


def pan_and_scan_crops(images: Sequence[Image], image_processor: Any) -> list[int]:
    """How many crops Gemma 3's image processor adds to each sized image under pan and scan."""
    return [int(crops) for crops in image_processor(list(images), return_tensors="np", **PAN_AND_SCAN)["num_crops"]]


def image_token_counts(features: dict[str, Any], image_processor: Any) -> list[int]:
    """How many image tokens each image's features take: its grid's t x h x w over merge_size^2."""
    merge = int(image_processor.merge_size) ** 2
    return [int(grid.prod()) // merge for grid in features["image_grid_thw"]]


def patch_token_counts(images: Sequence[Image], image_processor: Any, *, plugin: str = "qwen2_vl",
                       processor_settings: Mapping[str, Any] | None = None, multimodal_processor: Any = None,
                       crop_to_patches: bool = False) -> list[int]:
    """How many image tokens each sized image takes, from its size alone where the processor's own patch
    arithmetic allows: tokenizing needs the counts, not the pixels, which the training collator cuts later.
    `processor_settings`: the multimodal processor's own numbers (LLaVA's patch_size and the rest);
    `multimodal_processor`: LLaVA-NeXT's processor, whose own arithmetic counts its tiles' features;
    `crop_to_patches`: InternVL's tiles, counted by its image processor."""
    if plugin == "llava":
        return [llava_token_count(images[0], image_processor, processor_settings or {})] * len(images) if images else []
    if plugin == "gemma3":
        return [int((processor_settings or {})["image_seq_length"])] * len(images)
    if plugin == "paligemma":
        return [paligemma_image_tokens(image_processor)] * len(images)
    if plugin == "mllama":  # the pixels reach the decoder through cross-attention, not through tokens
        return [1] * len(images)
    if plugin == "llava_next":
        return llava_next_token_counts(images, image_processor, processor_settings or {}, multimodal_processor)
    if plugin == MINICPM_V_4_6:
        return [image.tokens for image in sliced_images(images, image_processor)]
    if plugin == "intern_vl":
        tiles = (image_processor(list(images), return_tensors="np", **CROP_TO_PATCHES)["num_patches"] if crop_to_patches and images
                 else [1] * len(images))
        return [int((processor_settings or {})["image_seq_length"]) * int(count) for count in tiles]
    merge = int(image_processor.merge_size) ** 2
    return [int(image_processor.get_number_of_image_patches(image.height, image.width, {})) // merge for image in images]


def cross_attention_inputs(input_ids: Any, images: Sequence[Image], image_processor: Any, *, image_token_id: int,
                           attention_mask: Any = None) -> dict[str, Any]:
    """Llama 3.2 Vision's inputs for a batch (`input_ids` [batch, n], right-padded; `images` sized, in the
    order of their tokens): each example's images cut into tiles by the image processor (`pixel_values`
    [batch, image, tile, ...], `aspect_ratio_ids`, `aspect_ratio_mask`), and `cross_attention_mask` [batch,
    token, image, tile], which lets each text token see the tiles of the images before it (MllamaProcessor's
    own functions, on each example's ids without its padding, as LLaMA-Factory passes them)."""
    import torch
    from transformers.models.mllama.processing_mllama import convert_sparse_cross_attention_mask_to_dense, get_cross_attention_token_mask

    rows = input_ids.tolist()
    if attention_mask is not None:
        rows = [row[:int(length)] for row, length in zip(rows, attention_mask.sum(dim=1).tolist())]
    batched, start = [], 0
    for row in rows:
        count = row.count(image_token_id)
        batched.append(list(images[start:start + count]))
        start += count
    features = dict(image_processor(batched, return_tensors="np"))
    mask = convert_sparse_cross_attention_mask_to_dense([get_cross_attention_token_mask(row, image_token_id) for row in rows],
                                                        num_tiles=features.pop("num_tiles"),
                                                        max_num_tiles=int(image_processor.max_image_tiles), length=input_ids.shape[1])
    return {**{name: torch.from_numpy(value) for name, value in features.items()}, "cross_attention_mask": torch.from_numpy(mask)}


@dataclass(frozen=True)
class SlicedImage:
    """How MiniCPM-V 4.6's image processor cuts one image: the whole image, and a grid of slices of one size
    (`rows` 0: none), each part's tokens its patch grid over the merge."""

    whole_tokens: int
    rows: int
    columns: int
    slice_tokens: int
    numbered: bool
    """The processor's `use_image_id`: an `<image_id>n</image_id>` tag goes before the image."""

    @property
    def tokens(self) -> int:
        return self.whole_tokens + self.rows * self.columns * self.slice_tokens


def sliced_images(images: Sequence[Image], image_processor: Any) -> list[SlicedImage]:
    """MiniCPM-V 4.6's parts of each image, from its size by the image processor's own arithmetic (the sizes
    it resizes the whole image and the grid to), without cutting pixels. Every slice of an image is cut at
    one size, so LLaMA-Factory's count (the first slice's, for all) and MiniCPMV4_6Processor's (each
    slice's own) agree."""
    processor, patch = image_processor, int(image_processor.patch_size)
    mode, resolution = processor.downsample_mode, processor.scale_resolution
    merged = 4 if mode == "4x" else 16  # patches a token: the tower's window merger and the projector each merge 2 x 2
    cut = []
    for image in images:
        size = (image.height, image.width)
        grid = processor.get_sliced_grid(size, processor.max_slice_nums, resolution) if processor.slice_mode else None
        height, width = processor.find_best_resize(size, resolution, patch, downsample_mode=mode, allow_upscale=grid is None)
        rows, columns, slice_tokens = 0, 0, 0
        if grid is not None:
            rows, columns = grid
            grid_height, grid_width = processor.get_refine_size(size, grid, resolution, patch, downsample_mode=mode,
                                                                allow_upscale=True)
            slice_tokens = (grid_height // rows // patch) * (grid_width // columns // patch) // merged
        cut.append(SlicedImage(whole_tokens=(height // patch) * (width // patch) // merged, rows=rows, columns=columns,
                               slice_tokens=slice_tokens, numbered=bool(processor.use_image_id)))
    return cut


def sliced_image_text(image: SlicedImage, media: MediaTokens, *, index: int) -> str:
    """MiniCPM-V 4.6's text of one image, the `index`-th of its row (see the module's doc)."""
    number = f"{IMAGE_ID_MARKERS[0]}{index}{IMAGE_ID_MARKERS[1]}" if image.numbered else ""
    whole = f"{media.vision_bos}{media.image_token * image.whole_tokens}{media.vision_eos}"
    one_slice = f"{SLICE_MARKERS[0]}{media.image_token * image.slice_tokens}{SLICE_MARKERS[1]}"
    return number + whole + "\n".join([one_slice * image.columns] * image.rows)


def paligemma_image_tokens(image_processor: Any) -> int:
    """PaliGemma's tokens an image: its image processor's `image_seq_length` (preprocessor_config.json),
    as PaliGemmaProcessor reads it."""
    from tuneline.core.errors import ConfigError

    count = getattr(image_processor, "image_seq_length", None)
    if not isinstance(count, int) or count < 1:
        raise ConfigError("the model's preprocessor_config.json sets no image_seq_length; PaliGemma writes that many "
                          "<image> tokens an image: use the model's own preprocessor_config.json.")
    return count


LLAVA_SETTINGS = ("patch_size", "vision_feature_select_strategy", "num_additional_image_tokens")
"""LlavaProcessor's numbers that count an image's tokens (processor_config.json)."""


def llava_token_count(image: Image, image_processor: Any, settings: Mapping[str, Any]) -> int:
    """LLaVA's tokens for an image: patches of the processed size, plus the additional (class) tokens,
    less one under the `default` strategy. The processed size is the crop, or the fixed resize, or
    (neither being fixed) what the processor makes of `image`: LLaMA-Factory reads it off the row's first
    image and uses it for all, which the fixed sizes make the same."""
    height, width = _processed_size(image, image_processor)
    patch = int(settings["patch_size"])
    count = (height // patch) * (width // patch) + int(settings.get("num_additional_image_tokens") or 0)
    return count - 1 if settings.get("vision_feature_select_strategy") == "default" else count


def llava_next_token_counts(images: Sequence[Image], image_processor: Any, settings: Mapping[str, Any],
                            multimodal_processor: Any) -> list[int]:
    """LLaVA-NeXT's tokens for each image: its base tile's patches, the patches of the tiles of the best
    grid for its size with the padding taken off, and a newline feature a row (LlavaNextProcessor's own
    count), less one under the `default` strategy. The tile is the processor's crop (LLaMA-Factory reads
    it off the first image; the crop is one size for all)."""
    if not images:
        return []
    height, width = _processed_size(images[0], image_processor)
    less = 1 if settings.get("vision_feature_select_strategy") == "default" else 0
    return [int(multimodal_processor._get_number_of_features(image.height, image.width, height, width)) - less
            for image in images]


def _processed_size(image: Image, image_processor: Any) -> tuple[int, int]:
    crop, size = getattr(image_processor, "crop_size", None), getattr(image_processor, "size", None)
    if getattr(image_processor, "do_center_crop", False) and crop:
        return int(crop["height"]), int(crop["width"])
    if size and "height" in size and "width" in size:
        return int(size["height"]), int(size["width"])
    pixels = image_processor([image], return_tensors="np")["pixel_values"]
    return int(pixels.shape[-2]), int(pixels.shape[-1])


def expand_videos(messages: Sequence[dict[str, str]], texts: Sequence[str]) -> list[dict[str, str]]:
    """`messages` with the n-th `<video>` written as `texts[n]` (core/data/media/video/layout.py writes them)."""
    return _expanded(messages, texts, VIDEO_PLACEHOLDER)


def expand_audios(messages: Sequence[dict[str, str]], counts: Sequence[int], media: MediaTokens) -> list[dict[str, str]]:
    """`messages` with the n-th `<audio>` written as `counts[n]` audio tokens between the audio markers."""
    texts = [f"{media.audio_bos}{(media.audio_token or '') * count}{media.audio_eos}" for count in counts]
    return _expanded(messages, texts, AUDIO_PLACEHOLDER)


def audio_token_count(samples: int, feature_extractor: Any) -> int:
    """Qwen2-Audio's tokens for a clip of `samples` samples: its mel frames (a hop each, up to the feature
    extractor's chunk) after the encoder's two stride-2 steps."""
    limit = int(feature_extractor.n_samples)  # a longer clip is cut to the chunk, as the extractor cuts it
    frames = math.ceil(min(samples, limit) / int(feature_extractor.hop_length))
    return (((frames - 1) // 2 + 1) - 2) // 2 + 1


def expand_images(messages: Sequence[dict[str, str]], counts: Sequence[int], media: MediaTokens,
                  crops: Sequence[int] | None = None, *, slicings: Sequence[SlicedImage] | None = None,
                  first_index: int = 0) -> list[dict[str, str]]:
    """`messages` with the n-th `<image>` (across the messages, in order) written as `counts[n]` image
    tokens between the template's vision markers, and (Gemma 3's pan and scan) once more for each of
    its `crops[n]` crops; or (MiniCPM-V 4.6) as `slicings[n]`, numbered from `first_index` (the row's
    images before these messages). The caller has checked that the counts match."""
    if media.images_first:  # PaliGemma: the tokens go before the conversation (`image_prefix`), the text loses the placeholder
        return _expanded(messages, [""] * len(counts), IMAGE_PLACEHOLDER)
    if slicings is not None:
        texts = [sliced_image_text(image, media, index=first_index + n) for n, image in enumerate(slicings)]
        return _expanded(messages, texts, IMAGE_PLACEHOLDER)
    texts = [f"{media.vision_bos}{media.image_token * count}{media.vision_eos}" for count in counts]
    if crops is not None:
        texts = [f"Here is the original image {text} and here are some crops to help you see better " + " ".join([text] * n)
                 for text, n in zip(texts, crops, strict=True)]
    return _expanded(messages, texts, IMAGE_PLACEHOLDER)


def image_prefix(counts: Sequence[int], media: MediaTokens) -> int:
    """How many image tokens go before the conversation: all of them for PaliGemma (`images_first`), else none."""
    return sum(counts) if media.images_first else 0


def _expanded(messages: Sequence[dict[str, str]], texts: Sequence[str], placeholder: str) -> list[dict[str, str]]:
    pending = iter(texts)
    expanded = []
    for message in messages:
        pieces = message["content"].split(placeholder)
        content = pieces[0] + "".join(f"{next(pending)}{piece}" for piece in pieces[1:])
        expanded.append({**message, "content": content})
    return expanded


def placeholder_counts(messages: Sequence[dict[str, str]]) -> dict[str, int]:
    """How many `<image>`, `<video>` and `<audio>` placeholders the messages hold, by media column."""
    text = "".join(message["content"] for message in messages)
    return {key: text.count(placeholder) for key, placeholder in PLACEHOLDERS.items()}
