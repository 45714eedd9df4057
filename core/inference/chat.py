"""Interactive chat with a model in the terminal: `tuneline chat PATH`.

PATH is a Hugging Face model folder (config.json), a LoRA adapter folder (adapter_config.json:
its base comes from `base_model_name_or_path`), or a workspace artifact folder (manifest.json)
holding either, such as a stage's `artifacts/trained/<key>` or its export. Conversations are
rendered with the saved tokenizer's own chat template (`apply_chat_template` with the generation
prompt), or with a tuneline template named by `template`. Answers stream as they are generated;
the history is kept across turns until `clear`; `exit` (or the end of input) ends the session.
Input is read line by line, so a conversation can be piped in. Images, videos and sounds (`--image`,
`--video`, `--audio`, for a model of a family that takes them) are shown with the first message: its
`<image>`, `<video>` and `<audio>` placeholders, or ones put in front of it, are expanded into the
model's media tokens as training expands them, and the pixels and features go to generate().
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from transformers import TextStreamer

from tuneline.core.config import DataConfig, GeneratingConfig, ModelConfig
from tuneline.core.data.media.columns import AUDIOS, IMAGES, MEDIA_COLUMNS, VIDEOS
from tuneline.core.data.media.expansion import PLACEHOLDERS, placeholder_counts
from tuneline.core.data.media.rows import SECONDS_SPACED, MediaRows, media_rows_for_model
from tuneline.core.errors import ConfigError, unknown_name_message
from tuneline.core.store.artifacts import read_manifest

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from tuneline.core.templates.spec import Template

ADAPTER_CONFIG = "adapter_config.json"
MODEL_CONFIG = "config.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
CLEAR, EXIT = "clear", "exit"
MEDIA_FLAGS = {IMAGES: "--image", VIDEOS: "--video", AUDIOS: "--audio"}
"""The chat command's option for each media column."""


@dataclass(frozen=True)
class ModelSource:
    """What to load for PATH: the model (folder or hub id), an adapter on top, the tokenizer folder."""

    model: str
    adapter: Path | None
    tokenizer: str

    def describe(self) -> str:
        return f"{self.adapter} (adapter on {self.model})" if self.adapter else self.model


def resolve_source(path: str | Path, *, what: str = "chat PATH") -> ModelSource:
    """The model, adapter and tokenizer that PATH names, or a ConfigError saying what PATH must be;
    `what` names PATH in the messages (the command's argument, or the YAML key that holds it)."""
    folder = Path(path)
    if not folder.is_dir():
        problem = "is a file" if folder.exists() else "does not exist"
        raise ConfigError(f"{what} '{path}' {problem}; pass a model folder (config.json), an adapter folder "
                          "(adapter_config.json) or a stage's artifact folder in a workspace (manifest.json).")
    manifest = read_manifest(folder)
    if manifest is None and folder.name.endswith(".partial"):
        raise ConfigError(f"{what} '{path}' is an unfinished artifact (no manifest.json): its stage did not "
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
    raise ConfigError(_no_model_message(folder, manifest, what=what))


def _no_model_message(folder: Path, manifest: dict[str, Any] | None, *, what: str) -> str:
    if manifest is not None:
        return (f"{what} '{folder}' is a '{manifest.get('kind')}' artifact, which holds no model; pass a "
                "trained, merged or export artifact folder.")
    found = sorted(str(p.parent) for p in folder.glob("artifacts/*/*/manifest.json")
                   if (p.parent / MODEL_CONFIG).is_file() or (p.parent / ADAPTER_CONFIG).is_file())
    if found:
        listed = ", ".join(found[:8]) + (", ..." if len(found) > 8 else "")
        return f"{what} '{folder}' is a workspace; pass one of its model artifact folders: {listed}."
    return (f"{what} '{folder}' holds neither {MODEL_CONFIG} (a model) nor {ADAPTER_CONFIG} (an adapter); "
            "pass a model, adapter or artifact folder.")


def load_chat_model(source: ModelSource, *, template: str | None = None, keys: DataConfig | None = None,
                    model_config: ModelConfig | None = None) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Model (adapter applied, eval mode, on the GPU when there is one) and a tokenizer with a chat template.

    `template` renders with that tuneline template (with the template keys of `keys`: default_system,
    tool_format, enable_thinking) instead of the tokenizer's own; `model_config` holds the loading keys
    of an inference YAML (trust_remote_code, hub token, revision)."""
    import torch

    from tuneline.core.models.loading import load_model

    tokenizer = load_chat_tokenizer(source, template=template, keys=keys, model_config=model_config)
    model = load_model(source.model, model=model_config, vocab_size=len(tokenizer))
    if source.adapter is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, str(source.adapter))
    if torch.cuda.is_available():
        model = model.to("cuda")
    return model.eval(), tokenizer


def load_chat_tokenizer(source: ModelSource, *, template: str | None = None, keys: DataConfig | None = None,
                        model_config: ModelConfig | None = None) -> PreTrainedTokenizerBase:
    """The tokenizer of `source` with the chat template `load_chat_model` gives it (see there)."""
    from tuneline.core.models.loading import load_tokenizer

    tokenizer = load_tokenizer(source.tokenizer, model=model_config)
    if template is not None:
        _use_template(tokenizer, chat_template(template, tokenizer, keys=keys))
    if not tokenizer.chat_template:
        raise ConfigError(f"the tokenizer of '{source.describe()}' has no chat template; pass --template NAME "
                          "(a tuneline template such as chatml), or chat with a model that tuneline trained or exported.")
    return tokenizer


def chat_template(name: str, tokenizer: PreTrainedTokenizerBase, *, keys: DataConfig | None = None) -> Template:
    """The tuneline template `name` with the template keys of `keys` applied, as a stage that trains with
    them renders its conversations."""
    from tuneline.core.templates.conversation import get_template
    from tuneline.core.templates.options import with_template_keys

    template = get_template(name, tokenizer=tokenizer)
    if keys is None:
        return template
    return with_template_keys(template, default_system=keys.default_system, tool_format=keys.tool_format,
                              enable_thinking=keys.enable_thinking, preserve_thinking=keys.preserve_thinking)


def _use_template(tokenizer: PreTrainedTokenizerBase, template: Template) -> None:
    from tuneline.core.templates.conversation import chat_template_jinja, fix_tokenizer

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
    media: MediaRows | None = None
    """How the model reads images, videos and sound, when `shown` holds any."""
    shown: dict[str, list[str]] = field(default_factory=dict)
    """The files shown with the conversation's first message (again after `clear`), by media column
    (images, videos, audios), as LLaMA-Factory's chat shows them."""

    def clear(self) -> None:
        self.history.clear()

    def reply(self, message: str, *, write: Callable[[str], None]) -> str:
        """Answer `message` given the history, passing text to `write` as it is generated."""
        import torch

        from tuneline.core.evaluation.predict import generation_kwargs

        if not self.history and any(self.shown.values()):
            message = with_placeholders(message, {column: len(paths) for column, paths in self.shown.items()})
        self.history.append({"role": "user", "content": message})
        prompt, shown = self._prompt()
        input_ids = torch.tensor([prompt], device=self.model.device)
        extra = {}
        if self.media is not None and any(shown.values()):
            inputs = self.media.model_inputs(input_ids, shown.get(IMAGES, []), shown.get(VIDEOS, []), shown.get(AUDIOS, []),
                                             token_ids=self.media.token_ids(self.tokenizer))
            extra = {key: value.to(self.model.device) for key, value in inputs.items()}
        streamer = WriterStreamer(self.tokenizer, write, skip_special_tokens=self.generating.skip_special_tokens)
        with torch.no_grad():
            output = self.model.generate(input_ids=input_ids,
                                         attention_mask=torch.ones(1, len(prompt), dtype=torch.long, device=self.model.device),
                                         streamer=streamer, **extra, **generation_kwargs(self.generating, self.tokenizer, self.model))
        answer = self.tokenizer.decode(output[0, len(prompt):], skip_special_tokens=self.generating.skip_special_tokens).strip()
        self.history.append({"role": "assistant", "content": answer})
        return answer

    def _prompt(self) -> tuple[list[int], dict[str, list[str]]]:
        """The rendered conversation and the files it shows, by media column; the oldest turns are dropped
        while it does not fit the model (the media with the first)."""
        limit = self.model.config.get_text_config().max_position_embeddings - self.generating.max_new_tokens
        while True:
            system = [{"role": "system", "content": self.system}] if self.system else []
            messages = system + self.history
            held = placeholder_counts(self.history[:1]) if self.media is not None else {}
            shown = {column: paths for column, paths in self.shown.items() if held.get(column)}
            prefix: list[int] = []
            if shown:
                row = self.media.expand({"prompt": messages, "response": [], **shown})
                messages, prefix = row["prompt"], self.media.prefix_ids(shown.get(IMAGES, []), self.tokenizer)
            ids = prefix + list(self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                                   return_dict=False))
            if len(ids) <= limit or len(self.history) <= 1:
                return ids, shown
            del self.history[:2]


def with_placeholders(message: str, counts: dict[str, int]) -> str:
    """`message` holding as many `<image>`, `<video>` and `<audio>` placeholders as `counts` (by media column)
    says: those it lacks go in front, sounds first, then videos, then images, as LLaMA-Factory puts them."""
    for column in MEDIA_COLUMNS:  # each goes in front of the ones before
        placeholder, count = PLACEHOLDERS[column], counts.get(column, 0)
        written = message.count(placeholder)
        if written > count:
            flag = MEDIA_FLAGS[column]
            raise ConfigError(f"the message holds {written} {placeholder} placeholders and {count} file(s) were given "
                              f"with {flag}; give one {flag} per placeholder.")
        message = placeholder * (count - written) + message
    return message


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


def chat_media(source: ModelSource, *, images: list[str] = (), videos: list[str] = (), audios: list[str] = (),
               template: str | None) -> MediaRows | None:
    """How the model of `source` reads the files of `--image`, `--video` and `--audio` (None without any);
    a ConfigError names a file that cannot be read, or a model that reads no such media."""
    if not (images or videos or audios):
        return None
    from tuneline.core.config import MediaConfig
    from tuneline.core.data.media.audio.clips import AudioError
    from tuneline.core.data.media.audio.clips import check as check_audio
    from tuneline.core.data.media.video.frames import VideoError
    from tuneline.core.data.media.video.frames import check as check_video
    from tuneline.core.models.composite import MODEL_TEMPLATES
    from tuneline.core.templates.catalog import TEMPLATES
    from tuneline.core.templates.unwritten import unwritten_template_message

    settings = MediaConfig()
    _check_images(images)
    for path in videos:  # the checks of a dataset's media rows: a stream whose first frame or sound decodes
        try:
            check_video(path)
        except VideoError as e:
            raise ConfigError(f"--video {path}: {e}; pass a video file PyAV opens (MP4, WebM, ...).") from None
    for path in audios:
        try:
            check_audio(path)
        except AudioError as e:
            raise ConfigError(f"--audio {path}: {e}; pass a sound file PyAV opens (WAV, FLAC, MP3, ...).") from None
    if template is not None and template not in TEMPLATES:
        raise ConfigError(unwritten_template_message(template) or unknown_name_message("template", template, TEMPLATES))
    adapter = source.adapter
    processor = adapter if adapter is not None and (adapter / "preprocessor_config.json").is_file() else source.model
    if videos or audios:
        model_type = _config_value(Path(source.model), "model_type")
        name = template or MODEL_TEMPLATES.get(model_type or "")
        if name is None:
            raise ConfigError(f"'{source.model}' is a {model_type or 'text'} model, which hears and sees no media; pass a "
                              "model of a family that takes videos (Qwen2-VL) or sound (Qwen2-Audio), or leave them out.")
        given = {IMAGES: images, VIDEOS: videos, AUDIOS: audios}
        flags = {column: [MEDIA_FLAGS[column]] if paths else [] for column, paths in given.items()}
        rows = MediaRows.load(TEMPLATES[name], processor, settings, datasets=flags)
        # the model's own type spaces video positions (Qwen2.5-VL's seconds), whichever folder holds the processor
        return dataclasses.replace(rows, video_seconds=model_type in SECONDS_SPACED)
    return media_rows_for_model(source.model, template=TEMPLATES[template] if template else None, settings=settings,
                                processor_path=processor)


def _check_images(paths: Iterable[str]) -> None:
    from PIL import Image, UnidentifiedImageError

    for path in paths:
        try:
            with Image.open(path) as image:
                image.verify()
        except (OSError, UnidentifiedImageError) as e:
            raise ConfigError(f"--image {path}: not a readable image ({type(e).__name__}: {e}); pass a PNG, JPEG or "
                              "other file Pillow opens.") from e


def _config_value(folder: Path, key: str) -> Any:
    try:
        return json.loads((folder / MODEL_CONFIG).read_text(encoding="utf-8")).get(key)
    except (OSError, ValueError, AttributeError):
        return None
