"""The OpenAI-compatible HTTP app: `GET /v1/models`, `POST /v1/chat/completions`, and with
`page` the web chat at `/` (`webchat.html`); for a reward model, LLaMA-Factory's
`POST /v1/score/evaluation` instead of chat completions (`scoring.py`).

As LLaMA-Factory's API: when `api_key` is set (API_KEY), every /v1 request must carry
`Authorization: Bearer <key>` or gets 401. Errors are answered in OpenAI's shape
(`{"error": {"message", "type", "param", "code"}}`), malformed requests with 400; what `guards.py`
refuses before the app reads a request (a body over the limit, not JSON, a foreign Host), and a
failure's generic 500, are answered in the same shape. A streamed answer
is server-sent events: `data: {chunk}` lines, the first with the assistant role, the last with the
finish reason (then a usage chunk with `stream_options.include_usage`), then `data: [DONE]`.
"""

from __future__ import annotations

import hmac
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Collection
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException

from tuneline.core.errors import TunelineError
from tuneline.core.serving.backends import QueueFull
from tuneline.core.serving.guards import RequestGuard, error_response
from tuneline.core.serving.protocol import (
    ChatRequest,
    RequestError,
    RequestLimits,
    chunk_body,
    completion_body,
    error_body,
    parse_chat_request,
    usage_body,
)
from tuneline.core.serving.relay import Relay, busy_response, wait_for_answers
from tuneline.core.serving.scoring import parse_score_request
from tuneline.core.serving.tool_calls import read_tool_calls

if TYPE_CHECKING:
    from tuneline.core.serving.backends import Answer, GenerationEngine, Ticket
    from tuneline.core.serving.scoring import ScoringEngine

PAGE = Path(__file__).with_name("webchat.html")
log = logging.getLogger(__name__)


def create_app(engine: GenerationEngine | None, *, model_name: str, api_key: str | None, page: bool = False,
               root_path: str = "", scorer: ScoringEngine | None = None, limits: RequestLimits = RequestLimits(),
               allowed_hosts: Collection[str] | None = None) -> FastAPI:
    """The app serving `engine` (a model that generates) or `scorer` (a reward model) as `model_name`;
    requests bounded by `limits`, and, with `allowed_hosts`, answered only for a loopback Host or those names."""
    app = FastAPI(title="tuneline", root_path=root_path, docs_url=None, redoc_url=None, openapi_url=None)
    app.add_middleware(RequestGuard, max_body_bytes=limits.body_bytes, allowed_hosts=allowed_hosts)
    _add_error_handlers(app)
    created = int(time.time())

    async def check_key(request: Request) -> None:
        if api_key and not _authorized(request, api_key):
            raise RequestError("Invalid API key: send the key the server was started with (API_KEY) as "
                               "'Authorization: Bearer <key>'.", code="invalid_api_key", status=401)

    @app.get("/v1/models", dependencies=[Depends(check_key)])
    async def list_models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": created, "owned_by": "tuneline"}]}

    @app.post("/v1/score/evaluation", dependencies=[Depends(check_key)])
    async def score_evaluation(request: Request) -> dict[str, Any]:
        if scorer is None:
            raise RequestError("Not allowed: this server serves a model that generates; /v1/score/evaluation scores texts "
                               "with a reward model (serve an rm stage's output).", status=405)
        asked = parse_score_request(await request.body(), context_length=scorer.context_length, limits=limits)
        scores = await run_in_threadpool(scorer.score, asked)
        return {"id": f"scoreeval-{uuid.uuid4().hex}", "model": model_name, "scores": scores}

    @app.post("/v1/chat/completions", dependencies=[Depends(check_key)])
    async def chat_completions(request: Request) -> Any:
        if engine is None:
            raise RequestError("Not allowed: this server serves a reward model, which scores texts and writes none; "
                               "POST them to /v1/score/evaluation.", status=405)
        chat = parse_chat_request(await request.body(), limits=limits)
        if chat.stream and (chat.n > 1 or chat.tools):
            raise RequestError("Streaming answers only one choice without tools; send 'stream': false for 'n' > 1 or "
                               "for 'tools'.", param="stream")
        prepared = await run_in_threadpool(engine.prepare, chat)  # a template that cannot write the tools: 400
        completion_id, relay = f"chatcmpl-{uuid.uuid4().hex}", Relay()
        try:
            tickets = engine.submit(prepared, copies=chat.n, write=relay.write if chat.stream else None, done=relay.done)
        except QueueFull as full:
            return busy_response(full)
        if chat.stream:
            events = _events(engine, tickets[0], relay, completion_id=completion_id, model=model_name,
                             include_usage=chat.include_usage)
            return StreamingResponse(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        answers = await wait_for_answers(request, engine, tickets, relay)
        if answers is None:  # the client has gone: nobody reads this
            return Response(status_code=499)
        choices = [_choice(i, answer, chat, engine) for i, answer in enumerate(answers)]
        return completion_body(completion_id=completion_id, model=model_name, choices=choices,
                               prompt_tokens=len(prepared.prompt), completion_tokens=sum(a.completion_tokens for a in answers))

    if page:
        @app.get("/", response_class=HTMLResponse)
        async def chat_page() -> HTMLResponse:
            return HTMLResponse(PAGE.read_text(encoding="utf-8").replace("{{MODEL_NAME}}", _html(model_name)))

    return app


def _authorized(request: Request, api_key: str) -> bool:
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), api_key.encode())


def _html(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")


def _choice(index: int, answer: Answer, chat: ChatRequest, engine: GenerationEngine) -> dict[str, Any]:
    """A choice of a whole answer; with tools, an answer in the template's tool-call format becomes `tool_calls`."""
    template = engine.renderer.template
    calls = read_tool_calls(answer.text, tool_format=template.tool_format) if chat.tools and template else None
    if calls:
        tool_calls = [{"id": f"call_{uuid.uuid4().hex}", "type": "function", "function": {"name": name, "arguments": arguments}}
                      for name, arguments in calls]
        return {"index": index, "message": {"role": "assistant", "content": None, "tool_calls": tool_calls},
                "finish_reason": "tool_calls"}
    return {"index": index, "message": {"role": "assistant", "content": answer.text}, "finish_reason": answer.finish_reason}


def _sse(body: dict[str, Any]) -> str:
    return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"


async def _events(engine: GenerationEngine, ticket: Ticket, relay: Relay, *, completion_id: str, model: str,
                  include_usage: bool) -> AsyncIterator[str]:
    """The answer's chunks as the decoding thread writes them into `relay`; a client that goes away (the
    response stops iterating) cancels its generation."""
    chunk = {"completion_id": completion_id, "model": model}
    try:
        yield _sse(chunk_body(**chunk, delta={"role": "assistant", "content": ""}))
        while True:
            kind, value = await relay.next()
            if kind == "text":
                yield _sse(chunk_body(**chunk, delta={"content": value}))
            elif isinstance(value, BaseException):  # the response has begun: the error goes in the stream
                log.error("Streamed completion %s failed: %s: %s", completion_id, type(value).__name__, value)
                yield _sse(error_body("Generation failed; the server's log has the details.", kind="server_error"))
                break
            else:
                yield _sse(chunk_body(**chunk, delta={}, finish_reason=value.finish_reason))
                if include_usage:
                    yield _sse(chunk_body(**chunk, delta=None, usage=usage_body(value.prompt_tokens, value.completion_tokens)))
                break
        yield "data: [DONE]\n\n"
    finally:
        engine.cancel(ticket)


def _add_error_handlers(app: FastAPI) -> None:
    """Every error in OpenAI's shape: ours, tuneline's input errors (a template that cannot write the
    request's tools), FastAPI's validation (400, not 422) and HTTP errors (404, 405). Any other exception
    is the guard's generic 500."""

    async def request_error(_: Request, error: RequestError) -> JSONResponse:
        return error_response(error)

    async def input_error(_: Request, error: TunelineError) -> JSONResponse:
        return error_response(RequestError(f"{error}", code="invalid_input"))

    async def validation_error(_: Request, error: RequestValidationError) -> JSONResponse:
        first = error.errors()[0] if error.errors() else {}
        where = ".".join(str(part) for part in first.get("loc", ()) if part != "body")
        return error_response(RequestError(f"Invalid request{f' at {where}' if where else ''}: {first.get('msg', 'malformed')}."))

    async def http_error(_: Request, error: HTTPException) -> JSONResponse:
        return error_response(RequestError(f"{error.detail}.", status=error.status_code))

    app.add_exception_handler(RequestError, request_error)
    app.add_exception_handler(TunelineError, input_error)
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(HTTPException, http_error)
