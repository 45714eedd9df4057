"""The queue in front of the served model, through the app: a request that finds the queue full gets 503
in OpenAI's error shape with Retry-After, and one whose client goes away, streamed or not, leaves the
queue without being generated. The decoding thread is held busy by a request whose `done` waits for the
test, so what is waiting is known at each moment."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path

import pytest

from tuneline.core.config import GeneratingConfig
from tuneline.core.serving.backends import Cancelled

pytestmark = pytest.mark.slow

BODY = {"model": "tiny", "messages": [{"role": "user", "content": "What is 2 plus 2?"}], "max_tokens": 4}


@pytest.fixture(scope="module")
def engine(tiny_base: Path):
    from tuneline.core.inference.chat import ModelSource
    from tuneline.core.serving.engine import load_engine
    from tuneline.core.serving.sources import ServedModel

    generating = GeneratingConfig(max_new_tokens=8, do_sample=False, repetition_penalty=3.0)
    served = ServedModel(ModelSource(str(tiny_base), None, str(tiny_base)), name="tiny", template="chatml", generating=generating)
    engine = load_engine(served, max_batch=1, queue_size=2)
    yield engine
    engine.close()


class Busy:
    """A one-token request whose end holds the decoding thread until `release()`."""

    def __init__(self, engine) -> None:
        from tuneline.core.serving.protocol import parse_chat_request

        self.holding, self.released = threading.Event(), threading.Event()
        prepared = engine.prepare(parse_chat_request(json.dumps({**BODY, "max_tokens": 1}).encode()))
        engine.submit(prepared, done=self._hold)
        assert self.holding.wait(30)

    def _hold(self, _: object) -> None:
        self.holding.set()
        self.released.wait(60)

    def release(self) -> None:
        self.released.set()


def test_a_full_queue_answers_503_with_retry_after(engine):
    from fastapi.testclient import TestClient

    from tuneline.core.serving.app import create_app
    from tuneline.core.serving.protocol import parse_chat_request

    busy = Busy(engine)
    waiting_ended: list[object] = []
    try:
        prepared = engine.prepare(parse_chat_request(json.dumps(BODY).encode()))
        engine.submit(prepared, copies=2, done=waiting_ended.append)  # the two places of the queue
        with TestClient(create_app(engine, model_name="tiny", api_key=None)) as client:
            full = client.post("/v1/chat/completions", json=BODY)
            assert full.status_code == 503, full.text
            assert int(full.headers["retry-after"]) >= 1
            error = full.json()["error"]
            assert set(error) == {"message", "type", "param", "code"} and error["code"] == "server_busy"
            assert error["message"].startswith("The server is busy: 2 requests are already waiting")
            busy.release()
            answered = client.post("/v1/chat/completions", json=BODY)  # the queue drains; there is room again
            assert answered.status_code == 200 and answered.json()["choices"][0]["finish_reason"] in ("stop", "length")
    finally:
        busy.release()
    assert len(waiting_ended) == 2 and all(not isinstance(outcome, BaseException) for outcome in waiting_ended)


async def call_and_leave(app, body: dict) -> list[dict]:
    """POST `body` to the app as a client that goes away once it has the response's first bytes (streamed)
    or while it waits (not streamed); the ASGI messages the app sent."""
    raw = json.dumps(body).encode()
    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1", "method": "POST",
             "scheme": "http", "path": "/v1/chat/completions", "raw_path": b"/v1/chat/completions", "query_string": b"",
             "root_path": "", "client": ("127.0.0.1", 50000), "server": ("127.0.0.1", 8000),
             "headers": [(b"host", b"127.0.0.1:8000"), (b"content-type", b"application/json"),
                         (b"content-length", str(len(raw)).encode())]}
    sent: list[dict] = []
    first_bytes = asyncio.Event()
    calls = 0

    async def receive() -> dict:
        nonlocal calls
        calls += 1
        if calls == 1:
            return {"type": "http.request", "body": raw, "more_body": False}
        if body.get("stream"):
            await first_bytes.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)
        if message["type"] == "http.response.body" and message.get("body"):
            first_bytes.set()

    await asyncio.wait_for(app(scope, receive, send), timeout=30)
    return sent


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_client_that_goes_away_leaves_the_queue_ungenerated(engine, stream: bool):
    from tuneline.core.serving.app import create_app

    app = create_app(engine, model_name="tiny", api_key=None)
    busy = Busy(engine)
    try:
        assert engine.scheduler.waiting == 0
        sent = asyncio.run(call_and_leave(app, {**BODY, "stream": stream}))
        assert engine.scheduler.waiting == 0  # taken out of the queue while the model was still busy
        start = next(m for m in sent if m["type"] == "http.response.start")
        if stream:
            assert start["status"] == 200 and b"data: [DONE]" not in b"".join(m.get("body", b"") for m in sent)
        else:
            assert start["status"] == 499
    finally:
        busy.release()
    ended = threading.Event()
    from tuneline.core.serving.protocol import parse_chat_request

    after: list[object] = []
    engine.submit(engine.prepare(parse_chat_request(json.dumps(BODY).encode())), done=lambda o: (after.append(o), ended.set()))
    assert ended.wait(30) and not isinstance(after[0], (Cancelled, Exception))  # the engine goes on serving
