"""Every registered template: it renders, its ids decode to its text, its Jinja export renders the
same text; and the LLaMA-Factory behaviours the conformance tests cannot reach (other vendors'
control tokens, tool formats, reasoning templates, the pieces handed to a batch encoder)."""

from __future__ import annotations

import dataclasses
import json

import pytest
from transformers import AutoTokenizer

from tuneline.core.errors import ConfigError, DataError
from tuneline.core.templates.conversation import (
    TEMPLATES,
    Conversation,
    chat_template_jinja,
    encode_oneturn,
    encode_prompt,
    encode_turns,
    get_template,
    message_pieces,
    render_text,
)
from tuneline.core.templates.spec import Template, Token

REQUIRED = {
    "default", "empty", "alpaca", "vicuna", "chatml", "qwen", "qwen3", "qwen3_nothink", "llama2", "llama3", "llama4",
    "mistral", "ministral", "mistral_small", "phi", "phi4", "gemma", "gemma3", "deepseek", "deepseek3", "deepseekr1",
    "yi", "baichuan2", "chatglm3", "glm4", "intern2", "cohere", "falcon", "zephyr", "openchat", "solar", "granite3",
    "olmo", "seed_oss", "smollm2", "gpt_oss",
}
CONVERSATION = [
    {"role": "user", "content": "Hi there"},
    {"role": "assistant", "content": "Hello! How can I help?"},
    {"role": "user", "content": "Tell me a joke."},
    {"role": "assistant", "content": "Why did the chicken cross the road?"},
]
THINKING_VARIANTS = [dataclasses.replace(t, **keys) for t in TEMPLATES.values() if t.reasoning
                     for keys in ({"enable_thinking": False}, {"enable_thinking": None},
                                  {"enable_thinking": False, "preserve_thinking": True})]
ALL = [*TEMPLATES.values(), *THINKING_VARIANTS]


def _id(template) -> str:
    thinking = {True: "", False: "-nothinking", None: "-thinking_none"}[template.enable_thinking]
    return template.name + thinking + ("-preserve" if template.preserve_thinking else "")


def _thinking(template, conversation):
    """The conversation with a thought in front of the first reply, for reasoning templates."""
    if not template.reasoning:
        return conversation
    first = {**conversation[1], "content": template.thought_words[0] + "Greet." + template.thought_words[1]
             + conversation[1]["content"]}
    return [conversation[0], first, *conversation[2:]]


@pytest.fixture(scope="module")
def gpt2(shared_dir):
    """gpt2 with every token the templates write by id or stop on, so any template can encode."""
    tokenizer = AutoTokenizer.from_pretrained(shared_dir / "tokenizers" / "gpt2")
    tokens = set()
    for template in TEMPLATES.values():
        tokens.update(template.stop_words)
        for slot in (template.format_user, template.format_system, template.observation_slot, template.format_prefix):
            tokens.update(piece.text for piece in slot if isinstance(piece, Token))
    tokens.discard("###")  # Yi-VL stops on plain text that alpaca's format writes: as a token it would change alpaca's encoding
    tokenizer.add_special_tokens({"additional_special_tokens": sorted(tokens)}, replace_extra_special_tokens=False)
    return tokenizer


@pytest.fixture(scope="module")
def qwen(shared_dir):
    return AutoTokenizer.from_pretrained(shared_dir / "tokenizers" / "qwen2.5")


def _ids(pairs) -> list[int]:
    return [token for source, target in pairs for token in source + target]


def test_registry_holds_the_required_families():
    assert REQUIRED <= set(TEMPLATES)
    assert len(TEMPLATES) >= 60
    assert all(name == template.name for name, template in TEMPLATES.items())


def test_template_problems_are_reported_together():
    with pytest.raises(ConfigError) as error:
        Template(name="broken", efficient_eos=True, thought_words=("<think>", ""), generation_prefix="A:")
    assert len(error.value.problems) == 3
    assert "efficient_eos templates end replies without EOS" in str(error.value)


@pytest.mark.parametrize("template", ALL, ids=_id)
@pytest.mark.parametrize("system", [None, "Be brief."])
def test_every_template_renders_and_exports_the_same_text(gpt2, template, system):
    conversation = _thinking(template, CONVERSATION)
    text = render_text(template, gpt2, messages=conversation, system=system)
    assert all(m["content"].split(template.thought_words[1])[-1] in text for m in conversation)
    pairs = encode_turns(template, gpt2, Conversation(prompt=conversation[:-1], response=conversation[-1:], system=system))
    assert gpt2.decode(_ids(pairs)) == text  # byte-level BPE: the ids spell out exactly the text
    prompt_text = render_text(template, gpt2, messages=conversation[:-1], system=system)
    assert gpt2.decode(encode_prompt(template, gpt2, Conversation(prompt=conversation[:-1], system=system))) == prompt_text

    jinja = chat_template_jinja(template, gpt2)
    chat = ([{"role": "system", "content": system}] if system else []) + conversation
    assert gpt2.apply_chat_template(chat, chat_template=jinja, tokenize=False) == text
    prompt = gpt2.apply_chat_template(chat[:-1], chat_template=jinja, tokenize=False, add_generation_prompt=True)
    assert prompt == prompt_text
    if template.reasoning:  # the first reply's thought: kept where LLaMA-Factory keeps it
        assert ("Greet." in text) is (template.enable_thinking is not False)
        assert ("Greet." in prompt_text) is template.preserve_thinking


# ---------------------------------------------------------------- vendor formats (LLaMA-Factory's slots)


def test_gemma_folds_the_system_text_into_the_first_user_message(gpt2):
    text = render_text(get_template("gemma"), gpt2, messages=CONVERSATION[:2], system="Be brief.")
    assert text == ("<|endoftext|><start_of_turn>user\nBe brief.\n\nHi there<end_of_turn>\n<start_of_turn>model\n"
                    "Hello! How can I help?<end_of_turn>\n")


def test_chatglm3_writes_its_tokens_by_id_and_encodes_each_slot_element_apart(gpt2):
    pieces = message_pieces(get_template("chatglm3"), gpt2, messages=CONVERSATION[:2], system="Be brief.")
    token = gpt2.convert_tokens_to_ids
    assert pieces[0] == [token("[gMASK]"), token("sop"), token("<|system|>"), "\n", "Be brief.", token("<|user|>"),
                         "\n", "Hi there", token("<|assistant|>")]
    assert pieces[1] == ["\n", "Hello! How can I help?"]  # efficient_eos: no eos after the reply


@pytest.mark.parametrize(("name", "first"), [("olmo", "eos"), ("llama4", "bos"), ("cohere", "bos")])
def test_prefix_slots(gpt2, name, first):
    pieces = message_pieces(get_template(name), gpt2, messages=CONVERSATION[:2], system=None)
    assert pieces[0][0] == getattr(gpt2, f"{first}_token_id")


def test_message_pieces_join_texts_only_where_an_added_token_starts_the_second(gpt2, qwen):
    qwen_pieces = message_pieces(get_template("qwen"), qwen, messages=CONVERSATION[:2], system="Be brief.")
    assert qwen_pieces[0] == ["<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n"
                              "<|im_start|>assistant\n"]
    # alpaca's default system and the instruction are two slot elements that LLaMA-Factory encodes
    # apart; joined, BPE would merge "\n\n###" differently
    alpaca = get_template("alpaca")
    system, user = message_pieces(alpaca, gpt2, messages=CONVERSATION[:2], system=None)[0]
    assert (system, user) == (alpaca.default_system, "### Instruction:\nHi there\n\n### Response:\n")
    apart = gpt2.encode(system) + gpt2.encode(user)
    assert apart != gpt2.encode(system + user)
    ((source, _),) = encode_turns(alpaca, gpt2, Conversation(prompt=CONVERSATION[:1], response=CONVERSATION[1:2]))
    assert source == apart


def test_encode_turns_encodes_exactly_the_message_pieces(qwen):
    template = get_template("llama3")
    pieces = message_pieces(template, qwen, messages=CONVERSATION, system="Be brief.")
    expected = [[t for p in message for t in (qwen.encode(p, add_special_tokens=False) if isinstance(p, str) else [p])]
                for message in pieces]
    conversation = Conversation(prompt=CONVERSATION[:-1], response=CONVERSATION[-1:], system="Be brief.")
    pairs = encode_turns(template, qwen, conversation)
    assert [ids for pair in pairs for ids in pair] == expected


# ---------------------------------------------------------------- tool calls and tool results

CALL = {"role": "function", "content": json.dumps({"name": "get_weather", "arguments": {"city": "Paris"}})}
RESULT = {"role": "observation", "content": '{"temp": 21}'}
TOOL_TURNS = [{"role": "user", "content": "Weather?"}, CALL, RESULT, {"role": "assistant", "content": "Sunny."}]


@pytest.mark.parametrize(
    ("name", "call_text", "result_text"),
    [
        ("chatml", 'Action: get_weather\nAction Input: {"city": "Paris"}<|im_end|>\n',
         '<|im_start|>tool\n{"temp": 21}<|im_end|>\n<|im_start|>assistant\n'),
        ("qwen", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>\n',
         '<|im_start|>user\n<tool_response>\n{"temp": 21}\n</tool_response><|im_end|>\n<|im_start|>assistant\n'),
        ("llama3", '{"name": "get_weather", "parameters": {"city": "Paris"}}<|eot_id|>',
         '<|start_header_id|>ipython<|end_header_id|>\n\n{"temp": 21}<|eot_id|>'
         '<|start_header_id|>assistant<|end_header_id|>\n\n'),
        ("mistral", '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}]<|endoftext|>',
         '[TOOL_RESULTS] {"content": {"temp": 21}}[/TOOL_RESULTS]'),
        ("glm4", 'get_weather\n{"city": "Paris"}', '<|observation|>\n{"temp": 21}<|assistant|>'),
        # a reasoning template: the call gets an empty thought in front, as a reply does
        ("seed_oss", "<seed:think></seed:think><|endoftext|>\n\n<seed:tool_call>\n<function=get_weather\n"
         "<parameter=city>Paris</parameter>\n</function>\n</seed:tool_call><|endoftext|>",
         '<|endoftext|>user\n{"temp": 21}<|endoftext|><|endoftext|>assistant\n'),
    ],
)
def test_tool_calls_and_results_in_each_tool_format(gpt2, name, call_text, result_text):
    pieces = message_pieces(get_template(name), gpt2, messages=TOOL_TURNS, system=None)
    call, result = ("".join(p if isinstance(p, str) else gpt2.convert_ids_to_tokens(p) for p in message)
                    for message in pieces[1:3])
    assert (call, result) == (call_text, result_text)


def test_tool_descriptions_in_the_glm4_format(gpt2):
    tools = json.dumps([{"name": "get_weather", "description": "Weather", "parameters": {"type": "object"}}])
    text = render_text(get_template("glm4"), gpt2, messages=TOOL_TURNS[:1], system=None, tools=tools)
    assert text.startswith("[gMASK]<sop><|system|>\n你是一个名为 ChatGLM 的人工智能助手。")
    assert '# 可用工具\n\n## get_weather\n\n{\n    "name": "get_weather",' in text
    assert text.endswith("在调用上述函数时，请使用 Json 格式表示调用的参数。<|user|>\nWeather?<|assistant|>")


@pytest.mark.parametrize(
    ("name", "content", "match"),
    [
        ("glm4", json.dumps([{"name": "a", "arguments": {}}, {"name": "b", "arguments": {}}]), "one tool call"),
        ("qwen", "get_weather(city='Paris')", "not valid JSON"),
        ("qwen", json.dumps({"tool": "get_weather"}), '"name": ..., "arguments"'),
    ],
)
def test_bad_tool_calls_are_reported(gpt2, name, content, match):
    with pytest.raises(DataError, match=match):
        render_text(get_template(name), gpt2, messages=[TOOL_TURNS[0], {"role": "function", "content": content}],
                    system=None)


# ---------------------------------------------------------------- reasoning templates

THOUGHT = "<think>\n\n</think>\n\n"
THINKING = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "<think>\nadd\n</think>\n\n4"},
            {"role": "user", "content": "3+3?"}, {"role": "assistant", "content": "6"}]


def _texts(tokenizer, pairs) -> list[tuple[str, str]]:
    return [(tokenizer.decode(source), tokenizer.decode(target)) for source, target in pairs]


def test_reasoning_template_trains_an_empty_thought_and_keeps_real_ones(qwen):
    pairs = encode_turns(get_template("qwen3"), qwen, Conversation(prompt=THINKING[:-1], response=THINKING[-1:]))
    (_, first), (_, second) = _texts(qwen, pairs)
    assert first == "<think>\nadd\n</think>\n\n4<|im_end|>\n"
    assert second == THOUGHT + "6<|im_end|>\n"
    assert pairs[1][1][: len(qwen.encode(THOUGHT))] == qwen.encode(THOUGHT)  # its own piece, trained


def test_reasoning_template_without_thinking_drops_thoughts_into_the_prompt(qwen):
    template = dataclasses.replace(get_template("qwen3"), enable_thinking=False)
    pairs = encode_turns(template, qwen, Conversation(prompt=THINKING[:-1], response=THINKING[-1:]))
    texts = _texts(qwen, pairs)
    assert [target for _, target in texts] == ["4<|im_end|>\n", "6<|im_end|>\n"]
    assert all(source.endswith("<|im_start|>assistant\n" + THOUGHT) for source, _ in texts)
    prompt = encode_prompt(template, qwen, Conversation(prompt=THINKING[:-1]))
    assert qwen.decode(prompt).endswith("<|im_start|>user\n3+3?<|im_end|>\n<|im_start|>assistant\n" + THOUGHT)


def test_reasoning_template_one_turn_drops_earlier_thoughts(qwen):
    template = get_template("qwen3")
    prompt_ids, reply_ids = encode_oneturn(template, qwen, Conversation(prompt=THINKING[:-1], response=THINKING[-1:]))
    assert "<think>\nadd" not in qwen.decode(prompt_ids)
    assert qwen.decode(reply_ids) == THOUGHT + "6<|im_end|>\n"
    generation = qwen.decode(encode_prompt(template, qwen, Conversation(prompt=THINKING[:-1])))
    assert "<think>" not in generation and generation.endswith("<|im_start|>assistant\n")


def test_tool_call_keeps_its_thought_in_front(qwen):
    call = {"role": "function", "content": "<think>\nlook it up\n</think>\n\n" + CALL["content"]}
    pairs = encode_turns(get_template("qwen3"), qwen, Conversation(prompt=[TOOL_TURNS[0]], response=[call]))
    assert qwen.decode(pairs[0][1]).startswith("<think>\nlook it up\n</think>\n\n<tool_call>\n{\"name\"")


def test_non_reasoning_variant_adds_no_thought(qwen):
    pairs = encode_turns(get_template("qwen3_nothink"), qwen, Conversation(prompt=THINKING[:-1], response=THINKING[-1:]))
    assert "<think>" not in qwen.decode(pairs[1][0] + pairs[1][1])


def test_gpt_oss_thought_words_frame_the_analysis_channel(gpt2):
    text = render_text(get_template("gpt_oss"), gpt2, messages=CONVERSATION[:2], system=None)
    assert text.endswith("<|start|>assistant<|channel|>analysis<|message|><|end|><|start|>assistant<|channel|>final"
                         "<|message|>Hello! How can I help?<|end|>")
