"""The data keys that change a template, applied as LLaMA-Factory 0.9.5 applies them when it
fixes the template for a run: `default_system`, `tool_format`, `enable_thinking` and
`preserve_thinking`.

- `default_system` replaces the system prompt written where a row has none.
- `tool_format` writes tool descriptions and tool calls in that format, and a tool call then
  takes the plain reply slot (its text, then eos; no eos for `efficient_eos` templates), not the
  template's own tool-call slot: LLaMA-Factory rebuilds the slot that way.
- `enable_thinking` and `preserve_thinking` apply to reasoning templates only (elsewhere
  LLaMA-Factory leaves them unread, and so does tuneline, with a warning).
"""

from __future__ import annotations

import dataclasses
import logging

from tuneline.core.errors import ConfigError, unknown_name_message
from tuneline.core.templates.spec import CONTENT, EOS, TOOL_FORMATS, Template

_LOG = logging.getLogger(__name__)


def template_key_problems(template_name: str | None, *, tool_format: str | None, enable_thinking: bool | None,
                          preserve_thinking: bool, auto: bool = False) -> list[str]:
    """One line per template key that cannot apply: an unknown tool format, or a key that would
    change how `template: auto` renders (the tokenizer's own chat template decides that)."""
    problems = []
    if tool_format is not None and tool_format not in TOOL_FORMATS:
        problems.append(unknown_name_message("tool_format", tool_format, TOOL_FORMATS))
    if auto:
        asked = [f"'tool_format: {tool_format}'"] if tool_format is not None else []
        asked += [f"'enable_thinking: {enable_thinking}'"] if enable_thinking is not True else []
        asked += ["'preserve_thinking: true'"] if preserve_thinking else []
        problems.extend(f"{key} changes how a named template writes conversations; 'template: {template_name}' renders the "
                        "tokenizer's own chat template, which decides that itself. Name a template (such as qwen3) or "
                        "remove the key." for key in asked)
    return problems


def with_template_keys(template: Template, *, default_system: str | None, tool_format: str | None,
                       enable_thinking: bool | None, preserve_thinking: bool) -> Template:
    """`template` with the stage's template keys applied (None: the template's own setting)."""
    problems = template_key_problems(template.name, tool_format=tool_format, enable_thinking=enable_thinking,
                                     preserve_thinking=preserve_thinking, auto=template.chat_template is not None)
    if problems:
        raise ConfigError(problems)
    changes: dict = {}
    if tool_format is not None:
        changes.update(tool_format=tool_format, format_function=(CONTENT,) if template.efficient_eos else (CONTENT, EOS))
    if default_system is not None:
        changes["default_system"] = default_system
    if template.reasoning:
        changes.update(enable_thinking=enable_thinking, preserve_thinking=preserve_thinking)
    elif enable_thinking is not True or preserve_thinking:
        _LOG.warning("template '%s' writes no thoughts, so 'enable_thinking' and 'preserve_thinking' change nothing; "
                     "they apply to reasoning templates such as qwen3.", template.name)
    return dataclasses.replace(template, **changes) if changes else template
