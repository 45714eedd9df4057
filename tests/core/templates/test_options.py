"""The template keys (`default_system`, `tool_format`, `enable_thinking`, `preserve_thinking`) as a
stage applies them to its template, and the settings refused when the config is read. Their tokens
are checked against LLaMA-Factory's own rows in test_golden.py."""

from __future__ import annotations

import logging
import re

import pytest

from tuneline.core.errors import ConfigError
from tuneline.core.stages.registry import build_stage_config
from tuneline.core.templates.conversation import get_template
from tuneline.core.templates.options import with_template_keys
from tuneline.core.templates.spec import CONTENT, EOS, TOOL_FORMATS

KEYS = {"default_system": None, "tool_format": None, "enable_thinking": True, "preserve_thinking": False}


def test_a_tool_format_writes_calls_through_the_plain_reply_slot():
    qwen = get_template("qwen")
    keyed = with_template_keys(qwen, **{**KEYS, "tool_format": "mistral", "default_system": "Be brief."})
    assert (keyed.tool_format, keyed.format_function, keyed.default_system) == ("mistral", (CONTENT, EOS), "Be brief.")
    assert qwen.function_slot == ("{content}<|im_end|>\n",)  # the registered value is left as it was
    efficient = with_template_keys(get_template("gpt_oss"), **{**KEYS, "tool_format": "qwen"})
    assert efficient.format_function == (CONTENT,)
    assert with_template_keys(qwen, **KEYS) is qwen


def test_thinking_keys_reach_reasoning_templates_only(caplog):
    thinking = {**KEYS, "enable_thinking": None, "preserve_thinking": True}
    keyed = with_template_keys(get_template("qwen3"), **thinking)
    assert (keyed.enable_thinking, keyed.preserve_thinking) == (None, True)
    with caplog.at_level(logging.WARNING):
        plain = with_template_keys(get_template("qwen"), **thinking)
    assert (plain.enable_thinking, plain.preserve_thinking) == (True, False)
    assert "writes no thoughts" in caplog.text


@pytest.mark.parametrize(("keys", "fragments"), [
    ({"tool_format": "qwn"}, ("tool_format 'qwn'", "did you mean 'qwen'", *TOOL_FORMATS)),
    ({"template": "auto", "tool_format": "qwen"}, ("'tool_format: qwen' changes how a named template", "'template: auto'")),
    ({"template": "auto", "enable_thinking": False}, ("'enable_thinking: False'",)),
    ({"template": "auto", "preserve_thinking": True}, ("'preserve_thinking: true'",)),
])
def test_template_keys_that_cannot_apply_are_named(keys, fragments):
    with pytest.raises(ConfigError) as error:
        build_stage_config({"stage": "sft", **keys})
    text = " ".join(error.value.problems)
    assert all(fragment in text for fragment in fragments), text


def test_template_keys_are_read_with_llamafactorys_values():
    config = build_stage_config({"stage": "sft", "template": "qwen3", "default_system": "", "tool_format": "qwen3_5",
                                 "enable_thinking": None, "preserve_thinking": True})
    assert (config.data.default_system, config.data.tool_format, config.data.enable_thinking) == ("", "qwen3_5", None)
    assert len(TOOL_FORMATS) == 13


@pytest.mark.parametrize(("content", "fragment"), [
    ('{"name": 7, "arguments": {}}', "a tool call's name must be a string"),
    ('{"name": "f", "arguments": [1]}', "the tool call arguments are not an object"),
    ('{"arguments": {}}', 'a function message must hold {"name": ..., "arguments": ...}'),
])
def test_a_malformed_tool_call_is_a_data_error_in_every_tool_format(content: str, fragment: str):
    from tuneline.core.errors import DataError
    from tuneline.core.templates.tools import call_text

    for tool_format in ("glm4_moe", "qwen3_5", "seed_oss", "default"):
        template = with_template_keys(get_template("qwen"), **{**KEYS, "tool_format": tool_format})
        if fragment.startswith("the tool call arguments") and tool_format == "default":
            continue  # the default format writes the arguments as JSON, whatever they are
        with pytest.raises(DataError, match=re.escape(fragment)):
            call_text(template, content)
