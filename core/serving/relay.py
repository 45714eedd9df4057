"""What the decoding thread writes, carried to the request's coroutine: the app awaits an asyncio
queue, and no request holds a thread of its own.

A non-streamed request polls its connection while it waits (`wait_for_answers`), as a streamed one is
watched by its response: a client that goes away cancels its generation, which leaves the batch at
the next step.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from fastapi.responses import JSONResponse

from tuneline.core.serving.backends import Answer, QueueFull
from tuneline.core.serving.protocol import error_body

if TYPE_CHECKING:
    from starlette.requests import Request

    from tuneline.core.serving.backends import GenerationEngine, Ticket

DISCONNECT_POLL_SECONDS = 0.5


class Relay:
    """`write` and `done` for `GenerationEngine.submit`, callable from any thread; `next()` awaits what they
    received, in order: ("text", piece) or ("done", Answer or the exception that ended the request)."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()

    def write(self, piece: str) -> None:
        self.loop.call_soon_threadsafe(self.queue.put_nowait, ("text", piece))

    def done(self, outcome: Answer | BaseException) -> None:
        self.loop.call_soon_threadsafe(self.queue.put_nowait, ("done", outcome))

    async def next(self) -> tuple[str, Any]:
        return await self.queue.get()


async def wait_for_answers(request: Request, engine: GenerationEngine, tickets: list[Ticket], relay: Relay) -> list[Answer] | None:
    """Every ticket's answer (in the order they end); None when the client went away first. An exception
    that ended one is raised; whatever is left of the others is cancelled."""
    ended: list[Answer] = []
    try:
        while len(ended) < len(tickets):
            try:
                kind, value = await asyncio.wait_for(relay.next(), timeout=DISCONNECT_POLL_SECONDS)
            except TimeoutError:
                if await request.is_disconnected():
                    return None
                continue
            if kind != "done":
                continue
            if isinstance(value, BaseException):
                raise value
            ended.append(value)
        return ended
    finally:
        for ticket in tickets:
            engine.cancel(ticket)  # nothing for those that ended


def busy_response(full: QueueFull) -> JSONResponse:
    """503 in OpenAI's error shape, with `Retry-After` in seconds."""
    message = (f"The server is busy: {full.waiting} requests are already waiting for the model; retry in "
               f"{full.retry_after} s.")
    return JSONResponse(error_body(message, kind="server_error", code="server_busy"), status_code=503,
                        headers={"Retry-After": str(full.retry_after)})
