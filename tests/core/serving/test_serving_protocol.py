"""Requests as the server reads them: roles mapped as LLaMA-Factory's API maps them, every malformed
field named in one sentence, the sampling settings merged as its engine merges them; and the stop
strings cut streamed text exactly where they cut the whole answer."""

from __future__ import annotations

import json

import pytest

from tuneline.core.config import GeneratingConfig
from tuneline.core.serving.protocol import RequestError, generating_for, parse_chat_request
from tuneline.core.serving.stop_text import StopText


def parse(**body) -> object:
    return parse_chat_request(json.dumps(body).encode())


def test_roles_system_and_tool_calls_map_to_tuneline_messages():
    request = parse(messages=[
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Weather "}, {"type": "text", "text": "in Paris?"}]},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
    ], tools=[{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {}}}}],
        stop="END", max_completion_tokens=5, max_tokens=9, stream=True, stream_options={"include_usage": True})
    assert request.system == "Be brief."
    assert [m["role"] for m in request.messages] == ["user", "function", "observation"]
    assert request.messages[0]["content"] == "Weather in Paris?"
    assert json.loads(request.messages[1]["content"]) == [{"name": "get_weather", "arguments": {"city": "Paris"}}]
    assert json.loads(request.tools)[0]["name"] == "get_weather"
    assert (request.stop, request.max_tokens, request.stream, request.include_usage) == (("END",), 5, True, True)


@pytest.mark.parametrize(("body", "message"), [
    ({"messages": []}, "'messages' must be a non-empty list of {role, content} objects; it is empty."),
    ({"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]},
     "messages[1] has role 'user' where an assistant message was expected"),
    ({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]},
     "the last message must be a user or tool message"),
    ({"messages": [{"role": "user", "content": "a"}, {"role": "system", "content": "b"}]},
     "messages[1] is a system message; only the first message may be one."),
    ({"messages": [{"role": "robot", "content": "a"}]}, 'messages[0] has role "robot"; use system, user, assistant or tool.'),
    ({"messages": [{"role": "user", "content": "a"}], "n": 0}, "'n' must be an integer from 1 to 16, got 0."),
    ({"messages": [{"role": "user", "content": "a"}], "stop": [""]}, "'stop' must be a non-empty string"),
    ({"messages": [{"role": "user", "content": "a"}], "stream": "yes"}, "'stream' must be a boolean"),
    ({"messages": [{"role": "user", "content": "a"}], "frequency_penalty": 1}, "'frequency_penalty' is not supported"),
    ({"messages": [{"role": "user", "content": "a"}], "tool_choice": "required"}, "'tool_choice' may be \"auto\" or"),
    ({"messages": [{"role": "user", "content": "a"}], "tools": [{"type": "function"}]}, "tools[0] has no 'function' object"),
])
def test_malformed_fields_are_named(body: dict, message: str):
    with pytest.raises(RequestError) as raised:
        parse(**body)
    assert raised.value.message.startswith(message) and raised.value.status == 400


def test_sampling_merges_request_and_served_defaults_as_llamafactory():
    defaults = GeneratingConfig(do_sample=True, temperature=0.95, max_new_tokens=64)
    user = [{"role": "user", "content": "a"}]
    assert generating_for(parse(messages=user, temperature=0), defaults).do_sample is False  # 0: greedy
    several = generating_for(parse(messages=user, n=3, do_sample=False, temperature=0), defaults)
    assert (several.do_sample, several.temperature) == (True, 1.0)
    sampled = generating_for(parse(messages=user, top_p=0.5, max_tokens=7, repetition_penalty=2), defaults)
    assert (sampled.do_sample, sampled.top_p, sampled.max_new_tokens, sampled.repetition_penalty) == (True, 0.5, 7, 2.0)
    assert generating_for(parse(messages=user), defaults) == defaults


@pytest.mark.parametrize("pieces", [["Hello wo", "rld. END of", " it"], ["Hel", "lo world.", " E", "ND"], ["Hello world. END"]])
def test_stop_text_streams_exactly_the_cut_answer(pieces: list[str]):
    sent: list[str] = []
    text = StopText(["END", "never"], sent.append)
    for piece in pieces:
        text.feed(piece)
    assert "E" not in "".join(sent)  # held back while it could begin END
    assert text.finish("".join(pieces)) == "Hello world. " == "".join(sent)
