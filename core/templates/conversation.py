"""Chat templates: turn a conversation into token ids exactly as LLaMA-Factory 0.9.5 does.

`message_pieces` writes each message out through its template slots as the pieces to encode:
texts (encoded on their own with `add_special_tokens=False`, so BPE never merges across message
boundaries) and token ids (bos/eos and token slots). `encode_turns`, `encode_oneturn` and
`encode_prompt` encode those pieces for a `Conversation`, so a batch encoder built on
`message_pieces` gives the same ids. `template: auto` renders with the tokenizer's own chat
template instead (`template_auto`). The templates are in `template_registry`; `chat_template_jinja`
exports one as a Jinja template and `check_template` compares one with the tokenizer's own.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tuneline.core.errors import ConfigError, DataError, unknown_name_message
from tuneline.core.templates.auto import auto_text, template_from_tokenizer
from tuneline.core.templates.catalog import AUTO, TEMPLATES
from tuneline.core.templates.check import check_template
from tuneline.core.templates.encode import encode_pieces, message_pieces
from tuneline.core.templates.format import Message, check_roles, ends_with_prompt, format_messages
from tuneline.core.templates.jinja import chat_template_jinja
from tuneline.core.templates.spec import BOS, EOS, Special, Template, Token
from tuneline.core.templates.unwritten import unwritten_template_message

if TYPE_CHECKING:
    from tokenizers import AddedToken
    from transformers import PreTrainedTokenizerBase

__all__ = [
    "BOS",
    "Conversation",
    "EOS",
    "TEMPLATES",
    "Template",
    "Token",
    "chat_template_jinja",
    "check_template",
    "encode_oneturn",
    "encode_pieces",
    "encode_prompt",
    "encode_turns",
    "fix_tokenizer",
    "get_template",
    "message_pieces",
    "pair_turns",
    "render_text",
    "stop_token_ids",
    "template_from_tokenizer",
    "turn_pieces",
]


def get_template(name: str, *, tokenizer: PreTrainedTokenizerBase | None = None) -> Template:
    """The registered template called `name`; `auto` builds one from `tokenizer`'s chat template."""
    if name == AUTO:
        if tokenizer is None:
            raise ConfigError(
                "'template: auto' reads the tokenizer's own chat template: call get_template('auto', "
                "tokenizer=...) with the model's tokenizer"
            )
        return template_from_tokenizer(tokenizer)
    if name not in TEMPLATES:
        raise ConfigError(unwritten_template_message(name) or unknown_name_message("template", name, [*TEMPLATES, AUTO]))
    return TEMPLATES[name]


# ---------------------------------------------------------------- tokenizer fixes


def fix_tokenizer(template: Template, tokenizer: PreTrainedTokenizerBase) -> list[str]:
    """Adjust `tokenizer` for `template` in place, as LLaMA-Factory does before encoding.

    With `replace_eos` the first stop word becomes eos; a tokenizer without eos gets
    `<|endoftext|>`; pad falls back to eos; the other stop words become special tokens.
    A named template sets them by their text, as LLaMA-Factory does, so a token the tokenizer
    already has loses its own strip settings: Phi-3's `<|end|>` stops swallowing the newline after
    it once it is eos, and every turn gets the `▁` and newline LLaMA-Factory writes there.
    `template: auto` keeps each token's settings, so the tokenizer still encodes its own chat
    template's rendering as it did. Returns the tokens that were new to the vocabulary (the
    model's embeddings must grow).
    """
    vocab = set(tokenizer.get_vocab())
    keep_settings = template.chat_template is not None
    stop_words = list(template.stop_words)
    if template.replace_eos:
        _set_eos(tokenizer, stop_words.pop(0), keep_settings=keep_settings)
    if tokenizer.eos_token_id is None:
        _set_eos(tokenizer, "<|endoftext|>", keep_settings=keep_settings)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    if stop_words:
        words = [_as_added(tokenizer, word) for word in stop_words] if keep_settings else stop_words
        tokenizer.add_special_tokens({"additional_special_tokens": words}, replace_extra_special_tokens=False)
    candidates = [tokenizer.eos_token, *stop_words]
    return [token for token in dict.fromkeys(candidates) if token not in vocab]


def _as_added(tokenizer: PreTrainedTokenizerBase, token: str) -> AddedToken | str:
    """The tokenizer's own added token for `token` (with its strip settings), else the text."""
    existing = {added.content: added for added in tokenizer.added_tokens_decoder.values()}
    return existing.get(token, token)


def _set_eos(tokenizer: PreTrainedTokenizerBase, token: str, *, keep_settings: bool) -> None:
    if tokenizer.eos_token != token:
        tokenizer.add_special_tokens({"eos_token": _as_added(tokenizer, token) if keep_settings else token})


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


# ---------------------------------------------------------------- encoding


@dataclass(frozen=True)
class Conversation:
    """What a template encodes: the prompt (ending with a user message), the reply messages, and
    the system prompt and tool descriptions (None: the template's default system, no tools)."""

    prompt: Sequence[Message]
    response: Sequence[Message] = ()
    system: str | None = None
    tools: str | None = None

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Conversation:
        """The conversation of a standard row; an empty system or tools counts as none."""
        return cls(prompt=row["prompt"], response=row.get("response") or (), system=row.get("system") or None,
                   tools=row.get("tools") or None)

    def messages(self) -> list[Message]:
        """`prompt + response`, checked to be a conversation that ends with the reply."""
        messages = [*self.prompt, *self.response]
        check_roles(messages)
        if ends_with_prompt(messages) or not messages:
            raise DataError(
                f"expected the conversation to end with an assistant message, got {len(messages)} "
                "messages (prompt ends with user, response holds exactly one assistant message)"
            )
        return messages


def turn_pieces(
    template: Template, tokenizer: PreTrainedTokenizerBase, conversation: Conversation, *, oneturn: bool = False,
    mask_history: bool = False,
) -> list[list[str | int]]:
    """The pieces of each message of the conversation (see `message_pieces`); `pair_turns` of their
    encoding is `encode_turns`. `oneturn` writes them with LLaMA-Factory's one-turn rules, as
    `encode_oneturn` encodes them; `mask_history` with its thought rules for last-turn training."""
    return message_pieces(template, tokenizer, messages=conversation.messages(), system=conversation.system,
                          tools=conversation.tools, oneturn=oneturn, mask_history=mask_history)


def pair_turns(encoded: list[list[int]]) -> list[tuple[list[int], list[int]]]:
    """(source_ids, target_ids) per turn from the ids of each message."""
    return [(encoded[i], encoded[i + 1]) for i in range(0, len(encoded), 2)]


def encode_turns(
    template: Template, tokenizer: PreTrainedTokenizerBase, conversation: Conversation, *, mask_history: bool = False
) -> list[tuple[list[int], list[int]]]:
    """(source_ids, target_ids) for each turn of the conversation (LLaMA-Factory's
    `encode_multiturn`): the prefix and system text open the first source."""
    return pair_turns(encode_pieces(tokenizer, turn_pieces(template, tokenizer, conversation, mask_history=mask_history)))


def encode_oneturn(
    template: Template, tokenizer: PreTrainedTokenizerBase, conversation: Conversation
) -> tuple[list[int], list[int]]:
    """(prompt_ids, response_ids): everything before the last reply is prompt (LLaMA-Factory's
    `encode_oneturn`, used for pairwise and KTO data; reasoning templates drop earlier thoughts)."""
    encoded = encode_pieces(tokenizer, turn_pieces(template, tokenizer, conversation, oneturn=True))
    return [token for ids in encoded[:-1] for token in ids], encoded[-1]


def encode_prompt(template: Template, tokenizer: PreTrainedTokenizerBase, conversation: Conversation) -> list[int]:
    """Ids of the conversation's prompt (ending with a user message) plus the assistant's generation
    prefix; its response, if any, is not encoded."""
    prompt = conversation.prompt
    check_roles(prompt)
    if not ends_with_prompt(prompt):
        raise DataError(f"a generation prompt must end with a user message, got {len(prompt)} messages")
    pieces = message_pieces(template, tokenizer, messages=prompt, system=conversation.system, tools=conversation.tools)
    return [token for ids in encode_pieces(tokenizer, pieces) for token in ids]


def render_text(
    template: Template,
    tokenizer: PreTrainedTokenizerBase,
    *,
    messages: list[Message],
    system: str | None,
    tools: str | None = None,
) -> str:
    """The text that `encode_turns`/`encode_prompt` encode for `messages`, as one string."""
    check_roles(messages)
    if template.chat_template is not None:
        return auto_text(template, tokenizer, messages=messages, system=system, tools=tools)
    texts = []
    for pieces in format_messages(template, messages, system=system, tools=tools):
        for piece in pieces:
            if isinstance(piece, Token):
                texts.append(piece.text)
            elif isinstance(piece, Special):
                texts.append((tokenizer.bos_token if piece is BOS else tokenizer.eos_token) or "")
            else:
                texts.append(piece)
    return "".join(texts)
