"""Chat templates: turn a conversation into token ids exactly as LLaMA-Factory 0.9.5 does.

Each message is written out through its template slot and encoded on its own
(`add_special_tokens=False`), so BPE never merges across message boundaries; the prefix (BOS) and
the system text go in front of the first message. `chat_template_jinja` gives the same text as a
Jinja chat template for the exported model. The templates themselves are in `template_registry`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from tuneline.core.errors import ConfigError, DataError, unknown_name_message
from tuneline.core.template_registry import (
    BOS,
    CONTENT,
    EOS,
    TEMPLATES,
    Piece,
    Slot,
    Special,
    Template,
    tool_text,
)

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

__all__ = [
    "BOS",
    "EOS",
    "TEMPLATES",
    "Template",
    "chat_template_jinja",
    "encode_prompt",
    "encode_turns",
    "fix_tokenizer",
    "get_template",
    "render_text",
    "stop_token_ids",
]

Message = dict[str, str]


def get_template(name: str) -> Template:
    """The registered template called `name`."""
    if name not in TEMPLATES:
        raise ConfigError(unknown_name_message("template", name, TEMPLATES))
    return TEMPLATES[name]


# ---------------------------------------------------------------- tokenizer fixes


def fix_tokenizer(template: Template, tokenizer: PreTrainedTokenizerBase) -> list[str]:
    """Adjust `tokenizer` for `template` in place, as LLaMA-Factory does before encoding.

    With `replace_eos` the first stop word becomes eos; a tokenizer without eos gets
    `<|endoftext|>`; pad falls back to eos; the other stop words become special tokens.
    Returns the tokens that were new to the vocabulary (the model's embeddings must grow).
    """
    vocab = set(tokenizer.get_vocab())
    stop_words = list(template.stop_words)
    if template.replace_eos:
        _set_eos(tokenizer, stop_words.pop(0))
    if tokenizer.eos_token_id is None:
        _set_eos(tokenizer, "<|endoftext|>")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    if stop_words:
        tokenizer.add_special_tokens(
            {"additional_special_tokens": stop_words}, replace_extra_special_tokens=False
        )
    candidates = [tokenizer.eos_token, *stop_words]
    return [token for token in dict.fromkeys(candidates) if token not in vocab]


def _set_eos(tokenizer: PreTrainedTokenizerBase, token: str) -> None:
    if tokenizer.eos_token != token:
        tokenizer.add_special_tokens({"eos_token": token})


def stop_token_ids(template: Template, tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """Ids that end generation: eos, then the template's stop words (after `fix_tokenizer`)."""
    ids = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    for word in template.stop_words:
        token_id = tokenizer.convert_tokens_to_ids(word)
        if token_id is None or (token_id == tokenizer.unk_token_id and word != tokenizer.unk_token):
            raise ConfigError(
                f"stop word {word!r} of template '{template.name}' is not a token of this tokenizer; "
                "call fix_tokenizer(template, tokenizer) first"
            )
        ids.append(token_id)
    return list(dict.fromkeys(ids))


# ---------------------------------------------------------------- formatting


def _check_roles(messages: Sequence[Message]) -> None:
    for i, message in enumerate(messages):
        expected = "user" if i % 2 == 0 else "assistant"
        if message.get("role") != expected:
            raise DataError(
                f"message {i} has role {message.get('role')!r}, expected {expected!r}: a conversation "
                "alternates user and assistant messages, starting with user"
            )
        if not isinstance(message.get("content"), str):
            raise DataError(f"message {i} ({expected}) has no text content: {message!r}")


def _fill(slot: Slot, content: str) -> list[Piece]:
    """The slot with its first `{content}` replaced (LLaMA-Factory replaces once per piece)."""
    return [p.replace(CONTENT, content, 1) if isinstance(p, str) else p for p in slot]


def _system_text(template: Template, system: str | None, tools: str | None) -> str | None:
    """The system message with tool descriptions, or None when there is none to write."""
    system = system or template.default_system
    if not (system or tools):
        return None
    return system + (tool_text(template, tools) if tools else "")


def _format_messages(
    template: Template, messages: Sequence[Message], *, system: str | None, tools: str | None
) -> list[list[Piece]]:
    """One list of pieces per message: prefix and system go in front of the first one."""
    system_text = _system_text(template, system, tools)
    formatted = []
    for i, message in enumerate(messages):
        pieces: list[Piece] = list(template.format_prefix) if i == 0 else []
        content = message["content"]
        if i == 0 and system_text is not None:
            system_pieces = _fill(template.format_system, system_text)
            if template.system_in_user:
                content = str(system_pieces[0]) + content
            else:
                pieces += system_pieces
        slot = template.format_user if message["role"] == "user" else template.format_assistant
        formatted.append(pieces + _fill(slot, content))
    return formatted


def _special(tokenizer: PreTrainedTokenizerBase, piece: Special) -> tuple[str, int] | None:
    token_id = tokenizer.bos_token_id if piece is BOS else tokenizer.eos_token_id
    token = tokenizer.bos_token if piece is BOS else tokenizer.eos_token
    return None if token_id is None else (token, token_id)


def _encode_pieces(tokenizer: PreTrainedTokenizerBase, pieces: Sequence[Piece]) -> list[int]:
    ids: list[int] = []
    for piece in pieces:
        if isinstance(piece, Special):
            special = _special(tokenizer, piece)
            ids += [special[1]] if special else []
        elif piece:
            ids += tokenizer.encode(piece, add_special_tokens=False)
    return ids


def _pieces_text(tokenizer: PreTrainedTokenizerBase, pieces: Sequence[Piece]) -> str:
    texts = []
    for piece in pieces:
        if isinstance(piece, Special):
            special = _special(tokenizer, piece)
            texts.append(special[0] if special else "")
        else:
            texts.append(piece)
    return "".join(texts)


# ---------------------------------------------------------------- encoding


def encode_turns(
    template: Template,
    tokenizer: PreTrainedTokenizerBase,
    *,
    prompt: list[Message],
    response: list[Message],
    system: str | None,
    tools: str | None = None,
) -> list[tuple[list[int], list[int]]]:
    """(source_ids, target_ids) for each user/assistant pair of `prompt + response`."""
    messages = [*prompt, *response]
    _check_roles(messages)
    if len(messages) % 2 != 0:
        raise DataError(
            f"expected the conversation to end with an assistant message, got {len(messages)} "
            "messages (prompt ends with user, response holds exactly one assistant message)"
        )
    formatted = _format_messages(template, messages, system=system, tools=tools)
    encoded = [_encode_pieces(tokenizer, pieces) for pieces in formatted]
    return [(encoded[i], encoded[i + 1]) for i in range(0, len(encoded), 2)]


def encode_prompt(
    template: Template,
    tokenizer: PreTrainedTokenizerBase,
    *,
    prompt: list[Message],
    system: str | None,
    tools: str | None = None,
) -> list[int]:
    """Ids of `prompt` (ending with a user message) plus the assistant's generation prefix."""
    _check_roles(prompt)
    if len(prompt) % 2 != 1:
        raise DataError(f"a generation prompt must end with a user message, got {len(prompt)} messages")
    formatted = _format_messages(template, prompt, system=system, tools=tools)
    return [token_id for pieces in formatted for token_id in _encode_pieces(tokenizer, pieces)]


def render_text(
    template: Template,
    tokenizer: PreTrainedTokenizerBase,
    *,
    messages: list[Message],
    system: str | None,
    tools: str | None = None,
) -> str:
    """The text that `encode_turns`/`encode_prompt` encode for `messages`, as one string."""
    _check_roles(messages)
    formatted = _format_messages(template, messages, system=system, tools=tools)
    return "".join(_pieces_text(tokenizer, pieces) for pieces in formatted)


# ---------------------------------------------------------------- Jinja export


def _jinja_literal(text: str) -> str:
    escaped = text.replace("\\", "\\\\").replace("'", "\\'").replace("\n", "\\n").replace("\r", "\\r")
    return f"'{escaped}'"


def _jinja_expr(slot: Sequence[Piece], tokenizer: PreTrainedTokenizerBase, *, variable: str) -> str:
    """A Jinja expression that writes `slot` with `variable` in place of `{content}`."""
    items = []
    for piece in slot:
        if isinstance(piece, Special):
            special = _special(tokenizer, piece)  # the token text: {{ eos_token }} may differ later
            items += [_jinja_literal(special[0])] if special else []
            continue
        before, found, after = piece.partition(CONTENT)
        items += [_jinja_literal(before)] if before else []
        items += [variable] if found else []
        items += [_jinja_literal(after)] if after else []
    return " + ".join(items) or "''"


def _without_generation_prefix(template: Template) -> Slot:
    if not template.generation_prefix:
        return template.format_user
    last = str(template.format_user[-1])
    return (*template.format_user[:-1], last[: len(last) - len(template.generation_prefix)])


def chat_template_jinja(template: Template, tokenizer: PreTrainedTokenizerBase) -> str:
    """A Jinja chat template that renders what `encode_turns` encodes (tools are not rendered).

    Use it as `tokenizer.chat_template` of an exported model, after `fix_tokenizer`. A leading
    system message replaces the default system; after a final user message the assistant's
    generation prefix is written only with `add_generation_prompt=True`.
    """
    system = _jinja_expr(template.format_system, tokenizer, variable="system_message")
    user = _jinja_expr(template.format_user, tokenizer, variable="content")
    user_open = _jinja_expr(_without_generation_prefix(template), tokenizer, variable="content")
    assistant = _jinja_expr(template.format_assistant, tokenizer, variable="content")
    prefix = _jinja_expr(template.format_prefix, tokenizer, variable="content")
    parts = [
        "{{ " + prefix + " }}",
        "{% set system_message = " + _jinja_literal(template.default_system) + " %}",
        "{% set loop_messages = messages %}",
        "{% if messages and messages[0]['role'] == 'system' %}",
        "{% set loop_messages = messages[1:] %}",
        "{% if messages[0]['content'] %}{% set system_message = messages[0]['content'] %}{% endif %}",
        "{% endif %}",
    ]
    if not template.system_in_user:
        parts.append("{% if system_message %}{{ " + system + " }}{% endif %}")
    parts += [
        "{% for message in loop_messages %}",
        "{% set content = message['content'] %}",
    ]
    if template.system_in_user:
        parts.append(
            "{% if loop.first and system_message %}{% set content = " + system + " + content %}{% endif %}"
        )
    parts += [
        "{% if message['role'] == 'user' %}",
        "{% if loop.last and not add_generation_prompt %}{{ " + user_open + " }}",
        "{% else %}{{ " + user + " }}{% endif %}",
        "{% elif message['role'] == 'assistant' %}{{ " + assistant + " }}",
        "{% endif %}",
        "{% endfor %}",
    ]
    return "".join(parts)
