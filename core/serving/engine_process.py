"""The decoding engine in a process of its own, so HTTP and decoding each get a core.

Python runs one thread of a process at a time. A server whose event loop and decoding thread share a
process spends every request's HTTP, JSON and rendering work on the core that decoding needs, and the
two wait on each other (benchmarks/serve_load.py measures it). `EngineProcess` keeps the app's side of
`GenerationEngine` in the server's process (rendering a request's prompt, the queue's bound, each
ticket's callbacks) and runs `HuggingFaceEngine` in a child process that loads the model. They speak
through one pipe: requests and cancels one way; each ticket's text (for streamed requests only) and its
end the other.

The child is forked on Linux, before this process reads a tokenizer or runs a torch operation (PyTorch's
own DataLoader workers start the same way), so it starts with its modules imported. A process that
already runs other threads (an application or a test that embeds the engine), and any process on
another system, spawns it instead: a fork copies the locks those threads hold. It ends when `close`
asks, or when this process goes away and its end of the pipe closes.
"""

from __future__ import annotations

import itertools
import logging
import multiprocessing
import pickle
import signal
import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tuneline.core.serving.backends import Answer, Cancelled, Prepared, QueueFull, Ticket, discard_text
from tuneline.core.serving.batching import retry_seconds

if TYPE_CHECKING:
    from multiprocessing.connection import Connection

    from tuneline.core.inference.prompts import PromptRenderer
    from tuneline.core.serving.protocol import ChatRequest
    from tuneline.core.serving.sources import ServedModel

log = logging.getLogger(__name__)

READY_POLL_SECONDS = 0.5


class EngineProcess:
    """`GenerationEngine` for the server's process; the model and its decoding live in a child process.

    The queue is bounded here: `max_batch` requests decode and `queue_size` more wait; one more is
    refused with QueueFull, its Retry-After estimated from how long the child's answers take."""

    def __init__(self, served: ServedModel, *, max_batch: int, queue_size: int, torch_threads: int | None) -> None:
        from tuneline.core.inference.chat import chat_template, load_chat_tokenizer
        from tuneline.core.inference.prompts import PromptRenderer

        # a fork copies every lock as it stands, those another thread holds included (a torch operation's, the
        # logging module's), and the child can die or hang on one ("The futex facility returned an unexpected
        # error code"): only a process that runs no other thread forks
        forking = sys.platform == "linux" and threading.active_count() == 1
        context = multiprocessing.get_context("fork" if forking else "spawn")
        self._pipe, child_end = context.Pipe()
        # a forked child holds a copy of this end too: it closes it, so that the pipe ends when this process does
        self._process = context.Process(target=run_child, name="tuneline-decoding", daemon=True,
                                        args=(child_end, self._pipe if forking else None, served, max_batch, queue_size,
                                              torch_threads))
        self._process.start()
        child_end.close()
        self.max_batch, self.queue_size, self.defaults = max_batch, queue_size, served.generating
        self.context_length = 0  # known once the child has loaded the model (`wait_until_ready`)
        self._sending, self._registry = threading.Lock(), threading.Lock()
        self._tickets: dict[int, Ticket] = {}
        self._numbers: dict[Ticket, int] = {}
        self._counter = itertools.count()
        self._answer_seconds = 1.0
        self._ended: RuntimeError | None = None
        self._tokenizing = threading.Lock()  # a fast tokenizer is not safe to call from two threads at once
        try:
            tokenizer = load_chat_tokenizer(served.source, template=served.template, keys=served.keys,
                                            model_config=served.model_config)
            template = chat_template(served.template, tokenizer, keys=served.keys) if served.template else None
        except BaseException:
            self.close()
            raise
        self.renderer: PromptRenderer = PromptRenderer(tokenizer, template)
        self._reader = threading.Thread(target=self._read, name="tuneline-decoding-replies", daemon=True)

    @property
    def pid(self) -> int | None:
        return self._process.pid

    def wait_until_ready(self) -> None:
        """Wait for the child to load the model; raise what stopped it (a ConfigError names the key)."""
        try:
            while not self._pipe.poll(READY_POLL_SECONDS):
                if not self._process.is_alive():
                    raise RuntimeError(f"the decoding process (pid {self._process.pid}) ended with exit code "
                                       f"{self._process.exitcode} while it loaded the model; see the lines above.")
            kind, value = self._pipe.recv()
        except BaseException:
            self.close()
            raise
        if kind == "failed":
            self.close()
            raise value
        self.context_length = value
        self._reader.start()

    def prepare(self, request: ChatRequest) -> Prepared:
        from tuneline.core.serving.engine import bounded

        with self._tokenizing:
            prompt = self.renderer.prompt_ids(request.messages, system=request.system, tools=request.tools)
        return bounded(request, prompt, defaults=self.defaults, context_length=self.context_length)

    def submit(self, prepared: Prepared, *, copies: int = 1, write: Callable[[str], None] | None = None,
               done: Callable[[Answer | BaseException], None]) -> list[Ticket]:
        with self._sending:
            if self._ended is not None:
                raise self._ended
            with self._registry:
                waiting = len(self._tickets) - self.max_batch
                if waiting + copies > self.queue_size:
                    raise QueueFull(max(waiting, 0), retry_after=retry_seconds(max(waiting, 0), self.max_batch,
                                                                                 self._answer_seconds))
                tickets = [Ticket(prepared, write or discard_text, done) for _ in range(copies)]
                numbers = [next(self._counter) for _ in tickets]
                for number, ticket in zip(numbers, tickets):
                    self._tickets[number], self._numbers[ticket] = ticket, number
            self._pipe.send(("submit", numbers, prepared, write is not None))
        return tickets

    def cancel(self, ticket: Ticket) -> None:
        ticket.cancelled.set()
        with self._registry:
            number = self._numbers.get(ticket)
        if number is None:
            return  # ended already
        with self._sending:
            if self._ended is None:
                self._pipe.send(("cancel", number))

    def close(self) -> None:
        """Stop the child (asked, then terminated after 10 s); tickets still open get Cancelled."""
        with self._sending:
            if self._process.is_alive() and self._ended is None:
                try:
                    self._pipe.send(("close",))
                except OSError:
                    pass
        self._process.join(10)
        if self._process.is_alive():
            self._process.terminate()
            self._process.join(5)
        self._end_open_tickets(Cancelled())

    def _read(self) -> None:
        """Hand what the child sends to each ticket, until the pipe closes."""
        while True:
            try:
                message = self._pipe.recv()
            except (EOFError, OSError):
                break
            if message[0] == "text":
                _, number, piece = message
                with self._registry:
                    ticket = self._tickets.get(number)
                if ticket is not None:
                    ticket.write(piece)
            else:
                _, number, outcome, self._answer_seconds = message
                with self._registry:
                    ticket = self._tickets.pop(number, None)
                    if ticket is not None:
                        del self._numbers[ticket]
                if ticket is not None:
                    ticket.done(outcome)
        self._process.join(1)
        ended = RuntimeError(f"the decoding process (pid {self._process.pid}) has ended (exit code "
                             f"{self._process.exitcode}); restart the server.")
        with self._sending:
            self._ended = ended
        if self._process.exitcode not in (0, None):
            log.error("%s", ended)
        self._end_open_tickets(ended)

    def _end_open_tickets(self, outcome: BaseException) -> None:
        with self._registry:
            open_tickets = list(self._tickets.values())
            self._tickets.clear()
            self._numbers.clear()
        for ticket in open_tickets:
            ticket.done(outcome)


def run_child(pipe: Connection, servers_end: Connection | None, served: ServedModel, max_batch: int, queue_size: int,
              torch_threads: int | None) -> None:
    """The child's life: load the model, then turn the pipe's requests into tickets of a HuggingFaceEngine and
    send back what they write and how they end. `servers_end` is the server's end of the pipe as a forked child
    inherits it, closed here: with it open, the server's death would never end the pipe."""
    if servers_end is not None:
        servers_end.close()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group; the server decides when this ends
    import torch

    from tuneline.core.serving.engine import load_engine

    if torch_threads:
        torch.set_num_threads(torch_threads)
    try:
        # room for every request the server admits: its own bound is the one that refuses
        engine = load_engine(served, max_batch=max_batch, queue_size=queue_size + max_batch)
    except BaseException as e:  # told to the server, which reports it as its own
        pipe.send(("failed", _sendable(e)))
        return
    pipe.send(("ready", engine.context_length))
    sending, registry = threading.Lock(), threading.Lock()
    tickets: dict[int, Ticket] = {}

    def send(message: tuple) -> None:
        with sending:
            try:
                pipe.send(message)
            except (OSError, ValueError):  # the server has gone; the loop below ends on its next read
                pass

    def done_of(number: int) -> Callable[[Answer | BaseException], None]:
        def done(outcome: Answer | BaseException) -> None:
            with registry:
                tickets.pop(number, None)
            send(("done", number, _sendable(outcome), engine.scheduler.answer_seconds))
        return done

    try:
        while True:
            try:
                message = pipe.recv()
            except (EOFError, OSError):
                break
            if message[0] == "close":
                break
            if message[0] == "cancel":
                with registry:
                    ticket = tickets.get(message[1])
                if ticket is not None:
                    engine.cancel(ticket)
                continue
            _, numbers, prepared, streams = message
            for number in numbers:
                write = (lambda piece, number=number: send(("text", number, piece))) if streams else None
                with registry:  # before its `done` can run
                    try:
                        tickets[number] = engine.submit(prepared, write=write, done=done_of(number))[0]
                    except QueueFull as full:
                        send(("done", number, full, engine.scheduler.answer_seconds))
    finally:
        engine.close()


def _sendable(value: Any) -> Any:
    """`value` if it pickles, else a RuntimeError that says what it was (an exception of a library may not)."""
    try:
        pickle.dumps(value)
        return value
    except Exception:
        return RuntimeError(f"{type(value).__name__}: {value}")
