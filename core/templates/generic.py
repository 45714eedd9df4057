"""Plain-text chat formats (no model-specific control tokens), as LLaMA-Factory 0.9.5 registers
them: default, empty, alpaca, vicuna and the older community formats."""

from __future__ import annotations

from tuneline.core.templates.spec import BOS, CONTENT, EOS, MediaTokens, Template, Token

_VICUNA_SYSTEM = (
    "A chat between a curious user and an artificial intelligence assistant. "
    "The assistant gives helpful, detailed, and polite answers to the user's questions."
)

GENERIC_TEMPLATES: tuple[Template, ...] = (
    Template(
        name="default",
        format_user=("Human: {content}", EOS, "\nAssistant:"),
        format_assistant=(CONTENT, EOS, "\n"),
        format_system=("System: {content}", EOS, "\n"),
        generation_prefix="\nAssistant:",
    ),
    Template(name="empty", format_assistant=(CONTENT,)),
    Template(
        name="alpaca",
        format_user=("### Instruction:\n{content}\n\n### Response:\n",),
        format_assistant=(CONTENT, EOS, "\n\n"),
        default_system=(
            "Below is an instruction that describes a task. "
            "Write a response that appropriately completes the request.\n\n"
        ),
        generation_prefix="### Response:\n",
    ),
    Template(
        name="vicuna",
        format_user=("USER: {content} ASSISTANT:",),
        default_system=_VICUNA_SYSTEM,
        generation_prefix=" ASSISTANT:",
    ),
    Template(
        name="llava",  # vicuna's format, with LLaVA-1.5's images
        format_user=("USER: {content} ASSISTANT:",),
        default_system=_VICUNA_SYSTEM,
        generation_prefix=" ASSISTANT:",
        media=MediaTokens(plugin="llava", image_token="<image>"),
    ),
    Template(
        name="llava_next",  # vicuna's format, with LLaVA-NeXT's tiled images
        format_user=("USER: {content} ASSISTANT:",),
        default_system=_VICUNA_SYSTEM,
        generation_prefix=" ASSISTANT:",
        media=MediaTokens(plugin="llava_next", image_token="<image>"),
    ),
    Template(
        name="aquila",
        format_user=("Human: {content}###Assistant:",),
        format_assistant=("{content}###",),
        format_system=("System: {content}###",),
        default_system=(
            "A chat between a curious human and an artificial intelligence assistant. "
            "The assistant gives helpful, detailed, and polite answers to the human's questions."
        ),
        stop_words=("</s>",),
        generation_prefix="###Assistant:",
    ),
    Template(
        name="belle",
        format_user=("Human: {content}\n\nBelle: ",),
        format_assistant=(CONTENT, EOS, "\n\n"),
        format_prefix=(BOS,),
        generation_prefix="Belle: ",
    ),
    Template(
        name="breeze",
        format_user=("[INST] {content} [/INST] ",),
        format_assistant=(CONTENT,),
        format_prefix=(BOS,),
        efficient_eos=True,
    ),
    Template(name="cpm", format_user=("<用户>{content}<AI>",), format_prefix=(BOS,), generation_prefix="<AI>"),
    Template(
        name="deepseek",
        format_user=("User: {content}\n\nAssistant:",),
        format_system=("{content}\n\n",),
        format_prefix=(BOS,),
        generation_prefix="Assistant:",
    ),
    Template(
        name="deepseekcoder",
        format_user=("### Instruction:\n{content}\n### Response:",),
        format_assistant=("\n{content}\n<|EOT|>\n",),
        format_prefix=(BOS,),
        default_system=(
            "You are an AI programming assistant, utilizing the DeepSeek Coder model, "
            "developed by DeepSeek Company, and you only answer questions related to computer science. "
            "For politically sensitive questions, security and privacy issues, "
            "and other non-computer science questions, you will refuse to answer.\n"
        ),
        generation_prefix="### Response:",
    ),
    Template(
        name="falcon",
        format_user=("User: {content}\nFalcon:",),
        format_assistant=("{content}\n",),
        efficient_eos=True,
        generation_prefix="Falcon:",
    ),
    Template(name="fewshot", format_assistant=("{content}\n\n",), efficient_eos=True),
    Template(
        name="olmo",
        format_user=("<|user|>\n{content}<|assistant|>\n",),
        format_prefix=(EOS,),
        generation_prefix="<|assistant|>\n",
    ),
    Template(
        name="openchat",
        format_user=("GPT4 Correct User: {content}", EOS, "GPT4 Correct Assistant:"),
        format_prefix=(BOS,),
        generation_prefix="GPT4 Correct Assistant:",
    ),
    Template(
        name="openchat-3.6",
        format_user=(
            "<|start_header_id|>GPT4 Correct User<|end_header_id|>\n\n{content}<|eot_id|>"
            "<|start_header_id|>GPT4 Correct Assistant<|end_header_id|>\n\n",
        ),
        format_prefix=(BOS,),
        stop_words=("<|eot_id|>",),
        generation_prefix="<|start_header_id|>GPT4 Correct Assistant<|end_header_id|>\n\n",
    ),
    Template(name="orion", format_user=("Human: {content}\n\nAssistant: ", EOS), format_prefix=(BOS,)),
    Template(
        name="solar",
        format_user=("### User:\n{content}\n\n### Assistant:\n",),
        format_assistant=(CONTENT,),
        format_system=("### System:\n{content}\n\n",),
        efficient_eos=True,
        generation_prefix="### Assistant:\n",
    ),
    Template(name="xverse", format_user=("Human: {content}\n\nAssistant: ",), generation_prefix="Assistant: "),
    Template(
        name="xuanyuan",
        format_user=("Human: {content} Assistant:",),
        default_system=(
            "以下是用户和人工智能助手之间的对话。用户以Human开头，人工智能助手以Assistant开头，"
            "会对人类提出的问题给出有帮助、高质量、详细和礼貌的回答，并且总是拒绝参与与不道德、"
            "不安全、有争议、政治敏感等相关的话题、问题和指示。\n"
        ),
        generation_prefix=" Assistant:",
    ),
    Template(
        name="yuan",
        format_user=(CONTENT, Token("<sep>")),
        format_assistant=("{content}<eod>\n",),
        stop_words=("<eod>",),
    ),
    Template(
        name="zephyr",
        format_user=("<|user|>\n{content}", EOS, "<|assistant|>\n"),
        format_system=("<|system|>\n{content}", EOS),
        default_system="You are Zephyr, a helpful assistant.",
        generation_prefix="<|assistant|>\n",
    ),
    Template(
        name="ziya",
        format_user=("<human>:{content}\n<bot>:",),
        format_assistant=("{content}\n",),
        generation_prefix="<bot>:",
    ),
)
