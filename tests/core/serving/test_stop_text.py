"""An answer's text as the server streams it: decoded a few tokens at a time into exactly the text the
whole ids decode to (byte-level and byte-fallback tokenizers alike), and cut at the first stop string,
with the work per token bounded however long the answer grows."""

from __future__ import annotations

import pytest

from tuneline.core.serving.stop_text import IncrementalDecoder, StopText

TEXT = "Hello wörld — 中文字符 and emojis 😀👍🏽, spaces   and\nnewlines. "


@pytest.mark.parametrize("name", ["gpt2", "llama2"])  # byte-level BPE; SentencePiece with byte fallback
def test_pieces_add_up_to_the_whole_decode_and_each_decode_reads_a_few_tokens(load, name: str):
    tokenizer = load(name)
    ids = tokenizer(TEXT * 30, add_special_tokens=False)["input_ids"]
    decoded: list[int] = []

    def decode(window: list[int]) -> str:
        decoded.append(len(window))
        return tokenizer.decode(window, skip_special_tokens=True)

    pieces = IncrementalDecoder(decode)
    text = [pieces.push(token) for token in ids]
    assert "".join(text) == tokenizer.decode(ids, skip_special_tokens=True)
    assert sum(1 for piece in text if piece) > len(ids) // 2  # it streams: most tokens hand out text at once
    # never the whole answer again: each decode reads a bounded window, so the work grows with the length
    assert len(ids) > 1000 and max(decoded) <= IncrementalDecoder.WINDOW + IncrementalDecoder.BYTES
    assert sum(decoded) <= 2 * (IncrementalDecoder.WINDOW + 1) * len(ids)


def test_bytes_that_make_no_character_are_handed_out_after_a_few_tokens(load):
    tokenizer = load("gpt2")
    continuation = tokenizer.convert_tokens_to_ids("\u00a9")  # the byte 0xA9 alone: never a character's start
    pieces = IncrementalDecoder(tokenizer.decode)
    text = [pieces.push(token) for token in [continuation] * 12]
    assert text[:3] == ["", "", ""] and "".join(text) == "\ufffd" * 9  # the last three wait for a possible character
    letter = tokenizer.convert_tokens_to_ids("a")
    assert "".join(text) + pieces.push(letter) == tokenizer.decode([continuation] * 12 + [letter])


@pytest.mark.parametrize("pieces", [["Hello wo", "rld. END of", " it"], ["Hel", "lo world.", " E", "ND"],
                                    ["Hello world. END"], list("Hello world. END and more")])
def test_streamed_text_is_cut_where_the_whole_answer_is(pieces: list[str]):
    sent: list[str] = []
    text = StopText(["END", "never", "world. EX"], sent.append)
    stopped = [text.feed(piece) for piece in pieces]
    ends = next(i for i in range(len(pieces)) if "END" in "".join(pieces[:i + 1]))
    assert stopped == [False] * ends + [True] * (len(pieces) - ends)  # from the piece that completes it on
    assert "".join(sent) == "Hello world. " == text.finish("".join(pieces))
    assert "E" not in "".join(sent)  # held back while it could begin END


def test_held_back_text_stays_shorter_than_the_longest_stop_string():
    sent: list[str] = []
    text = StopText(["<|stop|>", "xyz"], sent.append)
    for _ in range(5000):  # a long answer ending, again and again, in what could begin a stop string
        assert not text.feed("ab<|st")
        assert len(text.held) < len("<|stop|>")
    answer = "ab<|st" * 4999 + "ab"
    assert text.feed("op|> tail") and "".join(sent) == answer
    assert text.finish("ignored: the stop string was found") == answer


def test_finish_cuts_the_whole_decode_when_the_pieces_held_a_stop_string_back():
    sent: list[str] = []
    text = StopText(["STOP"], sent.append)
    text.feed("one two ST")
    assert "".join(sent) == "one two "
    assert text.finish("one two STOP three") == "one two " and text.stopped
