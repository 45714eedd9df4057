"""`tuneline api` on the tiny base, through the official `openai` client: one server for the module,
a real subprocess started from a LLaMA-Factory inference YAML (chatml, greedy) with API_KEY set.

Train/serve parity: the served answer equals the model's own greedy generate() on the prompt ids
tuneline's training encoder writes for the same conversation, streamed or not, and the usage block
counts exactly those ids.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from conftest import stop_process
from serving_server import MAX_NEW_TOKENS, greedy_reference, inference_yaml, start_server

pytestmark = pytest.mark.slow

API_KEY = "sk-tuneline-test"
SYSTEM = "You are a terse assistant."
HISTORY = [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hi there"},
           {"role": "user", "content": "What is 2 plus 2?"}]


@pytest.fixture(scope="module")
def started(tiny_base: Path, tmp_path_factory):
    """The server, and the test's own reference model loaded while the server loads its copy."""
    folder = tmp_path_factory.mktemp("api")
    starting = start_server("api", str(inference_yaml(tiny_base, folder)), folder=folder, env={"API_KEY": API_KEY})
    try:
        reference = greedy_reference(tiny_base)
        yield starting.wait(), reference
    finally:
        stop_process(starting.process)


@pytest.fixture(scope="module")
def server(started):
    return started[0]


@pytest.fixture(scope="module")
def reference(started):
    return started[1]


@pytest.fixture(scope="module")
def client(server):
    from openai import OpenAI

    return OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0, timeout=120)


def openai_messages() -> list[dict]:
    return [{"role": "system", "content": SYSTEM}, *HISTORY]


def test_models_lists_the_served_model(client, tiny_base: Path):
    assert [model.id for model in client.models.list().data] == [tiny_base.name]


def test_completion_is_the_greedy_generate_on_the_training_prompt(client, reference, tiny_base: Path):
    prompt, new, text = reference(HISTORY, SYSTEM)
    completion = client.chat.completions.create(model=tiny_base.name, messages=openai_messages(), temperature=0)
    choice = completion.choices[0]
    assert choice.message.role == "assistant" and choice.message.content == text and text.strip()
    assert choice.finish_reason == ("length" if len(new) == MAX_NEW_TOKENS else "stop")
    usage = completion.usage
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (len(prompt), len(new), len(prompt) + len(new))


def test_streamed_completion_is_the_same_answer(client, reference, tiny_base: Path):
    prompt, new, text = reference(HISTORY, SYSTEM)
    chunks = list(client.chat.completions.create(model=tiny_base.name, messages=openai_messages(), temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    pieces = [c.choices[0].delta.content or "" for c in chunks if c.choices]
    assert len([p for p in pieces if p]) > 1 and "".join(pieces) == text  # it arrived in pieces
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] in ("length", "stop")
    assert (chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens) == (len(prompt), len(new))


def test_stop_ends_the_answer_before_the_stop_text(client, reference, tiny_base: Path):
    _, new, text = reference(HISTORY, SYSTEM)
    stop = text.rstrip()[-2:]
    expected = text[: text.find(stop)]
    for stream in (False, True):
        response = client.chat.completions.create(model=tiny_base.name, messages=openai_messages(), temperature=0,
                                                  stop=[stop, "never written"], stream=stream)
        if stream:
            chunks = [c for c in response if c.choices]
            content, finish = "".join(c.choices[0].delta.content or "" for c in chunks), chunks[-1].choices[0].finish_reason
        else:
            content, finish = response.choices[0].message.content, response.choices[0].finish_reason
        assert (content, finish) == (expected, "stop")


def test_tool_messages_and_tools_render_as_training_writes_them(client, reference, tiny_base: Path):
    tool = {"name": "add", "description": "Add two numbers.",
            "parameters": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}}}
    call = {"name": "add", "arguments": {"a": 2, "b": 2}}
    conversation = [{"role": "user", "content": "What is 2 plus 2?"}, {"role": "function", "content": json.dumps([call])},
                    {"role": "observation", "content": "4"}]
    prompt, _, text = reference(conversation, SYSTEM, tools=json.dumps([tool]))
    messages = [{"role": "system", "content": SYSTEM}, conversation[0],
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": json.dumps(call["arguments"])}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "4"}]
    completion = client.chat.completions.create(model=tiny_base.name, messages=messages, temperature=0,
                                                tools=[{"type": "function", "function": tool}])
    assert completion.usage.prompt_tokens == len(prompt)
    assert completion.choices[0].message.content == text  # the tiny model calls no tool: a plain answer


def test_a_wrong_or_missing_api_key_gets_401(server, tiny_base: Path):
    from openai import AuthenticationError, OpenAI

    wrong = OpenAI(base_url=f"{server.url}/v1", api_key="sk-wrong", max_retries=0)
    with pytest.raises(AuthenticationError) as raised:
        wrong.chat.completions.create(model=tiny_base.name, messages=HISTORY)
    assert raised.value.status_code == 401 and "Invalid API key" in raised.value.message
    response = httpx.get(f"{server.url}/v1/models")
    assert response.status_code == 401 and response.json()["error"]["code"] == "invalid_api_key"


def test_a_generating_model_refuses_the_reward_score_endpoint(server):
    response = httpx.post(f"{server.url}/v1/score/evaluation", json={"messages": ["a text"]},
                          headers={"Authorization": f"Bearer {API_KEY}"})
    assert response.status_code == 405 and "serves a model that generates" in response.json()["error"]["message"]


@pytest.mark.parametrize(("body", "message"), [
    (b"{not json", "The request body is not valid JSON"),
    (b'{"model": "m"}', "'messages' must be a non-empty list of {role, content} objects; it is missing."),
    (b'{"messages": [{"role": "assistant", "content": "Hi"}]}', "messages[0] has role 'assistant' where a user or tool "
                                                               "message was expected"),
    (b'{"messages": [{"role": "user", "content": "Hi"}], "temperature": "hot"}', "'temperature' must be a number from 0 "
                                                                                 "to 2, got \"hot\"."),
    (b'{"messages": [{"role": "user", "content": 7}]}', "messages[0].content must be a string or a list of text parts"),
    (b'{"messages": [{"role": "user", "content": "Hi"}], "presence_penalty": 0.5}', "'presence_penalty' is not supported"),
])
def test_a_malformed_request_gets_400_with_a_clear_message(server, body: bytes, message: str):
    response = httpx.post(f"{server.url}/v1/chat/completions", content=body, timeout=60,
                          headers={"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["message"].startswith(message) and error["type"] == "invalid_request_error"
    assert set(error) == {"message", "type", "param", "code"}


def test_twenty_concurrent_requests_all_complete_with_the_same_answer(client, reference, tiny_base: Path):
    _, _, text = reference(HISTORY, SYSTEM)

    def ask(i: int) -> str:  # half of them streamed
        if i % 2 == 0:
            return client.chat.completions.create(model=tiny_base.name, messages=openai_messages(),
                                                  temperature=0).choices[0].message.content
        stream = client.chat.completions.create(model=tiny_base.name, messages=openai_messages(), temperature=0, stream=True)
        return "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)

    with ThreadPoolExecutor(max_workers=20) as pool:
        answers = list(pool.map(ask, range(20)))
    assert answers == [text] * 20


def test_a_saved_chat_template_renders_the_training_prompt_and_refuses_tools(tiny_base: Path, reference):
    """Without a template named, prompts are rendered with the tokenizer's saved chat template (the Jinja tuneline
    saves from the training template): the same ids as the training encoder; tools need the template named."""
    from tuneline.core.errors import DataError
    from tuneline.core.inference.prompts import NEEDS_TEMPLATE, PromptRenderer
    from tuneline.core.models.loading import load_tokenizer
    from tuneline.core.templates.conversation import chat_template_jinja, fix_tokenizer, get_template

    tokenizer = load_tokenizer(tiny_base)
    template = get_template("chatml", tokenizer=tokenizer)
    fix_tokenizer(template, tokenizer)
    tokenizer.chat_template = chat_template_jinja(template, tokenizer)
    saved = PromptRenderer(tokenizer, None)
    assert saved.prompt_ids(HISTORY, system=SYSTEM) == reference(HISTORY, SYSTEM)[0]
    with pytest.raises(DataError) as raised:
        saved.prompt_ids(HISTORY, system=SYSTEM, tools=json.dumps([{"name": "add", "parameters": {}}]))
    assert str(raised.value) == NEEDS_TEMPLATE


def raw_exchange(server, *parts: bytes, timeout: float = 30) -> tuple[int, dict]:
    """Send `parts` to the server as they are (no client library deciding the framing) and read its reply:
    (status, the JSON body). A server still waiting for the rest of a body times out instead."""
    import socket

    host, port = server.url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=timeout) as connection:
        for part in parts:
            connection.sendall(part)
        reply = b""
        while b"\r\n\r\n" not in reply or len(reply.partition(b"\r\n\r\n")[2]) < _length(reply):
            chunk = connection.recv(65536)
            assert chunk, f"the server closed the connection after {reply!r}"
            reply += chunk
    head, _, body = reply.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), json.loads(body[: _length(reply)])


def _length(reply: bytes) -> int:
    head = reply.partition(b"\r\n\r\n")[0].decode("latin-1").lower()
    return next((int(line.split(":", 1)[1]) for line in head.split("\r\n") if line.startswith("content-length:")), 1 << 30)


def request_head(server, *, length: str = "Transfer-Encoding: chunked", host: str = "127.0.0.1") -> bytes:
    return (f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {API_KEY}\r\n"
            f"Content-Type: application/json\r\n{length}\r\n\r\n").encode()


def test_the_server_refuses_a_declared_body_over_the_limit_without_reading_it(server):
    status, body = raw_exchange(server, request_head(server, length=f"Content-Length: {10 << 20}"))  # no body sent
    assert status == 413 and body["error"]["code"] == "request_too_large"


def test_the_server_cuts_off_a_chunked_body_once_it_is_over_the_limit(server):
    chunk = b"10000\r\n" + b" " * 0x10000 + b"\r\n"  # 64 KiB; 17 of them are over 1 MiB, and the body never ends
    status, body = raw_exchange(server, request_head(server), *[chunk] * 17)
    assert status == 413 and "limit of 1048576 bytes (API_MAX_BODY_BYTES)" in body["error"]["message"]


def test_the_server_answers_only_loopback_host_names_and_json_bodies(server, tiny_base: Path):
    port = server.url.rsplit(":", 1)[1]
    for host, status in ((f"rebound.example:{port}", 400), (f"localhost:{port}", 200), (f"127.0.0.1:{port}", 200)):
        response = httpx.get(f"{server.url}/v1/models", headers={"Host": host, "Authorization": f"Bearer {API_KEY}"})
        assert response.status_code == status, response.text
    assert response.json()["data"][0]["id"] == tiny_base.name
    page_post = httpx.post(f"{server.url}/v1/chat/completions", content=json.dumps({"messages": HISTORY}),
                           headers={"Content-Type": "text/plain", "Authorization": f"Bearer {API_KEY}"})
    assert page_post.status_code == 415 and page_post.json()["error"]["code"] == "unsupported_media_type"


def test_a_keyless_host_other_than_a_loopback_one_is_refused_or_warned_about(server, monkeypatch):
    from conftest import assert_refused, run_cli_here

    monkeypatch.delenv("API_KEY", raising=False)
    target = str(server.log.parent / "inference.yaml")
    refused = run_cli_here("api", target, "--host", "0.0.0.0", cwd=server.log.parent)
    assert_refused(refused, "the host 0.0.0.0 (--host, API_HOST) is not a loopback address", "--allow-no-key")
    # 192.0.2.1 is reserved for documentation, so no machine has it: the warning, then the address refused
    allowed = run_cli_here("api", target, "--host", "192.0.2.1", "--port", "0", "--allow-no-key", cwd=server.log.parent)
    assert allowed.stderr.startswith("warning: serving on 192.0.2.1 without API_KEY (--allow-no-key)"), allowed.stderr
    assert_refused(allowed, "cannot listen on 192.0.2.1:0")
