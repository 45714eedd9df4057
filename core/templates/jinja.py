"""A template as a Jinja chat template, for the tokenizer of an exported model.

It renders what the encoder writes for system, user, tool-result (`tool`/`observation`) and
assistant messages, the thoughts of reasoning templates included; tool descriptions and tool calls
are not rendered. Special tokens are written as the fixed tokenizer's text (`{{ eos_token }}`
may name another token once the model is loaded elsewhere).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from tuneline.core.templates.format import empty_thought
from tuneline.core.templates.spec import BOS, CONTENT, Piece, Slot, Special, Template, Token

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


def _literal(text: str) -> str:
    escaped = text.replace("\\", "\\\\").replace("'", "\\'").replace("\n", "\\n").replace("\r", "\\r")
    return f"'{escaped}'"


def _piece_text(piece: Special | Token, tokenizer: PreTrainedTokenizerBase) -> str:
    if isinstance(piece, Token):
        return piece.text
    token, token_id = ((tokenizer.bos_token, tokenizer.bos_token_id) if piece is BOS
                       else (tokenizer.eos_token, tokenizer.eos_token_id))
    return token if token_id is not None else ""


def _expr(slot: Sequence[Piece], tokenizer: PreTrainedTokenizerBase, *, variable: str = "content") -> str:
    """A Jinja expression that writes `slot` with `variable` in place of the first `{content}`."""
    items = []
    for piece in slot:
        if not isinstance(piece, str):
            text = _piece_text(piece, tokenizer)
            items += [_literal(text)] if text else []
            continue
        before, found, after = piece.partition(CONTENT)
        items += [_literal(before)] if before else []
        items += [variable] if found else []
        items += [_literal(after)] if after else []
    return " + ".join(items) or "''"


def _without_generation_prefix(template: Template, slot: Slot) -> Slot:
    if not template.generation_prefix:
        return slot
    last = str(slot[-1])
    return (*slot[:-1], last[: len(last) - len(template.generation_prefix)])


def _thought_macros(template: Template) -> list[str]:
    """`strip_thought(text)`: the text without its first thought, as the encoder drops thoughts;
    `lacks_thought(text)`: 'yes' when the text holds neither thought word."""
    opening, closing = (_literal(word) for word in template.thought_words)
    bare_opening, bare_closing = (_literal(word.strip()) for word in template.thought_words)
    return [
        "{% macro strip_thought(text) %}{% if " + opening + " in text and " + closing + " in text %}"
        "{% set head = text.split(" + opening + ", 1) %}"
        "{{ (head[0] + head[1].split(" + closing + ", 1)[1]).lstrip('\\n') }}"
        "{% else %}{{ text }}{% endif %}{% endmacro %}",
        "{% macro lacks_thought(text) %}{% if " + bare_opening + " not in text and " + bare_closing
        + " not in text %}yes{% endif %}{% endmacro %}",
    ]


def _source_branch(template: Template, tokenizer: PreTrainedTokenizerBase, slot: Slot) -> list[str]:
    """A user or tool-result message; the last one of a prompt leaves out the reply opening
    unless `add_generation_prompt`; reasoning templates without thinking close it with an empty
    thought."""
    full, open_ = _expr(slot, tokenizer), _expr(_without_generation_prefix(template, slot), tokenizer)
    parts = ["{% if loop.last and not add_generation_prompt %}{{ " + open_ + " }}{% else %}{{ " + full + " }}"]
    if template.reasoning and not template.enable_thinking:
        thought = _literal(empty_thought(template))
        reply = "loop.nextitem['content']"
        next_lacks = f"lacks_thought({f'strip_thought({reply})' if template.enable_thinking is False else reply})"
        parts.append("{% if loop.last or (not prompt_mode and " + next_lacks + ") %}"
                     "{{ " + thought + " }}{% endif %}")
    parts.append("{% endif %}")
    return parts


def _assistant_branch(template: Template, tokenizer: PreTrainedTokenizerBase) -> list[str]:
    """An assistant message; a reasoning template drops or adds its thought as `render_text` does:
    a prompt's earlier replies lose theirs unless `preserve_thinking`; a conversation's replies lose
    theirs with `enable_thinking: false`, or get the empty one with `enable_thinking: true`."""
    parts = []
    if template.reasoning:
        strip = "{% set content = strip_thought(content) %}"
        if template.enable_thinking is False:
            in_conversation = strip
        elif template.enable_thinking:
            in_conversation = "{% if lacks_thought(content) %}{{ " + _literal(empty_thought(template)) + " }}{% endif %}"
        else:
            in_conversation = ""
        in_prompt = "" if template.preserve_thinking else strip
        parts.append("{% if prompt_mode %}" + in_prompt + "{% else %}" + in_conversation + "{% endif %}")
    return parts + ["{{ " + _expr(template.format_assistant, tokenizer) + " }}"]


def chat_template_jinja(template: Template, tokenizer: PreTrainedTokenizerBase) -> str:
    """A Jinja chat template that renders what `render_text` writes (`template: auto` returns the
    tokenizer's own). Use it as `tokenizer.chat_template` of an exported model, after
    `fix_tokenizer`. A leading system message replaces the default system; after a final user
    message the assistant's generation prefix is written only with `add_generation_prompt=True`."""
    if template.chat_template is not None:
        return template.chat_template
    system = _expr(template.format_system, tokenizer, variable="system_message")
    parts = _thought_macros(template) if template.reasoning else []
    parts += [
        "{{ " + _expr(template.format_prefix, tokenizer) + " }}",
        "{% set system_message = " + _literal(template.default_system) + " %}",
        "{% set loop_messages = messages %}",
        "{% if messages and messages[0]['role'] == 'system' %}",
        "{% set loop_messages = messages[1:] %}",
        "{% if messages[0]['content'] %}{% set system_message = messages[0]['content'] %}{% endif %}",
        "{% endif %}",
        "{% set prompt_mode = loop_messages and loop_messages[-1]['role'] in ['user', 'tool', 'observation'] %}",
    ]
    if not template.system_in_user:
        parts.append("{% if system_message %}{{ " + system + " }}{% endif %}")
    parts += ["{% for message in loop_messages %}", "{% set content = message['content'] %}"]
    if template.system_in_user:
        first_system = _expr(template.format_system[:1], tokenizer, variable="system_message")
        parts.append("{% if loop.first and system_message %}{% set content = " + first_system
                     + " + content %}{% endif %}")
    parts += ["{% if message['role'] == 'user' %}", *_source_branch(template, tokenizer, template.format_user)]
    parts += ["{% elif message['role'] in ['tool', 'observation'] %}",
              *_source_branch(template, tokenizer, template.observation_slot)]
    parts += ["{% elif message['role'] == 'assistant' %}", *_assistant_branch(template, tokenizer)]
    parts += ["{% endif %}", "{% endfor %}"]
    return "".join(parts)
