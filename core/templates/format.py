"""A conversation written out through a template's slots, one list of pieces per message.

This is LLaMA-Factory 0.9.5's `Template._encode` before any token id exists: the prefix and the
system text (with the tool descriptions) go in front of the first message (or into it, for
`system_in_user`), tool calls are written in the template's tool format, and reasoning templates
get their thoughts kept, dropped or added as LLaMA-Factory's ReasoningTemplate does.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from tuneline.core.errors import DataError
from tuneline.core.templates.spec import CONTENT, Piece, Slot, Template
from tuneline.core.templates.tools import call_text, tool_text

Message = Mapping[str, str]
SOURCE_ROLES = ("user", "observation")
"""Roles that open a turn (even positions)."""
TARGET_ROLES = ("assistant", "function")
"""Roles that answer it (odd positions): the trained part of a turn."""


def check_roles(messages: Sequence[Message]) -> None:
    """Refuse a conversation whose roles do not alternate source/target, starting with a source."""
    for i, message in enumerate(messages):
        allowed = SOURCE_ROLES if i % 2 == 0 else TARGET_ROLES
        if message.get("role") not in allowed:
            raise DataError(
                f"message {i} has role {message.get('role')!r}, expected {' or '.join(map(repr, allowed))}: a "
                "conversation alternates user/observation and assistant/function messages, starting with user"
            )
        if not isinstance(message.get("content"), str):
            raise DataError(f"message {i} ({message['role']}) has no text content: {message!r}")


def ends_with_prompt(messages: Sequence[Message]) -> bool:
    """Whether the conversation ends with a user/observation message, awaiting a reply."""
    return bool(messages) and messages[-1]["role"] in SOURCE_ROLES


def fill(slot: Slot, content: str) -> list[Piece]:
    """The slot with the first `{content}` of each text piece replaced, as LLaMA-Factory does."""
    return [p.replace(CONTENT, content, 1) if isinstance(p, str) else p for p in slot]


def system_text(template: Template, system: str | None, tools: str | None) -> str | None:
    """The system message with tool descriptions, or None when there is none to write."""
    system = system or template.default_system
    if not (system or tools):
        return None
    return system + (tool_text(template, tools) if tools else "")


# ---------------------------------------------------------------- thoughts (reasoning templates)


def empty_thought(template: Template) -> str:
    return template.thought_words[0] + template.thought_words[1]


def has_thought(template: Template, content: str) -> bool:
    opening, closing = (word.strip() for word in template.thought_words)
    return opening in content or closing in content


def remove_thought(template: Template, content: str) -> str:
    opening, closing = map(re.escape, template.thought_words)
    return re.sub(f"{opening}(.*?){closing}", "", content, flags=re.DOTALL).lstrip("\n")


def _split_thought(template: Template, content: str) -> tuple[str, str]:
    """(thought, rest) of a tool call message: its first thought is kept in front of the calls."""
    opening, closing = map(re.escape, template.thought_words)
    found = re.search(f"{opening}(.*?){closing}", content, flags=re.DOTALL)
    return (found.group(0), content.replace(found.group(0), "")) if found else ("", content)


def _reasoning_contents(template: Template, messages: Sequence[Message], *, oneturn: bool,
                        mask_history: bool) -> list[str]:
    """Message contents with thoughts dropped where LLaMA-Factory drops them.

    Multi-turn (training): every thought is dropped with `enable_thinking: false`; with
    `mask_history` (and without `preserve_thinking`) those of the earlier replies too.
    One-turn (a prompt, or pairwise data): the earlier replies' thoughts are dropped unless
    `preserve_thinking`, the last reply's with `enable_thinking: false`.
    """
    contents = [message["content"] for message in messages]
    last = len(messages) - 1 if not ends_with_prompt(messages) else len(messages)
    without_thinking = template.enable_thinking is False
    history_dropped = (oneturn or mask_history) and not template.preserve_thinking
    for i in range(1, len(messages), 2):
        earlier = i < last
        if oneturn:
            drop = history_dropped if earlier else without_thinking
        else:
            drop = without_thinking or (earlier and history_dropped)
        if drop:
            contents[i] = remove_thought(template, contents[i])
    return contents


def _add_empty_thoughts(
    template: Template, formatted: list[list[Piece]], contents: Sequence[str], *, oneturn: bool, mask_history: bool
) -> None:
    """Give each reply without a thought an empty one: in front of the reply when it is trained
    (`enable_thinking: true`), else at the end of the prompt before it. One-turn, and multi-turn
    with `mask_history` unless `preserve_thinking`: the last reply only; a prompt's reply is the
    one still to come, so the prompt gets it unless `enable_thinking` is true."""
    thought = empty_thought(template)
    if len(formatted) % 2 == 1:
        if not template.enable_thinking:
            formatted[-1].append(thought)
        return
    last_only = oneturn or (mask_history and not template.preserve_thinking)
    for i in range(len(formatted) - 1 if last_only else 1, len(formatted), 2):
        if has_thought(template, contents[i]):
            continue
        if template.enable_thinking:
            formatted[i].insert(0, thought)
        else:
            formatted[i - 1].append(thought)


# ---------------------------------------------------------------- the whole conversation


def _target_slot(template: Template, message: Message, content: str) -> list[Piece]:
    if message["role"] == "assistant":
        return fill(template.format_assistant, content)
    if template.system_in_user:  # LLaMA-Factory's Llama2Template passes no thought words here
        return fill(template.function_slot, call_text(template, content))
    thought, calls = _split_thought(template, content)
    return fill(template.function_slot, thought + call_text(template, calls))


def format_messages(
    template: Template,
    messages: Sequence[Message],
    *,
    system: str | None,
    tools: str | None,
    oneturn: bool = False,
    mask_history: bool = False,
) -> list[list[Piece]]:
    """One list of pieces per message; prefix and system go in front of (or into) the first one.

    A conversation ending with a user/observation message is a prompt: it is written with
    LLaMA-Factory's one-turn rules, as for generation. `mask_history` (only the last turn trains)
    changes which thoughts a reasoning template keeps, as in LLaMA-Factory.
    """
    oneturn = oneturn or ends_with_prompt(messages)
    contents = (_reasoning_contents(template, messages, oneturn=oneturn, mask_history=mask_history)
                if template.reasoning else None)
    prefix_system = system_text(template, system, tools)
    formatted: list[list[Piece]] = []
    for i, message in enumerate(messages):
        content = message["content"] if contents is None else contents[i]
        pieces: list[Piece] = list(template.format_prefix) if i == 0 else []
        if i == 0 and prefix_system is not None:
            system_pieces = fill(template.format_system, prefix_system)
            if template.system_in_user:
                content = str(system_pieces[0]) + content
            else:
                pieces += system_pieces
        if message["role"] == "user":
            pieces += fill(template.format_user, content)
        elif message["role"] == "observation":
            pieces += fill(template.observation_slot, content)
        else:
            pieces += _target_slot(template, message, content)
        formatted.append(pieces)
    if contents is not None:
        _add_empty_thoughts(template, formatted, contents, oneturn=oneturn, mask_history=mask_history)
    return formatted
