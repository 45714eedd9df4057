"""Tool calls read back from answers: for every tool format, what tuneline's writer (the text a model
trained on tool-call rows learns to write) reads back as the same calls; plain answers stay text."""

from __future__ import annotations

import dataclasses
import json

import pytest

from tuneline.core.serving.tool_calls import READERS, read_tool_calls
from tuneline.core.templates.catalog import TEMPLATES
from tuneline.core.templates.spec import TOOL_FORMATS
from tuneline.core.templates.tools import call_text

CALLS = [{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}},
         {"name": "add", "arguments": {"a": 1.5, "b": [1, 2]}}]
ONE_CALL_FORMATS = ("glm4",)  # writes one call per message


def test_every_tool_format_has_a_reader():
    assert set(READERS) == set(TOOL_FORMATS)


@pytest.mark.parametrize("tool_format", TOOL_FORMATS)
def test_written_calls_read_back(tool_format: str):
    template = dataclasses.replace(TEMPLATES["chatml"], tool_format=tool_format)
    calls = CALLS[:1] if tool_format in ONE_CALL_FORMATS else CALLS
    written = call_text(template, json.dumps(calls))
    read = read_tool_calls(written, tool_format=tool_format)
    assert read is not None, written
    assert [(name, json.loads(arguments)) for name, arguments in read] == [(c["name"], c["arguments"]) for c in calls]


@pytest.mark.parametrize("tool_format", TOOL_FORMATS)
def test_a_plain_answer_is_no_call(tool_format: str):
    assert read_tool_calls("It is sunny in Paris today.", tool_format=tool_format) is None


def test_the_formats_of_real_models():
    qwen = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    assert read_tool_calls(qwen, tool_format="qwen") == [("get_weather", '{"city": "Paris"}')]
    minimax = '<minimax:tool_call>\n<invoke name="f">\n<parameter name="x">hi</parameter>\n</invoke>\n</minimax:tool_call>'
    assert read_tool_calls(minimax, tool_format="minimax2") == [("f", '{"x": "hi"}')]
    assert read_tool_calls("Action: f\nAction Input: not json", tool_format="default") is None
