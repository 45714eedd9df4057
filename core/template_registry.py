"""Chat templates as frozen values: the slot strings of LLaMA-Factory 0.9.5's templates.

A template says how each message is written out. A slot is a tuple of pieces: text, in which the
first `{content}` is replaced by the message, or `BOS` / `EOS`, which stand for the tokenizer's
bos/eos token as it is after `fix_tokenizer`. Each text piece is encoded on its own, so the split
into pieces is part of the template (it decides where BPE may not merge).

Behaviour lives in `tuneline.core.templates`; this module only holds the data and the tool prompts.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from types import MappingProxyType
from typing import Any, Literal

from tuneline.core.errors import ConfigError, DataError


class Special(Enum):
    """A slot piece that is a special token of the (fixed) tokenizer, not text."""

    BOS = "bos_token"
    EOS = "eos_token"


BOS = Special.BOS
EOS = Special.EOS
CONTENT = "{content}"

Piece = str | Special
Slot = tuple[Piece, ...]
ToolFormat = Literal["default", "qwen", "mistral"]


@dataclass(frozen=True)
class Template:
    """How a conversation becomes text, with LLaMA-Factory's semantics for each field."""

    name: str
    format_user: Slot = (CONTENT,)
    """A user message, followed by the assistant's generation prefix (it opens the reply)."""
    format_assistant: Slot = (CONTENT, EOS)
    """An assistant message, including whatever closes the turn."""
    format_system: Slot = (CONTENT,)
    """The system message (plus the tool descriptions), written before the first user message."""
    format_prefix: Slot = ()
    """Written once at the very start (usually the BOS token)."""
    default_system: str = ""
    """Used when a row has no system message."""
    stop_words: tuple[str, ...] = ()
    """Texts that end a reply; with `replace_eos` the first becomes the tokenizer's eos."""
    efficient_eos: bool = False
    """The assistant slot has no eos: one eos is appended after the last turn and the eos that
    closes each earlier turn is trained as the first label of the following source."""
    replace_eos: bool = False
    """Make `stop_words[0]` the tokenizer's eos token (see `fix_tokenizer`)."""
    system_in_user: bool = False
    """Fold the system text into the first user message (llama2, mistral), as LLaMA-Factory's
    Llama2Template does; `format_system` is then a single text piece."""
    generation_prefix: str = ""
    """The end of `format_user` that opens the assistant's reply. The exported Jinja template
    leaves it out after a final user message when `add_generation_prompt` is false; empty means
    the prompt ends the same either way (llama2, mistral)."""
    tool_format: ToolFormat | None = "default"
    """How tool descriptions are appended to the system text; None: rows with tools are refused."""
    pretrain_eos: str | None = None
    """Text appended to each pretraining document instead of the tokenizer's eos text."""

    def __post_init__(self) -> None:
        problems = [f"template '{self.name}': {p}" for p in _slot_problems(self)]
        if problems:
            raise ConfigError(problems)


def _slot_problems(template: Template) -> list[str]:
    problems = []
    for field in ("format_user", "format_assistant", "format_system"):
        slot = getattr(template, field)
        if not any(isinstance(piece, str) and CONTENT in piece for piece in slot):
            problems.append(f"{field} {slot!r} has no {CONTENT} piece")
    if template.replace_eos and not template.stop_words:
        problems.append("replace_eos needs at least one stop word")
    if template.system_in_user and not (
        len(template.format_system) == 1 and isinstance(template.format_system[0], str)
    ):
        problems.append("system_in_user needs format_system to be a single text piece")
    last = template.format_user[-1] if template.format_user else None
    if template.generation_prefix and not (
        isinstance(last, str) and last.endswith(template.generation_prefix)
    ):
        problems.append(f"generation_prefix {template.generation_prefix!r} must end format_user")
    return problems


_CHATML_USER = "<|im_start|>user\n{content}<|im_end|>\n<|im_start|>assistant\n"
_CHATML_ASSISTANT = "{content}<|im_end|>\n"
_CHATML_SYSTEM = "<|im_start|>system\n{content}<|im_end|>\n"
_LLAMA3_ASSISTANT_HEADER = "<|start_header_id|>assistant<|end_header_id|>\n\n"

_REGISTRY: tuple[Template, ...] = (
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
        default_system=(
            "A chat between a curious user and an artificial intelligence assistant. "
            "The assistant gives helpful, detailed, and polite answers to the user's questions."
        ),
        generation_prefix=" ASSISTANT:",
    ),
    Template(
        name="chatml",
        format_user=(_CHATML_USER,),
        format_assistant=(_CHATML_ASSISTANT,),
        format_system=(_CHATML_SYSTEM,),
        stop_words=("<|im_end|>", "<|im_start|>"),
        replace_eos=True,
        generation_prefix="<|im_start|>assistant\n",
    ),
    Template(
        name="qwen",
        format_user=(_CHATML_USER,),
        format_assistant=(_CHATML_ASSISTANT,),
        format_system=(_CHATML_SYSTEM,),
        default_system="You are Qwen, created by Alibaba Cloud. You are a helpful assistant.",
        stop_words=("<|im_end|>",),
        replace_eos=True,
        generation_prefix="<|im_start|>assistant\n",
        tool_format="qwen",
    ),
    Template(
        name="llama3",
        format_user=(
            "<|start_header_id|>user<|end_header_id|>\n\n{content}<|eot_id|>" + _LLAMA3_ASSISTANT_HEADER,
        ),
        format_assistant=("{content}<|eot_id|>",),
        format_system=("<|start_header_id|>system<|end_header_id|>\n\n{content}<|eot_id|>",),
        format_prefix=(BOS,),
        stop_words=("<|eot_id|>", "<|eom_id|>"),
        replace_eos=True,
        generation_prefix=_LLAMA3_ASSISTANT_HEADER,
        tool_format=None,  # LLaMA-Factory's llama3 tool prompt embeds today's date: not reproducible
        pretrain_eos="<|end_of_text|>",
    ),
    Template(
        name="llama2",
        format_user=(BOS, "[INST] {content} [/INST]"),
        format_system=("<<SYS>>\n{content}\n<</SYS>>\n\n",),
        system_in_user=True,
    ),
    Template(
        name="mistral",
        format_user=("[INST] {content}[/INST]",),
        format_assistant=(" {content}", EOS),
        format_system=("{content}\n\n",),
        format_prefix=(BOS,),
        system_in_user=True,
        tool_format="mistral",
    ),
    Template(
        name="phi",
        format_user=("<|user|>\n{content}<|end|>\n<|assistant|>\n",),
        format_assistant=("{content}<|end|>\n",),
        format_system=("<|system|>\n{content}<|end|>\n",),
        stop_words=("<|end|>",),
        replace_eos=True,
        generation_prefix="<|assistant|>\n",
    ),
)

TEMPLATES: Mapping[str, Template] = MappingProxyType({t.name: t for t in _REGISTRY})


# Tool descriptions appended to the system text (LLaMA-Factory's tool prompts, same wording).

_DEFAULT_TOOL_PROMPT = (
    "You have access to the following tools:\n{tool_text}"
    "Use the following format if using a tool:\n"
    "```\n"
    "Action: tool name (one of [{tool_names}])\n"
    "Action Input: the input to the tool, in a JSON format representing the kwargs "
    '(e.g. ```{{"input": "hello world", "num_beams": 5}}```)\n'
    "```\n"
)

_QWEN_TOOL_PROMPT = (
    "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>{tool_text}"
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\n<tool_call>\n{{"name": <function-name>, '
    '"arguments": <args-json-object>}}\n</tool_call>'
)


def _unwrap(tool: dict[str, Any]) -> dict[str, Any]:
    return tool.get("function", "") if tool.get("type") == "function" else tool


def _wrap(tool: dict[str, Any]) -> dict[str, Any]:
    return tool if tool.get("type") == "function" else {"type": "function", "function": tool}


def _default_param_line(name: str, param: dict[str, Any], required: list[str]) -> str:
    req = ", required" if name in required else ""
    enum = ", should be one of [{}]".format(", ".join(param["enum"])) if param.get("enum") else ""
    item_spec = param.get("items")
    items = ", where each item should be {}".format(item_spec.get("type", "")) if item_spec else ""
    return f"  - {name} ({param.get('type', '')}{req}): {param.get('description', '')}{enum}{items}\n"


def _default_tools(tools: list[dict[str, Any]]) -> str:
    tool_text, names = "", []
    for tool in map(_unwrap, tools):
        params = tool["parameters"]
        args = "".join(
            _default_param_line(name, param, params.get("required", []))
            for name, param in params["properties"].items()
        )
        tool_text += (
            f"> Tool Name: {tool['name']}\nTool Description: {tool.get('description', '')}\n"
            f"Tool Args:\n{args}\n"
        )
        names.append(tool["name"])
    return _DEFAULT_TOOL_PROMPT.format(tool_text=tool_text, tool_names=", ".join(names))


def _qwen_tools(tools: list[dict[str, Any]]) -> str:
    tool_text = "".join("\n" + json.dumps(_wrap(tool), ensure_ascii=False) for tool in tools)
    return _QWEN_TOOL_PROMPT.format(tool_text=tool_text)


def _mistral_tools(tools: list[dict[str, Any]]) -> str:
    wrapped = json.dumps([_wrap(tool) for tool in tools], ensure_ascii=False)
    return f"[AVAILABLE_TOOLS] {wrapped}[/AVAILABLE_TOOLS]"


_TOOL_FORMATTERS = {"default": _default_tools, "qwen": _qwen_tools, "mistral": _mistral_tools}


def tool_text(template: Template, tools: str) -> str:
    """The text that describes `tools` (a JSON list of function schemas) in the system message."""
    if template.tool_format is None:
        raise DataError(
            f"template '{template.name}' does not support tool descriptions, but the row has tools; "
            "drop the tools column or use a template with a tool format (qwen, mistral, default)"
        )
    try:
        parsed = json.loads(tools)
    except json.JSONDecodeError as e:
        raise DataError(f"the row's tools are not valid JSON ({e}): {tools[:200]!r}") from e
    if not isinstance(parsed, list):
        parsed = [parsed]
    if not parsed:
        return ""
    try:
        return _TOOL_FORMATTERS[template.tool_format](parsed)
    except (KeyError, TypeError, AttributeError) as e:
        raise DataError(f"the row's tools are not function schemas ({e!r}): {tools[:200]!r}") from e
