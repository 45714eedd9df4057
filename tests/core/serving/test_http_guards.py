"""The limits and guards over HTTP, on the app itself (FastAPI's test client, the tiny base served with
chatml and small limits): each refusal in OpenAI's error shape with its status, what is within the
limits answered, and an unexpected failure a generic 500 whose traceback only the server's log shows."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import pytest

from tuneline.core.serving.protocol import RequestLimits

LIMITS = RequestLimits(body_bytes=4096, messages=5, stop_strings=2, stop_length=8, choices=2)
ALLOWED_HOST = "api.internal"
SECRET_PATH = "/srv/private/weights/model.safetensors"
USER = {"role": "user", "content": "Hello"}


@pytest.fixture(scope="module")
def app(tiny_base: Path):
    from tuneline.core.config import GeneratingConfig
    from tuneline.core.inference.chat import ModelSource
    from tuneline.core.serving.app import create_app
    from tuneline.core.serving.engine import load_engine
    from tuneline.core.serving.sources import ServedModel

    served = ServedModel(ModelSource(str(tiny_base), None, str(tiny_base)), name="tiny", template="chatml",
                         generating=GeneratingConfig(max_new_tokens=2, do_sample=False))
    app = create_app(load_engine(served), model_name="tiny", api_key=None, limits=LIMITS, allowed_hosts=(ALLOWED_HOST,))

    @app.get("/v1/failing")
    async def failing() -> None:  # a failure whose text holds a path the client must not see
        raise FileNotFoundError(2, "No such file or directory", SECRET_PATH)

    return app


@pytest.fixture(scope="module")
def client(app):
    from fastapi.testclient import TestClient

    with TestClient(app, base_url="http://127.0.0.1:8000") as client:
        yield client


def chat(client, body: dict | bytes, **headers: str):
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return client.post("/v1/chat/completions", content=content, headers={"Content-Type": "application/json", **headers})


def error_of(response, status: int) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return error


def padded(size: int) -> bytes:
    """A valid chat request exactly `size` bytes long (spaces after the JSON)."""
    body = json.dumps({"messages": [USER], "max_tokens": 1}).encode()
    return body + b" " * (size - len(body))


def test_a_body_at_the_limit_is_answered_and_one_byte_more_is_413(client):
    assert chat(client, padded(LIMITS.body_bytes)).status_code == 200
    error = error_of(chat(client, padded(LIMITS.body_bytes + 1)), 413)
    assert error["code"] == "request_too_large" and "limit of 4096 bytes (API_MAX_BODY_BYTES)" in error["message"]


def asgi_post(app, chunks: list[bytes], *, content_length: int | None = None) -> tuple[int, int]:
    """POST `chunks` to the chat endpoint as a server hands a body to the app, one `receive` each:
    (the reply's status, how many chunks the app read)."""
    reads, sent = [], []

    async def receive() -> dict:
        reads.append(1)
        return {"type": "http.request", "body": chunks[len(reads) - 1], "more_body": len(reads) < len(chunks)}

    async def send(message: dict) -> None:
        sent.append(message)

    headers = [(b"host", b"127.0.0.1:8000"), (b"content-type", b"application/json")]
    headers += [(b"content-length", str(content_length).encode())] if content_length is not None else []
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": "/v1/chat/completions", "raw_path": b"/v1/chat/completions", "query_string": b"", "root_path": "",
             "headers": headers, "client": ("127.0.0.1", 50000), "server": ("127.0.0.1", 8000)}
    asyncio.run(app(scope, receive, send))
    return sent[0]["status"], len(reads)


def test_a_chunked_body_is_cut_off_once_it_grows_past_the_limit(app):
    # no Content-Length: only the bytes read so far tell; the fifth 1 KiB chunk goes over 4 KiB
    assert asgi_post(app, [b" " * 1024] * 8) == (413, 5)


def test_a_declared_length_over_the_limit_is_refused_before_the_body_is_read(app):
    assert asgi_post(app, [b"{}"], content_length=10 * LIMITS.body_bytes) == (413, 0)


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", ""])
def test_a_body_that_is_not_declared_json_is_415(client, content_type: str):
    response = client.post("/v1/chat/completions", content=json.dumps({"messages": [USER]}).encode(),
                           headers={"Content-Type": content_type})
    error = error_of(response, 415)
    assert error["code"] == "unsupported_media_type" and "Content-Type: application/json" in error["message"]


@pytest.mark.parametrize(("host", "status"), [("evil.example", 400), ("evil.example:8000", 400), ("127.0.0.1.nip.io", 400),
                                              ("localhost:8000", 200), ("[::1]:8000", 200), (f"{ALLOWED_HOST}:8000", 200)])
def test_only_loopback_and_allowed_host_names_are_answered(client, host: str, status: int):
    response = client.get("/v1/models", headers={"Host": host})
    if status == 200:
        assert response.status_code == 200 and response.json()["data"][0]["id"] == "tiny"
    else:
        error = error_of(response, status)
        assert error["code"] == "invalid_host" and "API_ALLOWED_HOSTS" in error["message"]


@pytest.mark.parametrize(("body", "message"), [
    ({"messages": [USER, {"role": "assistant", "content": "Hi"}] * 3 + [USER]}, "'messages' holds 7 messages and this server "
                                                                               "reads at most 5"),
    ({"messages": [USER], "stop": ["a", "b", "c"]}, "'stop' holds 3 strings and this server takes at most 2"),
    ({"messages": [USER], "stop": "a long stop"}, "stop[0] is 11 characters long"),
    ({"messages": [USER], "n": 3}, "'n' must be an integer from 1 to 2, got 3."),
    ({"messages": [USER], "tools": 5}, "'tools' must be a list of tools, got 5;"),
    ({"messages": [USER], "tools": [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]},
     "tools[0] is not a function schema the default tool format can describe"),
])
def test_the_app_applies_the_limits_it_was_given_and_names_malformed_tools(client, body: dict, message: str):
    error = error_of(chat(client, body), 400)
    assert error["message"].startswith(message) and error["type"] == "invalid_request_error", error


def test_an_unexpected_failure_is_a_generic_500_and_its_traceback_is_on_the_server_log(client, capsys):
    error = error_of(client.get("/v1/failing"), 500)
    found = re.fullmatch(r"The server failed; see the server's log \(request id ([0-9a-f]{16})\)\.", error["message"])
    assert found and (error["type"], error["code"]) == ("server_error", "server_error")
    assert SECRET_PATH not in json.dumps(error) and "FileNotFoundError" not in json.dumps(error)
    log = capsys.readouterr().err
    assert f"request {found.group(1)} (GET /v1/failing) failed:" in log
    assert "Traceback" in log and SECRET_PATH in log
