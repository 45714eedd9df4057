"""A conversation turned into the prompt ids a model answers, as training wrote its conversations.

With a tuneline template (an inference YAML's `template` key or `--template`), the prompt is what
the training encoder writes (`templates.conversation.encode_prompt`, LLaMA-Factory's
`encode_oneturn` with an empty reply): the same pieces, each encoded on its own, tool descriptions
in the system text and tool calls in the template's tool format. Without one it is the tokenizer's
saved chat template (which tuneline writes from the training template when it saves a model) with
the generation prompt, as `tuneline chat` renders it; that Jinja does not write tool descriptions or
tool calls, so those need the template named.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tuneline.core.errors import DataError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from tuneline.core.templates.spec import Template

Message = Mapping[str, str]
"""A message with tuneline's roles: user, assistant, observation (a tool's result), function (tool calls)."""
NEEDS_TEMPLATE = ("This model's prompts are rendered with its tokenizer's saved chat template, which writes no tool "
                  "descriptions or tool calls; serve it with its training template named (`template: NAME` in the "
                  "inference YAML, or --template NAME) to use tools.")


@dataclass(frozen=True)
class PromptRenderer:
    """How the served model's prompts are written: `template` (None: the tokenizer's chat template)."""

    tokenizer: PreTrainedTokenizerBase
    template: Template | None

    @property
    def renders_tools(self) -> bool:
        return self.template is not None

    def prompt_ids(self, messages: Sequence[Message], *, system: str | None = None, tools: str | None = None) -> list[int]:
        """Ids of `messages` (ending with a user or observation message) and the assistant's opening;
        `system` replaces the default system prompt, `tools` is a JSON list of function schemas."""
        if self.template is not None:
            from tuneline.core.templates.conversation import Conversation, encode_prompt

            return encode_prompt(self.template, self.tokenizer, Conversation(prompt=messages, system=system, tools=tools))
        if tools or any(message["role"] == "function" for message in messages):
            raise DataError(NEEDS_TEMPLATE)
        chat = [{"role": "system", "content": system}] if system else []
        chat += [{"role": "tool" if m["role"] == "observation" else m["role"], "content": m["content"]} for m in messages]
        return list(self.tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=True, return_dict=False))
