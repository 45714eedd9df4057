"""LLaMA-Factory's multimodal copies of text formats: LLaVA-NeXT checkpoints trained on Llama 3, Mistral,
Qwen and Yi write their base model's format with LLaVA-NeXT's images, and Yi-VL writes its own plain
format with LLaVA's images."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from tuneline.core.templates.spec import CONTENT, MediaTokens, Template

LLAVA_MEDIA = MediaTokens(plugin="llava", image_token="<image>")
LLAVA_NEXT_MEDIA = MediaTokens(plugin="llava_next", image_token="<image>")
_YI_VL_SYSTEM = (
    "This is a chat between an inquisitive human and an AI assistant. Assume the role of the AI assistant. "
    "Read all the images carefully, and respond to the human's questions with informative, helpful, detailed and "
    "polite answers. 这是一个好奇的人类和一个人工智能助手之间的对话。假设你扮演这个AI助手的角色。"
    "仔细阅读所有的图像，并对人类的问题做出信息丰富、有帮助、详细的和礼貌的回答。\n\n"
)


def media_variants(text: Mapping[str, Template]) -> tuple[Template, ...]:
    """The multimodal copies of the text templates `text` (by name)."""
    return (
        replace(text["llama3"], name="llava_next_llama3", media=LLAVA_NEXT_MEDIA),
        replace(text["mistral"], name="llava_next_mistral", media=LLAVA_NEXT_MEDIA),
        # Qwen's format with the system prompt of Qwen 1.5, which these checkpoints were tuned on
        replace(text["qwen"], name="llava_next_qwen", default_system="You are a helpful assistant.", media=LLAVA_NEXT_MEDIA),
        replace(text["yi"], name="llava_next_yi", media=LLAVA_NEXT_MEDIA),
        Template(name="yi_vl", format_user=("### Human: {content}\n### Assistant:",), format_assistant=("{content}\n",),
                 format_system=(CONTENT,), default_system=_YI_VL_SYSTEM, stop_words=("###",), efficient_eos=True,
                 generation_prefix="\n### Assistant:", media=LLAVA_MEDIA),
    )
