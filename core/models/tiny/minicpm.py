"""The project's tiny MiniCPM-V 4.6: a NaViT-style SigLIP tower with its window merger after the first block,
the merger that projects into the text, and Qwen3.5's hybrid decoder (linear-attention layers, then a full
attention one), from transformers' own config classes, randomly initialised and saved with MiniCPMV4_6ImageProcessorPil
at a small resolution, so the folder loads with AutoModelForImageTextToText, AutoTokenizer and
AutoImageProcessor like a downloaded one. `vision.build_vision_language_model` builds it for
`family: minicpmv4_6`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

MINICPM_V_TOKENS = ("<|image_pad|>", "<image>", "</image>", "<slice>", "</slice>", "<image_id>", "</image_id>")
"""MiniCPM-V 4.6's image token (Qwen's own pad) and its markers, single tokens in its tokenizer."""
SCALE_RESOLUTION = 112  # the whole image about 112 x 112 pixels: 4 tokens (a token is 56 x 56 pixels)


def minicpm_v_model(text_config: dict[str, Any], *, vision_width: int, depth: int, patch_size: int, image_token_id: int):
    """A MiniCPM-V 4.6 of `text_config`'s sizes (a Qwen3.5 decoder's), with a tower `vision_width` wide and
    `depth` blocks deep whose window merger follows its first block."""
    from transformers import MiniCPMV4_6Config, MiniCPMV4_6ForConditionalGeneration

    width, heads, layers = text_config["hidden_size"], text_config["num_attention_heads"], text_config["num_hidden_layers"]
    # Qwen3.5's decoder: Gated DeltaNet (linear attention) layers, then a full attention one, as each of its groups of four
    text = dict(text_config, model_type="qwen3_5_text", head_dim=width // heads, linear_key_head_dim=width // heads,
                linear_value_head_dim=width // heads, linear_num_key_heads=text_config["num_key_value_heads"],
                linear_num_value_heads=heads, layer_types=["linear_attention"] * (layers - 1) + ["full_attention"])
    vision = dict(hidden_size=vision_width, intermediate_size=2 * vision_width, num_hidden_layers=depth, num_attention_heads=2,
                  image_size=SCALE_RESOLUTION, patch_size=patch_size)
    config = MiniCPMV4_6Config(text_config=text, vision_config=vision, insert_layer_id=0, image_size=SCALE_RESOLUTION,
                               image_token_id=image_token_id, tie_word_embeddings=text_config.get("tie_word_embeddings", False))
    return MiniCPMV4_6ForConditionalGeneration(config)


def save_minicpm_v_processor(output_dir: str | Path, *, patch_size: int) -> None:
    """MiniCPM-V 4.6's image processor at `SCALE_RESOLUTION` (the checkpoint's own: 448), slicing large images
    as the checkpoint does (at most 9 slices)."""
    from transformers import MiniCPMV4_6ImageProcessorPil

    MiniCPMV4_6ImageProcessorPil(scale_resolution=SCALE_RESOLUTION, patch_size=patch_size).save_pretrained(output_dir)
