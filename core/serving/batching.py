"""The queue in front of the model and the one thread that decodes: requests share the model in batches.

`submit` puts requests in a bounded queue (`queue_size`; when it is full, `QueueFull` says how many
seconds to wait before retrying, estimated from how long recent answers took). The decoding thread
admits waiting requests between steps, as many as its decoder has room for (`max_batch` rows), a few
at a time (`admit_at_least`) while a batch runs, so a new request never waits for a batch to end;
`cancel` takes a request out of the queue at once, or out of the batch at its next step. No request
holds a thread of its own.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

from tuneline.core.serving.backends import Cancelled, QueueFull, Ticket

if TYPE_CHECKING:
    from tuneline.core.serving.decoding import Row

log = logging.getLogger(__name__)

DEFAULT_MAX_BATCH, DEFAULT_QUEUE_SIZE = 16, 64


class Decoder(Protocol):
    """A batch of rows advanced together (`BatchDecoder`, or `SoloDecoder` with room for one)."""

    capacity: int
    admit_at_least: int
    """Rows that join a running batch together (fewer when fewer wait)."""
    rows: list[Row]

    def admit(self, rows: Sequence[Row]) -> None: ...

    def step(self) -> None: ...

    def drop(self, leaving: Sequence[Row], *, reason: BaseException | None) -> None: ...


class Scheduler:
    """Waiting tickets, and the thread that turns them into rows of `decoder` and decodes them."""

    def __init__(self, decoder: Decoder, *, make_row: Callable[[Ticket], Row], queue_size: int) -> None:
        self.decoder, self.make_row, self.queue_size = decoder, make_row, queue_size
        self._waiting: deque[Ticket] = deque()
        self._changed = threading.Condition()
        self._closed = False
        self._answer_seconds = 1.0  # a moving mean of how long an admitted request took to end
        self._thread = threading.Thread(target=self._run, name="tuneline-decoding", daemon=True)
        self._thread.start()

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @property
    def answer_seconds(self) -> float:
        """A moving mean of how long an admitted request took to end."""
        return self._answer_seconds

    def submit(self, tickets: Sequence[Ticket]) -> None:
        """Queue `tickets` together, or raise QueueFull (none queued) when the queue has no room for all."""
        with self._changed:
            if self._closed:
                raise RuntimeError("the engine is closed")
            if len(self._waiting) + len(tickets) > self.queue_size:
                raise QueueFull(len(self._waiting), retry_after=self._retry_after())
            self._waiting.extend(tickets)
            self._changed.notify()

    def cancel(self, ticket: Ticket) -> None:
        ticket.cancelled.set()
        with self._changed:
            if ticket not in self._waiting:
                return  # running (its row leaves at the decoder's next step) or already done
            self._waiting.remove(ticket)
        ticket.done(Cancelled())

    def close(self, timeout: float = 10.0) -> None:
        with self._changed:
            self._closed = True
            self._changed.notify()
        self._thread.join(timeout)

    def _retry_after(self) -> int:
        return retry_seconds(len(self._waiting), self.decoder.capacity, self._answer_seconds)

    def _run(self) -> None:
        while True:
            with self._changed:
                while not (self._closed or self._waiting or self.decoder.rows):
                    self._changed.wait()
                if self._closed:
                    break
                running, room = len(self.decoder.rows), self.decoder.capacity - len(self.decoder.rows)
                enough = not running or room >= min(len(self._waiting), self.decoder.admit_at_least)
                taken = [self._waiting.popleft() for _ in range(min(room, len(self._waiting)) if enough else 0)]
            try:
                self._advance(taken)
            except Exception as e:  # a bug here must not stop the server: the rows it touched fail
                log.exception("The decoding loop failed")
                self.decoder.drop(list(self.decoder.rows), reason=e)
        self._cancel_all()

    def _advance(self, taken: Sequence[Ticket]) -> None:
        """Admit `taken`, then decode one step (a whole answer, for a decoder of one)."""
        rows = []
        for ticket in taken:
            if ticket.cancelled.is_set():  # cancelled as it left the queue
                ticket.done(Cancelled())
                continue
            try:
                rows.append(self.make_row(ticket))
            except Exception as e:
                log.exception("A request could not start")
                ticket.done(e)
        if rows:
            self.decoder.admit(rows)
        running = list(self.decoder.rows)
        if running:
            self.decoder.step()
            now, still = time.monotonic(), {id(row) for row in self.decoder.rows}
            for row in running:
                if id(row) not in still:
                    self._answer_seconds = 0.8 * self._answer_seconds + 0.2 * (now - row.started)

    def _cancel_all(self) -> None:
        with self._changed:
            waiting, self._waiting = list(self._waiting), deque()
        for ticket in waiting:
            ticket.done(Cancelled())
        self.decoder.drop(list(self.decoder.rows), reason=Cancelled())


def retry_seconds(waiting: int, capacity: int, answer_seconds: float) -> int:
    """Seconds a refused client should wait: the rounds of `capacity` answers the `waiting` requests need,
    and its own, at `answer_seconds` each."""
    rounds = waiting / max(capacity, 1) + 1
    return max(1, math.ceil(rounds * answer_seconds))
