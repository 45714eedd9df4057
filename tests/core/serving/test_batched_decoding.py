"""Concurrent requests decoded together by the served engine on the tiny base: every answer has the tokens
the model's own generate() gives its prompt alone (chatml, greedy, repetition penalty 3.0), while rows of
mixed lengths join a running batch and leave it at different steps; a cancelled row leaves at the next
step and the others finish unchanged; sampling rows decode too; max_tokens is bounded by the context."""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path

import pytest

from tuneline.core.config import GeneratingConfig
from tuneline.core.serving.backends import Answer, Cancelled
from tuneline.core.serving.protocol import RequestError, parse_chat_request

pytestmark = pytest.mark.slow

GREEDY = GeneratingConfig(max_new_tokens=12, do_sample=False, repetition_penalty=3.0)
WORDS = ("the model reads every token of the prompt before it writes a word of its answer and some prompts are "
         "much longer than others").split()


def load(tiny_base: Path, *, max_batch: int, queue_size: int = 64):
    from tuneline.core.inference.chat import ModelSource
    from tuneline.core.serving.engine import load_engine
    from tuneline.core.serving.sources import ServedModel

    served = ServedModel(ModelSource(str(tiny_base), None, str(tiny_base)), name="tiny", template="chatml", generating=GREEDY)
    return load_engine(served, max_batch=max_batch, queue_size=queue_size)


@pytest.fixture(scope="module")
def engine(tiny_base: Path):
    engine = load(tiny_base, max_batch=5)
    yield engine
    engine.close()


def request(words: int, **settings):
    """A conversation whose last message is `words` words long (its prompt grows with it)."""
    body = {"messages": [{"role": "user", "content": " ".join(WORDS[i % len(WORDS)] for i in range(words))}], **settings}
    import json

    return parse_chat_request(json.dumps(body).encode())


def alone(engine, prepared) -> tuple[str, int, str]:
    """generate() on the prompt alone: (text, tokens, finish reason), as the served answer reports them."""
    import torch

    from tuneline.core.evaluation.predict import generation_kwargs

    kwargs = generation_kwargs(prepared.generating, engine.tokenizer, engine.model)
    ids = torch.tensor([prepared.prompt])
    with torch.no_grad():
        output = engine.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), **kwargs)
    new = output[0, len(prepared.prompt):].tolist()
    ended = len(new) < prepared.generating.max_new_tokens or new[-1] in kwargs["eos_token_id"]
    return engine.tokenizer.decode(new, skip_special_tokens=True), len(new), "stop" if ended else "length"


def submit_all(engine, prepared: list, **callbacks) -> list[Answer | BaseException]:
    """Submit every request before any ends; wait for all."""
    outcomes: list[Answer | BaseException | None] = [None] * len(prepared)
    ended = [threading.Event() for _ in prepared]
    for i, one in enumerate(prepared):
        def done(outcome, i=i):
            outcomes[i] = outcome
            ended[i].set()
        engine.submit(one, write=callbacks.get("write", {}).get(i, lambda _: None), done=done)
    assert all(event.wait(120) for event in ended)
    return outcomes


def test_concurrent_answers_are_the_tokens_generate_gives_each_prompt_alone(engine):
    lengths = [1, 30, 4, 17, 2, 60, 9, 23, 3, 45, 12, 6, 38, 1, 27, 14]  # words; budgets differ, so rows end apart
    # a budget of 1 ends a row at the token its prefill chooses, while others read with it go on
    prepared = [engine.prepare(request(words, max_tokens=1 if i % 5 == 2 else 6 + i % 7)) for i, words in enumerate(lengths)]
    assert len({len(p.prompt) for p in prepared}) >= 12
    batch_sizes: list[int] = []

    def watch(_: str) -> None:  # called on the decoding thread, inside a step
        batch_sizes.append(len(engine.scheduler.decoder.rows))

    answers = submit_all(engine, prepared, write=dict.fromkeys(range(len(prepared)), watch))
    assert [(a.text, a.completion_tokens, a.finish_reason) for a in answers] == [alone(engine, p) for p in prepared]
    assert [a.prompt_tokens for a in answers] == [len(p.prompt) for p in prepared]
    assert max(batch_sizes) == 5  # the rows were decoded together, as many as the batch holds


def test_a_cancelled_row_leaves_and_the_others_finish_unchanged(engine):
    prepared = [engine.prepare(request(words, max_tokens=10)) for words in (3, 20, 8, 40)]
    long = dataclasses.replace(prepared[1], generating=dataclasses.replace(prepared[1].generating, max_new_tokens=900))
    pieces: list[str] = []
    tickets: list = []

    def cancel_after_three(piece: str) -> None:
        pieces.append(piece)
        if len(pieces) == 3:
            engine.cancel(tickets[0])

    ended = threading.Event()
    tickets.extend(engine.submit(long, write=cancel_after_three, done=lambda outcome: (pieces.append(outcome), ended.set())))
    others = submit_all(engine, prepared)
    assert ended.wait(60) and isinstance(pieces[-1], Cancelled)
    assert len(pieces) <= 5  # at most the step it was cancelled in wrote more, of the 900 tokens it could
    assert [(a.text, a.completion_tokens, a.finish_reason) for a in others] == [alone(engine, p) for p in prepared]
    assert engine.scheduler.decoder.rows == [] and engine.scheduler.waiting == 0


def test_sampling_rows_decode_in_the_batch_with_their_own_draws(engine):
    import torch

    torch.manual_seed(0)
    greedy = engine.prepare(request(10, max_tokens=12))
    sampled = [engine.prepare(request(10, max_tokens=12, do_sample=True, temperature=1.0, top_p=1.0)) for _ in range(4)]
    assert all(p.generating.do_sample for p in sampled)
    answers = submit_all(engine, [greedy, *sampled])
    assert (answers[0].text, answers[0].completion_tokens, answers[0].finish_reason) == alone(engine, greedy)
    texts = {a.text for a in answers[1:]}
    assert len(texts) > 1 and answers[0].text not in texts  # near-uniform draws of a random model: all differ
    assert all(a.completion_tokens <= 12 for a in answers[1:])


def test_max_tokens_is_bounded_by_the_context_left_after_the_prompt(tiny_base: Path):
    engine = load(tiny_base, max_batch=2)
    try:
        engine.model.config.max_position_embeddings = 64  # this engine's own copy of the model
        prepared = engine.prepare(request(8, max_tokens=10**6))
        assert prepared.generating.max_new_tokens == 64 - len(prepared.prompt) > 0
        answer = submit_all(engine, [prepared])[0]
        assert answer.prompt_tokens + answer.completion_tokens <= 64
        assert (answer.text, answer.completion_tokens, answer.finish_reason) == alone(engine, prepared)
        with pytest.raises(RequestError) as raised:
            engine.prepare(request(80))
        assert raised.value.status == 400 and raised.value.code == "context_length_exceeded"
    finally:
        engine.close()


def test_beam_search_decodes_alone_through_generate(tiny_base: Path):
    from tuneline.core.inference.chat import ModelSource
    from tuneline.core.serving.decoding import SoloDecoder
    from tuneline.core.serving.engine import load_engine
    from tuneline.core.serving.sources import ServedModel

    beams = dataclasses.replace(GREEDY, num_beams=3)
    engine = load_engine(ServedModel(ModelSource(str(tiny_base), None, str(tiny_base)), name="tiny", template="chatml",
                                     generating=beams), max_batch=4)
    try:
        assert isinstance(engine.scheduler.decoder, SoloDecoder)  # beams reorder rows: no shared cache
        prepared = [engine.prepare(request(words, max_tokens=8)) for words in (2, 15, 6)]
        answers = submit_all(engine, prepared)
        assert [(a.text, a.completion_tokens, a.finish_reason) for a in answers] == [alone(engine, p) for p in prepared]
    finally:
        engine.close()


def test_answers_longer_than_the_caches_spare_columns_are_the_tokens_of_generate(engine):
    from tuneline.core.serving.growing_cache import GrowingLayer

    prepared = [engine.prepare(request(words, max_tokens=3 * GrowingLayer.SPARE_COLUMNS)) for words in (2, 25, 9)]
    answers = submit_all(engine, prepared)
    assert [(a.text, a.completion_tokens, a.finish_reason) for a in answers] == [alone(engine, p) for p in prepared]
    assert max(a.completion_tokens for a in answers) > 2 * GrowingLayer.SPARE_COLUMNS  # its buffers grew twice


def test_rows_joining_a_batch_whose_rebuild_fails_are_told_and_the_engine_goes_on(tiny_base: Path):
    engine = load(tiny_base, max_batch=4)
    decoder, failures = engine.scheduler.decoder, []
    rebuild = decoder._rebuild

    def fails_once(joining):  # a fault where the prefilled rows are copied into the batch
        if joining and not failures:
            failures.append(RuntimeError("no memory for the batch's cache"))
            raise failures[0]
        return rebuild(joining)

    decoder._rebuild = fails_once
    try:
        prepared = [engine.prepare(request(words, max_tokens=6)) for words in (3, 12, 30)]
        first = submit_all(engine, prepared)
        assert first == [failures[0]] * 3
        again = submit_all(engine, prepared)
        assert [(a.text, a.completion_tokens, a.finish_reason) for a in again] == [alone(engine, p) for p in prepared]
    finally:
        engine.close()
