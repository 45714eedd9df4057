"""`infer_backend`: which engine generates the served answers, and the interface every engine keeps.

`huggingface` (transformers, `engine.py`) runs everywhere and is the one tuneline serves with.
`vllm` and `sglang` are LLaMA-Factory's GPU engines: asked for on a machine without their package
or without a CUDA GPU, they are refused with what is missing; where both are there, this version
still refuses them (it does not drive those engines yet) rather than serve with another engine
than the one named.

The app talks to an engine only through `GenerationEngine`: `prepare` a request (its prompt ids and
settings), `submit` it (its text arrives through `write`, its end through `done`, from the engine's
own thread), `cancel` it. A CUDA engine such as vLLM's or SGLang's, which batch and queue requests
themselves, slots in behind the same four calls.
"""

from __future__ import annotations

import importlib.util
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, Protocol

if TYPE_CHECKING:
    from tuneline.core.config import GeneratingConfig
    from tuneline.core.inference.prompts import PromptRenderer
    from tuneline.core.serving.protocol import ChatRequest

BACKENDS = ("huggingface", "vllm", "sglang")
PACKAGES = {"vllm": "vllm", "sglang": "sglang"}


@dataclass(frozen=True)
class Prepared:
    """A request's prompt ids and generation settings, ready to generate from; `generating.max_new_tokens`
    is already bounded by the context the prompt leaves."""

    prompt: list[int]
    generating: GeneratingConfig
    stops: tuple[str, ...]


@dataclass(frozen=True)
class Answer:
    text: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: Literal["stop", "length"]


class QueueFull(Exception):
    """Every place in the waiting queue is taken; the client may retry after `retry_after` seconds."""

    def __init__(self, waiting: int, *, retry_after: int) -> None:
        super().__init__(f"{waiting} requests are already waiting for the model")
        self.waiting, self.retry_after = waiting, retry_after


class Cancelled(Exception):
    """What `done` receives for a request cancelled before it finished."""


@dataclass(eq=False)
class Ticket:
    """One submitted request. `write` gets its text piece by piece and `done` its Answer (or the exception
    that ended it) exactly once, both from the engine's thread (`done` from the cancelling thread for a
    request cancelled while it waits)."""

    prepared: Prepared
    write: Callable[[str], None]
    done: Callable[[Answer | BaseException], None]
    cancelled: threading.Event = field(default_factory=threading.Event)
    submitted: float = field(default_factory=time.monotonic)


def discard_text(_: str) -> None:
    """The `write` of a request whose text is read only from its Answer."""


class GenerationEngine(Protocol):
    """What the HTTP app needs of an engine that generates."""

    renderer: PromptRenderer

    def prepare(self, request: ChatRequest) -> Prepared:
        """The prompt ids and settings of `request`; a RequestError when the prompt leaves no room to answer."""
        ...

    def submit(self, prepared: Prepared, *, copies: int, write: Callable[[str], None] | None,
               done: Callable[[Answer | BaseException], None]) -> list[Ticket]:
        """`copies` generations of `prepared`, queued together; QueueFull when the queue has no room for them.
        `write` None: the text is read only from the Answer (nothing is streamed)."""
        ...

    def cancel(self, ticket: Ticket) -> None:
        """Stop `ticket`'s generation (waiting or running); its `done` gets Cancelled."""
        ...

    def close(self) -> None:
        """Stop the engine's thread; requests still waiting or running get Cancelled."""
        ...


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def backend_problems(backend: str, *, has_package: Callable[[str], bool] | None = None,
                     has_cuda: Callable[[], bool] = _has_cuda) -> list[str]:
    """One line per reason `backend` cannot serve here (none for huggingface)."""
    if backend == "huggingface":
        return []
    found = has_package or (lambda name: importlib.util.find_spec(name) is not None)
    package = PACKAGES[backend]
    problems = []
    if not found(package):
        problems.append(f"'infer_backend: {backend}' needs the {package} package, which is not installed; install it "
                        f"(pip install {package}) on a CUDA machine, or use 'infer_backend: huggingface'.")
    if not has_cuda():
        problems.append(f"'infer_backend: {backend}' needs a CUDA GPU, and this machine has none; use "
                        "'infer_backend: huggingface', which runs on a CPU.")
    if not problems:
        problems.append(f"'infer_backend: {backend}' is not driven by this version of tuneline's server yet; use "
                        "'infer_backend: huggingface' (transformers' generate, on this GPU).")
    return problems
