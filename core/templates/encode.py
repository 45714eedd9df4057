"""The pieces a conversation is encoded from, and their encoding: the one path to token ids.

`message_pieces` gives, per message, texts to encode with `add_special_tokens=False` and token ids
to write as they are; `encode_pieces` encodes them (all texts in one tokenizer call). A batch
encoder that encodes the same pieces gets exactly the ids of `encode_turns`.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING

from tuneline.core.errors import ConfigError
from tuneline.core.templates.auto import auto_message_pieces
from tuneline.core.templates.format import Message, check_roles, format_messages
from tuneline.core.templates.spec import BOS, EOS, Piece, Special, Template, Token

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

_MERGE_STARTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def merge_starts(tokenizer: PreTrainedTokenizerBase) -> tuple[str, ...]:
    """Added tokens a text may start with and still be encoded together with the text before it.

    Added tokens are cut out of the text before normalisation and pre-tokenisation, so two texts
    that meet at one of them encode the same joined or apart (unless the token strips whitespace
    to its left, must stand alone, or is matched after normalisation). With `split_special_tokens`
    the special ones are text like any other and are not cut out.
    """
    cached = _MERGE_STARTS.get(tokenizer)
    if cached is not None and cached[0] == len(tokenizer):
        return cached[1]
    splits_special = tokenizer.split_special_tokens
    starts = tuple(
        token.content
        for token in tokenizer.added_tokens_decoder.values()
        if token.content and not (token.lstrip or token.single_word or token.normalized or (token.special and splits_special))
    )
    _MERGE_STARTS[tokenizer] = (len(tokenizer), starts)
    return starts


def _token_id(tokenizer: PreTrainedTokenizerBase, piece: Special | Token, template: Template) -> int | None:
    if piece is BOS:
        return tokenizer.bos_token_id
    if piece is EOS:
        return tokenizer.eos_token_id
    token_id = tokenizer.convert_tokens_to_ids(piece.text)
    if token_id is None or (token_id == tokenizer.unk_token_id and piece.text != tokenizer.unk_token):
        raise ConfigError(
            f"template '{template.name}' writes the token {piece.text!r}, which this tokenizer does not have; "
            "use the template that matches the model's tokenizer"
        )
    return token_id


def _resolve(
    pieces: Sequence[Piece], tokenizer: PreTrainedTokenizerBase, template: Template, starts: tuple[str, ...]
) -> list[str | int]:
    resolved: list[str | int] = []
    for piece in pieces:
        if isinstance(piece, str):
            if not piece:
                continue
            if resolved and isinstance(resolved[-1], str) and piece.startswith(starts):
                resolved[-1] += piece
            else:
                resolved.append(piece)
        else:
            token_id = _token_id(tokenizer, piece, template)
            if token_id is not None:  # LLaMA-Factory skips a bos/eos slot the tokenizer lacks
                resolved.append(token_id)
    return resolved


def message_pieces(
    template: Template,
    tokenizer: PreTrainedTokenizerBase,
    *,
    messages: Sequence[Message],
    system: str | None,
    tools: str | None = None,
    oneturn: bool = False,
    mask_history: bool = False,
) -> list[list[str | int]]:
    """For each message, the pieces to encode in order: texts and token ids.

    Encode each text with `tokenizer(text, add_special_tokens=False)` and write each int as it is;
    concatenated per message they give exactly `encode_turns`'s ids. Consecutive texts are joined
    where that cannot change the ids (the second starts with an added token); two texts still
    side by side must be encoded apart, as LLaMA-Factory encodes each slot element on its own.
    `oneturn` applies LLaMA-Factory's one-turn rules (pairwise data; prompts always use them);
    `mask_history` its thought rules for data that trains the last turn only.
    With `template: auto` every piece is a token id of the tokenizer's own rendering.
    """
    check_roles(messages)
    if template.chat_template is not None:
        return list(auto_message_pieces(template, tokenizer, messages=messages, system=system, tools=tools))
    formatted = format_messages(template, messages, system=system, tools=tools, oneturn=oneturn, mask_history=mask_history)
    starts = merge_starts(tokenizer)
    return [_resolve(pieces, tokenizer, template, starts) for pieces in formatted]


def encode_pieces(tokenizer: PreTrainedTokenizerBase, pieces: Sequence[Sequence[str | int]]) -> list[list[int]]:
    """Token ids of each message's pieces (all texts in one tokenizer call)."""
    texts = [piece for message in pieces for piece in message if isinstance(piece, str)]
    encoded = iter(tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else [])
    ids: list[list[int]] = []
    for message in pieces:
        message_ids: list[int] = []
        for piece in message:
            if isinstance(piece, str):
                message_ids += next(encoded)
            else:
                message_ids.append(piece)
        ids.append(message_ids)
    return ids


