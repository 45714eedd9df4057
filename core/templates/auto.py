"""`template: auto`: the tokenizer's own Jinja chat template renders each conversation.

The whole conversation is rendered once and encoded once, so its ids are exactly
`apply_chat_template(..., tokenize=True)`'s. The turns are then found in that text: a reply starts
where rendering it and rendering a placeholder in its place first differ, and ends after the text
the template closes a turn with (`<|im_end|>\\n`, `<|eot_id|>`, ` </s>`, ...), so the label mask
covers the reply and its end-of-turn token. The text is cut into token ids at those points.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from tuneline.core.errors import ConfigError, DataError
from tuneline.core.templates.format import SOURCE_ROLES, ends_with_prompt
from tuneline.core.templates.spec import Template
from tuneline.core.templates.tools import parse_calls

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

PLACEHOLDER = "\ue000"
"""A private-use character no real content holds: rendered in place of a reply to find it."""
_PROBE = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": PLACEHOLDER}]

Render = Callable[..., str]


def own_chat_template(tokenizer: PreTrainedTokenizerBase) -> str | None:
    """The tokenizer's Jinja chat template (its default one), or None."""
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, Mapping):
        template = template.get("default")
    return template if isinstance(template, str) and template.strip() else None


def template_from_tokenizer(tokenizer: PreTrainedTokenizerBase) -> Template:
    """The `auto` template: render with `tokenizer`'s chat template; its stop word is the token
    that closes a reply when that is not already eos (Phi-3's `<|end|>`)."""
    jinja = own_chat_template(tokenizer)
    if jinja is None:
        raise ConfigError(
            "'template: auto' needs the tokenizer's own chat template, but this tokenizer has none "
            f"({type(tokenizer).__name__}, name_or_path={getattr(tokenizer, 'name_or_path', '?')!r}); "
            "name a template instead, e.g. 'template: default'"
        )
    render = _renderer(tokenizer, jinja, tools=None)
    try:
        closed = render(_PROBE, add_generation_prompt=False)
    except DataError as e:
        raise ConfigError(f"'template: auto': the tokenizer's chat template cannot render a user/assistant "
                          f"conversation ({e})") from e
    tail = closed[closed.rfind(PLACEHOLDER) + 1:]
    stop = _first_added_token(tokenizer, tail)
    stop_words = (stop,) if stop and stop != tokenizer.eos_token else ()
    return Template(name="auto", stop_words=stop_words, chat_template=jinja)


def _first_added_token(tokenizer: PreTrainedTokenizerBase, text: str) -> str | None:
    added = tokenizer.added_tokens_decoder
    for token_id in tokenizer(text, add_special_tokens=False)["input_ids"]:
        if token_id in added:
            return added[token_id].content
    return None


# ---------------------------------------------------------------- rendering


def _renderer(tokenizer: PreTrainedTokenizerBase, jinja: str, *, tools: list[dict] | None) -> Render:
    def render(chat: list[dict], *, add_generation_prompt: bool) -> str:
        try:
            return tokenizer.apply_chat_template(
                chat, chat_template=jinja, tools=tools, tokenize=False, add_generation_prompt=add_generation_prompt
            )
        except Exception as e:  # jinja2 errors, raise_exception() calls in the template
            raise DataError(f"the tokenizer's chat template refused the conversation: {e}") from e

    return render


def _tool_list(tools: str | None) -> list[dict] | None:
    if not tools:
        return None
    try:
        parsed = json.loads(tools)
    except json.JSONDecodeError as e:
        raise DataError(f"the row's tools are not valid JSON ({e}): {tools[:200]!r}") from e
    parsed = parsed if isinstance(parsed, list) else [parsed]
    wrapped = [tool if tool.get("type") == "function" else {"type": "function", "function": tool} for tool in parsed]
    return wrapped or None


def chat_messages(messages: Sequence[Mapping[str, str]], system: str | None) -> list[dict[str, Any]]:
    """The conversation in transformers' chat format: tool calls as `tool_calls` (ids of nine
    alphanumeric characters, as Mistral requires), tool results as role `tool`."""
    chat: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
    call_count, last_call = 0, ""
    for message in messages:
        if message["role"] == "function":
            calls = []
            for name, arguments in parse_calls(message["content"]):
                call_id = f"call{call_count:05d}"
                call_count += 1
                calls.append({"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}})
            last_call = calls[0]["id"]
            chat.append({"role": "assistant", "content": "", "tool_calls": calls})
        elif message["role"] == "observation":
            chat.append({"role": "tool", "content": message["content"], "tool_call_id": last_call})
        else:
            chat.append({"role": message["role"], "content": message["content"]})
    return chat


# ---------------------------------------------------------------- finding the turns


def _common_prefix(a: str, b: str) -> int:
    """Length of the longest common prefix (a binary search over slice comparisons)."""
    low, high = 0, min(len(a), len(b))
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (middle, high) if a[:middle] == b[:middle] else (low, middle - 1)
    return low


def _common_suffix(a: str, b: str, limit: int) -> int:
    """Length of the longest common suffix, at most `limit`."""
    low, high = 0, max(0, limit)
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (middle, high) if a[len(a) - middle:] == b[len(b) - middle:] else (low, middle - 1)
    return low


def _reply_span(render: Render, chat: list[dict], index: int, text: str, *, prompt: bool) -> tuple[int, int]:
    """(start, end) in `text` of the reply `chat[index]` with what closes its turn."""
    closed = render(chat[: index + 1], add_generation_prompt=False)
    probe = render([*chat[:index], {"role": "assistant", "content": PLACEHOLDER}], add_generation_prompt=False)
    start = _common_prefix(closed, probe)
    content_end = len(closed) - _common_suffix(closed, probe, min(len(closed), len(probe)) - start)
    tail = closed[content_end:]
    if not text.startswith(closed[:content_end]):
        # the template writes earlier turns differently once later ones follow (dropped thoughts):
        # find the reply in the whole conversation instead
        whole = [*chat[:index], {"role": "assistant", "content": PLACEHOLDER}, *chat[index + 1:]]
        try:
            probe = render(whole, add_generation_prompt=prompt)
        except DataError as e:
            raise DataError(
                f"'template: auto' cannot find message {index} in the rendered conversation: the chat template "
                f"writes it differently once later turns follow, and refuses a placeholder in its place ({e})"
            ) from e
        start = _common_prefix(text, probe)
        content_end = len(text) - _common_suffix(text, probe, min(len(text), len(probe)) - start)
    return start, content_end + _common_prefix(text[content_end:], tail)


def _first_token_from(offsets: Sequence[tuple[int, int]], text: str, start: int, position: int) -> int:
    """The first token (from `start`) that holds reply text at or after `position`; a token that
    begins earlier with template text (e.g. `<|assistant|>` swallowing the newline) stays before."""
    k = start
    while k < len(offsets) and offsets[k][1] <= position:
        k += 1
    if k < len(offsets) and offsets[k][0] < position and text[offsets[k][0]:position].strip():
        k += 1
    return k


def _last_token_before(offsets: Sequence[tuple[int, int]], start: int, position: int) -> int:
    """The index after the last token (from `start`) that ends at or before `position`."""
    k = start
    while k < len(offsets) and offsets[k][1] <= position:
        k += 1
    return k


def _check_tools(text: str, chat: list[dict], spans: dict[int, tuple[int, int]], tools: list[dict] | None) -> None:
    for index, (start, end) in spans.items():
        for call in chat[index].get("tool_calls", []):
            if call["function"]["name"] not in text[start:end]:
                raise DataError(
                    f"the tokenizer's chat template does not write tool calls (the call to "
                    f"{call['function']['name']!r} is missing from its text); use a named template with tool calls"
                )
    for tool in tools or []:
        if tool["function"].get("name", "") not in text:
            raise DataError("the tokenizer's chat template does not write the row's tool descriptions; "
                            "use a named template with a tool format")


def auto_message_pieces(
    template: Template,
    tokenizer: PreTrainedTokenizerBase,
    *,
    messages: Sequence[Mapping[str, str]],
    system: str | None,
    tools: str | None,
) -> list[list[int]]:
    """Token ids of each message as the tokenizer's chat template renders the conversation."""
    tool_list = _tool_list(tools)
    render = _renderer(tokenizer, template.chat_template or "", tools=tool_list)
    chat = chat_messages(messages, system or template.default_system or None)
    first = len(chat) - len(messages)
    prompt = ends_with_prompt(messages)
    text = render(chat, add_generation_prompt=prompt)
    encoding = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = encoding["input_ids"], encoding["offset_mapping"]
    spans = {first + i: _reply_span(render, chat, first + i, text, prompt=prompt)
             for i in range(1, len(messages), 2)}
    _check_tools(text, chat, spans, tool_list)
    pieces: list[list[int]] = []
    cursor = 0
    for start_char, end_char in spans.values():
        start = _first_token_from(offsets, text, cursor, start_char)
        end = max(start, _last_token_before(offsets, start, end_char))
        pieces += [ids[cursor:start], ids[start:end]]
        cursor = end
    if prompt:
        pieces.append(ids[cursor:])
    else:
        pieces[-1] = pieces[-1] + ids[cursor:]  # text after the last turn closes it (Phi-3's eos)
    return pieces


def auto_text(
    template: Template,
    tokenizer: PreTrainedTokenizerBase,
    *,
    messages: Sequence[Mapping[str, str]],
    system: str | None,
    tools: str | None,
) -> str:
    """The text the tokenizer's chat template renders for the conversation."""
    render = _renderer(tokenizer, template.chat_template or "", tools=_tool_list(tools))
    return render(chat_messages(messages, system or template.default_system or None),
                  add_generation_prompt=messages[-1]["role"] in SOURCE_ROLES)
