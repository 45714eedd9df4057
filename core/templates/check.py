"""The template checks: what a named template writes against the tokenizer's own chat template
(a difference is reported, and is a warning unless `strict_template`), and whether the tokenizer
can write the template's markers and stop words at all (if not, training would break the model).

The rendering comparison:

A probe conversation (a system prompt and two turns, then the same without the system prompt) is
encoded with the template and with `apply_chat_template`; the first differing token is described.
Two documented behaviours of official templates are not reported:

- the system prompt placed elsewhere than the first user message (Mistral v0.3 writes it before the
  last user message, and drops it when the chat ends with a reply): for `system_in_user` templates
  the official rendering of the conversation with the system text folded into the first user
  message, as the template folds it, counts as a match;
- an eos the official template appends after the last turn (Phi-3.5 with
  `add_generation_prompt=False`).

It does report LLaMA-Factory's llama2 layout against Meta's: `[/INST]` + reply + `</s>` encodes
without the `▁` token Meta's ` </s>` puts before each eos, so the trained tokens really differ.
"""

from __future__ import annotations

import re
from collections.abc import Container, Sequence
from typing import TYPE_CHECKING

from tuneline.core.errors import TunelineError
from tuneline.core.templates.auto import own_chat_template
from tuneline.core.templates.encode import encode_pieces, message_pieces
from tuneline.core.templates.format import fill
from tuneline.core.templates.spec import CONTENT, Template, Token

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

PROBE_SYSTEM = "You are a helpful assistant. Answer briefly."
PROBE = (
    {"role": "user", "content": "Hi! What is 2+2?"},
    {"role": "assistant", "content": "2+2 equals 4."},
    {"role": "user", "content": "And 3+3?"},
    {"role": "assistant", "content": "3+3 equals 6."},
)
_WINDOW = 6
_MARKER = re.compile(r"<[|\uff5c][^\s<>]+?[|\uff5c]>|\[\|[^\s\[\]]+?\|\]")
"""Control-token text written in a slot: `<|im_start|>`, `<|eot_id|>`, DeepSeek's `<｜User｜>`, EXAONE's
`[|user|]`. Control tokens of other shapes are listed in the template's `markers`; other bracketed
text (llama2's `[INST]`, Qwen's `<tool_response>`) is plain text in the official formats."""


def _official_ids(tokenizer: PreTrainedTokenizerBase, chat: list[dict]) -> list[int]:
    return list(tokenizer.apply_chat_template(chat, tokenize=True, return_dict=False))


def _official_candidates(template: Template, tokenizer: PreTrainedTokenizerBase, system: str | None) -> list[list[int]]:
    messages = [dict(message) for message in PROBE]
    candidates = [_official_ids(tokenizer, ([{"role": "system", "content": system}] if system else []) + messages)]
    if system and template.system_in_user:
        folded = str(fill(template.format_system, system)[0]) + messages[0]["content"]
        candidates.append(_official_ids(tokenizer, [{"role": "user", "content": folded}, *messages[1:]]))
    return candidates


def _matches(ours: list[int], official: list[int], eos_id: int | None) -> bool:
    return ours == official or (official[:-1] == ours and official[-1:] == [eos_id])


def first_difference(ours: Sequence[int], theirs: Sequence[int]) -> int | None:
    """The first position where two id sequences differ (a shorter one ends there), or None when equal."""
    if list(ours) == list(theirs):
        return None
    return next((i for i, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b), min(len(ours), len(theirs)))


def around(tokenizer: PreTrainedTokenizerBase, ids: Sequence[int], at: int) -> str:
    """The text on either side of position `at` of `ids` and the first ids from there, for a message."""
    before = tokenizer.decode(ids[max(0, at - _WINDOW):at])
    after = tokenizer.decode(ids[at:at + _WINDOW])
    return f"{before!r} + {after!r} (ids {list(ids[at:at + 3])})"


def _describe(
    template: Template, tokenizer: PreTrainedTokenizerBase, ours: list[int], official: list[int], system: str | None
) -> str:
    at = first_difference(ours, official) or 0
    probe = "with a system prompt" if system else "without a system prompt"
    return (
        f"template '{template.name}' does not write what this tokenizer's own chat template writes for a "
        f"two-turn conversation {probe}: the token ids first differ at position {at} "
        f"({len(ours)} ids from the template, {len(official)} from the chat template). "
        f"Template: {around(tokenizer, ours, at)}; chat template: {around(tokenizer, official, at)}. A model trained "
        "with this template sees another format than the one its chat template prompts it with; name the matching "
        "template or use 'template: auto'."
    )


def check_template(template: Template, tokenizer: PreTrainedTokenizerBase) -> str | None:
    """One paragraph on the first difference between `template` and the tokenizer's own chat
    template on a probe conversation, or None when they agree or the tokenizer has none."""
    own = own_chat_template(tokenizer)
    if own is None or template.chat_template == own:
        return None
    for system in (PROBE_SYSTEM, None):
        try:
            pieces = message_pieces(template, tokenizer, messages=PROBE, system=system)
        except TunelineError as e:
            return f"template '{template.name}' cannot encode a plain conversation with this tokenizer: {e}"
        ours = [token for ids in encode_pieces(tokenizer, pieces) for token in ids]
        try:
            candidates = _official_candidates(template, tokenizer, system)
        except Exception as e:  # the chat template's own errors
            return (f"the tokenizer's chat template cannot render the probe conversation, so "
                    f"'{template.name}' was not compared with it: {e}")
        if not any(_matches(ours, official, tokenizer.eos_token_id) for official in candidates):
            return _describe(template, tokenizer, ours, candidates[0], system)
    return None


def template_markers(template: Template) -> list[str]:
    """The control tokens the template writes, in slot order: `Token` pieces, `<|...|>` and `[|...|]`
    text, the template's listed `markers` and the stop words written in its slots."""
    slots = (template.format_prefix, template.format_system, template.format_user, template.format_assistant,
             template.function_slot, template.observation_slot)
    known = re.compile("|".join(map(re.escape, sorted({*template.markers, *template.stop_words}, key=len, reverse=True)))
                       or r"(?!)")
    markers: list[str] = []
    for piece in (piece for slot in slots for piece in slot):
        if isinstance(piece, Token):
            markers.append(piece.text)
        elif isinstance(piece, str):
            text = piece.replace(CONTENT, " ")
            found = [*_MARKER.finditer(text), *known.finditer(text)]
            markers += [match.group() for match in sorted(found, key=lambda match: match.start())]
    return list(dict.fromkeys(markers))


def vocabulary_problems(
    template: Template, tokenizer: PreTrainedTokenizerBase, *, original_vocab: Container[str], resize_vocab: bool
) -> list[str]:
    """What the template writes that the model could not learn to write, one line each.

    Run after `fix_tokenizer`. A marker must encode to one token, or the model is taught a control
    token as pieces of text; so must each stop word, or generation cannot stop on it. A marker, or
    the stop word that becomes eos, that the fix added to the vocabulary (not in `original_vocab`)
    is written into every example with no trained embedding, so it needs `resize_vocab: true`.
    The other stop words are only matched at generation, and are added as LLaMA-Factory adds them.
    """
    markers = template_markers(template)
    problems = []
    for kind, word in [*(("marker", m) for m in markers), *(("stop word", w) for w in template.stop_words)]:
        ids = tokenizer(word, add_special_tokens=False)["input_ids"]
        if len(ids) != 1 and tokenizer.split_special_tokens:
            problems.append(
                f"template '{template.name}' writes the {kind} {word!r}, which 'split_special_tokens: true' splits into "
                f"{len(ids)} tokens, so the model would learn its control token as text (LLaMA-Factory trains it so); "
                "remove split_special_tokens, or use a template that writes no special-token text (default, alpaca)."
            )
        elif len(ids) != 1:
            problems.append(
                f"template '{template.name}' writes the {kind} {word!r}, which this tokenizer splits into {len(ids)} "
                "tokens, so the model would learn its control token as text; use the template that matches the "
                "model's tokenizer (or 'template: auto')."
            )
    written = [*markers, *template.stop_words[:1]] if template.replace_eos else markers
    vocab = tokenizer.get_vocab()
    added = [word for word in dict.fromkeys(written) if word not in original_vocab and word in vocab]
    if added and not resize_vocab:
        problems.append(
            f"template '{template.name}' writes the token(s) {', '.join(map(repr, added))}, which this tokenizer "
            "does not have: they were added, with no embedding in the model; set 'resize_vocab: true' to grow the "
            "embeddings, or use the template that matches the model's tokenizer."
        )
    return problems
