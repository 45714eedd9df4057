"""Formats with a vendor's own control tokens, as LLaMA-Factory 0.9.5 registers them: Llama 2/3/4,
Mistral, Phi, Gemma, DeepSeek V3/R1, GLM, Baichuan 2, Cohere, Granite, Seed-OSS, gpt-oss, ..."""

from __future__ import annotations

from dataclasses import replace

from tuneline.core.templates.chatml import INTERN_SYSTEM
from tuneline.core.templates.spec import BOS, CONTENT, EOS, MediaTokens, Template, Token, headed_template

_GEMMA_REPLY = "<start_of_turn>model\n"
_GEMMA_USER = "<start_of_turn>user\n{content}<end_of_turn>\n" + _GEMMA_REPLY
_GEMMA_OBSERVATION = "<start_of_turn>tool\n{content}<end_of_turn>\n" + _GEMMA_REPLY
GEMMA3_MEDIA = MediaTokens(plugin="gemma3", image_token="<image_soft_token>", vision_bos="\n\n<start_of_image>",
                           vision_eos="<end_of_image>\n\n")
"""Gemma 3's image: its processor's full image sequence, one soft token per pooled vision feature."""
MLLAMA_MEDIA = MediaTokens(plugin="mllama", image_token="<|image|>")
"""Llama 3.2 Vision's images: one `<|image|>` each, read by the decoder's cross-attention layers."""
PALIGEMMA_MEDIA = MediaTokens(plugin="paligemma", image_token="<image>", images_first=True)
"""PaliGemma's images: the image processor's `image_seq_length` `<image>` tokens an image, all before the text."""
GLM4V_MEDIA = MediaTokens(plugin="glm4v", image_token="<|image|>", video_token="<|video|>", vision_bos="<|begin_of_image|>",
                          vision_eos="<|end_of_image|>", video_bos="<|begin_of_video|>", video_eos="<|end_of_video|>")
"""GLM-4V's image (GLM-4.1V-Thinking): Qwen2-VL's sizing and merged patches between GLM's image markers; a video's
frames each as an image, between its video markers (core/data/media/video/layout.py)."""
_DEEPSEEK3_USER = "<\uff5cUser\uff5c>{content}<\uff5cAssistant\uff5c>"  # fullwidth bars, as DeepSeek writes them
_GLM_STOP = ("<|user|>", "<|observation|>")
_GLM_PREFIX = ("[gMASK]", "<sop>")
_SEED_SYSTEM = (
    "You are an AI programming assistant, utilizing the Seed-Coder model, developed by ByteDance Seed, "
    "and you only answer questions related to computer science. For politically sensitive questions, "
    "security and privacy issues, and other non-computer science questions, you will refuse to answer.\n\n"
)
_GRANITE_HEADER = "<|start_of_role|>{role}<|end_of_role|>"


def _gemma(name: str, *, stop_words: tuple[str, ...], replace_eos: bool, efficient_eos: bool,
           media: MediaTokens | None = None) -> Template:
    return Template(
        name=name,
        format_user=(_GEMMA_USER,),
        format_assistant=("{content}<end_of_turn>\n",),
        format_system=("{content}\n\n",),
        format_observation=(_GEMMA_OBSERVATION,),
        format_prefix=(BOS,),
        stop_words=stop_words,
        markers=("<start_of_turn>", "<end_of_turn>"),
        replace_eos=replace_eos,
        efficient_eos=efficient_eos,
        system_in_user=True,
        generation_prefix=_GEMMA_REPLY,
        media=media,
    )


def _glm4(name: str, *, reasoning: bool, stop_words: tuple[str, ...] = _GLM_STOP,
          media: MediaTokens | None = None) -> Template:
    return Template(
        name=name,
        format_user=("<|user|>\n{content}<|assistant|>",),
        format_assistant=("\n{content}",),
        format_system=("<|system|>\n{content}",),
        format_function=(CONTENT,),
        format_observation=("<|observation|>\n{content}<|assistant|>",),
        format_prefix=("[gMASK]<sop>",),
        stop_words=stop_words,
        markers=_GLM_PREFIX,
        efficient_eos=True,
        reasoning=reasoning,
        generation_prefix="<|assistant|>",
        tool_format="glm4",
        media=media,
    )


def _mistral(name: str, *, space: str, system: str, system_in_user: bool) -> Template:
    """Mistral's [INST] format; v3 (`mistral`) writes a space after each control token, tekken doesn't."""
    return Template(
        name=name,
        format_user=(f"[INST]{space}{{content}}[/INST]",),
        format_assistant=(f"{space}{{content}}", EOS),
        format_system=(system,),
        format_function=(f"[TOOL_CALLS]{space}{{content}}", EOS),
        format_observation=(f'[TOOL_RESULTS]{space}{{"content": {{content}}}}[/TOOL_RESULTS]',),
        format_prefix=(BOS,),
        system_in_user=system_in_user,
        tool_format="mistral",
    )


VENDOR_TEMPLATES: tuple[Template, ...] = (
    Template(
        name="llama2",
        format_user=(BOS, "[INST] {content} [/INST]"),
        format_system=("<<SYS>>\n{content}\n<</SYS>>\n\n",),
        system_in_user=True,
    ),
    Template(
        name="llama2_zh",
        format_user=(BOS, "[INST] {content} [/INST]"),
        format_system=("<<SYS>>\n{content}\n<</SYS>>\n\n",),
        default_system="You are a helpful assistant. 你是一个乐于助人的助手。",
        system_in_user=True,
    ),
    headed_template("llama3", header="<|start_header_id|>{role}<|end_header_id|>\n\n", end="<|eot_id|>",
                    tool="ipython", format_prefix=(BOS,), stop_words=("<|eot_id|>", "<|eom_id|>"), replace_eos=True,
                    tool_format="llama3", pretrain_eos="<|end_of_text|>"),
    headed_template("mllama", header="<|start_header_id|>{role}<|end_header_id|>\n\n", end="<|eot_id|>",
                    tool="ipython", format_prefix=(BOS,), stop_words=("<|eot_id|>", "<|eom_id|>"), replace_eos=True,
                    tool_format="llama3", media=MLLAMA_MEDIA),
    headed_template("llama4", header="<|header_start|>{role}<|header_end|>\n\n", end="<|eot|>", tool="ipython",
                    format_prefix=(BOS,), stop_words=("<|eot|>", "<|eom|>"), replace_eos=True, tool_format="llama3"),
    _mistral("mistral", space=" ", system="{content}\n\n", system_in_user=True),
    _mistral("ministral", space="", system="{content}\n\n", system_in_user=True),
    _mistral("mistral_small", space="", system="[SYSTEM_PROMPT]{content}[/SYSTEM_PROMPT]", system_in_user=False),
    headed_template("phi", header="<|{role}|>\n", end="<|end|>\n", stop_words=("<|end|>",), replace_eos=True),
    _gemma("gemma", stop_words=("<end_of_turn>",), replace_eos=True, efficient_eos=False),
    _gemma("gemma2", stop_words=("<eos>", "<end_of_turn>"), replace_eos=False, efficient_eos=True),
    _gemma("gemma3", stop_words=("<end_of_turn>",), replace_eos=True, efficient_eos=False, media=GEMMA3_MEDIA),
    # PaliGemma's plain format (a caption or answer after one line of prompt) and its Gemma-style chat;
    # LLaMA-Factory writes the system prompt straight before the first message in both
    Template(name="paligemma", format_user=("{content}\n",), format_prefix=(BOS,), system_in_user=True, media=PALIGEMMA_MEDIA),
    replace(_gemma("paligemma_chat", stop_words=("<end_of_turn>",), replace_eos=True, efficient_eos=False,
                   media=PALIGEMMA_MEDIA), format_system=(CONTENT,)),
    Template(name="deepseek3", format_user=(_DEEPSEEK3_USER,), format_prefix=(BOS,),
             generation_prefix="<\uff5cAssistant\uff5c>"),
    Template(name="deepseekr1", format_user=(_DEEPSEEK3_USER,), format_prefix=(BOS,), reasoning=True,
             generation_prefix="<\uff5cAssistant\uff5c>"),
    Template(
        name="baichuan2",
        format_user=("<reserved_106>{content}<reserved_107>",),
        format_assistant=(CONTENT,),
        markers=("<reserved_106>", "<reserved_107>"),
        efficient_eos=True,
        generation_prefix="<reserved_107>",
    ),
    Template(
        name="chatglm3",
        format_user=(Token("<|user|>"), "\n", CONTENT, Token("<|assistant|>")),
        format_assistant=("\n", CONTENT),
        format_system=(Token("<|system|>"), "\n", CONTENT),
        format_function=(CONTENT,),
        format_observation=(Token("<|observation|>"), "\n", CONTENT, Token("<|assistant|>")),
        format_prefix=(Token("[gMASK]"), Token("sop")),
        stop_words=_GLM_STOP,
        efficient_eos=True,
        tool_format="glm4",
    ),
    _glm4("glm4", reasoning=False),
    _glm4("glmz1", reasoning=True),
    _glm4("glm4v", reasoning=True, stop_words=(*_GLM_STOP, "</answer>"), media=GLM4V_MEDIA),
    Template(
        name="codegeex4",
        format_user=("<|user|>\n{content}<|assistant|>\n",),
        format_assistant=(CONTENT,),
        format_system=("<|system|>\n{content}",),
        format_function=(CONTENT,),
        format_observation=("<|observation|>\n{content}<|assistant|>\n",),
        format_prefix=("[gMASK]<sop>",),
        markers=_GLM_PREFIX,
        default_system=(
            "你是一位智能编程助手，你叫CodeGeeX。你会为用户回答关于编程、代码、计算机方面的任何问题，"
            "并提供格式规范、可以执行、准确安全的代码，并在必要时提供详细的解释。"
        ),
        stop_words=_GLM_STOP,
        efficient_eos=True,
        generation_prefix="<|assistant|>\n",
        tool_format="glm4",
    ),
    Template(
        name="intern",
        format_user=("<|User|>:{content}\n<|Bot|>:",),
        format_assistant=("{content}<eoa>\n",),
        format_system=("<|System|>:{content}\n",),
        format_prefix=(BOS,),
        default_system=INTERN_SYSTEM,
        stop_words=("<eoa>",),
        generation_prefix="<|Bot|>:",
    ),
    Template(
        name="cohere",
        format_user=(
            "<|START_OF_TURN_TOKEN|><|USER_TOKEN|>{content}<|END_OF_TURN_TOKEN|>"
            "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>",
        ),
        format_system=("<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>{content}<|END_OF_TURN_TOKEN|>",),
        format_prefix=(BOS,),
        generation_prefix="<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>",
    ),
    headed_template("granite3", header=_GRANITE_HEADER, end="<|end_of_text|>\n"),
    headed_template(
        "granite4",
        header=_GRANITE_HEADER,
        end="<|end_of_text|>\n",
        # a tool result opens the reply with "assistant\n", not the assistant's header, as LLaMA-Factory writes it
        format_observation=("<|start_of_role|>tool<|end_of_role|>{content}<|end_of_text|>\n<|start_of_role|>assistant\n",),
        default_system="You are Granite, developed by IBM. You are a helpful AI assistant.",
        stop_words=("<|end_of_text|>",),
    ),
    Template(
        name="exaone",
        format_user=("[|user|]{content}\n[|assistant|]",),
        format_assistant=(CONTENT, EOS, "\n"),
        format_system=("[|system|]{content}[|endofturn|]\n",),
        generation_prefix="[|assistant|]",
    ),
    Template(
        name="starchat",
        format_user=("<|user|>\n{content}<|end|>\n<|assistant|>",),
        format_assistant=("{content}<|end|>\n",),
        format_system=("<|system|>\n{content}<|end|>\n",),
        stop_words=("<|end|>",),
        generation_prefix="<|assistant|>",
    ),
    Template(
        name="hunyuan",
        format_user=("{content}<|extra_0|>",),
        format_assistant=("{content}<|eos|>",),
        format_system=("{content}<|extra_4|>",),
        format_prefix=("<|startoftext|>",),
        stop_words=("<|eos|>",),
    ),
    Template(
        name="seed_coder",
        format_user=(BOS, "user\n{content}", EOS, BOS, "assistant\n"),
        format_system=(BOS, "system\n{content}", EOS),
        default_system=_SEED_SYSTEM,
        generation_prefix="assistant\n",
    ),
    Template(
        name="seed_oss",
        format_user=(BOS, "user\n{content}", EOS, BOS, "assistant\n"),
        format_system=(BOS, "system\n{content}", EOS),
        format_function=(BOS, "\n{content}", EOS),
        reasoning=True,
        thought_words=("<seed:think>", "</seed:think>"),
        generation_prefix="assistant\n",
        tool_format="seed_oss",
    ),
    Template(
        name="gpt_oss",
        format_user=("<|start|>user<|message|>{content}<|end|><|start|>assistant",),
        format_assistant=("{content}<|end|>",),
        format_system=("<|start|>system<|message|>{content}<|end|>",),
        default_system="You are ChatGPT, a large language model trained by OpenAI.",
        efficient_eos=True,
        reasoning=True,
        thought_words=("<|channel|>analysis<|message|>", "<|end|><|start|>assistant<|channel|>final<|message|>"),
        generation_prefix="<|start|>assistant",
    ),
)
