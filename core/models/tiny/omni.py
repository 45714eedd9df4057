"""The project's tiny Qwen2.5-Omni thinker (the part that reads text, images, videos and sound and writes
text; LLaMA-Factory trains this part alone): a Qwen2.5-VL-style vision tower, a Whisper-style audio encoder and
Qwen2's decoder, from transformers' own config classes, randomly initialised and saved with Qwen2-VL's image
processor and Whisper's feature extractor, so the folder loads with AutoModelForImageTextToText,
AutoImageProcessor and AutoFeatureExtractor like a downloaded one. `vision.build_vision_language_model`
builds it for `vision: qwen2_5_omni_thinker`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tuneline.core.models.tiny.audio import ENCODER_POSITIONS, MEL_BINS

OMNI_TOKENS = ("<|vision_bos|>", "<|vision_eos|>", "<|IMAGE|>", "<|VIDEO|>", "<|audio_bos|>", "<|audio_eos|>", "<|AUDIO|>")
"""Qwen2.5-Omni's media tokens, as its tokenizer names them."""


def qwen2_omni_thinker(text_config: dict[str, Any], *, vision_width: int, depth: int, patch_size: int, merge_size: int,
                       temporal_patch_size: int, ids: dict[str, int]):
    """A Qwen2.5-Omni thinker of `text_config`'s decoder, with a vision tower and an audio encoder `vision_width`
    wide and `depth` blocks deep; `ids`: the media tokens' ids."""
    from transformers import Qwen2_5OmniThinkerConfig, Qwen2_5OmniThinkerForConditionalGeneration

    width = text_config["hidden_size"]
    vision = dict(depth=depth, hidden_size=vision_width, intermediate_size=2 * vision_width, num_heads=2,
                  patch_size=patch_size, spatial_merge_size=merge_size, temporal_patch_size=temporal_patch_size,
                  window_size=56, out_hidden_size=width, fullatt_block_indexes=[0])
    audio = dict(d_model=vision_width, encoder_layers=depth, encoder_attention_heads=2, encoder_ffn_dim=2 * vision_width,
                 num_mel_bins=MEL_BINS, max_source_positions=ENCODER_POSITIONS, output_dim=width)
    config = Qwen2_5OmniThinkerConfig(text_config=text_config, vision_config=vision, audio_config=audio,
                                      audio_token_index=ids["<|AUDIO|>"], image_token_index=ids["<|IMAGE|>"],
                                      video_token_index=ids["<|VIDEO|>"], audio_start_token_id=ids["<|audio_bos|>"],
                                      audio_end_token_id=ids["<|audio_eos|>"])
    config.vision_start_token_id = ids["<|vision_bos|>"]  # where its 3D positions find each image and video
    return Qwen2_5OmniThinkerForConditionalGeneration(config)


def save_qwen2_omni_processors(image_processor, output_dir: str | Path) -> None:
    """The image processor and Whisper's feature extractor, both in preprocessor_config.json as Qwen2.5-Omni keeps
    them (AutoImageProcessor and AutoFeatureExtractor each read their own keys)."""
    import json

    from transformers import WhisperFeatureExtractor

    folder = Path(output_dir)
    WhisperFeatureExtractor(feature_size=MEL_BINS).save_pretrained(folder)
    audio = json.loads((folder / "preprocessor_config.json").read_text(encoding="utf-8"))
    image_processor.save_pretrained(folder)
    image = json.loads((folder / "preprocessor_config.json").read_text(encoding="utf-8"))
    (folder / "preprocessor_config.json").write_text(json.dumps({**audio, **image}, indent=2), encoding="utf-8")
