"""OpenAI's chat completion request, read and checked, and the bodies the server answers with.

A request body is read by hand rather than by a pydantic model, so that every malformed request
gets a 400 with one sentence naming the field, in OpenAI's error shape, instead of FastAPI's 422
list. Roles map as LLaMA-Factory's API maps them: `tool` is an observation (a tool's result), an
assistant message with `tool_calls` is a `function` message holding the calls as JSON, a first
`system` (or `developer`) message is the system prompt. Sampling follows LLaMA-Factory too:
`temperature: 0` is greedy, `n > 1` samples, the inference YAML's generation keys are the defaults.
What one request may ask for is bounded (`RequestLimits`, each a server setting), so that no client
ties up the server with thousands of messages or stop strings.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tuneline.core.config import GeneratingConfig

SOURCE_ROLES, TARGET_ROLES = ("user", "observation"), ("assistant", "function")
REFUSED_PENALTIES = ("presence_penalty", "frequency_penalty")


class RequestError(Exception):
    """A request the server cannot answer; `message` is one sentence for the client."""

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.message, self.param, self.code, self.status = message, param, code, status


@dataclass(frozen=True)
class RequestLimits:
    """What one request may hold; over a limit is refused (413 for the body, else 400) naming the setting.
    The request's tokens are bounded apart, by the model's context (`engine.prepare`)."""

    body_bytes: int = 1 << 20
    """The largest request body, in bytes (API_MAX_BODY_BYTES; 1 MiB)."""
    messages: int = 256
    """The most messages in one chat request, a first system message included (API_MAX_MESSAGES)."""
    stop_strings: int = 16
    """The most `stop` strings (API_MAX_STOP_STRINGS; OpenAI takes 4)."""
    stop_length: int = 256
    """The longest `stop` string, in characters (API_MAX_STOP_LENGTH)."""
    choices: int = 16
    """The largest `n`, answers to one request (API_MAX_N)."""
    score_texts: int = 64
    """The most texts one /v1/score/evaluation request scores (API_MAX_SCORE_TEXTS)."""


@dataclass(frozen=True)
class ChatRequest:
    """A checked request: messages in tuneline's roles, the system prompt apart, tools as JSON. The
    sampling fields are None where the request leaves them to the served defaults."""

    messages: tuple[Mapping[str, str], ...]
    """user, assistant, observation (OpenAI's `tool`) and function (an assistant's `tool_calls`)."""
    system: str | None = None
    tools: str | None = None
    """The `function` objects of `tools`, as the JSON list a template describes in the system text."""
    model: str | None = None
    stream: bool = False
    include_usage: bool = False
    """`stream_options.include_usage`: a last chunk with the usage block."""
    n: int = 1
    max_tokens: int | None = None
    """`max_completion_tokens`, else `max_tokens`: generate's max_new_tokens."""
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    """`top_k`, `do_sample` and `repetition_penalty` are not OpenAI's fields; clients send them as extra
    body fields (LLaMA-Factory's API reads `do_sample` too)."""
    do_sample: bool | None = None
    repetition_penalty: float | None = None
    stop: tuple[str, ...] = ()


def error_body(message: str, *, kind: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict[str, Any]:
    """OpenAI's error shape."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def json_object(raw: bytes) -> dict[str, Any]:
    """The JSON object a request body holds, or a RequestError saying it holds none."""
    try:
        body = json.loads(raw or b"null")
    except (ValueError, UnicodeDecodeError) as e:
        raise RequestError(f"The request body is not valid JSON ({e}); send a JSON object with 'messages'.") from None
    except RecursionError:  # arrays nested thousands deep
        raise RequestError("The request body nests JSON too deeply to read; send a JSON object with 'messages'.") from None
    if not isinstance(body, dict):
        raise RequestError("The request body must be a JSON object with 'messages', not "
                           f"{type(body).__name__ if body is not None else 'empty'}.")
    return body


def parse_chat_request(raw: bytes, *, limits: RequestLimits = RequestLimits()) -> ChatRequest:
    """The request in `raw` (a JSON body), or a RequestError naming what is wrong with it or the limit it is over."""
    body = json_object(raw)
    _refuse_unsupported(body)
    raw_messages = body.get("messages")
    if isinstance(raw_messages, list) and len(raw_messages) > limits.messages:
        raise RequestError(f"'messages' holds {len(raw_messages)} messages and this server reads at most {limits.messages} "
                           "in one request (API_MAX_MESSAGES); send a shorter conversation.", param="messages")
    system, messages = read_messages(raw_messages)
    stops = read_stops(body.get("stop"), limits=limits)
    max_tokens = _number(body, "max_completion_tokens", integer=True, low=1)
    return ChatRequest(
        messages=messages, system=system, tools=read_tools(body.get("tools"), body.get("tool_choice")),
        model=_typed(body, "model", str), stream=bool(_typed(body, "stream", bool)),
        include_usage=bool(_typed(_typed(body, "stream_options", dict) or {}, "include_usage", bool)),
        n=_number(body, "n", integer=True, low=1, high=limits.choices) or 1,
        max_tokens=max_tokens if max_tokens is not None else _number(body, "max_tokens", integer=True, low=1),
        temperature=_number(body, "temperature", low=0, high=2), top_p=_number(body, "top_p", low=0, high=1),
        top_k=_number(body, "top_k", integer=True, low=0), do_sample=_typed(body, "do_sample", bool),
        repetition_penalty=_number(body, "repetition_penalty", above=0), stop=stops,
    )


def read_stops(stop: Any, *, limits: RequestLimits) -> tuple[str, ...]:
    """`stop` (a string or a list of them) as a tuple, each checked against the limits."""
    stops = (stop,) if isinstance(stop, str) else tuple(stop) if isinstance(stop, list) else stop
    if stops is None:
        return ()
    if not isinstance(stops, tuple) or not all(isinstance(s, str) and s for s in stops):
        raise RequestError("'stop' must be a non-empty string or a list of non-empty strings.", param="stop")
    if len(stops) > limits.stop_strings:
        raise RequestError(f"'stop' holds {len(stops)} strings and this server takes at most {limits.stop_strings} "
                           "(API_MAX_STOP_STRINGS); send fewer.", param="stop")
    for index, text in enumerate(stops):
        if len(text) > limits.stop_length:
            raise RequestError(f"stop[{index}] is {len(text)} characters long and this server takes stop strings of at "
                               f"most {limits.stop_length} (API_MAX_STOP_LENGTH); send a shorter one.", param="stop")
    return stops


def _refuse_unsupported(body: Mapping[str, Any]) -> None:
    for key in REFUSED_PENALTIES:
        value = _number(body, key, low=-2, high=2)
        if value:
            raise RequestError(f"'{key}' is not supported: transformers' generate has no additive penalty; leave it at 0 "
                               "and send 'repetition_penalty' (a multiplier, 1.0 means none) instead.", param=key)
    if body.get("logprobs") or body.get("top_logprobs"):
        raise RequestError("'logprobs' is not supported by this server; leave it out.", param="logprobs")
    if body.get("logit_bias"):
        raise RequestError("'logit_bias' is not supported by this server; leave it out.", param="logit_bias")


def _typed(body: Mapping[str, Any], key: str, kind: type) -> Any:
    value = body.get(key)
    if value is not None and (not isinstance(value, kind) or (kind is not bool and isinstance(value, bool))):
        raise RequestError(f"'{key}' must be a {_KIND_NAMES[kind]}, got {json.dumps(value)[:80]}.", param=key)
    return value


_KIND_NAMES = {str: "string", bool: "boolean", dict: "JSON object", list: "list"}


def _number(body: Mapping[str, Any], key: str, *, integer: bool = False, low: float | None = None,
            high: float | None = None, above: float | None = None) -> Any:
    """`body[key]` checked to be a number (an int with `integer`, else made a float) within the bounds; None when absent."""
    value = body.get(key)
    if value is None:
        return None
    valid = not isinstance(value, bool) and (isinstance(value, int) if integer else isinstance(value, (int, float)))
    in_range = valid and (low is None or value >= low) and (high is None or value <= high) and (above is None or value > above)
    if not in_range:
        bounds = f" from {low}" if low is not None else f" above {above}" if above is not None else ""
        bounds += f" to {high}" if high is not None else ""
        kind = "an integer" if integer else "a number"
        raise RequestError(f"'{key}' must be {kind}{bounds}, got {json.dumps(value)[:80]}.", param=key)
    return value if integer else float(value)


def read_messages(raw: Any) -> tuple[str | None, tuple[Mapping[str, str], ...]]:
    """(system prompt, the other messages in tuneline's roles), checked to alternate and end with a
    user or tool message."""
    if not isinstance(raw, list) or not raw:
        got = "missing" if raw is None else f"a {type(raw).__name__}" if not isinstance(raw, list) else "empty"
        raise RequestError(f"'messages' must be a non-empty list of {{role, content}} objects; it is {got}.",
                           param="messages")
    system = None
    if isinstance(raw[0], dict) and raw[0].get("role") in ("system", "developer"):
        system = _content(raw[0], 0)
        raw = raw[1:]
    offset = 1 if system is not None else 0
    messages = tuple(_message(message, i + offset) for i, message in enumerate(raw))
    for i, message in enumerate(messages):
        expected = SOURCE_ROLES if i % 2 == 0 else TARGET_ROLES
        if message["role"] not in expected:
            wanted = "a user or tool" if i % 2 == 0 else "an assistant"
            raise RequestError(f"messages[{i + offset}] has role '{_openai_role(message['role'])}' where {wanted} message "
                               "was expected: after an optional first system message, messages must alternate user "
                               "(or tool) and assistant, ending with a user or tool message.", param="messages")
    if not messages or messages[-1]["role"] not in SOURCE_ROLES:
        raise RequestError("the last message must be a user or tool message for the assistant to answer.", param="messages")
    return system, messages


def _openai_role(role: str) -> str:
    return {"observation": "tool", "function": "assistant"}.get(role, role)


def _message(message: Any, index: int) -> dict[str, str]:
    if not isinstance(message, dict):
        raise RequestError(f"messages[{index}] must be a JSON object with 'role' and 'content'.", param="messages")
    role = message.get("role")
    if role in ("system", "developer"):
        raise RequestError(f"messages[{index}] is a system message; only the first message may be one.", param="messages")
    if role not in ("user", "assistant", "tool", "function"):
        raise RequestError(f"messages[{index}] has role {json.dumps(role)}; use system, user, assistant or tool.",
                           param="messages")
    if role == "assistant" and message.get("tool_calls"):
        return {"role": "function", "content": _calls_json(message["tool_calls"], index)}
    return {"role": {"tool": "observation"}.get(role, role), "content": _content(message, index)}


def _content(message: Mapping[str, Any], index: int) -> str:
    """The text of a message: a string, or a list of text parts (joined)."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                                         for p in content):
        return "".join(part["text"] for part in content)
    if isinstance(content, list):
        raise RequestError(f"messages[{index}].content holds a part that is not text; this server reads text parts "
                           "({\"type\": \"text\", \"text\": ...}) only.", param="messages")
    raise RequestError(f"messages[{index}].content must be a string or a list of text parts, got "
                       f"{json.dumps(content)[:80]}.", param="messages")


def _calls_json(tool_calls: Any, index: int) -> str:
    """An assistant's tool calls as tuneline's function message: [{"name", "arguments"}] with parsed arguments."""
    calls = []
    for call in tool_calls if isinstance(tool_calls, list) else [None]:
        function = call.get("function") if isinstance(call, dict) else None
        name = function.get("name") if isinstance(function, dict) else None
        arguments = function.get("arguments", "{}") if isinstance(function, dict) else None
        try:
            parsed = json.loads(arguments) if isinstance(arguments, str) else arguments
        except ValueError:
            parsed = None
        if not isinstance(name, str) or not isinstance(parsed, dict):
            raise RequestError(f"messages[{index}].tool_calls must be a list of {{\"type\": \"function\", \"function\": "
                               "{\"name\": ..., \"arguments\": \"<a JSON object>\"}}.", param="messages")
        calls.append({"name": name, "arguments": parsed})
    return json.dumps(calls, ensure_ascii=False)


def read_tools(raw: Any, choice: Any) -> str | None:
    """The functions of `tools` as the JSON list a template describes, or None (no tools, or tool_choice none)."""
    if choice not in (None, "auto", "none"):
        raise RequestError("'tool_choice' may be \"auto\" or \"none\" here; the model decides whether to call a tool.",
                           param="tool_choice")
    if raw is None or raw == [] or choice == "none":
        return None
    if not isinstance(raw, list):
        raise RequestError(f"'tools' must be a list of tools, got {json.dumps(raw)[:80]}; {TOOL_SHAPE}", param="tools")
    functions = []
    for index, tool in enumerate(raw):
        function, problem = _tool_function(tool)
        if problem:
            raise RequestError(f"tools[{index}]{problem}; {TOOL_SHAPE}", param="tools")
        functions.append(function)
    return json.dumps(functions, ensure_ascii=False)


TOOL_SHAPE = ("each tool is {\"type\": \"function\", \"function\": {\"name\": ..., \"description\": ..., \"parameters\": "
              "<a JSON Schema object>}}.")


def _tool_function(tool: Any) -> tuple[Any, str | None]:
    """A tool's `function` object, and what is wrong with it (a phrase after `tools[i]`), if anything."""
    if not isinstance(tool, dict):
        return None, f" is {json.dumps(tool)[:40]}, not a JSON object"
    if tool.get("type", "function") != "function":
        return None, f".type is {json.dumps(tool['type'])[:40]}; only \"function\" tools are served"
    function = tool.get("function")
    if not isinstance(function, dict):
        return None, " has no 'function' object" if function is None else ".function is not a JSON object"
    name, parameters = function.get("name"), function.get("parameters")
    if not isinstance(name, str) or not name:
        return None, ".function.name is missing" if name is None else ".function.name must be a non-empty string"
    if not isinstance(function.get("description", ""), str):
        return None, f".function.description ({name}) must be a string"
    if parameters is None:
        return function, None
    if not isinstance(parameters, dict):
        return None, f".function.parameters ({name}) must be a JSON Schema object, got {json.dumps(parameters)[:40]}"
    properties, required = parameters.get("properties", {}), parameters.get("required", [])
    if not isinstance(properties, dict) or not all(isinstance(schema, dict) for schema in properties.values()):
        return None, f".function.parameters.properties ({name}) must map each argument's name to its schema object"
    if not isinstance(required, list) or not all(isinstance(key, str) for key in required):
        return None, f".function.parameters.required ({name}) must be a list of argument names"
    return function, None


def generating_for(request: ChatRequest, defaults: GeneratingConfig) -> GeneratingConfig:
    """The served defaults with the request's settings, as LLaMA-Factory's engine merges them."""
    changes: dict[str, Any] = {key: value for key, value in (
        ("do_sample", request.do_sample), ("temperature", request.temperature), ("top_p", request.top_p),
        ("top_k", request.top_k), ("repetition_penalty", request.repetition_penalty),
        ("max_new_tokens", request.max_tokens)) if value is not None}
    merged = dataclasses.replace(defaults, **changes)
    if request.n > 1:  # several answers need sampling, at some temperature
        merged = dataclasses.replace(merged, do_sample=True, temperature=merged.temperature or 1.0)
    if not merged.temperature or not merged.top_p:
        merged = dataclasses.replace(merged, do_sample=False)
    return merged


def completion_body(*, completion_id: str, model: str, choices: Sequence[Mapping[str, Any]], prompt_tokens: int,
                    completion_tokens: int) -> dict[str, Any]:
    return {"id": completion_id, "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": list(choices), "usage": usage_body(prompt_tokens, completion_tokens)}


def usage_body(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def chunk_body(*, completion_id: str, model: str, delta: Mapping[str, Any] | None, finish_reason: str | None = None,
               usage: Mapping[str, int] | None = None) -> dict[str, Any]:
    """One streamed chunk; a usage chunk (stream_options.include_usage) has no choices."""
    choices = [] if delta is None else [{"index": 0, "delta": dict(delta), "finish_reason": finish_reason}]
    chunk = {"id": completion_id, "object": "chat.completion.chunk", "created": int(time.time()), "model": model,
             "choices": choices}
    return {**chunk, "usage": dict(usage)} if usage is not None else chunk
