"""Tool descriptions (appended to the system text) and tool calls (`function` messages), written in
each tool format exactly as LLaMA-Factory 0.9.5 writes them: the same prompts, the same JSON."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from tuneline.core.errors import DataError
from tuneline.core.templates.spec import Template

Call = tuple[str, Any]
"""A tool call: (name, arguments as parsed from the row)."""

_DEFAULT_TOOL_PROMPT = (
    "You have access to the following tools:\n{tool_text}"
    "Use the following format if using a tool:\n"
    "```\n"
    "Action: tool name (one of [{tool_names}])\n"
    "Action Input: the input to the tool, in a JSON format representing the kwargs "
    '(e.g. ```{{"input": "hello world", "num_beams": 5}}```)\n'
    "```\n"
)

_QWEN_TOOL_PROMPT = (
    "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>{tool_text}"
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\n<tool_call>\n{{"name": <function-name>, '
    '"arguments": <args-json-object>}}\n</tool_call>'
)

_GLM4_TOOL_PROMPT = (
    "你是一个名为 ChatGLM 的人工智能助手。你是基于智谱 AI 公司训练的语言模型 GLM-4 模型开发的，"
    "你的任务是针对用户的问题和要求提供适当的答复和支持。\n\n# 可用工具{tool_text}"
)

_SEED_TOOL_PROMPT = (
    "system\nYou are Doubao, a helpful AI assistant. You may call one or more functions to assist with the user "
    "query.Tool List:\nYou are authorized to use the following tools (described in JSON Schema format). Before "
    "performing any task, you must decide how to call them based on the descriptions and parameters of these "
    "tools.{tool_text}\n工具调用请遵循如下格式:\n<seed:tool_call>\n<function=example_function_name>\n"
    "<parameter=example_parameter_1>value_1</parameter>\n<parameter=example_parameter_2>This is the value for "
    "the second parameter\nthat can span\nmultiple lines</parameter>\n</function>\n</seed:tool_call>\n"
)


_GLM4_MOE_TOOL_PROMPT = (
    "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>{tool_text}"
    "\n</tools>\n\nFor each function call, output the function name and arguments within the following XML format:"
    "\n<tool_call>{{function-name}}\n<arg_key>{{arg-key-1}}</arg_key>\n<arg_value>{{arg-value-1}}</arg_value>"
    "\n<arg_key>{{arg-key-2}}</arg_key>\n<arg_value>{{arg-value-2}}</arg_value>\n...\n</tool_call>\n"
)

_MINIMAX1_TOOL_PROMPT = (
    "You are provided with these tools:\n<tools>\n{tool_text}</tools>\n\n"
    "If you need to call tools, please respond with <tool_calls></tool_calls> XML tags, and provide tool-name and "
    "json-object of arguments, following the format below:\n<tool_calls>\n"
    '{{"name": <tool-name-1>, "arguments": <args-json-object-1>}}\n...\n</tool_calls>'
)

_MINIMAX2_TOOL_PROMPT = (
    "\n\n# Tools\n\nYou may call one or more tools to assist with the user query.\n"
    "Here are the tools available in JSONSchema format:\n\n<tools>\n{tool_text}</tools>\n\n"
    "When making tool calls, use XML format to invoke tools and pass parameters:\n"
    '\n<minimax:tool_call>\n<invoke name="tool-name-1">\n<parameter name="param-key-1">param-value-1</parameter>\n'
    '<parameter name="param-key-2">param-value-2</parameter>\n...\n</invoke>\n</minimax:tool_call>'
)

_QWEN3_5_TOOL_PROMPT = (
    "\n\n# Tools\n\nYou have access to the following functions:\n\n<tools>{tool_text}"
    "\n</tools>\n\nIf you choose to call a function ONLY reply in the following format with NO suffix:\n\n"
    "<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n</parameter>\n"
    "<parameter=example_parameter_2>\nThis is the value for the second parameter\nthat can span\nmultiple lines\n"
    "</parameter>\n</function>\n</tool_call>\n\n<IMPORTANT>\nReminder:\n"
    "- Function calls MUST follow the specified format: "
    "an inner <function=...></function> block must be nested within <tool_call></tool_call> XML tags\n"
    "- Required parameters MUST be specified\n"
    "- You may provide optional reasoning for your function call in natural language "
    "BEFORE the function call, but NOT after\n"
    "- If there is no function call available, answer the question like normal with your current knowledge "
    "and do not tell the user about function calls\n</IMPORTANT>"
)

_LING_TOOL_PROMPT = _QWEN_TOOL_PROMPT.removeprefix("\n\n") + "\ndetailed thinking off"

_LFM2_TOOL_PROMPT = "List of tools: <|tool_list_start|>{tool_text}<|tool_list_end|>"

_GEMMA4_QUOTE = '<|"|>'
"""How Gemma 4's tool syntax quotes a string."""


def _dumps(value: Any, **kwargs: Any) -> str:
    return json.dumps(value, ensure_ascii=False, **kwargs)


def _unwrap(tool: dict[str, Any], *, missing: Any = "") -> dict[str, Any]:
    return tool.get("function", missing) if tool.get("type") == "function" else tool


def _text(value: Any) -> str:
    """A parameter value as the XML-like formats write it: a string as it is, anything else as JSON."""
    return value if isinstance(value, str) else _dumps(value)


def _wrap(tool: dict[str, Any]) -> dict[str, Any]:
    return tool if tool.get("type") == "function" else {"type": "function", "function": tool}


# ---------------------------------------------------------------- tool descriptions


def _default_param_line(name: str, param: dict[str, Any], required: list[str]) -> str:
    req = ", required" if name in required else ""
    enum = ", should be one of [{}]".format(", ".join(param["enum"])) if param.get("enum") else ""
    item_spec = param.get("items")
    items = ", where each item should be {}".format(item_spec.get("type", "")) if item_spec else ""
    return f"  - {name} ({param.get('type', '')}{req}): {param.get('description', '')}{enum}{items}\n"


def _default_tools(tools: list[dict[str, Any]]) -> str:
    tool_text, names = "", []
    for tool in map(_unwrap, tools):
        params = tool["parameters"]
        args = "".join(
            _default_param_line(name, param, params.get("required", []))
            for name, param in params["properties"].items()
        )
        tool_text += (
            f"> Tool Name: {tool['name']}\nTool Description: {tool.get('description', '')}\n"
            f"Tool Args:\n{args}\n"
        )
        names.append(tool["name"])
    return _DEFAULT_TOOL_PROMPT.format(tool_text=tool_text, tool_names=", ".join(names))


def _qwen_tools(tools: list[dict[str, Any]]) -> str:
    return _QWEN_TOOL_PROMPT.format(tool_text=_qwen_tool_list(tools))


def _mistral_tools(tools: list[dict[str, Any]]) -> str:
    return f"[AVAILABLE_TOOLS] {_dumps([_wrap(tool) for tool in tools])}[/AVAILABLE_TOOLS]"


def _glm4_tools(tools: list[dict[str, Any]]) -> str:
    tool_text = "".join(
        f"\n\n## {tool['name']}\n\n{_dumps(tool, indent=4)}\n在调用上述函数时，请使用 Json 格式表示调用的参数。"
        for tool in map(_unwrap, tools)
    )
    return _GLM4_TOOL_PROMPT.format(tool_text=tool_text)


def _llama3_tools(tools: list[dict[str, Any]]) -> str:
    raise DataError(
        "the llama3 tool format does not support tool descriptions here: LLaMA-Factory's llama3 tool prompt "
        "writes today's date, so the same row would give different tokens from one day to the next; "
        "drop the tools column or use a template with another tool format (qwen, mistral, default)"
    )


def _seed_tools(tools: list[dict[str, Any]]) -> str:
    return _SEED_TOOL_PROMPT.format(tool_text="\n" + _dumps(tools))


def _qwen_tool_list(tools: list[dict[str, Any]]) -> str:
    return "".join("\n" + _dumps(_wrap(tool)) for tool in tools)


def _glm4_moe_tools(tools: list[dict[str, Any]]) -> str:
    return _GLM4_MOE_TOOL_PROMPT.format(tool_text=_qwen_tool_list(tools))


def _ling_tools(tools: list[dict[str, Any]]) -> str:
    return _LING_TOOL_PROMPT.format(tool_text=_qwen_tool_list(tools))


def _qwen3_5_tools(tools: list[dict[str, Any]]) -> str:
    return _QWEN3_5_TOOL_PROMPT.format(tool_text="".join("\n" + _dumps(_unwrap(tool, missing=tool)) for tool in tools))


def _minimax1_tools(tools: list[dict[str, Any]]) -> str:
    return _MINIMAX1_TOOL_PROMPT.format(tool_text="".join(_dumps(_unwrap(tool)) + "\n" for tool in tools))


def _minimax2_tools(tools: list[dict[str, Any]]) -> str:
    return _MINIMAX2_TOOL_PROMPT.format(tool_text="".join(f"<tool>{_dumps(_unwrap(tool))}</tool>\n" for tool in tools))


def _lfm2_tools(tools: list[dict[str, Any]]) -> str:
    return _LFM2_TOOL_PROMPT.format(tool_text=_dumps([_unwrap(tool, missing=tool) for tool in tools]))


def _gemma4_quoted(text: Any) -> str:
    return f"{_GEMMA4_QUOTE}{text}{_GEMMA4_QUOTE}"


def _gemma4_properties(properties: dict[str, Any]) -> str:
    described = []
    for name, schema in properties.items():
        parts = [f"description:{_gemma4_quoted(schema['description'])}"] if schema.get("description") else []
        parts += [f"type:{_gemma4_quoted(str(schema['type']).upper())}"] if schema.get("type") else []
        described.append(f"{name}:{{{','.join(parts)}}}")
    return ",".join(described)


def _gemma4_declaration(tool: dict[str, Any]) -> str:
    text = f"declaration:{tool['name']}{{description:{_gemma4_quoted(tool.get('description', ''))}"
    params = tool.get("parameters")
    if params:
        parts = [f"properties:{{{_gemma4_properties(params['properties'])}}}"] if params.get("properties") else []
        if params.get("required"):
            parts.append("required:[" + ",".join(_gemma4_quoted(item) for item in params["required"]) + "]")
        parts += [f"type:{_gemma4_quoted(str(params['type']).upper())}"] if params.get("type") else []
        text += f",parameters:{{{','.join(parts)}}}"
    response = tool.get("response")
    if response:
        parts = [f"description:{_gemma4_quoted(response['description'])}"] if response.get("description") else []
        kind = str(response.get("type", "")).upper()
        parts += [f"type:{_gemma4_quoted(kind)}"] if kind == "OBJECT" else []
        text += f",response:{{{','.join(parts)}}}"
    return text + "}"


def _gemma4_tools(tools: list[dict[str, Any]]) -> str:
    return "\n".join(_gemma4_declaration(_unwrap(tool, missing=tool)) for tool in tools)


_DESCRIBERS: dict[str, Callable[[list[dict[str, Any]]], str]] = {
    "default": _default_tools, "qwen": _qwen_tools, "mistral": _mistral_tools,
    "glm4": _glm4_tools, "llama3": _llama3_tools, "seed_oss": _seed_tools,
    "glm4_moe": _glm4_moe_tools, "ling": _ling_tools, "qwen3_5": _qwen3_5_tools, "minimax1": _minimax1_tools,
    "minimax2": _minimax2_tools, "lfm2": _lfm2_tools, "gemma4": _gemma4_tools,
}


def tool_text(template: Template, tools: str) -> str:
    """The text that describes `tools` (a JSON list of function schemas) in the system message."""
    parsed = _parse(tools, what="tools")
    if not isinstance(parsed, list):
        parsed = [parsed]
    if not parsed:
        return ""
    describe = _DESCRIBERS[template.tool_format]
    try:
        return describe(parsed)
    except (KeyError, TypeError, AttributeError) as e:
        index = next((i for i, tool in enumerate(parsed) if not _describes(describe, tool)), 0)
        raise DataError(f"tools[{index}] is not a function schema the {template.tool_format} tool format can describe "
                        f"({e!r}): {_dumps(parsed[index])[:200]!r}; a tool is {{\"name\", \"description\", \"parameters\": "
                        "{\"type\": \"object\", \"properties\": {...}, \"required\": [...]}}") from e


def _describes(describe: Callable[[list[dict[str, Any]]], str], tool: Any) -> bool:
    """Whether `describe` can write `tool` alone (to name the tool of a list it cannot write)."""
    try:
        describe([tool])
    except (KeyError, TypeError, AttributeError):
        return False
    return True


# ---------------------------------------------------------------- tool calls


def _default_calls(calls: list[Call]) -> str:
    return "\n".join(f"Action: {name}\nAction Input: {_dumps(arguments)}" for name, arguments in calls)


def _qwen_calls(calls: list[Call]) -> str:
    return "\n".join(
        f"<tool_call>\n{_dumps({'name': name, 'arguments': arguments})}\n</tool_call>" for name, arguments in calls
    )


def _mistral_calls(calls: list[Call]) -> str:
    return _dumps([{"name": name, "arguments": arguments} for name, arguments in calls])


def _glm4_calls(calls: list[Call]) -> str:
    if len(calls) > 1:
        raise DataError("the glm4 tool format writes one tool call per message, got a list of several")
    name, arguments = calls[0]
    return f"{name}\n{_dumps(arguments)}"


def _llama3_calls(calls: list[Call]) -> str:
    objects = [{"name": name, "parameters": arguments} for name, arguments in calls]
    return _dumps(objects[0] if len(objects) == 1 else objects)


def _seed_call(name: str, arguments: dict[str, Any]) -> str:
    params = "".join(
        f"\n<parameter={key}>{_text(value)}</parameter>"
        for key, value in arguments.items()
    )
    return f"\n<seed:tool_call>\n<function={name}{params}\n</function>\n</seed:tool_call>"


def _seed_calls(calls: list[Call]) -> str:
    return "\n".join(_seed_call(name, arguments) for name, arguments in calls)


def _glm4_moe_calls(calls: list[Call]) -> str:
    return "\n".join(
        "\n<tool_call>" + name + "".join(f"\n<arg_key>{key}</arg_key>\n<arg_value>{_text(value)}</arg_value>"
                                          for key, value in arguments.items())
        for name, arguments in calls
    )


def _qwen3_5_calls(calls: list[Call]) -> str:
    return "\n".join(
        f"<tool_call>\n<function={name}>"
        + "".join(f"\n<parameter={key}>\n{_text(value)}\n</parameter>" for key, value in arguments.items())
        + "\n</function>\n</tool_call>"
        for name, arguments in calls
    )


def _minimax1_calls(calls: list[Call]) -> str:
    objects = "\n".join(_dumps({"name": name, "arguments": arguments}) for name, arguments in calls)
    return f"<tool_calls>\n{objects}\n</tool_calls>"


def _minimax2_calls(calls: list[Call]) -> str:
    return "\n".join(
        f'<invoke name="{name}">'
        + "".join(f'\n<parameter name="{key}">{_text(value)}</parameter>' for key, value in arguments.items())
        + "\n</invoke>"
        for name, arguments in calls
    )


def _lfm2_call(name: str, arguments: dict[str, Any]) -> str:
    keywords = [f'{key}="{value}"' if isinstance(value, str) else f"{key}={_dumps(value)}" for key, value in arguments.items()]
    return f"{name}({', '.join(keywords)})"


def _lfm2_calls(calls: list[Call]) -> str:
    return "<|tool_call_start|>[" + ", ".join(_lfm2_call(name, arguments) for name, arguments in calls) + "]<|tool_call_end|>"


def _gemma4_value(value: Any, *, quote_keys: bool) -> str:
    if isinstance(value, str):
        return _gemma4_quoted(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        items = [f"{_gemma4_quoted(key) if quote_keys else key}:{_gemma4_value(value[key], quote_keys=quote_keys)}"
                 for key in sorted(value)]
        return "{" + ",".join(items) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_gemma4_value(item, quote_keys=quote_keys) for item in value) + "]"
    return "null" if value is None else str(value)


def _gemma4_call(name: str, arguments: Any) -> str:
    if isinstance(arguments, dict):
        body = ",".join(f"{key}:{_gemma4_value(arguments[key], quote_keys=False)}" for key in sorted(arguments))
    elif isinstance(arguments, str):
        body = arguments
    else:
        body = _gemma4_value(arguments, quote_keys=False)
    return f"<|tool_call>call:{name}{{{body}}}<tool_call|>"


def _gemma4_calls(calls: list[Call]) -> str:
    return "".join(_gemma4_call(name, arguments) for name, arguments in calls)


_CALL_WRITERS: dict[str, Callable[[list[Call]], str]] = {
    "default": _default_calls, "qwen": _qwen_calls, "mistral": _mistral_calls,
    "glm4": _glm4_calls, "llama3": _llama3_calls, "seed_oss": _seed_calls,
    "glm4_moe": _glm4_moe_calls, "ling": _qwen_calls, "qwen3_5": _qwen3_5_calls, "minimax1": _minimax1_calls,
    "minimax2": _minimax2_calls, "lfm2": _lfm2_calls, "gemma4": _gemma4_calls,
}


def parse_calls(content: str) -> list[Call]:
    """The calls of a `function` message: a JSON object `{"name", "arguments"}` or a list of them."""
    parsed = _parse(content, what="function message")
    calls = parsed if isinstance(parsed, list) else [parsed]
    try:
        found = [(call["name"], call["arguments"]) for call in calls]
    except (KeyError, TypeError) as e:
        raise DataError(
            f'a function message must hold {{"name": ..., "arguments": ...}} or a list of them, got {content[:200]!r}'
        ) from e
    if not all(isinstance(name, str) for name, _ in found):
        raise DataError(f"a tool call's name must be a string: {content[:200]!r}")
    return found


def call_text(template: Template, content: str) -> str:
    """The tool calls of a `function` message written in the template's tool format."""
    try:
        return _CALL_WRITERS[template.tool_format](parse_calls(content))
    except AttributeError as e:  # arguments that are not an object, in a format that lists their keys
        raise DataError(f"the tool call arguments are not an object: {content[:200]!r}") from e


def _parse(text: str, *, what: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise DataError(f"the row's {what} is not valid JSON ({e}): {text[:200]!r}") from e
