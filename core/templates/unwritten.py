"""LLaMA-Factory 0.9.5's templates that tuneline does not write yet, each with what it is for: a config
naming one is refused by name, with the reason and the way round, never as an unknown template."""

from __future__ import annotations

TEXT_FORMATS: frozenset[str] = frozenset({
    "aeva", "bailing", "bailing_v2", "ernie", "ernie_nothink", "glm4_7", "glm4_moe", "hunyuan_small", "hy3", "index",
    "lfm2", "mimo_v2", "minimax1", "minimax2", "phi4_mini", "phi_small", "telechat2", "youtu",
})
"""Text-only formats."""

MEDIA_FORMATS: dict[str, str] = {
    "dots_ocr": "dots.ocr (Qwen2-VL's media with its own tokens)",
    "ernie_vl": "ERNIE-4.5-VL (its own image and video plugin)",
    "gemma3n": "Gemma 3n (images and audio)",
    "gemma4": "Gemma 4 (images and video)",
    "gemma4n": "Gemma 4n (images, video and audio)",
    "glm4_5v": "GLM-4.5V (GLM-4.1V's media in GLM-4.5's format)",
    "glm_ocr": "GLM-OCR (GLM-4.1V's media)",
    "granite3_vision": "Granite 3 Vision (LLaVA-NeXT's tiles in Granite's format)",
    "keye_vl": "Keye-VL (Qwen2-VL's media)",
    "kimi_vl": "Kimi-VL (its own image plugin)",
    "lfm2_vl": "LFM2-VL (its own image plugin)",
    "llava_next_video": "LLaVA-NeXT-Video (images and video)",
    "llava_next_video_mistral": "LLaVA-NeXT-Video on Mistral (images and video)",
    "llava_next_video_yi": "LLaVA-NeXT-Video on Yi (images and video)",
    "mimo_vl": "MiMo-VL (Qwen2-VL's media)",
    "minicpm_o": "MiniCPM-o (its own image, video and audio plugin)",
    "minicpm_v": "MiniCPM-V (its own image and video plugin)",
    "ministral3": "Ministral 3 (Pixtral's images)",
    "pixtral": "Pixtral (its own image plugin)",
    "qwen3_5": "Qwen3.5 (Qwen3-VL's media in Qwen3.5's format)",
    "qwen3_5_nothink": "Qwen3.5 without thinking (Qwen3-VL's media)",
    "qwen3_6": "Qwen3.6 (Qwen3-VL's media)",
    "qwen3_omni": "Qwen3-Omni (images, video and audio)",
    "qwen3_omni_nothink": "Qwen3-Omni without thinking (images, video and audio)",
    "video_llava": "Video-LLaVA (images and video)",
    "youtu_vl": "Youtu-VL (its own image and video plugin)",
}
"""Multimodal formats, by the family each is for."""


def unwritten_template_message(name: str) -> str | None:
    """Why `template: name` cannot run here and what to do instead; None for a name LLaMA-Factory does not have either."""
    auto = ("'template: auto' renders rows with the model's own chat template (the tokenizer's), whose tokens can differ "
            "from LLaMA-Factory's where the two formats differ")
    if name in TEXT_FORMATS:
        return (f"template '{name}' is one of LLaMA-Factory 0.9.5's text formats that tuneline does not write yet; "
                f"{auto}, or name one of the templates docs/templates.md lists.")
    if name in MEDIA_FORMATS:
        return (f"template '{name}' is LLaMA-Factory 0.9.5's format for {MEDIA_FORMATS[name]}, whose media tuneline does "
                f"not expand yet; text-only rows of the same model train with {auto}.")
    return None
