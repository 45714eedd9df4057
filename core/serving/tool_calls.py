"""Tool calls read back from a model's answer, in the template's tool format: the inverse of
`core/templates/tools.py`'s call writers, with the patterns LLaMA-Factory 0.9.5's API reads them by.

Each reader returns the calls as (name, arguments as a JSON string, as OpenAI's `function.arguments`
holds them), or None when the answer holds no call in that format (it is then a plain reply).
glm4_moe is read in its own XML form (LLaMA-Factory reads it with Qwen's JSON pattern, which never
matches what that format writes), and minimax2's invocations also without the `<minimax:tool_call>`
wrapper that its writer leaves out.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Callable
from typing import Any

ToolCall = tuple[str, str]
"""(function name, arguments as a JSON object's text)."""


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def _loads(text: str) -> Any:
    """JSON, or None when `text` is not JSON."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return None


def _value(raw: str) -> Any:
    """An XML-like format's parameter value: JSON where it parses, else the text as written."""
    parsed = _loads(raw.strip())
    return raw.strip() if parsed is None and raw.strip() != "null" else parsed


def _default(content: str) -> list[ToolCall] | None:
    found = re.findall(r"Action:\s*([a-zA-Z0-9_]+)\s*Action Input:\s*(.+?)(?=\s*Action:|\s*$)", content, re.DOTALL)
    calls = []
    for name, arguments in found:
        parsed = _loads(arguments.strip().strip('"').strip("`"))
        if parsed is None:
            return None
        calls.append((name.strip(), _dumps(parsed)))
    return calls or None


def _json_objects(content: str, *, arguments_key: str) -> list[ToolCall] | None:
    """A JSON object {"name", arguments_key} or a list of them (mistral, llama3)."""
    parsed = _loads(content.strip())
    objects = parsed if isinstance(parsed, list) else [parsed]
    if not objects or not all(isinstance(o, dict) and "name" in o and arguments_key in o for o in objects):
        return None
    return [(str(o["name"]), _dumps(o[arguments_key])) for o in objects]


def _qwen(content: str) -> list[ToolCall] | None:
    found = re.findall(r"<tool_call>(.+?)</tool_call>(?=\s*<tool_call>|\s*$)", content, re.DOTALL)
    calls = []
    for block in found:
        parsed = _loads(block.strip())
        if not isinstance(parsed, dict) or "name" not in parsed or "arguments" not in parsed:
            return None
        calls.append((str(parsed["name"]), _dumps(parsed["arguments"])))
    return calls or None


def _glm4(content: str) -> list[ToolCall] | None:
    if "\n" not in content:
        return None
    name, arguments = content.split("\n", maxsplit=1)
    parsed = _loads(arguments.strip())
    return [(name, _dumps(parsed))] if parsed is not None else None


def _glm4_moe(content: str) -> list[ToolCall] | None:
    calls = []
    for block in content.split("<tool_call>")[1:]:
        block = block.split("</tool_call>", 1)[0]
        name = re.split(r"\n|<arg_key>", block, maxsplit=1)[0].strip()
        pairs = re.findall(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", block, re.DOTALL)
        if not name:
            return None
        calls.append((name, _dumps({key.strip(): _value(value) for key, value in pairs})))
    return calls or None


def _tagged_functions(content: str, *, outer: str) -> list[ToolCall] | None:
    """`<outer><function=NAME><parameter=KEY>VALUE</parameter>...</function></outer>` (qwen3_5, seed_oss)."""
    pattern = rf"<{outer}>\s*<function=\s*([^\s<>]+)\s*(.*?)\s*</function>\s*</{outer}>"
    calls = []
    for name, block in re.findall(pattern, content, re.DOTALL):
        pairs = re.findall(r"<parameter=(.*?)>(.*?)</parameter>", block.strip(), re.DOTALL)
        calls.append((name.strip(), _dumps({key: _value(value) for key, value in pairs})))
    return calls or None


def _minimax1(content: str) -> list[ToolCall] | None:
    found = re.search(r"<tool_calls>\s*(.+?)\s*</tool_calls>", content, re.DOTALL)
    if not found:
        return None
    objects = [_loads(line.strip()) for line in found.group(1).split("\n") if line.strip()]
    return [(str(o["name"]), _dumps(o.get("arguments", {}))) for o in objects if isinstance(o, dict) and "name" in o] or None


def _minimax2(content: str) -> list[ToolCall] | None:
    """Invocations inside `<minimax:tool_call>`, or bare ones: the format's writer (as LLaMA-Factory's) writes no wrapper."""
    found = re.search(r"<minimax:tool_call>\s*(.+?)\s*</minimax:tool_call>", content, re.DOTALL)
    calls = []
    for name, block in re.findall(r"<invoke name=\"(.*?)\">(.*?)</invoke>", found.group(1) if found else content, re.DOTALL):
        pairs = re.findall(r"<parameter name=\"(.*?)\">(.*?)</parameter>", block, re.DOTALL)
        calls.append((name.strip(), _dumps({key: _value(value) for key, value in pairs})))
    return calls or None


def _lfm2_value(node: ast.AST) -> Any:
    if isinstance(node, ast.Name) and node.id in ("true", "false", "null"):
        return {"true": True, "false": False, "null": None}[node.id]
    return ast.literal_eval(node)


def _lfm2(content: str) -> list[ToolCall] | None:
    found = re.search(r"<\|tool_call_start\|>(.*?)<\|tool_call_end\|>", content, re.DOTALL)
    try:
        tree = ast.parse(found.group(1).strip(), mode="eval") if found else None
    except SyntaxError:
        return None
    nodes = tree.body.elts if tree and isinstance(tree.body, ast.List) else [tree.body] if tree else []
    calls = []
    for node in nodes:
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
            return None
        try:
            arguments = {keyword.arg: _lfm2_value(keyword.value) for keyword in node.keywords}
        except (ValueError, SyntaxError):
            return None
        calls.append((node.func.id, _dumps(arguments)))
    return calls or None


def _gemma4_arguments(text: str) -> str:
    """Gemma 4's `key:value,...` with `<|"|>`-quoted strings, as a JSON object's text where it parses."""
    if not text.strip():
        return "{}"
    quoted = re.sub(r"<\|\"\|>(.*?)<\|\"\|>", lambda m: _dumps(m.group(1)), "{" + text.strip() + "}", flags=re.DOTALL)
    keyed = re.sub(r"(^|[{\s,])([A-Za-z_][A-Za-z0-9_]*)(\s*:)", r'\1"\2"\3', quoted)
    for candidate in (keyed, text.strip()):
        parsed = _loads(candidate)
        if parsed is not None:
            return _dumps(parsed)
    return text.strip()


def _gemma4(content: str) -> list[ToolCall] | None:
    found = re.findall(r"<\|tool_call>call:([^{\s]+)\{(.*?)\}<tool_call\|>", content, re.DOTALL)
    return [(name.strip(), _gemma4_arguments(block)) for name, block in found] or None


READERS: dict[str, Callable[[str], list[ToolCall] | None]] = {
    "default": _default,
    "qwen": _qwen,
    "ling": _qwen,
    "glm4_moe": _glm4_moe,
    "mistral": lambda content: _json_objects(content, arguments_key="arguments"),
    "llama3": lambda content: _json_objects(content, arguments_key="parameters"),
    "glm4": _glm4,
    "qwen3_5": lambda content: _tagged_functions(content, outer="tool_call"),
    "seed_oss": lambda content: _tagged_functions(content, outer="seed:tool_call"),
    "minimax1": _minimax1,
    "minimax2": _minimax2,
    "lfm2": _lfm2,
    "gemma4": _gemma4,
}


def read_tool_calls(content: str, *, tool_format: str) -> list[ToolCall] | None:
    """The tool calls `content` holds in `tool_format`, or None when it is a plain answer."""
    return READERS[tool_format](content)
