"""`template: auto` beyond the conformance cases, and the mismatch guard `check_template`."""

from __future__ import annotations

import copy
import dataclasses
import json

import pytest

from tuneline.core.errors import ConfigError, DataError
from tuneline.core.templates.conversation import (
    Conversation,
    chat_template_jinja,
    check_template,
    encode_turns,
    fix_tokenizer,
    get_template,
    message_pieces,
    render_text,
    stop_token_ids,
)

CONVERSATION = [
    {"role": "user", "content": "Hi! What is 2+2?"},
    {"role": "assistant", "content": "2+2 equals 4."},
    {"role": "user", "content": "And 3+3?"},
    {"role": "assistant", "content": "3+3 equals 6."},
]




def _turns(template, tokenizer, messages, system=None, tools=None):
    conversation = Conversation(prompt=messages[:-1], response=messages[-1:], system=system, tools=tools)
    return encode_turns(template, tokenizer, conversation)


# ---------------------------------------------------------------- building the auto template


def test_auto_needs_a_tokenizer_with_a_chat_template(load):
    with pytest.raises(ConfigError, match=r"get_template\('auto', tokenizer=\.\.\.\)"):
        get_template("auto")
    with pytest.raises(ConfigError, match="needs the tokenizer's own chat template, but this tokenizer has none"):
        get_template("auto", tokenizer=load("gpt2"))


def test_unknown_name_suggests_auto():
    with pytest.raises(ConfigError, match="did you mean 'auto'"):
        get_template("atuo")


@pytest.mark.parametrize(("name", "stop_words"), [("phi3.5", ("<|end|>",)), ("qwen2.5", ()), ("llama2", ())])
def test_auto_stops_on_the_token_that_closes_a_reply(load, name, stop_words):
    template = get_template("auto", tokenizer=load(name))
    assert template.stop_words == stop_words
    assert chat_template_jinja(template, load(name)) == load(name).chat_template


def test_auto_fix_keeps_eos_and_adds_the_turn_end_as_stop(load):
    tokenizer = copy.deepcopy(load("phi3.5"))
    template = get_template("auto", tokenizer=tokenizer)
    assert fix_tokenizer(template, tokenizer) == []
    assert tokenizer.eos_token == "<|endoftext|>"
    assert stop_token_ids(template, tokenizer) == [32000, 32007]
    # Phi-3's <|end|> keeps swallowing the newline after it
    assert tokenizer.encode("a<|end|>\nb", add_special_tokens=False) == load("phi3.5").encode("a<|end|>\nb",
                                                                                               add_special_tokens=False)


# ---------------------------------------------------------------- rendering and turns


def test_auto_pieces_are_the_token_ids_of_the_official_rendering(load):
    tokenizer = load("llama3")
    template = get_template("auto", tokenizer=tokenizer)
    pieces = message_pieces(template, tokenizer, messages=CONVERSATION, system="Be brief.")
    assert all(isinstance(piece, int) for message in pieces for piece in message)
    text = render_text(template, tokenizer, messages=CONVERSATION, system="Be brief.")
    chat = [{"role": "system", "content": "Be brief."}, *CONVERSATION]
    assert text == tokenizer.apply_chat_template(chat, tokenize=False)
    assert [tokenizer.decode(ids) for ids in pieces[1::2]] == ["2+2 equals 4.<|eot_id|>", "3+3 equals 6.<|eot_id|>"]


def test_auto_llama2_reply_keeps_the_space_before_eos(load):
    tokenizer = load("llama2")
    pairs = _turns(get_template("auto", tokenizer=tokenizer), tokenizer, CONVERSATION[:2])
    ((source, target),) = pairs
    tokens = tokenizer.convert_ids_to_tokens(target)
    assert tokens[0] == "2" and tokens[-2:] == ["▁", "</s>"]  # the reply starts at its first character
    assert tokenizer.convert_ids_to_tokens(source)[-4:] == ["/", "INST", "]", "▁"]


def test_auto_mistral_drops_the_system_prompt_as_the_official_template_does(load):
    tokenizer = load("mistral-v0.3")
    template = get_template("auto", tokenizer=tokenizer)
    with_system = _turns(template, tokenizer, CONVERSATION, system="Be brief.")
    assert with_system == _turns(template, tokenizer, CONVERSATION, system=None)


# A chat template that, like Qwen3's, drops the thoughts of replies before the last user message:
# a reply renders differently once another turn follows it.
_DROPS_OLD_THOUGHTS = (
    "{%- set ns = namespace(last=0) -%}"
    "{%- for m in messages -%}{%- if m.role == 'user' -%}{%- set ns.last = loop.index0 -%}{%- endif -%}{%- endfor -%}"
    "{%- for m in messages -%}{{- '<|im_start|>' + m.role + '\\n' -}}"
    "{%- if m.role == 'assistant' and loop.index0 < ns.last and '</think>' in m.content -%}"
    "{{- m.content.split('</think>')[-1].lstrip('\\n') -}}{%- else -%}{{- m.content -}}{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


def test_auto_finds_replies_that_later_turns_rewrite(load):
    tokenizer = load("qwen2.5")
    template = dataclasses.replace(get_template("auto", tokenizer=tokenizer), chat_template=_DROPS_OLD_THOUGHTS)
    messages = [CONVERSATION[0], {"role": "assistant", "content": "<think>\nadd\n</think>\n\n4"},
                CONVERSATION[2], {"role": "assistant", "content": "<think>\nadd again\n</think>\n\n6"}]
    pairs = _turns(template, tokenizer, messages)
    official = tokenizer.apply_chat_template(messages, chat_template=_DROPS_OLD_THOUGHTS, tokenize=True,
                                             return_dict=False)
    assert [token for source, target in pairs for token in source + target] == official
    assert [tokenizer.decode(target) for _, target in pairs] == ["4<|im_end|>\n",
                                                                "<think>\nadd again\n</think>\n\n6<|im_end|>\n"]


def test_auto_refuses_tool_calls_the_chat_template_does_not_write(load):
    tokenizer = load("llama3")  # Llama 3.0's template writes message content only
    template = get_template("auto", tokenizer=tokenizer)
    call = {"role": "function", "content": json.dumps({"name": "get_weather", "arguments": {"city": "Paris"}})}
    with pytest.raises(DataError, match="does not write tool calls"):
        _turns(template, tokenizer, [CONVERSATION[0], call])
    tools = json.dumps([{"name": "get_weather", "parameters": {"type": "object", "properties": {}}}])
    with pytest.raises(DataError, match="does not write the row's tool descriptions"):
        _turns(template, tokenizer, CONVERSATION[:2], tools=tools)


def test_auto_reports_a_conversation_the_chat_template_refuses(load):
    tokenizer = load("llama2")  # Llama 2's template raises unless roles alternate user/assistant
    template = get_template("auto", tokenizer=tokenizer)
    with pytest.raises(DataError, match="chat template refused the conversation.*alternate"):
        _turns(template, tokenizer, [CONVERSATION[0], CONVERSATION[1], {"role": "observation", "content": "{}"},
                                     CONVERSATION[3]])


# ---------------------------------------------------------------- the mismatch guard


@pytest.mark.parametrize(
    ("template_name", "tokenizer_name"),
    [
        ("qwen", "qwen2.5"),
        ("llama3", "llama3"),
        ("mistral", "mistral-v0.3"),  # README quirk: system prompt before the last user message, or dropped
        ("phi", "phi3.5"),  # README quirk: add_generation_prompt=False appends <|endoftext|>
        ("default", "gpt2"),  # no chat template to compare with
    ],
)
def test_check_template_accepts_the_matching_template(load, template_name, tokenizer_name):
    assert check_template(get_template(template_name), load(tokenizer_name)) is None


def test_check_template_accepts_auto_and_fixed_tokenizers(load):
    tokenizer = copy.deepcopy(load("phi3.5"))
    fix_tokenizer(get_template("phi"), tokenizer)  # eos is now <|end|>: the official render ends with it
    assert check_template(get_template("phi"), tokenizer) is None
    assert check_template(get_template("auto", tokenizer=load("qwen2.5")), load("qwen2.5")) is None


def test_check_template_reports_llama2_space_before_eos(load):
    """LLaMA-Factory's llama2 layout really trains other tokens than Meta's: no '▁' before </s>."""
    message = check_template(get_template("llama2"), load("llama2"))
    assert message is not None and "\n" not in message
    assert "with a system prompt" in message and "position 47" in message
    assert "(ids [2, 1, 518])" in message and "(ids [29871, 2, 1])" in message


@pytest.mark.parametrize(
    ("template_name", "tokenizer_name", "expected"),
    [
        ("chatml", "qwen2.5", "without a system prompt: the token ids first differ at position 1"),
        ("llama3", "qwen2.5", "with a system prompt: the token ids first differ at position 0"),
        ("qwen", "phi3.5", "use 'template: auto'"),
    ],
)
def test_check_template_reports_the_first_difference(load, template_name, tokenizer_name, expected):
    message = check_template(get_template(template_name), load(tokenizer_name))
    assert message is not None and expected in message
    assert message.startswith(f"template '{template_name}' does not write what this tokenizer's own chat template")
