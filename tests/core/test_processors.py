"""Supervised and pretraining processors: labels, per-turn truncation, packing into blocks."""

from __future__ import annotations

import dataclasses

import pytest
from transformers import AutoTokenizer

from tuneline.core.data.processors import (
    IGNORE_INDEX,
    encode_pretrain_texts,
    encode_supervised_row,
    infer_seqlen,
)
from tuneline.core.errors import ConfigError, DataError
from tuneline.core.templates import fix_tokenizer, get_template

M = IGNORE_INDEX


@pytest.fixture(scope="module")
def gpt2(shared_dir):
    """gpt2 after fix_tokenizer for the `default`/`empty` templates (pad = eos = 50256)."""
    tokenizer = AutoTokenizer.from_pretrained(shared_dir / "tokenizers" / "gpt2")
    fix_tokenizer(get_template("default"), tokenizer)
    return tokenizer


@pytest.fixture(scope="module")
def llama3(shared_dir):
    tokenizer = AutoTokenizer.from_pretrained(shared_dir / "tokenizers" / "llama3")
    fix_tokenizer(get_template("llama3"), tokenizer)
    return tokenizer


def _words(letter: str, n: int) -> str:
    """`n` gpt2 tokens: 'a a a' is ['a', ' a', ' a']."""
    return letter + f" {letter}" * (n - 1)


def _row(*turns: tuple[str, str], system: str = "") -> dict:
    """A standard row from (user, assistant) pairs."""
    prompt = []
    for user, assistant in turns[:-1]:
        prompt += [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]
    prompt.append({"role": "user", "content": turns[-1][0]})
    response = [{"role": "assistant", "content": turns[-1][1]}]
    return {"prompt": prompt, "response": response, "system": system, "tools": ""}


def _encode(row: dict, tokenizer, *, template: str = "default", cutoff_len: int = 1024, **options):
    return encode_supervised_row(
        row, template=get_template(template), tokenizer=tokenizer, cutoff_len=cutoff_len, **options
    )


def _pretrain(texts: list[str], tokenizer, *, template: str, cutoff_len: int) -> list[dict]:
    template_value = get_template(template)
    return encode_pretrain_texts(texts, tokenizer=tokenizer, template=template_value, cutoff_len=cutoff_len)


def _ids(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


# ---------------------------------------------------------------- infer_seqlen


@pytest.mark.parametrize(
    ("source_len", "target_len", "cutoff_len", "expected"),
    [
        (10, 20, 100, (10, 20)),  # both fit
        (100, 20, 50, (30, 20)),  # target < half: keep it, cut the source to 50 - 20
        (20, 100, 50, (20, 30)),  # source < half: keep it, cut the target to 50 - 20
        (60, 40, 50, (30, 20)),  # both long: target gets int(50 * 40/100) = 20
        (30, 70, 33, (10, 23)),  # int(33 * 0.7) = int(23.1) = 23, source gets the other 10
        (25, 25, 50, (25, 25)),  # exactly half each: proportional, int(50 * 0.5) = 25
        (25, 100, 50, (10, 40)),  # source exactly half is not "under half": int(50 * 100/125) = 40
        (100, 25, 50, (40, 10)),  # target exactly half likewise: int(50 * 25/125) = 10
        (5, 5, 1, (1, 0)),  # int(1 * 0.5) = 0: the one token left goes to the source
        (7, 3, 0, (0, 0)),
    ],
)
def test_infer_seqlen_hand_computed(source_len, target_len, cutoff_len, expected):
    assert infer_seqlen(source_len, target_len, cutoff_len) == expected


# ---------------------------------------------------------------- labels


def test_labels_mask_prompt_and_keep_response_with_eos(gpt2):
    row = _row(("Hi", "Hello"))
    encoded = _encode(row, gpt2)
    source = [20490, 25, 15902, 50256, 198, 48902, 25]  # "Human: Hi" <eos> "\nAssistant:"
    target = [15496, 50256, 198]  # "Hello" <eos> "\n"
    assert encoded == {
        "input_ids": source + target,
        "attention_mask": [1] * 10,
        "labels": [M] * 7 + target,
    }


def test_every_assistant_turn_is_trained(gpt2):
    row = _row(("Hi", "Hello"), ("Bye", "Ciao"), system="Be nice.")
    encoded = _encode(row, gpt2)
    trained = [t for t in encoded["labels"] if t != M]
    assert gpt2.decode(trained) == "Hello<|endoftext|>\nCiao<|endoftext|>\n"
    assert gpt2.decode(encoded["input_ids"]) == (
        "System: Be nice.<|endoftext|>\nHuman: Hi<|endoftext|>\nAssistant:Hello<|endoftext|>\n"
        "Human: Bye<|endoftext|>\nAssistant:Ciao<|endoftext|>\n"
    )


def test_train_on_prompt_trains_everything(gpt2):
    encoded = _encode(_row(("Hi", "Hello")), gpt2, train_on_prompt=True)
    assert encoded["labels"] == encoded["input_ids"]


def test_mask_history_trains_only_the_last_turn(gpt2):
    row = _row(("Hi", "Hello"), ("Bye", "Ciao"))
    encoded = _encode(row, gpt2, mask_history=True)
    assert gpt2.decode([t for t in encoded["labels"] if t != M]) == "Ciao<|endoftext|>\n"
    plain = _encode(row, gpt2)
    assert encoded["input_ids"] == plain["input_ids"]


def test_efficient_eos_trains_the_turn_end_on_the_next_source(gpt2):
    template = dataclasses.replace(get_template("empty"), name="empty_eos", efficient_eos=True)
    row = _row((_words("a", 3), _words("b", 2)), (_words("c", 4), _words("d", 2)))
    encoded = encode_supervised_row(row, template=template, tokenizer=gpt2, cutoff_len=1024)
    a, b, c, d = (_ids(gpt2, _words(x, n)) for x, n in (("a", 3), ("b", 2), ("c", 4), ("d", 2)))
    assert encoded["input_ids"] == a + b + c + d + [50256]
    assert encoded["labels"] == [M] * 3 + b + [50256, M, M, M] + d + [50256]
    with pytest.raises(ConfigError, match="train_on_prompt"):
        encode_supervised_row(row, template=template, tokenizer=gpt2, cutoff_len=1024, train_on_prompt=True)


# ---------------------------------------------------------------- truncation (BEHAVIOUR.md §4)


def test_single_turn_cut_in_proportion(gpt2):
    src, tgt = _words("a", 60), _words("b", 40)
    encoded = _encode(_row((src, tgt)), gpt2, template="empty", cutoff_len=50)
    # infer_seqlen(60, 40, 50) == (30, 20)
    assert encoded["input_ids"] == _ids(gpt2, src)[:30] + _ids(gpt2, tgt)[:20]
    assert encoded["labels"] == [M] * 30 + _ids(gpt2, tgt)[:20]


THREE_TURNS = (
    (_words("a", 10), _words("b", 10)),
    (_words("c", 60), _words("d", 40)),
    (_words("e", 5), _words("f", 5)),
)


def test_budget_runs_out_and_later_turns_are_dropped(gpt2):
    encoded = _encode(_row(*THREE_TURNS), gpt2, template="empty", cutoff_len=50)
    a, b, c, d = (_ids(gpt2, text) for text in (*THREE_TURNS[0], *THREE_TURNS[1]))
    # turn 1: (10, 10) fits, 30 left; turn 2: infer_seqlen(60, 40, 30) = (18, 12); turn 3: no budget
    assert infer_seqlen(60, 40, 30) == (18, 12)
    assert encoded["input_ids"] == a + b + c[:18] + d[:12]
    assert encoded["labels"] == [M] * 10 + b + [M] * 18 + d[:12]
    assert len(encoded["input_ids"]) == 50


def test_mask_history_keeps_the_last_turns(gpt2):
    encoded = _encode(_row(*THREE_TURNS), gpt2, template="empty", cutoff_len=50, mask_history=True)
    c, d, e, f = (_ids(gpt2, text) for text in (*THREE_TURNS[1], *THREE_TURNS[2]))
    # last-first: turn 3 (5, 5) fits, 40 left; turn 2: infer_seqlen(60, 40, 40) = (24, 16); turn 1 dropped
    assert infer_seqlen(60, 40, 40) == (24, 16)
    assert encoded["input_ids"] == c[:24] + d[:16] + e + f
    assert encoded["labels"] == [M] * 45 + f


def test_nothing_trainable_left_gives_none(gpt2):
    row = _row((_words("a", 5), _words("b", 5)))
    assert _encode(row, gpt2, template="empty", cutoff_len=1) is None


@pytest.mark.parametrize(
    "row",
    [
        {"prompt": [{"role": "user", "content": "x"}], "response": [], "system": "", "tools": ""},
        {"prompt": [], "response": [{"role": "assistant", "content": "y"}], "system": "", "tools": ""},
        {"prompt": [{"role": "assistant", "content": "x"}], "response": [{"role": "user", "content": "y"}]},
    ],
)
def test_invalid_rows_are_reported(gpt2, row):
    with pytest.raises(DataError):
        _encode(row, gpt2, cutoff_len=64)


# ---------------------------------------------------------------- pretraining (BEHAVIOUR.md §7)


def test_pretrain_appends_eos_concatenates_and_drops_the_tail(gpt2):
    blocks = _pretrain(["hello world", "foo bar baz"], gpt2, template="default", cutoff_len=3)
    # stream: [31373, 995, 50256, 21943, 2318, 275, 1031, 50256]; the last 2 do not fill a block
    assert [b["input_ids"] for b in blocks] == [[31373, 995, 50256], [21943, 2318, 275]]
    assert all(b["labels"] == b["input_ids"] and b["attention_mask"] == [1, 1, 1] for b in blocks)
    assert _pretrain(["hello"], gpt2, template="default", cutoff_len=3) == []


def test_pretrain_llama3_uses_end_of_text_and_writes_bos(llama3):
    blocks = _pretrain(["hello world", "foo bar baz"], llama3, template="llama3", cutoff_len=3)
    # stream: [15339, 1917, 128001, 8134, 3703, 51347, 128001]; BOS 128000 overwrites each block's first token
    assert llama3.eos_token == "<|eot_id|>"
    assert [b["input_ids"] for b in blocks] == [[128000, 1917, 128001], [128000, 3703, 51347]]
    assert [b["labels"] for b in blocks] == [b["input_ids"] for b in blocks]

