"""What one request may hold, read by the pure functions the server calls: each limit refuses one more
than it allows, names its setting, and is read from the environment; malformed tools are named by
index; the Host check and the refusal of a keyless server on a host other than a loopback one."""

from __future__ import annotations

import json

import pytest
from starlette.datastructures import Headers

from tuneline.core.errors import ConfigError, DataError
from tuneline.core.serving.guards import host_allowed, is_loopback, refusal
from tuneline.core.serving.protocol import RequestError, RequestLimits, parse_chat_request
from tuneline.core.serving.scoring import parse_score_request
from tuneline.core.serving.server import LIMIT_SETTINGS, exposure_warning, request_limits, server_settings

DEFAULTS = RequestLimits()
TOOL = {"type": "function", "function": {"name": "add", "description": "Add two numbers.",
                                         "parameters": {"type": "object", "properties": {"a": {"type": "number"}},
                                                        "required": ["a"]}}}


def conversation(count: int) -> list[dict]:
    """`count` (odd) messages alternating user and assistant, ending with a user's."""
    return [{"role": "user" if i % 2 == 0 else "assistant", "content": f"m{i}"} for i in range(count)]


def refused(raw: dict, *, limits: RequestLimits = DEFAULTS) -> RequestError:
    with pytest.raises(RequestError) as raised:
        parse_chat_request(json.dumps(raw).encode(), limits=limits)
    assert raised.value.status == 400
    return raised.value


def test_defaults_are_the_documented_ones():
    assert (DEFAULTS.body_bytes, DEFAULTS.messages, DEFAULTS.stop_strings, DEFAULTS.stop_length, DEFAULTS.choices,
            DEFAULTS.score_texts) == (1 << 20, 256, 16, 256, 16, 64)


@pytest.mark.parametrize(("at_limit", "over", "message"), [
    ({"messages": conversation(255), "stop": "END"}, {"messages": conversation(257)},
     "'messages' holds 257 messages and this server reads at most 256 in one request (API_MAX_MESSAGES)"),
    ({"messages": conversation(1), "stop": [f"s{i}" for i in range(16)]},
     {"messages": conversation(1), "stop": [f"s{i}" for i in range(17)]},
     "'stop' holds 17 strings and this server takes at most 16 (API_MAX_STOP_STRINGS)"),
    ({"messages": conversation(1), "stop": ["a", "x" * 256]}, {"messages": conversation(1), "stop": ["a", "x" * 257]},
     "stop[1] is 257 characters long and this server takes stop strings of at most 256 (API_MAX_STOP_LENGTH)"),
    ({"messages": conversation(1), "n": 16}, {"messages": conversation(1), "n": 17}, "'n' must be an integer from 1 to 16, got 17."),
])
def test_each_chat_limit_allows_its_bound_and_refuses_one_more(at_limit: dict, over: dict, message: str):
    parse_chat_request(json.dumps(at_limit).encode())
    assert refused(over).message.startswith(message)


def test_a_system_message_counts_toward_the_messages_limit():
    limits = RequestLimits(messages=3)
    parse_chat_request(json.dumps({"messages": conversation(3)}).encode(), limits=limits)
    system = [{"role": "system", "content": "Be brief."}]
    assert refused({"messages": system + conversation(3)}, limits=limits).param == "messages"


def test_configured_limits_are_the_ones_applied():
    limits = RequestLimits(stop_strings=1, stop_length=3, choices=2)
    assert refused({"messages": conversation(1), "stop": ["a", "b"]}, limits=limits).message.startswith("'stop' holds 2")
    assert refused({"messages": conversation(1), "stop": "abcd"}, limits=limits).message.startswith("stop[0] is 4")
    assert refused({"messages": conversation(1), "n": 3}, limits=limits).message.startswith("'n' must be an integer from 1 to 2")


def test_json_nested_too_deeply_is_a_400_not_a_crash():
    with pytest.raises(RequestError) as raised:
        parse_chat_request(b"[" * 200_000 + b"]" * 200_000)
    assert raised.value.status == 400 and "nests JSON too deeply" in raised.value.message


def test_score_texts_and_max_length_are_bounded():
    def score(limit: int = DEFAULTS.score_texts, **body) -> RequestError:
        with pytest.raises(RequestError) as raised:
            parse_score_request(json.dumps(body).encode(), context_length=2048, limits=RequestLimits(score_texts=limit))
        return raised.value

    assert len(parse_score_request(json.dumps({"messages": ["t"] * 64}).encode(), context_length=2048).texts) == 64
    assert score(messages=["t"] * 65).message.startswith("'messages' holds 65 texts and this server scores at most 64 in "
                                                         "one request (API_MAX_SCORE_TEXTS)")
    assert score(2, messages=["t"] * 3).message.startswith("'messages' holds 3 texts")
    assert parse_score_request(b'{"messages": ["t"], "max_length": 2048}', context_length=2048).max_length == 2048
    error = score(messages=["t"], max_length=2049)
    assert error.message.startswith("'max_length' is 2049, above the reward model's context of 2048 tokens")
    assert (error.param, error.code) == ("max_length", "context_length_exceeded")


@pytest.mark.parametrize(("tools", "message"), [
    (5, "'tools' must be a list of tools, got 5;"),
    ({"type": "function"}, "'tools' must be a list of tools, got {"),
    ([TOOL, "add"], 'tools[1] is "add", not a JSON object;'),
    ([{"type": "retrieval"}], 'tools[0].type is "retrieval"; only "function" tools are served;'),
    ([{"type": "function"}], "tools[0] has no 'function' object;"),
    ([TOOL, {"type": "function", "function": {"description": "x"}}], "tools[1].function.name is missing;"),
    ([{"type": "function", "function": {"name": ""}}], "tools[0].function.name must be a non-empty string;"),
    ([{"type": "function", "function": {"name": "f", "parameters": []}}],
     "tools[0].function.parameters (f) must be a JSON Schema object, got [];"),
    ([{"type": "function", "function": {"name": "f", "parameters": {"properties": ["a"]}}}],
     "tools[0].function.parameters.properties (f) must map each argument's name to its schema object;"),
    ([{"type": "function", "function": {"name": "f", "parameters": {"properties": {}, "required": "a"}}}],
     "tools[0].function.parameters.required (f) must be a list of argument names;"),
])
def test_a_malformed_tool_is_named_by_its_index(tools, message: str):
    error = refused({"messages": conversation(1), "tools": tools})
    assert error.message.startswith(message) and error.param == "tools", error.message


def test_a_tool_its_format_cannot_describe_is_named_by_its_index():
    from tuneline.core.templates.conversation import get_template
    from tuneline.core.templates.tools import tool_text

    no_properties = {"name": "b", "parameters": {"type": "object"}}  # the default format lists the properties
    with pytest.raises(DataError) as raised:
        tool_text(get_template("default"), json.dumps([TOOL["function"], no_properties]))
    assert str(raised.value).startswith("tools[1] is not a function schema the default tool format can describe")


def test_limits_are_read_from_the_environment_and_wrong_ones_listed():
    env = {name: str(10 + i) for i, name in enumerate(LIMIT_SETTINGS)}
    assert request_limits(env) == RequestLimits(*(10 + i for i in range(len(LIMIT_SETTINGS))))
    assert request_limits({}) == DEFAULTS
    with pytest.raises(ConfigError) as raised:
        request_limits({"API_MAX_BODY_BYTES": "1MB", "API_MAX_N": "0"})
    assert raised.value.problems == ["API_MAX_BODY_BYTES='1MB' is not a positive whole number; set it to one, or leave it "
                                     "out for the default (1048576).",
                                     "API_MAX_N='0' is not a positive whole number; set it to one, or leave it out for "
                                     "the default (16)."]


@pytest.mark.parametrize(("header", "allowed"), [
    ("localhost", True), ("LOCALHOST:8000", True), ("127.0.0.1:8000", True), ("127.3.2.1", True), ("[::1]:8000", True),
    ("api.internal:8000", True), ("evil.example", False), ("evil.example:8000", False), ("localhost.evil.example", False),
    ("10.0.0.5:8000", False), (None, False), ("", False),
])
def test_the_host_check_answers_loopback_names_and_the_allowed_ones(header: str | None, allowed: bool):
    assert host_allowed(header, ("api.internal",)) is allowed


def test_a_post_must_be_json_and_within_the_body_limit_by_its_header():
    def why(method: str = "POST", **headers: str) -> RequestError | None:
        return refusal(method, Headers(headers), max_body_bytes=100, allowed_hosts=None)

    assert why(**{"content-type": "application/json; charset=utf-8", "content-length": "100"}) is None
    assert why("GET") is None
    assert why(**{"content-type": "text/plain"}).status == 415
    assert why().status == 415 and "(got none)" in why().message
    too_large = why(**{"content-type": "application/json", "content-length": "101"})
    assert too_large.status == 413 and too_large.message.startswith("The request body is over this server's limit of "
                                                                    "100 bytes (API_MAX_BODY_BYTES)")


def test_a_keyless_server_on_a_host_other_than_a_loopback_one_is_refused_unless_allowed():
    for host in ("127.0.0.1", "127.0.0.2", "localhost", "::1"):
        settings = server_settings({}, host=host)
        assert is_loopback(host) and exposure_warning(settings) is None and settings.checked_hosts == ()
    with pytest.raises(ConfigError) as raised:
        server_settings({}, host="0.0.0.0")
    assert "the host 0.0.0.0 (--host, API_HOST) is not a loopback address" in str(raised.value)
    assert "--allow-no-key" in str(raised.value) and "API_KEY" in str(raised.value)
    with pytest.raises(ConfigError):
        server_settings({"API_HOST": "192.168.1.5"})
    keyed = server_settings({"API_KEY": "secret"}, host="0.0.0.0")
    assert exposure_warning(keyed) is None and keyed.checked_hosts is None  # no names given: Host not checked
    allowed = server_settings({}, host="0.0.0.0", allow_no_key=True)
    assert exposure_warning(allowed).startswith("warning: serving on 0.0.0.0 without API_KEY")
    named = server_settings({"API_KEY": "secret", "API_ALLOWED_HOSTS": "Api.Internal, gpu-box"}, host="0.0.0.0")
    assert named.checked_hosts == ("api.internal", "gpu-box")


def test_the_command_refuses_a_keyless_host_other_than_a_loopback_one(tmp_path, monkeypatch):
    from conftest import assert_refused, run_cli_here

    monkeypatch.delenv("API_KEY", raising=False)
    result = run_cli_here("api", "never-read.yaml", "--host", "0.0.0.0", cwd=tmp_path)
    assert_refused(result, "the host 0.0.0.0 (--host, API_HOST) is not a loopback address", "--allow-no-key")
