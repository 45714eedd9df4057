"""The `Template` value: how each message of a conversation is written out, as LLaMA-Factory 0.9.5
describes it with its `register_template` fields.

A slot is a tuple of pieces: text, in which the first `{content}` is replaced by the message, `BOS`
/ `EOS` (the tokenizer's bos/eos token after `fix_tokenizer`), or `Token("...")`, one vocabulary
token written by id. Each text piece is encoded on its own (LLaMA-Factory never lets BPE merge
across two slot elements), so the split into pieces is part of the template.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any, Literal, get_args

from tuneline.core.errors import ConfigError


class Special(Enum):
    """A slot piece that is a special token of the (fixed) tokenizer, not text."""

    BOS = "bos_token"
    EOS = "eos_token"


@dataclass(frozen=True)
class Token:
    """A slot piece written as the id of one vocabulary token (LLaMA-Factory's `{"token": ...}`)."""

    text: str


BOS = Special.BOS
EOS = Special.EOS
CONTENT = "{content}"
ROLE = "{role}"

Piece = str | Special | Token
Slot = tuple[Piece, ...]
ToolFormat = Literal["default", "gemma4", "glm4", "glm4_moe", "lfm2", "ling", "llama3", "minimax1", "minimax2", "mistral",
                     "qwen", "qwen3_5", "seed_oss"]
TOOL_FORMATS: tuple[str, ...] = get_args(ToolFormat)
"""LLaMA-Factory 0.9.5's tool formats, the values `tool_format` takes."""
DEFAULT_THOUGHT_WORDS = ("<think>\n", "\n</think>\n\n")
MediaPlugin = Literal["qwen2_vl", "qwen3_vl", "glm4v", "llava", "llava_next", "gemma3", "intern_vl", "paligemma", "mllama",
                      "minicpm_v_4_6", "qwen2_audio", "qwen2_omni"]
QWEN_PLUGINS = ("qwen2_vl", "qwen3_vl", "glm4v", "qwen2_omni")  # images sized and cut alike (Qwen3-VL in patches of 16)
"""The families whose media placeholders tuneline expands (LLaMA-Factory's `mm_plugin` names)."""


@dataclass(frozen=True)
class MediaTokens:
    """How a multimodal template writes a row's media: LLaMA-Factory's `mm_plugin` and its tokens.

    Each `<image>` of a message becomes `vision_bos`, `image_token` repeated once per feature the
    family's image processor makes of that image, and `vision_eos` (see `core.data.media.expansion`)."""

    plugin: MediaPlugin
    image_token: str | None
    """None: the family reads no images (Qwen2-Audio)."""
    video_token: str | None = None
    vision_bos: str = ""
    vision_eos: str = ""
    audio_token: str | None = None
    """Each `<audio>` becomes `audio_bos`, this token once per audio feature, and `audio_eos`."""
    audio_bos: str = ""
    audio_eos: str = ""
    video_bos: str = ""
    video_eos: str = ""
    """GLM-4.1V's markers around a whole video (its frames each between `vision_bos` and `vision_eos`)."""
    images_first: bool = False
    """PaliGemma: every image's tokens are written before the whole conversation (its BOS too), and each
    `<image>` is dropped from the text, instead of expanded in its place."""


@dataclass(frozen=True)
class Template:
    """How a conversation becomes text, with LLaMA-Factory's semantics for each field.

    Roles: `user` and `observation` (a tool result) open a turn; `assistant` and `function` (a
    tool call: a JSON object or list of `{"name", "arguments"}`) answer it.
    """

    name: str
    format_user: Slot = (CONTENT,)
    """A user message, followed by the assistant's generation prefix (it opens the reply)."""
    format_assistant: Slot = (CONTENT, EOS)
    """An assistant message, including whatever closes the turn."""
    format_system: Slot = (CONTENT,)
    """The system message (plus the tool descriptions), written before the first user message."""
    format_function: Slot | None = None
    """A tool call, `{content}` being the calls written in `tool_format`; None: `format_assistant`."""
    format_observation: Slot | None = None
    """A tool result; None: `format_user`."""
    format_prefix: Slot = ()
    """Written once at the very start (usually the BOS token)."""
    default_system: str = ""
    """Used when a row has no system message."""
    stop_words: tuple[str, ...] = ()
    """Texts that end a reply; with `replace_eos` the first becomes the tokenizer's eos."""
    markers: tuple[str, ...] = ()
    """Control tokens the slots write as text in a shape the mismatch check cannot tell from
    plain text (Gemma's `<start_of_turn>`, GLM's `<sop>`); `<|...|>` and `[|...|]` text, `Token`
    pieces and stop words written in a slot are markers without being listed."""
    efficient_eos: bool = False
    """The assistant slot has no eos: one eos is appended after the last turn and the eos that
    closes each earlier turn is trained as the first label of the following source."""
    replace_eos: bool = False
    """Make `stop_words[0]` the tokenizer's eos token (see `fix_tokenizer`)."""
    system_in_user: bool = False
    """Fold the system text into the first user message (llama2, mistral, gemma), as
    LLaMA-Factory's Llama2Template does; only the first piece of `format_system` is used."""
    reasoning: bool = False
    """LLaMA-Factory's ReasoningTemplate: a reply without a thought gets an empty one
    (`thought_words` joined), trained with `enable_thinking`, else written into the prompt."""
    enable_thinking: bool | None = True
    """For reasoning templates: True keeps thoughts and trains the empty ones; False drops every
    thought from the replies and writes the empty thought after each prompt instead (untrained);
    None keeps the thoughts there are and writes the empty ones after the prompt, as False does."""
    preserve_thinking: bool = False
    """For reasoning templates: keep the thoughts of earlier replies where LLaMA-Factory drops them
    (one-turn encoding: prompts and pairwise data; multi-turn with `mask_history`)."""
    thought_words: tuple[str, str] = DEFAULT_THOUGHT_WORDS
    """What opens and closes a thought. A tool call's leading thought is kept in front of it."""
    generation_prefix: str = ""
    """The end of `format_user` that opens the assistant's reply. The exported Jinja template
    leaves it out after a final user message when `add_generation_prompt` is false; empty means
    the prompt ends the same either way (llama2, mistral)."""
    tool_format: ToolFormat = "default"
    """How tool descriptions (system text) and tool calls (`function` messages) are written."""
    pretrain_eos: str | None = None
    """Text appended to each pretraining document instead of the tokenizer's eos text."""
    chat_template: str | None = None
    """Set only by `template: auto`: the tokenizer's own Jinja chat template renders every
    conversation and the slots above are unused."""
    media: MediaTokens | None = None
    """A multimodal template's media tokens; None: the template takes text only."""

    def __post_init__(self) -> None:
        problems = [f"template '{self.name}': {p}" for p in _problems(self)]
        if problems:
            raise ConfigError(problems)

    @property
    def function_slot(self) -> Slot:
        return self.format_assistant if self.format_function is None else self.format_function

    @property
    def observation_slot(self) -> Slot:
        return self.format_user if self.format_observation is None else self.format_observation


def headed_template(
    name: str,
    *,
    header: str,
    end: str,
    user: str = "user",
    assistant: str = "assistant",
    system: str = "system",
    tool: str | None = None,
    **fields: Any,
) -> Template:
    """A template whose every message is `header` (its `{role}` named for the message), the text
    and `end`, as these models' own Jinja templates write a turn. The user slot, and a tool result
    (role `tool`; None: written as a user message), end with the assistant's header, which is also
    `generation_prefix`. `fields` are the template's other fields, passed on to `Template`."""
    reply = header.replace(ROLE, assistant)

    def turn(role: str) -> str:
        return header.replace(ROLE, role) + CONTENT + end

    slots: dict[str, Any] = {"format_user": (turn(user) + reply,), "format_assistant": (CONTENT + end,),
                             "format_system": (turn(system),), "generation_prefix": reply}
    if tool is not None:
        slots["format_observation"] = (turn(tool) + reply,)
    return Template(name=name, **{**slots, **fields})


def _has_content(slot: Slot) -> bool:
    return any(isinstance(piece, str) and CONTENT in piece for piece in slot)


def _problems(template: Template) -> list[str]:
    problems = []
    slots = {"format_user": template.format_user, "format_assistant": template.format_assistant,
             "format_system": template.format_system, "format_function": template.function_slot,
             "format_observation": template.observation_slot}
    problems += [f"{field} {slot!r} has no {CONTENT} piece" for field, slot in slots.items() if not _has_content(slot)]
    if any(isinstance(piece, str) and CONTENT in piece for piece in template.format_prefix):
        problems.append(f"format_prefix {template.format_prefix!r} must not hold {CONTENT}")
    written = "".join(piece for slot in (template.format_prefix, *slots.values()) for piece in slot
                      if isinstance(piece, str))
    problems += [f"marker {marker!r} is written in no slot" for marker in template.markers if marker not in written]
    if template.replace_eos and not template.stop_words:
        problems.append("replace_eos needs at least one stop word")
    if template.efficient_eos and EOS in template.format_assistant:
        problems.append("efficient_eos templates end replies without EOS in format_assistant")
    if template.system_in_user and not (template.format_system and isinstance(template.format_system[0], str)):
        problems.append("system_in_user needs format_system to start with its text piece")
    last = template.format_user[-1] if template.format_user else None
    if template.generation_prefix and not (isinstance(last, str) and last.endswith(template.generation_prefix)):
        problems.append(f"generation_prefix {template.generation_prefix!r} must end format_user")
    if len(template.thought_words) != 2 or not all(template.thought_words):
        problems.append(f"thought_words must be two non-empty texts, got {template.thought_words!r}")
    return problems
