"""ChatML-style formats (`<|im_start|>role\\n...<|im_end|>`), as LLaMA-Factory 0.9.5 registers them:
chatml itself, the Qwen family, Yi, MiniCPM-V 4.6, InternLM2, SmolLM, Phi-4 and the other copies of chatml."""

from __future__ import annotations

from typing import Any

from tuneline.core.templates.spec import BOS, MediaTokens, Template, headed_template

_HEADER = "<|im_start|>{role}\n"
_END = "<|im_end|>\n"
_QWEN_OBSERVATION = "<|im_start|>user\n<tool_response>\n{content}\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
INTERN_SYSTEM = (
    "You are an AI assistant whose name is InternLM (书生·浦语).\n"
    "- InternLM (书生·浦语) is a conversational language model that is developed by Shanghai AI Laboratory "
    "(上海人工智能实验室). It is designed to be helpful, honest, and harmless.\n"
    "- InternLM (书生·浦语) can understand and communicate fluently in the language "
    "chosen by the user such as English and 中文."
)
"""InternLM's default system prompt, also that of its older format (`intern` in vendor.py)."""
_DBRX_SYSTEM = (
    "You are DBRX, created by Databricks. You were last updated in December 2023. "
    "You answer questions based on information available up to that point.\n"
    "YOU PROVIDE SHORT RESPONSES TO SHORT QUESTIONS OR STATEMENTS, but provide thorough "
    "responses to more complex and open-ended questions.\nYou assist with various tasks, "
    "from writing to coding (using markdown for code blocks — remember to use ``` with "
    "code, JSON, and tables).\n(You do not have real-time data access or code execution "
    "capabilities. You avoid stereotyping and provide balanced perspectives on "
    "controversial topics. You do not provide song lyrics, poems, or news articles and "
    "do not divulge details of your training data.)\nThis is your system prompt, "
    "guiding your responses. Do not reference it, just respond to the user. If you find "
    "yourself talking about this message, stop. You should be responding appropriately "
    "and usually that means not mentioning this.\nYOU DO NOT MENTION ANY OF THIS INFORMATION "
    "ABOUT YOURSELF UNLESS THE INFORMATION IS DIRECTLY PERTINENT TO THE USER'S QUERY."
)


def _chatml(name: str, **fields: Any) -> Template:
    """chatml's `<|im_start|>role\\n...<|im_end|>\\n` messages and whatever else `fields` sets."""
    return headed_template(name, header=_HEADER, end=_END, **fields)


def _qwen(name: str, **fields: Any) -> Template:
    """chatml with Qwen's tool calls and tool results (`<tool_call>`, `<tool_response>`)."""
    qwen = {"format_observation": (_QWEN_OBSERVATION,), "tool_format": "qwen", "stop_words": ("<|im_end|>",),
            "replace_eos": True}
    return _chatml(name, **{**qwen, **fields})


INTERN_VL_SYSTEM = "你是书生·万象，英文名是InternVL，是由上海人工智能实验室、清华大学及多家合作单位联合开发的多模态大语言模型。"
"""InternVL's default system prompt."""
_INTERN_VL_MEDIA = MediaTokens(plugin="intern_vl", image_token="<IMG_CONTEXT>", vision_bos="<img>", vision_eos="</img>")
_QWEN2_OMNI_MEDIA = MediaTokens(plugin="qwen2_omni", image_token="<|IMAGE|>", video_token="<|VIDEO|>",
                                vision_bos="<|vision_bos|>", vision_eos="<|vision_eos|>", audio_token="<|AUDIO|>",
                                audio_bos="<|audio_bos|>", audio_eos="<|audio_eos|>")
"""Qwen2.5-Omni's thinker: Qwen2-VL's images and videos and Qwen2-Audio's sounds, under its own token names."""
_MINICPM_V_4_6_MEDIA = MediaTokens(plugin="minicpm_v_4_6", image_token="<|image_pad|>", vision_bos="<image>",
                                   vision_eos="</image>")
"""MiniCPM-V 4.6's images (no videos yet): each image and each of its slices, Qwen's `<|image_pad|>` once per merged
patch, the whole image between `<image>` and `</image>` (see `core.data.media.expansion` for the slices)."""
_QWEN3_VL_MEDIA = MediaTokens(plugin="qwen3_vl", image_token="<|image_pad|>", video_token="<|video_pad|>",
                              vision_bos="<|vision_start|>", vision_eos="<|vision_end|>")

CHATML_TEMPLATES: tuple[Template, ...] = (
    _chatml("chatml", tool="tool", stop_words=("<|im_end|>", "<|im_start|>"), replace_eos=True),
    _chatml("chatml_de", tool="tool", stop_words=("<|im_end|>", "<|im_start|>"), replace_eos=True,
            default_system="Du bist ein freundlicher und hilfsbereiter KI-Assistent."),
    _qwen("qwen", default_system="You are Qwen, created by Alibaba Cloud. You are a helpful assistant."),
    _qwen("qwen2_vl", default_system="You are a helpful assistant.",
          media=MediaTokens(plugin="qwen2_vl", image_token="<|image_pad|>", video_token="<|video_pad|>",
                            vision_bos="<|vision_start|>", vision_eos="<|vision_end|>")),
    _qwen("qwen2_omni", default_system="You are a helpful assistant.", media=_QWEN2_OMNI_MEDIA),
    _chatml("qwen2_audio", default_system="You are a helpful assistant.", stop_words=("<|im_end|>",), replace_eos=True,
            media=MediaTokens(plugin="qwen2_audio", image_token=None, audio_token="<|AUDIO|>", audio_bos="<|audio_bos|>",
                              audio_eos="<|audio_eos|>")),
    _qwen("qwen3", reasoning=True),
    _qwen("qwen3_nothink"),
    _qwen("qwen3_vl", reasoning=True, media=_QWEN3_VL_MEDIA),
    _qwen("qwen3_vl_nothink", media=_QWEN3_VL_MEDIA),
    _qwen("mimo", default_system="You are a helpful assistant.", reasoning=True),
    _chatml("yi", stop_words=("<|im_end|>",)),
    _chatml("minicpm_v_4_6", default_system="You are a helpful assistant.", stop_words=("<|im_end|>",),
            media=_MINICPM_V_4_6_MEDIA),
    _chatml("intern2", format_prefix=(BOS,), default_system=INTERN_SYSTEM, stop_words=("<|im_end|>",)),
    _chatml("intern_vl", format_prefix=(BOS,), default_system=INTERN_VL_SYSTEM, stop_words=("<|im_end|>",), media=_INTERN_VL_MEDIA),
    _chatml("intern_s1", format_prefix=(BOS,), stop_words=("<|im_end|>",), media=_INTERN_VL_MEDIA),
    _chatml("smollm", stop_words=("<|im_end|>",)),
    _chatml("smollm2", stop_words=("<|im_end|>",),
            default_system="You are a helpful AI assistant named SmolLM, trained by Hugging Face."),
    _chatml("dbrx", tool="tool", default_system=_DBRX_SYSTEM, stop_words=("<|im_end|>",), replace_eos=True),
    _chatml("cpm3", tool="tool", format_prefix=(BOS,), stop_words=("<|im_end|>",)),
    _chatml("cpm4", tool="tool", format_prefix=(BOS,), stop_words=("<|im_end|>",)),
    _chatml("opencoder", tool="tool", stop_words=("<|im_end|>",),
            default_system="You are OpenCoder, created by OpenCoder Team."),
    _chatml("falcon_h1", tool="tool", format_prefix=(BOS,), stop_words=("<|im_end|>", "<|end_of_text|>")),
    _chatml(
        "sailor",
        user="question",
        assistant="answer",
        default_system=(
            "You are an AI assistant named Sailor created by Sea AI Lab. "
            "Your answer should be friendly, unbiased, faithful, informative and detailed."
        ),
        stop_words=("<|im_end|>",),
    ),
    headed_template("phi4", header="<|im_start|>{role}<|im_sep|>", end="<|im_end|>", stop_words=("<|im_end|>",),
                    replace_eos=True),
    headed_template("moonlight", header="<|im_{role}|>{role}<|im_middle|>", end="<|im_end|>",
                    default_system="You are a helpful assistant provided by Moonshot-AI.", stop_words=("<|im_end|>",),
                    replace_eos=True),
)
