"""Named templates and `template: auto` against the real tokenizers' own chat templates.

For each tokenizer in ../shared/tokenizers, 22 conversations (system prompt or not, up to four
turns, CJK, emoji, combining marks, right-to-left scripts, edge whitespace) and, where the official
template writes tool calls (qwen2.5, mistral-v0.3), tool conversations. The whole conversation's
ids must equal `apply_chat_template(..., tokenize=True)`. Where the official template behaves
differently on purpose, the test asserts exactly that difference; each is a quirk listed in
../shared/tokenizers/README.md ("Known quirks"). `template: auto` has no exceptions.
"""

from __future__ import annotations

import dataclasses
import json
import re
import unicodedata
from collections.abc import Callable

import pytest
from transformers import AutoTokenizer

from tuneline.core.templates.auto import chat_messages
from tuneline.core.templates.conversation import (
    Conversation,
    encode_prompt,
    encode_turns,
    fix_tokenizer,
    get_template,
    render_text,
)
from tuneline.core.templates.tools import parse_calls


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    messages: tuple[dict, ...]
    system: str | None = None
    tools: tuple[dict, ...] = ()


def _turns(*texts: str) -> tuple[dict, ...]:
    return tuple({"role": "user" if i % 2 == 0 else "assistant", "content": t} for i, t in enumerate(texts))


SYSTEM = "You're a helpful assistant. Answer briefly."
CASES = [
    Case("single", _turns("Hi! What is 2+2?", "2+2 equals 4.")),
    Case("single_system", _turns("Hi! What is 2+2?", "2+2 equals 4."), SYSTEM),
    Case("two_cjk", _turns("Hi! What is 2+2?", "2+2 equals 4.", "用中文说一遍，再写一行 Python。", "二加二等于四。\nprint(2 + 2)")),
    Case("two_cjk_system", _turns("こんにちは、元気ですか？", "はい、元気です。", "한국어로 말해 줘.", "네, 알겠습니다."),
         "日本語で答えて。"),
    Case("three", _turns("Name a colour.", "Blue.", "Another, in 'quotes'?", "'Red' \\ and more.", "Thanks!\n\nBye.",
                         "Bye — see you.")),
    Case("four_system", _turns("1", "one", "2", "two", "3", "three", "4", "four"), "Count in words."),
    Case("emoji", _turns("Rate this 👍🏽 and 👨‍👩‍👧‍👦?", "🎉 Great: 5/5 ⭐⭐⭐⭐⭐")),
    Case("combining", _turns("Cafe\u0301 or café? A\u030angstro\u0308m", "Both are cafe\u0301; Ångström."),
         "Re\u0301sume\u0301"),
    Case("rtl", _turns("مرحبا، كيف حالك؟", "שלום! אני בסדר.", "नमस्ते दुनिया", "धन्यवाद।")),
    Case("cyrillic_greek", _turns("Привет, мир!", "Γειά σου κόσμε!"), "Отвечай кратко."),
    Case("user_leading_spaces", _turns("   indented question", "answer")),
    Case("user_trailing_spaces", _turns("question   ", "answer"), SYSTEM),
    Case("assistant_leading_space", _turns("question", " answer with a leading space")),
    Case("assistant_trailing_spaces", _turns("question", "answer with trailing spaces  "), SYSTEM),
    Case("newlines_around", _turns("\nquestion on a new line\n", "answer\n")),
    Case("code", _turns("Fix:\n```python\ndef f(x):\n\treturn x+1\n```",
                        "```python\ndef f(x):\n    return x + 1\n```")),
    Case("markup", _turns("<b>bold</b> & <br/> {json: [1, 2]}", "Use &lt;b&gt; for <b>.")),
    Case("math", _turns("∑ x² ≤ 10³ and √2 ≈ 1.414?", "Yes: ∫₀¹ x dx = ½.")),
    Case("short", _turns(".", "!")),
    Case("inner_whitespace", _turns("a  b\t\tc   d", "e \t f")),
    Case("system_multiline", _turns("Hello", "Hi there."), "Rules:\n- be brief\n- be kind"),
    Case("four_mixed", _turns("Hola", "¡Hola!", "Ça va ?", "Très bien.", "Wie geht's?", "Gut.", "Tschüss", "Ciao 👋"),
         "Répondez brièvement."),
]

_WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city, 今天",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
_TIME = {"type": "function", "function": {"name": "get_time", "description": "Local time",
                                           "parameters": {"type": "object", "properties": {}}}}


def _call(*calls: tuple[str, dict]) -> dict:
    body = [{"name": name, "arguments": arguments} for name, arguments in calls]
    return {"role": "function", "content": json.dumps(body[0] if len(body) == 1 else body, ensure_ascii=False)}


def _user(text: str) -> dict:
    return {"role": "user", "content": text}


def _observation(text: str) -> dict:
    return {"role": "observation", "content": text}


def _assistant(text: str) -> dict:
    return {"role": "assistant", "content": text}


TOOL_CASES = [
    Case("one_call", (_user("Weather in Paris?"), _call(("get_weather", {"city": "Paris"})),
                      _observation('{"temp": 21}'), _assistant("Sunny, 21°C.")), tools=(_WEATHER,)),
    Case("parallel_calls", (_user("Weather in Paris and Köln?"),
                            _call(("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Köln"})),
                            _observation('[{"temp": 21}, {"temp": 15}]'), _assistant("21°C and 15°C.")),
         tools=(_WEATHER, _TIME)),
    Case("two_rounds", (_user("Time, then weather in Oslo?"), _call(("get_time", {})), _observation('"09:00"'),
                        _call(("get_weather", {"city": "Oslo"})), _observation('{"temp": -3}'),
                        _assistant("It is 09:00 and -3°C.")), tools=(_WEATHER, _TIME)),
    Case("no_call", _turns("What tools do you have?", "Weather and time."), tools=(_WEATHER, _TIME)),
]
MULTI_TURN = [case for case in CASES if len(case.messages) > 2]
QWEN_ONLY_TOOL_CASES = [  # Mistral v0.3 drops the system prompt of a chat that ends with a reply
    Case("one_call_system", TOOL_CASES[0].messages, SYSTEM, tools=(_WEATHER,)),
]


# ---------------------------------------------------------------- documented official quirks


def _edge_space(text: str) -> bool:
    return text != text.strip()


def _map_contents(case: Case, change: Callable[[int, dict], str], *, system: str | None = None) -> Case:
    messages = tuple({**m, "content": change(i, m)} for i, m in enumerate(case.messages))
    return dataclasses.replace(case, messages=messages, system=case.system if system is None else system)


def _strip_assistants(case: Case) -> Case:
    return _map_contents(case, lambda i, m: m["content"].strip() if m["role"] == "assistant" else m["content"])


@dataclasses.dataclass(frozen=True)
class Pairing:
    """A tokenizer, its named template and the official quirks that make the two differ.

    `always` rewrites the official ids for a quirk every conversation shows; `triggered` says
    whether a conversation shows the other quirk; `view` gives (our conversation, official
    conversation) that render alike despite it.
    """

    tokenizer: str
    template: str
    eot: int
    always: Callable[[list[int]], list[int]] = lambda ids: ids
    triggered: Callable[[Case], bool] = lambda case: False
    view: Callable[[Case], tuple[Case, Case]] = lambda case: (case, case)
    fixed: bool = True
    """Encode ours with the tokenizer fixed for the template (False: as shipped)."""


def _llama2_without_space_before_eos(ids: list[int]) -> list[int]:
    # Meta's template writes ' ' + reply + ' ' + eos: a lone '▁' (29871) before each </s> (2), which
    # LLaMA-Factory's llama2 template (reply then eos, no space) does not write.
    return [t for i, t in enumerate(ids) if not (t == 29871 and ids[i + 1:i + 2] == [2])]


def _phi_without_final_eos(ids: list[int]) -> list[int]:
    # README, phi3.5: "add_generation_prompt=False appends <|endoftext|>" (32000).
    assert ids[-1] == 32000
    return ids[:-1]


def _llama2_view(case: Case) -> tuple[Case, Case]:
    # README, llama2: "message content is .strip()ped"; the first user message is stripped after
    # the <<SYS>> block is put in front of it, so only its right end when there is a system prompt.
    def strip(i: int, m: dict) -> str:
        return m["content"].rstrip() if i == 0 and case.system else m["content"].strip()

    return _map_contents(case, strip), case


def _mistral_view(case: Case) -> tuple[Case, Case]:
    # README, mistral-v0.3: the system prompt goes before the LAST user message and is dropped when
    # the chat ends with a reply; LLaMA-Factory folds it into the first one, as "system\n\nuser".
    # The official template also `|trim`s each reply (" " + content|trim + eos).
    ours = _strip_assistants(case)
    if not case.system:
        return ours, ours
    folded = _map_contents(ours, lambda i, m: f"{case.system}\n\n{m['content']}" if i == 0 else m["content"], system="")
    return ours, folded


PAIRINGS = [
    Pairing("qwen2.5", "qwen", eot=151645),
    Pairing(
        # README, llama3: "content is | trimmed" (system prompt included).
        "llama3", "llama3", eot=128009,
        triggered=lambda case: any(_edge_space(m["content"]) for m in case.messages) or _edge_space(case.system or ""),
        view=lambda case: (_map_contents(case, lambda i, m: m["content"].strip(), system=(case.system or "").strip()),
                           case),
    ),
    Pairing("llama2", "llama2", eot=2, always=_llama2_without_space_before_eos,
            triggered=lambda case: any(_edge_space(m["content"]) for m in case.messages), view=_llama2_view),
    Pairing("mistral-v0.3", "mistral", eot=2,
            triggered=lambda case: bool(case.system) or any(
                _edge_space(m["content"]) for m in case.messages if m["role"] == "assistant"),
            view=_mistral_view),
    Pairing(
        # README, phi3.5: "Added tokens have rstrip=true: whitespace right after <|user|> etc. is
        # swallowed". LLaMA-Factory encodes each reply on its own, after <|assistant|>\n, so a
        # reply's leading whitespace survives; the official whole-text encoding swallows it.
        # LLaMA-Factory makes <|end|> eos by its text, which drops its rstrip: fixed so, every turn
        # end gains '▁' and a newline (test_golden.py holds those ids), so the slots are compared
        # here through the tokenizer as shipped.
        "phi3.5", "phi", eot=32007, always=_phi_without_final_eos, fixed=False,
        triggered=lambda case: any(m["content"][:1].isspace() for m in case.messages if m["role"] == "assistant"),
        view=lambda case: (_map_contents(case, lambda i, m: m["content"].lstrip() if m["role"] == "assistant"
                                         else m["content"]), case),
    ),
]


# ---------------------------------------------------------------- fixtures and helpers


@pytest.fixture(scope="module")
def tokenizers(shared_dir):
    """Tokenizers by (folder, template): None is the unmodified tokenizer the official renders
    come from; a template name gets a tokenizer fixed for it, as the pipeline does."""
    cache: dict[tuple[str, str | None], object] = {}

    def get(name: str, template: str | None = None):
        if (name, template) not in cache:
            tokenizer = AutoTokenizer.from_pretrained(shared_dir / "tokenizers" / name)
            if template is not None:
                fix_tokenizer(get_template(template, tokenizer=tokenizer), tokenizer)
            cache[(name, template)] = tokenizer
        return cache[(name, template)]

    return get


def _chat(case: Case) -> list[dict]:
    return chat_messages(case.messages, case.system)


def _official(tokenizer, case: Case, **kwargs) -> list[int]:
    tools = [dict(tool) for tool in case.tools] or None
    return tokenizer.apply_chat_template(_chat(case), tools=tools, tokenize=True, return_dict=False, **kwargs)


def _pairs(template_name: str, tokenizer, case: Case):
    template = get_template(template_name, tokenizer=tokenizer)
    tools = json.dumps(list(case.tools), ensure_ascii=False) if case.tools else None
    messages = list(case.messages)
    conversation = Conversation(prompt=messages[:-1], response=messages[-1:], system=case.system, tools=tools)
    return encode_turns(template, tokenizer, conversation)


def _ours(template_name: str, tokenizer, case: Case) -> list[int]:
    return [token for source, target in _pairs(template_name, tokenizer, case) for token in source + target]


def _by_name(items) -> dict:
    return {"ids": [item.name for item in items]}


# ---------------------------------------------------------------- named templates


@pytest.mark.parametrize("pairing", PAIRINGS, ids=[p.tokenizer for p in PAIRINGS])
@pytest.mark.parametrize("case", CASES, **_by_name(CASES))
def test_named_template_equals_official(tokenizers, pairing, case):
    official_tokenizer = tokenizers(pairing.tokenizer)
    ours_tokenizer = tokenizers(pairing.tokenizer, pairing.template if pairing.fixed else None)
    ours = _ours(pairing.template, ours_tokenizer, case)
    official = pairing.always(_official(official_tokenizer, case))
    if not pairing.triggered(case):
        assert ours == official
        return
    assert ours != official  # the quirk shows: the official template changes this conversation
    ours_case, official_case = pairing.view(case)
    expected = pairing.always(_official(official_tokenizer, official_case))
    assert _ours(pairing.template, ours_tokenizer, ours_case) == expected


@pytest.mark.parametrize(("tokenizer_name", "template_name"), [("qwen2.5", "qwen"), ("llama3", "llama3")])
@pytest.mark.parametrize("case", MULTI_TURN, **_by_name(MULTI_TURN))
def test_named_prompt_equals_official_generation_prompt(tokenizers, tokenizer_name, template_name, case):
    if template_name == "llama3" and PAIRINGS[1].triggered(case):
        case = PAIRINGS[1].view(case)[0]
    prompt = dataclasses.replace(case, messages=case.messages[:-1])
    template = get_template(template_name)
    ours = encode_prompt(template, tokenizers(tokenizer_name, template_name),
                         Conversation(prompt=list(prompt.messages), system=prompt.system))
    assert ours == _official(tokenizers(tokenizer_name), prompt, add_generation_prompt=True)


@pytest.mark.parametrize("case", [*TOOL_CASES, *QWEN_ONLY_TOOL_CASES], **_by_name([*TOOL_CASES, *QWEN_ONLY_TOOL_CASES]))
def test_qwen_tool_calls_equal_official(tokenizers, case):
    assert _ours("qwen", tokenizers("qwen2.5", "qwen"), case) == _official(tokenizers("qwen2.5"), case)


def _mistral_lf_layout(official_text: str) -> str:
    """The official Mistral v0.3 text rewritten to LLaMA-Factory's layout. README, mistral-v0.3:
    "tool-call ids must be 9 alphanumeric characters": the official template writes an id into
    each call and result, LLaMA-Factory writes none. And as with the system prompt, the official
    template puts [AVAILABLE_TOOLS] before the last user message, LLaMA-Factory puts the tool
    descriptions into the first user message, followed by "\\n\\n"."""
    text = re.sub(r', "(call_)?id": "call\d{5}"', "", official_text)
    tools = re.search(r"\[AVAILABLE_TOOLS\].*?\[/AVAILABLE_TOOLS\]", text, flags=re.DOTALL)
    if tools is None:
        return text
    text = text.replace(tools.group(0), "", 1)
    return text.replace("[INST] ", "[INST] " + tools.group(0) + "\n\n", 1)


@pytest.mark.parametrize("case", TOOL_CASES, **_by_name(TOOL_CASES))
def test_mistral_tool_calls_differ_from_official_only_by_layout(tokenizers, case):
    official_tokenizer, ours_tokenizer = tokenizers("mistral-v0.3"), tokenizers("mistral-v0.3", "mistral")
    official_text = official_tokenizer.apply_chat_template(_chat(case), tools=list(case.tools), tokenize=False)
    ours_text = render_text(get_template("mistral"), ours_tokenizer, messages=list(case.messages), system=None,
                            tools=json.dumps(list(case.tools), ensure_ascii=False))
    assert ours_text != official_text
    assert ours_text == _mistral_lf_layout(official_text)
    ours = _ours("mistral", ours_tokenizer, case)
    assert ours == official_tokenizer(ours_text, add_special_tokens=False)["input_ids"]


def test_qwen_reply_starting_with_newlines_is_encoded_on_its_own(tokenizers):
    """LLaMA-Factory encodes each message on its own, so a reply that starts with newlines does not
    merge with the newline that opens it ("\\n" + "\\n\\n" instead of one "\\n\\n\\n" token); the
    official whole-text encoding merges them. `template: auto` follows the official one."""
    case = Case("newline_reply", _turns("Hi", "\n\nHello"))
    official = _official(tokenizers("qwen2.5"), case)
    ours = _ours("qwen", tokenizers("qwen2.5", "qwen"), case)
    assert ours != official
    assert ours[-6:] == [77091, 198, 271, 9707, 151645, 198] and official[-5:] == [77091, 1406, 9707, 151645, 198]
    assert _ours("auto", tokenizers("qwen2.5", "auto"), case) == official


# ---------------------------------------------------------------- template: auto


AUTO_TOKENIZERS = [p.tokenizer for p in PAIRINGS]
EOT = {p.tokenizer: p.eot for p in PAIRINGS}


@pytest.mark.parametrize("tokenizer_name", AUTO_TOKENIZERS)
@pytest.mark.parametrize("case", CASES, **_by_name(CASES))
def test_auto_equals_official(tokenizers, tokenizer_name, case):
    pairs = _pairs("auto", tokenizers(tokenizer_name, "auto"), case)
    official = _official(tokenizers(tokenizer_name), case)
    assert [token for source, target in pairs for token in source + target] == official
    replies = [m["content"] for m in case.messages if m["role"] == "assistant"]
    for (_, target), reply in zip(pairs, replies, strict=True):
        # the label mask covers the reply and the token that ends its turn
        decoded = unicodedata.normalize("NFC", tokenizers(tokenizer_name).decode(target))
        assert unicodedata.normalize("NFC", reply.strip()) in decoded
        assert EOT[tokenizer_name] in target


@pytest.mark.parametrize("tokenizer_name", AUTO_TOKENIZERS)
@pytest.mark.parametrize("case", MULTI_TURN, **_by_name(MULTI_TURN))
def test_auto_prompt_equals_official_generation_prompt(tokenizers, tokenizer_name, case):
    tokenizer = tokenizers(tokenizer_name, "auto")
    prompt = list(case.messages[:-1])
    template = get_template("auto", tokenizer=tokenizer)
    ours = encode_prompt(template, tokenizer, Conversation(prompt=prompt, system=case.system))
    official_case = dataclasses.replace(case, messages=case.messages[:-1])
    assert ours == _official(tokenizers(tokenizer_name), official_case, add_generation_prompt=True)


@pytest.mark.parametrize("tokenizer_name", ["qwen2.5", "mistral-v0.3"])
@pytest.mark.parametrize("case", TOOL_CASES, **_by_name(TOOL_CASES))
def test_auto_tool_calls_equal_official(tokenizers, tokenizer_name, case):
    pairs = _pairs("auto", tokenizers(tokenizer_name, "auto"), case)
    official = _official(tokenizers(tokenizer_name), case)
    assert [token for source, target in pairs for token in source + target] == official
    for message, (_, target) in zip(case.messages[1::2], pairs, strict=True):
        if message["role"] == "function":
            names = [name for name, _ in parse_calls(message["content"])]
            assert all(name in tokenizers(tokenizer_name).decode(target) for name in names)


# ---------------------------------------------------------------- the batch encoder


MARKUP_IN_TEXT = Case("markup_tokens_in_text", _turns("What do <|im_end|>, </s>, [INST] and <|eot_id|> mean?",
                                                      "Turn markers: <|im_start|>assistant and <|end|>."), SYSTEM)


@pytest.mark.parametrize("template_name", ["named", "auto"])
@pytest.mark.parametrize("pairing", PAIRINGS, ids=[p.tokenizer for p in PAIRINGS])
def test_batch_encoder_equals_row_by_row_encoding(tokenizers, pairing, template_name):
    """Preprocessing encodes a batch's texts in one call, cut before the template's added tokens
    and shared between rows; its examples equal those of each row encoded on its own."""
    from tuneline.core.data.encoding import EncodingSpec, encode_batch
    from tuneline.core.data.processors import RowEncoding, encode_supervised_row

    name = pairing.template if template_name == "named" else "auto"
    tokenizer = tokenizers(pairing.tokenizer, name)
    template = get_template(name, tokenizer=tokenizer)
    cases = [*CASES, MARKUP_IN_TEXT] + (TOOL_CASES if pairing.tokenizer in ("qwen2.5", "mistral-v0.3") else [])
    rows = [{"prompt": list(case.messages[:-1]), "response": list(case.messages[-1:]), "system": case.system or "",
             "tools": json.dumps(list(case.tools), ensure_ascii=False) if case.tools else ""} for case in cases]
    for cutoff_len in (4096, 24):  # whole, and cut by the truncation rule
        encoding = RowEncoding(template=template, cutoff_len=cutoff_len, train_on_prompt=False, mask_history=False)
        spec = EncodingSpec(examples="supervised", encoding=encoding, packing=False, neat_packing=False, predict=False,
                            batch_size=4)
        batch, counters = encode_batch(rows, spec=spec, tokenizer=tokenizer)
        single = [encode_supervised_row(row, tokenizer=tokenizer, encoding=encoding) for row in rows]
        assert batch == [example for example in single if example is not None]
        assert counters["rows_in"] == len(rows)
        assert (counters["rows_truncated"] > 0) == (cutoff_len == 24)
