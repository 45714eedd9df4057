"""Chat templates against the real tokenizers' own chat templates (../shared/tokenizers)."""

from __future__ import annotations

import copy
import dataclasses
import json

import pytest

from tuneline.core.errors import ConfigError, DataError
from tuneline.core.templates.conversation import (
    EOS,
    TEMPLATES,
    Conversation,
    Template,
    chat_template_jinja,
    encode_prompt,
    encode_turns,
    fix_tokenizer,
    get_template,
    render_text,
    stop_token_ids,
)

SYSTEM = "You're a helpful assistant. Answer briefly."


def _user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def _assistant(text: str) -> dict[str, str]:
    return {"role": "assistant", "content": text}


CONVERSATIONS = {
    "single": [_user("Hi! What is 2+2?"), _assistant("2+2 equals 4.")],
    "multi": [
        _user("Hi! What is 2+2?"),
        _assistant("2+2 equals 4."),
        _user("用中文说一遍，再写一行 Python。"),
        _assistant("二加二等于四。\nprint(2 + 2)"),
    ],
    "three": [
        _user("Name a colour."),
        _assistant("Blue."),
        _user("Another, in 'quotes'?"),
        _assistant("'Red' \\ and more."),
        _user("Thanks!\n\nBye."),
        _assistant("Bye — see you."),
    ],
}
CASES = [(conv, system) for conv in CONVERSATIONS for system in (None, SYSTEM)]




class _FixedTokenizers:
    """Copies of the tokenizers after `fix_tokenizer` for a template, and what each fix added."""

    def __init__(self, load) -> None:
        self._load = load
        self._cache: dict[tuple[str, str], object] = {}
        self.added: dict[tuple[str, str], list[str]] = {}

    def __call__(self, name: str, template_name: str):
        key = (name, template_name)
        if key not in self._cache:
            tokenizer = copy.deepcopy(self._load(name))
            self.added[key] = fix_tokenizer(get_template(template_name), tokenizer)
            self._cache[key] = tokenizer
        return self._cache[key]


@pytest.fixture(scope="module")
def fixed(load):
    return _FixedTokenizers(load)


def _with_system(messages: list[dict], system: str | None) -> list[dict]:
    return ([{"role": "system", "content": system}] if system else []) + messages


def _official_ids(tokenizer, conversation: list[dict], **kwargs) -> list[int]:
    return tokenizer.apply_chat_template(conversation, tokenize=True, return_dict=False, **kwargs)


def _pairs(template: Template, tokenizer, messages: list[dict], system: str | None, tools=None):
    conversation = Conversation(prompt=messages[:-1], response=messages[-1:], system=system, tools=tools)
    return encode_turns(template, tokenizer, conversation)


def _turn_ids(template: Template, tokenizer, messages: list[dict], system: str | None, tools=None):
    pairs = _pairs(template, tokenizer, messages, system, tools)
    assert len(pairs) == len(messages) // 2
    return [token for source, target in pairs for token in source + target]


# ---------------------------------------------------------------- registry


def test_get_template_returns_registered_values():
    expected = {"default", "empty", "chatml", "qwen", "llama3", "llama2", "mistral", "phi", "alpaca"}
    assert set(TEMPLATES) >= expected | {"vicuna"}
    qwen_system = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
    assert get_template("qwen").default_system == qwen_system
    assert get_template("llama3").stop_words == ("<|eot_id|>", "<|eom_id|>")


def test_unknown_template_names_the_nearest():
    with pytest.raises(ConfigError, match="unknown template 'qwen2'; did you mean 'qwen'"):
        get_template("qwen2")


def test_templates_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        get_template("qwen").default_system = "x"  # type: ignore[misc]
    with pytest.raises(TypeError):
        TEMPLATES["mine"] = get_template("qwen")  # type: ignore[index]


def test_template_without_content_slot_is_refused():
    with pytest.raises(ConfigError, match="format_user .* has no \\{content\\} piece"):
        Template(name="broken", format_user=("USER:",))
    with pytest.raises(ConfigError, match="replace_eos needs at least one stop word"):
        Template(name="broken", replace_eos=True)
    with pytest.raises(ConfigError, match="format_observation .* has no"):
        Template(name="broken", format_observation=("TOOL:",))


def test_named_templates_ignore_the_tokenizer(load):
    assert get_template("qwen", tokenizer=load("llama3")) is TEMPLATES["qwen"]


# ---------------------------------------------------------------- token-exact against the official templates


@pytest.mark.parametrize(("tokenizer_name", "template_name"), [("qwen2.5", "qwen"), ("llama3", "llama3")])
@pytest.mark.parametrize(("conversation", "system"), CASES)
def test_turns_equal_official_chat_template(load, fixed, tokenizer_name, template_name, conversation, system):
    messages = CONVERSATIONS[conversation]
    template = get_template(template_name)
    ours = _turn_ids(template, fixed(tokenizer_name, template_name), messages, system)
    assert ours == _official_ids(load(tokenizer_name), _with_system(messages, system))


@pytest.mark.parametrize(("tokenizer_name", "template_name"), [("qwen2.5", "qwen"), ("llama3", "llama3")])
@pytest.mark.parametrize("system", [None, SYSTEM])
def test_prompt_equals_official_generation_prompt(load, fixed, tokenizer_name, template_name, system):
    prompt = CONVERSATIONS["three"][:-1]
    template, tokenizer = get_template(template_name), fixed(tokenizer_name, template_name)
    ours = encode_prompt(template, tokenizer, Conversation(prompt=prompt, system=system))
    official = _official_ids(load(tokenizer_name), _with_system(prompt, system), add_generation_prompt=True)
    assert ours == official


def test_bos_prefix_only_on_first_source_and_targets_end_with_eot(fixed):
    tokenizer = fixed("llama3", "llama3")
    messages = CONVERSATIONS["three"]
    pairs = _pairs(get_template("llama3"), tokenizer, messages, None)
    # <|begin_of_text|> opens the first source only; later ones open with <|start_header_id|>
    assert [source[0] for source, _ in pairs] == [128000, 128006, 128006]
    assert all(target[-1] == 128009 for _, target in pairs)  # <|eot_id|>
    assert tokenizer.decode(pairs[1][1]) == "'Red' \\ and more.<|eot_id|>"


def test_qwen_inserts_its_default_system(fixed):
    tokenizer, template = fixed("qwen2.5", "qwen"), get_template("qwen")
    messages = CONVERSATIONS["single"]
    without = _turn_ids(template, tokenizer, messages, None)
    assert without == _turn_ids(template, tokenizer, messages, template.default_system)
    assert tokenizer.decode(without).startswith(
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
    )


def test_qwen_tools_equal_official_chat_template(load, fixed):
    tool = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city, 今天",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}},
                "required": ["city"],
            },
        },
    }
    messages = [_user("Weather in Paris?"), _assistant("Sunny.")]
    for system in (None, SYSTEM):
        tools = json.dumps([tool])
        ours = _turn_ids(get_template("qwen"), fixed("qwen2.5", "qwen"), messages, system, tools=tools)
        assert ours == _official_ids(load("qwen2.5"), _with_system(messages, system), tools=[tool])


def test_special_token_text_in_content_is_a_special_token(fixed):
    tokenizer = fixed("qwen2.5", "qwen")
    pairs = _pairs(get_template("qwen"), tokenizer, [_user("a<|im_end|>b"), _assistant("c")], "s")
    source = pairs[0][0]
    assert source.count(151645) == 3  # system end, the one in the text, user end


@pytest.mark.parametrize("conversation", list(CONVERSATIONS))
def test_mistral_without_system_equals_official(load, fixed, conversation):
    messages = CONVERSATIONS[conversation]
    ours = _turn_ids(get_template("mistral"), fixed("mistral-v0.3", "mistral"), messages, None)
    assert ours == _official_ids(load("mistral-v0.3"), messages)


def test_mistral_folds_system_into_first_user_message(load, fixed):
    """Official v0.3 puts the system text before the LAST user message (and drops it when the chat
    ends with an assistant turn); LLaMA-Factory's mistral template folds it into the first one."""
    template, tokenizer = get_template("mistral"), fixed("mistral-v0.3", "mistral")
    official = load("mistral-v0.3")
    prompt = [_user("Hi! What is 2+2?")]
    ours = encode_prompt(template, tokenizer, Conversation(prompt=prompt, system=SYSTEM))
    assert ours == _official_ids(official, _with_system(prompt, SYSTEM), add_generation_prompt=True)
    messages = CONVERSATIONS["multi"]
    folded = [_user(SYSTEM + "\n\n" + messages[0]["content"]), *messages[1:]]
    assert _turn_ids(template, tokenizer, messages, SYSTEM) == _official_ids(official, folded)


@pytest.mark.parametrize(("conversation", "system"), CASES)
def test_llama2_equals_official_except_space_before_eos(load, fixed, conversation, system):
    """LLaMA-Factory's llama2 template writes `[/INST]answer</s>` where Meta's writes
    `[/INST] answer </s>`: the same tokens except the lone '▁' before each `</s>`."""
    messages = CONVERSATIONS[conversation]
    ours = _turn_ids(get_template("llama2"), fixed("llama2", "llama2"), messages, system)
    official = _official_ids(load("llama2"), _with_system(messages, system))
    space, eos = 29871, 2
    assert official.count(eos) == len(messages) // 2
    expected = [t for i, t in enumerate(official) if not (t == space and official[i + 1 : i + 2] == [eos])]
    assert ours == expected


@pytest.mark.parametrize(("conversation", "system"), CASES)
def test_phi_equals_official_text_without_final_endoftext(load, fixed, conversation, system):
    messages = CONVERSATIONS[conversation]
    tokenizer = fixed("phi3.5", "phi")
    official_text = load("phi3.5").apply_chat_template(_with_system(messages, system), tokenize=False)
    assert official_text.endswith("<|end|>\n<|endoftext|>")
    text = render_text(get_template("phi"), tokenizer, messages=messages, system=system)
    assert text == official_text.removesuffix("<|endoftext|>")
    ours = _turn_ids(get_template("phi"), tokenizer, messages, system)
    assert ours == tokenizer.encode(text, add_special_tokens=False)


def test_default_template_text_with_gpt2(fixed):
    tokenizer = fixed("gpt2", "default")
    messages = CONVERSATIONS["single"]
    text = render_text(get_template("default"), tokenizer, messages=messages, system="Be brief.")
    assert text == (
        "System: Be brief.<|endoftext|>\n"
        "Human: Hi! What is 2+2?<|endoftext|>\nAssistant:2+2 equals 4.<|endoftext|>\n"
    )
    ((source, target),) = _pairs(get_template("default"), tokenizer, messages, "Be brief.")
    assert target == tokenizer.encode("2+2 equals 4.") + [50256] + tokenizer.encode("\n")
    assert source.count(50256) == 2


def test_default_tool_format_describes_each_argument(fixed):
    tool = {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name"},
                "unit": {"enum": ["c", "f"]},
            },
            "required": ["city"],
        },
    }
    text = render_text(
        get_template("default"), fixed("gpt2", "default"), messages=[_user("hi")], system=None,
        tools=json.dumps([tool]),
    )
    assert text.startswith(
        "System: You have access to the following tools:\n> Tool Name: get_weather\n"
        "Tool Description: Weather for a city\nTool Args:\n"
        "  - city (string, required): City name\n  - unit (): , should be one of [c, f]\n\n"
        "Use the following format if using a tool:\n```\nAction: tool name (one of [get_weather])\n"
    )
    assert text.endswith("```\n<|endoftext|>\nHuman: hi<|endoftext|>\nAssistant:")


def test_tools_refused_where_the_template_has_no_tool_format(fixed):
    with pytest.raises(DataError, match="does not support tool descriptions"):
        tools = '[{"name": "f", "parameters": {"properties": {}}}]'
        messages = [_user("hi"), _assistant("yo")]
        _pairs(get_template("llama3"), fixed("llama3", "llama3"), messages, None, tools)


@pytest.mark.parametrize(
    ("prompt", "response", "match"),
    [
        ([_assistant("x")], [_user("y")], "message 0 has role 'assistant'"),
        ([_user("x"), _user("y")], [_assistant("z")], "message 1 has role 'user'"),
        ([_user("x"), {"role": "observation", "content": "{}"}], [_assistant("z")], "message 1 has role 'observation'"),
        ([{"role": "function", "content": "{}"}], [_assistant("z")], "message 0 has role 'function'"),
        ([_user("x")], [], "end with an assistant message"),
    ],
)
def test_bad_role_order_is_reported(fixed, prompt, response, match):
    with pytest.raises(DataError, match=match):
        tokenizer = fixed("qwen2.5", "qwen")
        encode_turns(get_template("qwen"), tokenizer, Conversation(prompt=prompt, response=response))


# ---------------------------------------------------------------- tokenizer fixes and stop words


def test_fix_tokenizer_llama3_adds_eom_and_pads_with_eos(load, fixed):
    template = get_template("llama3")
    with pytest.raises(ConfigError, match="call fix_tokenizer"):
        stop_token_ids(template, load("llama3"))
    tokenizer = fixed("llama3", "llama3")
    assert fixed.added[("llama3", "llama3")] == ["<|eom_id|>"]
    assert (len(load("llama3")), len(tokenizer)) == (128256, 128257)
    assert (tokenizer.eos_token, tokenizer.pad_token) == ("<|eot_id|>", "<|eot_id|>")
    assert stop_token_ids(template, tokenizer) == [128009, 128256]
    assert tokenizer.encode("a<|eom_id|>", add_special_tokens=False) == [64, 128256]
    assert fix_tokenizer(template, tokenizer) == []  # a second fix changes nothing


def test_fix_tokenizer_replaces_eos_with_existing_token(load, fixed):
    tokenizer = fixed("phi3.5", "phi")
    assert fixed.added[("phi3.5", "phi")] == []
    assert load("phi3.5").eos_token == "<|endoftext|>"
    assert (tokenizer.eos_token, tokenizer.eos_token_id, len(tokenizer)) == ("<|end|>", 32007, 32011)
    assert tokenizer.pad_token_id == 32000  # kept: phi already has a pad token
    qwen = fixed("qwen2.5", "qwen")
    assert fixed.added[("qwen2.5", "qwen")] == []
    assert (qwen.eos_token_id, qwen.pad_token_id) == (151645, 151643)
    assert stop_token_ids(get_template("qwen"), qwen) == [151645]


def test_fix_tokenizer_sets_eos_by_its_text_as_llamafactory_does(load, fixed):
    """Phi-3's <|end|> swallows the newline after it (rstrip); made eos by its text, as LLaMA-Factory
    makes it, it no longer does, so every turn end is `<|end|>`, `▁`, newline, as LLaMA-Factory writes it."""
    text = "<|user|>\nHi<|end|>\n<|assistant|>\nHello<|end|>\n"
    assert load("phi3.5").encode(text, add_special_tokens=False) == [32010, 6324, 32007, 32001, 15043, 32007]
    assert fixed("phi3.5", "phi").encode(text, add_special_tokens=False) == [
        32010, 6324, 32007, 29871, 13, 32001, 15043, 32007, 29871, 13]


def test_fix_tokenizer_adds_missing_chatml_tokens_to_gpt2(load, fixed):
    tokenizer = fixed("gpt2", "chatml")
    assert fixed.added[("gpt2", "chatml")] == ["<|im_end|>", "<|im_start|>"]
    assert (tokenizer.eos_token_id, tokenizer.pad_token_id) == (50257, 50257)
    assert stop_token_ids(get_template("chatml"), tokenizer) == [50257, 50258]
    assert load("gpt2").pad_token_id is None
    plain = fixed("gpt2", "default")
    assert fixed.added[("gpt2", "default")] == []
    assert (plain.eos_token_id, plain.pad_token_id) == (50256, 50256)


# ---------------------------------------------------------------- Jinja export

JINJA_CASES = [
    ("qwen", "qwen2.5"),
    ("chatml", "gpt2"),
    ("llama3", "llama3"),
    ("llama2", "llama2"),
    ("mistral", "mistral-v0.3"),
    ("phi", "phi3.5"),
    ("vicuna", "llama2"),
    ("default", "gpt2"),
    ("alpaca", "gpt2"),
    ("empty", "gpt2"),
]


@pytest.mark.parametrize(("template_name", "tokenizer_name"), JINJA_CASES)
def test_jinja_renders_the_encoded_text(fixed, template_name, tokenizer_name):
    template, tokenizer = get_template(template_name), fixed(tokenizer_name, template_name)
    jinja = chat_template_jinja(template, tokenizer)
    for conversation, system in CASES:
        messages = CONVERSATIONS[conversation]
        def render(conversation: list[dict], **kwargs) -> str:
            return tokenizer.apply_chat_template(conversation, chat_template=jinja, tokenize=False, **kwargs)

        rendered = render(_with_system(messages, system))
        assert rendered == render_text(template, tokenizer, messages=messages, system=system)
        prompt = _with_system(messages[:-1], system)
        expected_prompt = render_text(template, tokenizer, messages=messages[:-1], system=system)
        assert render(prompt, add_generation_prompt=True) == expected_prompt
        without = render(prompt, add_generation_prompt=False)
        assert without + template.generation_prefix == expected_prompt


@pytest.mark.parametrize(("template_name", "tokenizer_name"), [("qwen", "qwen2.5"), ("llama3", "llama3")])
def test_jinja_ids_equal_encoded_ids(fixed, template_name, tokenizer_name):
    template, tokenizer = get_template(template_name), fixed(tokenizer_name, template_name)
    jinja = chat_template_jinja(template, tokenizer)
    messages = CONVERSATIONS["three"]
    rendered = _official_ids(tokenizer, _with_system(messages, SYSTEM), chat_template=jinja)
    assert rendered == _turn_ids(template, tokenizer, messages, SYSTEM)


def test_jinja_set_as_chat_template_of_gpt2(load):
    tokenizer = copy.deepcopy(load("gpt2"))
    template = get_template("default")
    fix_tokenizer(template, tokenizer)
    tokenizer.chat_template = chat_template_jinja(template, tokenizer)
    text = tokenizer.apply_chat_template([_user("Hi"), _assistant("Hello")], tokenize=False)
    assert text == "Human: Hi<|endoftext|>\nAssistant:Hello<|endoftext|>\n"
    prompt = tokenizer.apply_chat_template([_user("Hi")], tokenize=False, add_generation_prompt=True)
    assert prompt == "Human: Hi<|endoftext|>\nAssistant:"
    assert tokenizer.apply_chat_template([_user("Hi")], tokenize=False) == "Human: Hi<|endoftext|>"


def test_jinja_eos_is_the_fixed_token_text(fixed):
    template = dataclasses.replace(get_template("empty"), name="probe", format_assistant=("{content}", EOS))
    jinja = chat_template_jinja(template, fixed("phi3.5", "phi"))
    assert "'<|end|>'" in jinja and "eos_token" not in jinja
