"""Processors: supervised labels and per-turn truncation, pairwise, unsupervised and KTO
examples, pretraining blocks. Expectations are computed by hand from the rules in BEHAVIOUR.md."""

from __future__ import annotations

import copy
import dataclasses

import pytest
from transformers import AutoTokenizer

from tuneline.core.data.processors import (
    IGNORE_INDEX,
    RowEncoding,
    encode_feedback_rows,
    encode_pairwise_row,
    encode_pretrain_texts,
    encode_supervised_row,
    encode_unsupervised_row,
    infer_seqlen,
)
from tuneline.core.errors import ConfigError, DataError
from tuneline.core.templates.conversation import fix_tokenizer, get_template

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
    return encode_supervised_row(row, tokenizer=tokenizer,
                                 encoding=RowEncoding(template=get_template(template), cutoff_len=cutoff_len, **options))


def _pretrain(texts: list[str], tokenizer, *, template: str, cutoff_len: int, **options) -> list[dict]:
    template_value = get_template(template)
    return encode_pretrain_texts(texts, tokenizer=tokenizer, template=template_value, cutoff_len=cutoff_len, **options)


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
    encoded = encode_supervised_row(row, tokenizer=gpt2, encoding=RowEncoding(template=template, cutoff_len=1024))
    a, b, c, d = (_ids(gpt2, _words(x, n)) for x, n in (("a", 3), ("b", 2), ("c", 4), ("d", 2)))
    assert encoded["input_ids"] == a + b + c + d + [50256]
    assert encoded["labels"] == [M] * 3 + b + [50256, M, M, M] + d + [50256]
    with pytest.raises(ConfigError, match="train_on_prompt"):
        encode_supervised_row(row, tokenizer=gpt2, encoding=RowEncoding(template=template, cutoff_len=1024,
                                                                        train_on_prompt=True))


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


def test_pretrain_llama3_uses_end_of_text_and_writes_bos_only_when_the_flag_says_so(llama3):
    blocks = _pretrain(["hello world", "foo bar baz"], llama3, template="llama3", cutoff_len=3)
    # stream: [15339, 1917, 128001, 8134, 3703, 51347, 128001]; LLaMA-Factory reads add_bos_token,
    # which transformers 5 reports False for this tokenizer.json although encoding adds BOS
    assert llama3.eos_token == "<|eot_id|>" and llama3.add_bos_token is False
    assert [b["input_ids"] for b in blocks] == [[15339, 1917, 128001], [8134, 3703, 51347]]
    assert [b["labels"] for b in blocks] == [b["input_ids"] for b in blocks]
    flagged = copy.deepcopy(llama3)
    flagged.add_bos_token = True  # BOS 128000 overwrites each block's first token
    blocks = _pretrain(["hello world", "foo bar baz"], flagged, template="llama3", cutoff_len=3)
    assert [b["input_ids"] for b in blocks] == [[128000, 1917, 128001], [128000, 3703, 51347]]


def test_pretrain_explicit_packing_gives_blocks_one_shorter(gpt2):
    blocks = _pretrain(["hello world", "foo bar baz"], gpt2, template="default", cutoff_len=3, packing=True)
    # LLaMA-Factory cuts cutoff_len by one when packing is set: blocks of 2 from the 8-token stream
    assert [b["input_ids"] for b in blocks] == [[31373, 995], [50256, 21943], [2318, 275], [1031, 50256]]
    with pytest.raises(ConfigError, match="cutoff_len"):
        _pretrain(["hello"], gpt2, template="default", cutoff_len=1, packing=True)


def test_pretrain_blocks_stay_within_a_batch_of_rows(gpt2):
    texts = ["hello world", "foo bar baz"]
    # one row per batch: [31373, 995, 50256] gives one block of 2, its last token dropped
    blocks = _pretrain(texts, gpt2, template="default", cutoff_len=2, batch_size=1)
    assert [b["input_ids"] for b in blocks] == [[31373, 995], [21943, 2318], [275, 1031]]
    together = _pretrain(texts, gpt2, template="default", cutoff_len=2)
    assert [b["input_ids"] for b in together] == [[31373, 995], [50256, 21943], [2318, 275], [1031, 50256]]


def test_pretrain_without_packing_cuts_each_document(gpt2, llama3):
    blocks = _pretrain(["hello world", "foo bar baz"], gpt2, template="default", cutoff_len=4, packing=False)
    assert [b["input_ids"] for b in blocks] == [[31373, 995, 50256], [21943, 2318, 275, 1031]]
    assert [b["labels"] for b in blocks] == [b["input_ids"] for b in blocks]
    # with add_bos_token the BOS text goes in front, then the document is cut to cutoff_len
    flagged = copy.deepcopy(llama3)
    flagged.add_bos_token = True
    blocks = _pretrain(["hello world"], flagged, template="llama3", cutoff_len=3, packing=False)
    assert [b["input_ids"] for b in blocks] == [[128000, 15339, 1917]]
    blocks = _pretrain(["hello world"], llama3, template="llama3", cutoff_len=8, packing=False)
    assert [b["input_ids"] for b in blocks] == [[15339, 1917, 128001]]


# ---------------------------------------------------------------- pairwise (BEHAVIOUR.md §4)


def _pair(prompt: str, chosen: str, rejected: str, *, history: tuple[str, str] | None = None) -> dict:
    messages = []
    if history:
        messages = [{"role": "user", "content": history[0]}, {"role": "assistant", "content": history[1]}]
    return {
        "prompt": [*messages, {"role": "user", "content": prompt}],
        "response": [{"role": "assistant", "content": chosen}, {"role": "assistant", "content": rejected}],
        "system": "",
        "tools": "",
    }


def _pairwise(row: dict, tokenizer, *, template: str = "empty", cutoff_len: int = 1024):
    return encode_pairwise_row(row, tokenizer=tokenizer, encoding=RowEncoding(template=get_template(template),
                                                                             cutoff_len=cutoff_len))


def test_pairwise_labels_mask_the_prompt(gpt2):
    encoded = _pairwise(_pair("Hi", "Hello", "Bye"), gpt2, template="default")
    prompt = [20490, 25, 15902, 50256, 198, 48902, 25]  # "Human: Hi" <eos> "\nAssistant:"
    chosen, rejected = [15496, 50256, 198], [3886, 68, 50256, 198]  # "Hello"/"Bye" <eos> "\n"
    assert encoded == {
        "chosen_input_ids": prompt + chosen,
        "chosen_attention_mask": [1] * 10,
        "chosen_labels": [M] * 7 + chosen,
        "rejected_input_ids": prompt + rejected,
        "rejected_attention_mask": [1] * 11,
        "rejected_labels": [M] * 7 + rejected,
    }


def test_pairwise_earlier_turns_are_prompt(gpt2):
    row = _pair("Bye", "Ciao", "No", history=("Hi", "Hello"))
    encoded = _pairwise(row, gpt2, template="default")
    supervised = _encode(_row(("Hi", "Hello"), ("Bye", "Ciao")), gpt2)
    assert encoded["chosen_input_ids"] == supervised["input_ids"]
    # unlike SFT, the earlier reply "Hello" is not trained: only the last reply is
    assert gpt2.decode([t for t in encoded["chosen_labels"] if t != M]) == "Ciao<|endoftext|>\n"
    assert gpt2.decode([t for t in encoded["rejected_labels"] if t != M]) == "No<|endoftext|>\n"


def test_pairwise_one_split_against_the_longer_reply(gpt2):
    a, b, c = _ids(gpt2, _words("a", 60)), _ids(gpt2, _words("b", 40)), _ids(gpt2, _words("c", 30))
    encoded = _pairwise(_pair(_words("a", 60), _words("b", 40), _words("c", 30)), gpt2, cutoff_len=50)
    # infer_seqlen(60, max(40, 30), 50) = (30, 20): both replies are cut to 20
    assert encoded["chosen_input_ids"] == a[:30] + b[:20]
    assert encoded["rejected_input_ids"] == a[:30] + c[:20]
    assert encoded["rejected_labels"] == [M] * 30 + c[:20]


def test_pairwise_longer_rejected_reply_sets_the_split(gpt2):
    a, b, c = _ids(gpt2, _words("a", 10)), _ids(gpt2, _words("b", 5)), _ids(gpt2, _words("c", 45))
    encoded = _pairwise(_pair(_words("a", 10), _words("b", 5), _words("c", 45)), gpt2, cutoff_len=40)
    # infer_seqlen(10, 45, 40): the source is under half, so the replies get 40 - 10 = 30
    assert infer_seqlen(10, 45, 40) == (10, 30)
    assert encoded["chosen_input_ids"] == a + b
    assert encoded["rejected_input_ids"] == a + c[:30]
    assert encoded["rejected_labels"] == [M] * 10 + c[:30]


def test_pairwise_rows_need_two_replies(gpt2):
    row = _pair("Hi", "Hello", "Bye")
    row["response"] = row["response"][:1]
    with pytest.raises(DataError, match="chosen, rejected"):
        _pairwise(row, gpt2)
    assert _pairwise(_pair(_words("a", 5), "b", "c"), gpt2, cutoff_len=1) is None


# ---------------------------------------------------------------- unsupervised (prediction)


def _unsupervised(row: dict, tokenizer, *, template: str = "default", cutoff_len: int = 1024):
    return encode_unsupervised_row(row, tokenizer=tokenizer, encoding=RowEncoding(template=get_template(template),
                                                                                 cutoff_len=cutoff_len))


def test_unsupervised_gives_the_prompt_and_the_reply_as_labels(gpt2):
    encoded = _unsupervised(_row(("Hi", "Hello")), gpt2)
    assert encoded == {
        "input_ids": [20490, 25, 15902, 50256, 198, 48902, 25],
        "attention_mask": [1] * 7,
        "labels": [15496, 50256, 198],
    }


def test_unsupervised_without_a_single_reply_uses_an_empty_one(gpt2):
    no_reply = {**_row(("Hi", "Hello")), "response": []}
    assert _unsupervised(no_reply, gpt2)["labels"] == [50256, 198]  # "" <eos> "\n"
    pair = _pair("Hi", "Hello", "Bye")
    assert _unsupervised(pair, gpt2) == _unsupervised(no_reply, gpt2)


def test_unsupervised_cuts_prompt_and_reply_together(gpt2):
    a, b = _ids(gpt2, _words("a", 60)), _ids(gpt2, _words("b", 40))
    encoded = _unsupervised(_row((_words("a", 60), _words("b", 40))), gpt2, template="empty", cutoff_len=50)
    assert encoded == {"input_ids": a[:30], "attention_mask": [1] * 30, "labels": b[:20]}


# ---------------------------------------------------------------- feedback (KTO)


def _feedback(prompt: str, reply: str, tag: bool) -> dict:
    return {**_row((prompt, reply)), "kto_tag": tag}


def _kto(rows: list[dict], tokenizer, *, template: str = "empty", cutoff_len: int = 1024, **options):
    encoding = RowEncoding(template=get_template(template), cutoff_len=cutoff_len)
    return encode_feedback_rows(rows, tokenizer=tokenizer, encoding=encoding, **options)


KTO_ROWS = (("Hi", "Hello", True), ("Bye", "Ciao", False), ("Yes", "Sure", True))


def test_kto_pairs_each_prompt_with_the_previous_rows_reply(gpt2):
    encoded = _kto([_feedback(*row) for row in KTO_ROWS], gpt2)
    hi, bye, yes = ([17250], [3886, 68], [5297])
    hello, ciao, sure = ([15496], [34, 13481], [19457])
    assert [e["input_ids"] for e in encoded] == [hi + hello, bye + ciao, yes + sure]
    assert [e["labels"] for e in encoded] == [[M] + hello, [M, M] + ciao, [M] + sure]
    assert [e["kto_tags"] for e in encoded] == [True, False, True]
    # replies rotated by one: row 0 takes the last row's reply, row i the reply of row i - 1
    assert [e["kl_input_ids"] for e in encoded] == [hi + sure, bye + hello, yes + ciao]
    assert [e["kl_labels"] for e in encoded] == [[M] + sure, [M, M] + hello, [M] + ciao]
    assert [e["kl_attention_mask"] for e in encoded] == [[1, 1], [1, 1, 1], [1, 1, 1]]


def test_kto_rotation_stays_within_a_batch(gpt2):
    encoded = _kto([_feedback(*row) for row in KTO_ROWS], gpt2, batch_size=2)
    # batches [row 0, row 1] and [row 2]: row 2 is alone, so it is paired with its own reply
    assert [e["kl_input_ids"] for e in encoded] == [[17250, 34, 13481], [3886, 68, 15496], [5297, 19457]]


def test_kto_cuts_the_kl_example_on_its_own(gpt2):
    a, b, c = (_ids(gpt2, _words(x, n)) for x, n in (("a", 60), ("b", 40), ("c", 10)))
    rows = [_feedback(_words("a", 60), _words("b", 40), True), _feedback(_words("a", 60), _words("c", 10), False)]
    first, second = _kto(rows, gpt2, cutoff_len=50)
    # own example: infer_seqlen(60, 40, 50) = (30, 20); kl example: infer_seqlen(60, 10, 50) = (40, 10)
    assert first["input_ids"] == a[:30] + b[:20]
    assert first["kl_input_ids"] == a[:40] + c
    assert second["input_ids"] == a[:40] + c
    assert second["kl_input_ids"] == a[:30] + b[:20]


def test_kto_empty_reply_is_undesired_and_bad_rows_are_reported(gpt2):
    (encoded,) = _kto([_feedback("Hi", "", True)], gpt2, template="default")
    assert encoded["labels"][-2:] == [50256, 198] and encoded["kto_tags"] is False
    with pytest.raises(DataError, match="kto_tag"):
        _kto([{**_row(("Hi", "Hello")), "kto_tag": "yes"}], gpt2)
    assert _kto([_feedback(_words("a", 5), "b", True)], gpt2, cutoff_len=1) == [None]


def test_pairwise_with_a_reasoning_template_drops_earlier_thoughts(shared_dir):
    from transformers import AutoTokenizer

    from tuneline.core.data.processors import encode_pairwise_row
    from tuneline.core.templates.conversation import fix_tokenizer, get_template

    tokenizer = AutoTokenizer.from_pretrained(shared_dir / "tokenizers/qwen2.5")
    template = get_template("qwen3")
    fix_tokenizer(template, tokenizer)
    row = {
        "prompt": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "<think>\nsecret\n</think>\n\nb"},
                   {"role": "user", "content": "c"}],
        "response": [{"role": "assistant", "content": "d"}, {"role": "assistant", "content": "e"}],
        "system": "", "tools": "",
    }
    example = encode_pairwise_row(row, tokenizer=tokenizer, encoding=RowEncoding(template=template, cutoff_len=256))
    chosen = tokenizer.decode(example["chosen_input_ids"])
    assert "secret" not in chosen and "assistant\nb<|im_end|>" in chosen
    trained = [t for t, label in zip(example["chosen_input_ids"], example["chosen_labels"]) if label != -100]
    assert tokenizer.decode(trained) == "<think>\n\n</think>\n\nd<|im_end|>\n"
