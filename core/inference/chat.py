"""Interactive chat with a model in the terminal: `tuneline chat PATH`.

PATH is a Hugging Face model folder (config.json), a LoRA adapter folder (adapter_config.json:
its base comes from `base_model_name_or_path`), or a workspace artifact folder (manifest.json)
holding either, such as a stage's `artifacts/trained/<key>` or its export. Conversations are
rendered with the saved tokenizer's own chat template (`apply_chat_template` with the generation
prompt), or with a tuneline template named by `template`. Answers stream as they are generated;
the history is kept across turns until `clear`; `exit` (or the end of input) ends the session.
Input is read line by line, so a conversation can be piped in.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from transformers import TextStreamer

from tuneline.core.store.artifacts import read_manifest
from tuneline.core.config import GeneratingConfig
from tuneline.core.errors import ConfigError

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

ADAPTER_CONFIG = "adapter_config.json"
MODEL_CONFIG = "config.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
CLEAR, EXIT = "clear", "exit"


@dataclass(frozen=True)
class ModelSource:
    """What to load for PATH: the model (folder or hub id), an adapter on top, the tokenizer folder."""

    model: str
    adapter: Path | None
    tokenizer: str

    def describe(self) -> str:
        return f"{self.adapter} (adapter on {self.model})" if self.adapter else self.model


def resolve_source(path: str | Path) -> ModelSource:
    """The model, adapter and tokenizer that PATH names, or a ConfigError saying what PATH must be."""
    folder = Path(path)
    if not folder.is_dir():
        what = "is a file" if folder.exists() else "does not exist"
        raise ConfigError(f"chat PATH '{path}' {what}; pass a model folder (config.json), an adapter folder "
                          "(adapter_config.json) or a stage's artifact folder in a workspace (manifest.json).")
    manifest = read_manifest(folder)
    if manifest is None and folder.name.endswith(".partial"):
        raise ConfigError(f"chat PATH '{path}' is an unfinished artifact (no manifest.json): its stage did not "
                          "complete; rerun the pipeline, or pass the finished artifact folder.")
    if (folder / ADAPTER_CONFIG).is_file():
        base = json.loads((folder / ADAPTER_CONFIG).read_text(encoding="utf-8")).get("base_model_name_or_path")
        if not base:
            raise ConfigError(f"{folder / ADAPTER_CONFIG} names no 'base_model_name_or_path'; "
                              "export the merged model and chat with the exported folder.")
        tokenizer = str(folder) if (folder / TOKENIZER_CONFIG).is_file() else base
        return ModelSource(model=base, adapter=folder, tokenizer=tokenizer)
    if (folder / MODEL_CONFIG).is_file():
        return ModelSource(model=str(folder), adapter=None, tokenizer=str(folder))
    raise ConfigError(_no_model_message(folder, manifest))


def _no_model_message(folder: Path, manifest: dict[str, Any] | None) -> str:
    if manifest is not None:
        return (f"chat PATH '{folder}' is a '{manifest.get('kind')}' artifact, which holds no model; pass a "
                "trained, merged or export artifact folder.")
    found = sorted(str(p.parent) for p in folder.glob("artifacts/*/*/manifest.json")
                   if (p.parent / MODEL_CONFIG).is_file() or (p.parent / ADAPTER_CONFIG).is_file())
    if found:
        listed = ", ".join(found[:8]) + (", ..." if len(found) > 8 else "")
        return f"chat PATH '{folder}' is a workspace; pass one of its model artifact folders: {listed}."
    return (f"chat PATH '{folder}' holds neither {MODEL_CONFIG} (a model) nor {ADAPTER_CONFIG} (an adapter); "
            "pass a model, adapter or artifact folder.")


def load_chat_model(source: ModelSource, *, template: str | None = None) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Model (adapter applied, eval mode, on the GPU when there is one) and a tokenizer with a chat template."""
    import torch

    from tuneline.core.models.loading import load_model, load_tokenizer

    tokenizer = load_tokenizer(source.tokenizer)
    if template is not None:
        _use_template(tokenizer, template)
    if not tokenizer.chat_template:
        raise ConfigError(f"the tokenizer of '{source.describe()}' has no chat template; pass --template NAME "
                          "(a tuneline template such as chatml), or chat with a model that tuneline trained or exported.")
    model = load_model(source.model, vocab_size=len(tokenizer))
    if source.adapter is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, str(source.adapter))
    if torch.cuda.is_available():
        model = model.to("cuda")
    return model.eval(), tokenizer


def _use_template(tokenizer: PreTrainedTokenizerBase, name: str) -> None:
    from tuneline.core.templates.conversation import chat_template_jinja, fix_tokenizer, get_template

    template = get_template(name, tokenizer=tokenizer)
    fix_tokenizer(template, tokenizer)
    tokenizer.chat_template = chat_template_jinja(template, tokenizer)


@dataclass
class ChatSession:
    """A conversation: the history so far and how to answer the next message."""

    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    generating: GeneratingConfig
    name: str
    system: str | None = None
    history: list[dict[str, str]] = field(default_factory=list)

    def clear(self) -> None:
        self.history.clear()

    def reply(self, message: str, *, write: Callable[[str], None]) -> str:
        """Answer `message` given the history, passing text to `write` as it is generated."""
        import torch

        from tuneline.core.evaluation.predict import generation_kwargs

        self.history.append({"role": "user", "content": message})
        prompt = self._prompt_ids()
        streamer = WriterStreamer(self.tokenizer, write, skip_special_tokens=self.generating.skip_special_tokens)
        with torch.no_grad():
            output = self.model.generate(input_ids=torch.tensor([prompt], device=self.model.device),
                                         attention_mask=torch.ones(1, len(prompt), dtype=torch.long, device=self.model.device),
                                         streamer=streamer, **generation_kwargs(self.generating, self.tokenizer, self.model))
        answer = self.tokenizer.decode(output[0, len(prompt):], skip_special_tokens=self.generating.skip_special_tokens).strip()
        self.history.append({"role": "assistant", "content": answer})
        return answer

    def _prompt_ids(self) -> list[int]:
        """The rendered conversation; the oldest turns are dropped while it does not fit the model."""
        limit = self.model.config.max_position_embeddings - self.generating.max_new_tokens
        while True:
            system = [{"role": "system", "content": self.system}] if self.system else []
            ids = self.tokenizer.apply_chat_template(system + self.history, add_generation_prompt=True,
                                                     tokenize=True, return_dict=False)
            if len(ids) <= limit or len(self.history) <= 1:
                return list(ids)
            del self.history[:2]


class WriterStreamer(TextStreamer):
    """`TextStreamer` that hands each finished piece of text to a callable instead of printing it."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, write: Callable[[str], None], *, skip_special_tokens: bool) -> None:
        super().__init__(tokenizer, skip_prompt=True, skip_special_tokens=skip_special_tokens)
        self.write = write

    def on_finalized_text(self, text: str, stream_end: bool = False) -> None:
        self.write(text)


def chat_loop(session: ChatSession, lines: Iterable[str], *, write: Callable[[str], None], echo: bool) -> int:
    """Run the conversation over input `lines`; `echo` repeats each message (when input is piped)."""
    write(f"Chatting with {session.name}. Type a message; '{CLEAR}' forgets the history, '{EXIT}' quits.\n")
    for line in lines:
        message = line.strip()
        if echo and message:
            write(f"User: {message}\n")
        if not message:
            continue
        if message.lower() == EXIT:
            break
        if message.lower() == CLEAR:
            session.clear()
            write("History cleared.\n")
            continue
        write("Assistant: ")
        session.reply(message, write=write)
        write("\n")
    return 0
