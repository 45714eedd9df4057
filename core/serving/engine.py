"""Answers generated with transformers' generate (`infer_backend: huggingface`), one at a time.

A model generates one answer at a time here: requests render their prompts as they come and then
wait for the generation lock, so any number of concurrent requests complete, in turn, on a CPU.
Text is handed to a `write` callable as it is generated (the server streams it); `stop` strings end
generation as soon as the answer holds one, and the answer is cut before it, streamed text
included (text that could begin a stop string is held back until it cannot).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from transformers import StoppingCriteria, StoppingCriteriaList

from tuneline.core.config import GeneratingConfig
from tuneline.core.inference.chat import WriterStreamer
from tuneline.core.inference.prompts import PromptRenderer
from tuneline.core.serving.protocol import ChatRequest, RequestError, generating_for

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


@dataclass(frozen=True)
class Prepared:
    """A request's prompt ids and generation settings, ready to generate from."""

    prompt: list[int]
    generating: GeneratingConfig
    stops: tuple[str, ...]


@dataclass(frozen=True)
class Answer:
    text: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: Literal["stop", "length"]


class StopText:
    """Text passed on to `write` as it arrives, cut at the first stop string."""

    def __init__(self, stops: Sequence[str], write: Callable[[str], None]) -> None:
        self.stops, self.write, self.seen, self.sent = tuple(stops), write, "", 0

    def feed(self, piece: str) -> None:
        self.seen += piece
        cut = self.cut()
        self._send(cut if cut is not None else len(self.seen) - self._held())

    def finish(self, full: str) -> str:
        """The whole answer (`full`, the decoded ids, which the pieces fed add up to), cut; its unsent rest is sent."""
        if full.startswith(self.seen[: self.sent]):
            self.seen = full
        cut = self.cut()
        self._send(cut if cut is not None else len(self.seen))
        return self.seen[: self.sent]

    def cut(self) -> int | None:
        """Where the first stop string begins, if the text holds one."""
        found = [at for at in (self.seen.find(stop) for stop in self.stops) if at >= 0]
        return min(found) if found else None

    def _held(self) -> int:
        """How many trailing characters could be the start of a stop string."""
        return max((k for stop in self.stops for k in range(1, len(stop)) if self.seen.endswith(stop[:k])), default=0)

    def _send(self, end: int) -> None:
        if end > self.sent:
            self.write(self.seen[self.sent:end])
            self.sent = end


class _StopWhen(StoppingCriteria):
    """Ends generation once the answer holds a stop string, or when the client has gone."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, *, prompt_length: int, stops: Sequence[str],
                 cancelled: threading.Event | None, skip_special_tokens: bool) -> None:
        self.tokenizer, self.prompt_length, self.stops, self.cancelled = tokenizer, prompt_length, stops, cancelled
        self.skip_special_tokens = skip_special_tokens

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs: object) -> torch.BoolTensor:
        import torch

        done = self.cancelled is not None and self.cancelled.is_set()
        if not done and self.stops:
            text = self.tokenizer.decode(input_ids[0, self.prompt_length:], skip_special_tokens=self.skip_special_tokens)
            done = any(stop in text for stop in self.stops)
        return torch.full((input_ids.shape[0],), done, dtype=torch.bool, device=input_ids.device)


class HuggingFaceEngine:
    """The served model, its tokenizer and how prompts are rendered; generation under one lock."""

    def __init__(self, model: PreTrainedModel, renderer: PromptRenderer, *, defaults: GeneratingConfig) -> None:
        self.model, self.renderer, self.defaults = model, renderer, defaults
        self.tokenizer = renderer.tokenizer
        self._generating = threading.Lock()
        self._rendering = threading.Lock()  # a fast tokenizer is not safe to call from two threads at once

    @property
    def context_length(self) -> int:
        return int(self.model.config.get_text_config().max_position_embeddings)

    def prepare(self, request: ChatRequest) -> Prepared:
        """The prompt and settings of `request`; a RequestError when the prompt leaves no room to answer."""
        with self._rendering:
            prompt = self.renderer.prompt_ids(request.messages, system=request.system, tools=request.tools)
        if len(prompt) >= self.context_length:
            raise RequestError(f"The conversation is {len(prompt)} tokens and the model reads at most "
                               f"{self.context_length}; send fewer or shorter messages.", param="messages",
                               code="context_length_exceeded")
        return Prepared(prompt, generating_for(request, self.defaults), request.stop)

    def generate(self, prepared: Prepared, *, write: Callable[[str], None] = lambda _: None,
                 cancelled: threading.Event | None = None) -> Answer:
        """One answer to `prepared`, its text passed to `write` as it is generated."""
        import torch

        from tuneline.core.evaluation.predict import generation_kwargs

        generating, prompt = prepared.generating, prepared.prompt
        text = StopText(prepared.stops, write)
        streamer = WriterStreamer(self.tokenizer, text.feed, skip_special_tokens=generating.skip_special_tokens)
        stop_when = _StopWhen(self.tokenizer, prompt_length=len(prompt), stops=prepared.stops, cancelled=cancelled,
                              skip_special_tokens=generating.skip_special_tokens)
        kwargs = generation_kwargs(generating, self.tokenizer, self.model)
        input_ids = torch.tensor([prompt], device=self.model.device)
        with self._generating, torch.no_grad():
            output = self.model.generate(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), streamer=streamer,
                                         stopping_criteria=StoppingCriteriaList([stop_when]), **kwargs)
        new = output[0, len(prompt):].tolist()
        full = self.tokenizer.decode(new, skip_special_tokens=generating.skip_special_tokens)
        answer = text.finish(full)
        stopped = text.cut() is not None or (bool(new) and new[-1] in kwargs["eos_token_id"])
        return Answer(answer, len(prompt), len(new), "stop" if stopped else "length")
