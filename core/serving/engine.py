"""Answers generated with transformers (`infer_backend: huggingface`), concurrent requests in batches.

`prepare` renders a request's prompt (as training renders it) and bounds its answer by the context
the prompt leaves (`max_position_embeddings`; a prompt that fills it alone is a 400). `submit` queues
it for the decoding thread (`batching.py`), which decodes up to `max_batch` requests together with
the same tokens each would get from `generate()` alone (`decoding.py`); a full queue (`queue_size`
waiting) refuses it with `QueueFull`. Text is handed to a `write` callable as it is generated (the
server streams it); `stop` strings end generation as soon as the answer holds one, and the answer is
cut before it, streamed text included (`stop_text.py`). The app sees this class only through
`backends.GenerationEngine`; `tuneline api` runs it in a process of its own (`engine_process.py`).
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from tuneline.core.config import GeneratingConfig
from tuneline.core.inference.prompts import PromptRenderer
from tuneline.core.serving.backends import Answer, Prepared, Ticket, discard_text
from tuneline.core.serving.batching import DEFAULT_MAX_BATCH, DEFAULT_QUEUE_SIZE, Scheduler
from tuneline.core.serving.decoding import BatchDecoder, Row, SoloDecoder, batchable
from tuneline.core.serving.protocol import ChatRequest, RequestError, generating_for

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from tuneline.core.serving.sources import ServedModel


class HuggingFaceEngine:
    """The served model, its tokenizer and how prompts are rendered; one thread decodes for every request."""

    def __init__(self, model: PreTrainedModel, renderer: PromptRenderer, *, defaults: GeneratingConfig,
                 max_batch: int = DEFAULT_MAX_BATCH, queue_size: int = DEFAULT_QUEUE_SIZE) -> None:
        self.model, self.renderer, self.defaults = model.eval(), renderer, defaults
        self.tokenizer = renderer.tokenizer
        self._tokenizing = threading.Lock()  # a fast tokenizer is not safe to call from two threads at once
        decoder = (BatchDecoder(model, capacity=max_batch) if batchable(model, num_beams=defaults.num_beams)
                   else SoloDecoder(model))
        self.scheduler = Scheduler(decoder, make_row=self._row, queue_size=queue_size)

    @property
    def context_length(self) -> int:
        return int(self.model.config.get_text_config().max_position_embeddings)

    def prepare(self, request: ChatRequest) -> Prepared:
        """The prompt and settings of `request`, its answer bounded by the context left after the prompt; a
        RequestError when the prompt leaves no room to answer."""
        with self._tokenizing:
            prompt = self.renderer.prompt_ids(request.messages, system=request.system, tools=request.tools)
        return bounded(request, prompt, defaults=self.defaults, context_length=self.context_length)

    def submit(self, prepared: Prepared, *, copies: int = 1, write: Callable[[str], None] | None = None,
               done: Callable[[Answer | BaseException], None]) -> list[Ticket]:
        tickets = [Ticket(prepared, write or discard_text, done) for _ in range(copies)]
        self.scheduler.submit(tickets)
        return tickets

    def cancel(self, ticket: Ticket) -> None:
        self.scheduler.cancel(ticket)

    def close(self) -> None:
        self.scheduler.close()

    def generate(self, prepared: Prepared, *, write: Callable[[str], None] | None = None) -> Answer:
        """One answer to `prepared`, waited for in this thread (which the decoding thread never is)."""
        ended = threading.Event()
        result: list[Answer | BaseException] = []
        self.submit(prepared, write=write, done=lambda outcome: (result.append(outcome), ended.set()))
        ended.wait()
        if isinstance(result[0], BaseException):
            raise result[0]
        return result[0]

    def _row(self, ticket: Ticket) -> Row:
        from tuneline.core.evaluation.predict import generation_kwargs

        generating = ticket.prepared.generating
        skip = generating.skip_special_tokens

        def decode(ids: Sequence[int]) -> str:
            with self._tokenizing:
                return self.tokenizer.decode(ids, skip_special_tokens=skip)

        return Row(ticket, model=self.model, kwargs=generation_kwargs(generating, self.tokenizer, self.model), decode=decode)


def load_engine(served: ServedModel, *, max_batch: int = DEFAULT_MAX_BATCH, queue_size: int = DEFAULT_QUEUE_SIZE) -> HuggingFaceEngine:
    """The served model loaded, its prompts rendered as its training template writes them (or with its
    tokenizer's saved chat template when no template is named); `max_batch` requests decoded together,
    `queue_size` more waiting."""
    import torch

    from tuneline.core.inference.chat import chat_template, load_chat_model

    model, tokenizer = load_chat_model(served.source, template=served.template, keys=served.keys,
                                       model_config=served.model_config)
    if served.inference.infer_dtype != "auto":
        model = model.to(getattr(torch, served.inference.infer_dtype))
    template = chat_template(served.template, tokenizer, keys=served.keys) if served.template else None
    return HuggingFaceEngine(model, PromptRenderer(tokenizer, template), defaults=served.generating, max_batch=max_batch,
                             queue_size=queue_size)


def bounded(request: ChatRequest, prompt: list[int], *, defaults: GeneratingConfig, context_length: int) -> Prepared:
    """`request`'s prompt and settings, its answer bounded by the context left after the prompt; a
    RequestError when the prompt leaves no room to answer."""
    if len(prompt) >= context_length:
        raise RequestError(f"The conversation is {len(prompt)} tokens and the model reads at most "
                           f"{context_length}; send fewer or shorter messages.", param="messages",
                           code="context_length_exceeded")
    generating = generating_for(request, defaults)
    wanted = generating.max_new_tokens if generating.max_new_tokens > 0 else generating.max_length - len(prompt)
    if wanted <= 0:
        raise RequestError(f"The conversation is {len(prompt)} tokens and the server's max_length, {generating.max_length}, "
                           "bounds prompt and answer together; send fewer or shorter messages, or set 'max_tokens'.",
                           param="messages", code="context_length_exceeded")
    generating = dataclasses.replace(generating, max_new_tokens=min(wanted, context_length - len(prompt)))
    return Prepared(prompt, generating, request.stop)
