"""Interactive chat with a model in the terminal: `tuneline chat PATH`.

PATH is a Hugging Face model folder (config.json), a LoRA adapter folder (adapter_config.json:
its base comes from `base_model_name_or_path`), or a workspace artifact folder (manifest.json)
holding either, such as a stage's `artifacts/trained/<key>` or its export. Conversations are
rendered with the saved tokenizer's own chat template (`apply_chat_template` with the generation
prompt), or with a tuneline template named by `template`. Answers stream as they are generated;
the history is kept across turns until `clear`; `exit` (or the end of input) ends the session.
Input is read line by line, so a conversation can be piped in. Images (`--image`, a vision-language
model) are shown with the first message: its `<image>` placeholders, or ones put in front of it, are
expanded into the model's image tokens as training expands them, and the pixels go to generate().
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from transformers import TextStreamer

from tuneline.core.data.media_rows import MediaRows, media_rows_for_model
from tuneline.core.data.media_tokens import IMAGE_PLACEHOLDER
from tuneline.core.store.artifacts import read_manifest
from tuneline.core.config import GeneratingConfig
from tuneline.core.errors import ConfigError, unknown_name_message

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
    images: MediaRows | None = None
    """How the model reads images, when `image_paths` are given."""
    image_paths: list[str] = field(default_factory=list)
    """Images shown with the conversation's first message (again after `clear`), as LLaMA-Factory's chat shows them."""

    def clear(self) -> None:
        self.history.clear()

    def reply(self, message: str, *, write: Callable[[str], None]) -> str:
        """Answer `message` given the history, passing text to `write` as it is generated."""
        import torch

        from tuneline.core.evaluation.predict import generation_kwargs

        if not self.history and self.image_paths:
            message = with_image_placeholders(message, len(self.image_paths))
        self.history.append({"role": "user", "content": message})
        prompt, paths = self._prompt()
        input_ids = torch.tensor([prompt], device=self.model.device)
        extra = {}
        if self.images is not None:
            extra = {key: value.to(self.model.device) for key, value in
                     self.images.model_inputs(input_ids, paths, token_ids=self.images.token_ids(self.tokenizer)).items()}
        streamer = WriterStreamer(self.tokenizer, write, skip_special_tokens=self.generating.skip_special_tokens)
        with torch.no_grad():
            output = self.model.generate(input_ids=input_ids,
                                         attention_mask=torch.ones(1, len(prompt), dtype=torch.long, device=self.model.device),
                                         streamer=streamer, **extra, **generation_kwargs(self.generating, self.tokenizer, self.model))
        answer = self.tokenizer.decode(output[0, len(prompt):], skip_special_tokens=self.generating.skip_special_tokens).strip()
        self.history.append({"role": "assistant", "content": answer})
        return answer

    def _prompt(self) -> tuple[list[int], list[str]]:
        """The rendered conversation and the images it shows; the oldest turns are dropped while it
        does not fit the model (the images with the first)."""
        limit = self.model.config.get_text_config().max_position_embeddings - self.generating.max_new_tokens
        while True:
            system = [{"role": "system", "content": self.system}] if self.system else []
            messages = system + self.history
            shown = self.history[0]["content"].count(IMAGE_PLACEHOLDER) if self.images is not None else 0
            paths = self.image_paths if shown else []
            if paths:
                messages = self.images.expand_messages(messages, paths)
            ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
            if paths:
                ids = self.images.prefix_ids(paths, self.tokenizer) + list(ids)
            if len(ids) <= limit or len(self.history) <= 1:
                return list(ids), paths
            del self.history[:2]


def with_image_placeholders(message: str, count: int) -> str:
    """`message` holding `count` `<image>` placeholders: those it lacks go in front, as LLaMA-Factory puts them."""
    written = message.count(IMAGE_PLACEHOLDER)
    if written > count:
        raise ConfigError(f"the message holds {written} {IMAGE_PLACEHOLDER} placeholders and {count} image(s) were "
                          "given with --image; give one --image per placeholder.")
    return IMAGE_PLACEHOLDER * (count - written) + message


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


def chat_images(source: ModelSource, paths: list[str], *, template: str | None) -> MediaRows | None:
    """How the model of `source` reads the images at `paths` (None without images); a ConfigError names
    an image that cannot be read, or a model that reads none."""
    if not paths:
        return None
    from PIL import Image, UnidentifiedImageError

    from tuneline.core.config import MediaConfig
    from tuneline.core.templates.catalog import TEMPLATES
    from tuneline.core.templates.unwritten import unwritten_template_message

    for path in paths:
        try:
            with Image.open(path) as image:
                image.verify()
        except (OSError, UnidentifiedImageError) as e:
            raise ConfigError(f"--image {path}: not a readable image ({type(e).__name__}: {e}); pass a PNG, JPEG or "
                              "other file Pillow opens.") from e
    named = None
    if template is not None:
        if template not in TEMPLATES:
            raise ConfigError(unwritten_template_message(template) or unknown_name_message("template", template, TEMPLATES))
        named = TEMPLATES[template]
    adapter = source.adapter
    processor = adapter if adapter is not None and (adapter / "preprocessor_config.json").is_file() else source.model
    return media_rows_for_model(source.model, template=named, settings=MediaConfig(), processor_path=processor)
