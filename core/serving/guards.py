"""What the server checks before the app reads a request, and how it answers a failure: one ASGI
middleware (`RequestGuard`), every refusal in OpenAI's error shape.

- A body over the limit is refused with 413: by its Content-Length before any of it is read, and a
  chunked body as soon as it grows past the limit.
- A POST must say `Content-Type: application/json`, else 415: a web page may send text/plain, form
  or multipart bodies to any address without the server's consent, but not JSON, so a page the user
  visits cannot make a keyless server on their machine generate.
- With `allowed_hosts` (a server bound to a loopback address), a Host header naming anything but a
  loopback address, `localhost` or an allowed name is refused with 400. This defeats DNS rebinding: a
  page whose name is made to resolve to 127.0.0.1 sends its own name as Host.
- An exception no handler answered gets a generic 500 naming a request id; the traceback goes to the
  server's log (stderr) under that id, never to the client, whose reply would otherwise show paths.
"""

from __future__ import annotations

import ipaddress
import sys
import traceback
import uuid
from collections.abc import Collection

from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tuneline.core.serving.protocol import RequestError, error_body

JSON_MEDIA_TYPE = "application/json"
BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})


def error_response(error: RequestError) -> JSONResponse:
    """`error` in OpenAI's shape, with its status."""
    kind = "invalid_request_error" if error.status < 500 else "server_error"
    return JSONResponse(error_body(error.message, kind=kind, param=error.param, code=error.code), status_code=error.status)


def is_loopback(host: str) -> bool:
    """Whether `host` (a name or an address, IPv6 in brackets or not) is this machine's loopback:
    `localhost`, 127.0.0.0/8 or ::1."""
    name = host.strip().strip("[]").rstrip(".").lower()
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def host_name(header: str) -> str:
    """The host of a Host header, without its port and IPv6 brackets: `[::1]:8000` is `::1`."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1:header.index("]")] if "]" in header else header
    return header.partition(":")[0].rstrip(".")


def host_allowed(header: str | None, allowed_hosts: Collection[str]) -> bool:
    """Whether a request with this Host header may be answered: a loopback name or address, or a name
    in `allowed_hosts` (compared without case or port)."""
    if not header:
        return False
    name = host_name(header)
    return is_loopback(name) or name in {host.strip().lower() for host in allowed_hosts}


def refusal(method: str, headers: Headers, *, max_body_bytes: int, allowed_hosts: Collection[str] | None) -> RequestError | None:
    """Why a request with this method and these headers is refused before its body is read, if it is."""
    if allowed_hosts is not None and not host_allowed(headers.get("host"), allowed_hosts):
        names = ", ".join(["localhost", "127.0.0.1", "[::1]", *sorted(allowed_hosts)])
        return RequestError(f"The Host header {headers.get('host', '')!r} is not a name this server answers to ({names}); "
                            "to reach it under another name, start the server with that name in API_ALLOWED_HOSTS.",
                            code="invalid_host")
    if method in BODY_METHODS:
        media_type = headers.get("content-type", "").partition(";")[0].strip().lower()
        if media_type != JSON_MEDIA_TYPE:
            got = f"'{media_type}'" if media_type else "none"
            return RequestError(f"Send the request body as JSON with 'Content-Type: {JSON_MEDIA_TYPE}' (got {got}); "
                                "this server reads no other content type.", code="unsupported_media_type", status=415)
        length = headers.get("content-length", "")
        if length.isdigit() and int(length) > max_body_bytes:
            return body_too_large(max_body_bytes)
    return None


def body_too_large(max_body_bytes: int) -> RequestError:
    return RequestError(f"The request body is over this server's limit of {max_body_bytes} bytes (API_MAX_BODY_BYTES); "
                        "send a shorter request.", code="request_too_large", status=413)


class RequestGuard:
    """The checks above, around an ASGI app (added with `app.add_middleware(RequestGuard, ...)`)."""

    def __init__(self, app: ASGIApp, *, max_body_bytes: int, allowed_hosts: Collection[str] | None) -> None:
        self.app, self.max_body_bytes, self.allowed_hosts = app, max_body_bytes, allowed_hosts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        refused = refusal(scope["method"], Headers(scope=scope), max_body_bytes=self.max_body_bytes,
                          allowed_hosts=self.allowed_hosts)
        if refused is not None:
            await error_response(refused)(scope, receive, send)
            return
        started = False

        async def sending(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, self._bounded(receive), sending)
        except Exception as error:  # the last resort: logged here, answered without its text
            if started:  # the reply has begun (a stream): the connection is closed instead
                log_failure(new_request_id(), scope, error)
                return
            if isinstance(error, RequestError):  # a body cut off where no handler of the app saw it
                await error_response(error)(scope, receive, send)
                return
            request_id = new_request_id()
            log_failure(request_id, scope, error)
            await error_response(RequestError(f"The server failed; see the server's log (request id {request_id}).",
                                              code="server_error", status=500))(scope, receive, send)

    def _bounded(self, receive: Receive) -> Receive:
        """`receive`, raising 413 once the body read so far is over the limit."""
        received = 0

        async def bounded() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_body_bytes:
                    raise body_too_large(self.max_body_bytes)
            return message

        return bounded


def new_request_id() -> str:
    return uuid.uuid4().hex[:16]


def log_failure(request_id: str, scope: Scope, error: BaseException) -> None:
    """The failure's traceback on the server's log (stderr), under the id its client was told."""
    lines = traceback.format_exception(type(error), error, error.__traceback__)
    print(f"tuneline api: request {request_id} ({scope.get('method')} {scope.get('path')}) failed:\n{''.join(lines)}",
          file=sys.stderr, flush=True)
