"""The request mix of `benchmarks/serve_load.py` and the clients that send it to a chat completions server.

Kinds: `answer` (not streamed), `stream` (read to [DONE]), `disconnect` (streamed, closed after its
first chunks), `near_context` (a prompt that leaves less room in the context than its `max_tokens`),
and the hostile ones with the status each must get (EXPECTED): a body over the size limit, more stop
strings or messages than the limits, a prompt longer than the context, a text/plain body, a Host
header naming another machine.
"""

from __future__ import annotations

import http.client
import json
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import urlsplit

from tuneline.core.serving.protocol import RequestLimits

MAX_TOKENS = (None, 4, 8, 24, 48)  # None: the served default
PROMPT_WORDS = (3, 12, 40, 120, 300)
DISCONNECT_MAX_TOKENS = 400  # a generation that goes on after its client left costs the others dearly
NEAR_CONTEXT_MAX_TOKENS = 64  # more than the room such a prompt leaves
LIMITS = RequestLimits()  # the served defaults (API_MAX_BODY_BYTES, ...), which the hostile requests exceed
MAX_RETRIES = 30
PROBE_EVERY = 0.2
# the share of each kind in a plan; the rest are plain (non-streamed) answers
SHARES = {"stream": 0.24, "disconnect": 0.10, "near_context": 0.04, "big_body": 0.03, "many_stops": 0.03,
          "many_messages": 0.02, "over_context": 0.03, "plain_text": 0.02, "foreign_host": 0.02}
EXPECTED = {"big_body": 413, "many_stops": 400, "many_messages": 400, "over_context": 400, "plain_text": 415,
            "foreign_host": 400}
HEADERS = {"plain_text": {"Content-Type": "text/plain"},
           "foreign_host": {"Host": "attacker.example"}}  # a page's own name, as DNS rebinding sends it
CHAT_PATH = "/v1/chat/completions"
STREAMED = ("stream", "disconnect")
ANSWERED = ("answer", "stream", "near_context")  # full answers, compared with the reference


class Renders(Protocol):
    """How the served model writes prompts: their ids, and its context length."""

    context: int

    def prompt_ids(self, messages: list[dict[str, str]], system: str | None) -> tuple[int, ...]: ...


@dataclass(frozen=True)
class Planned:
    kind: str
    body: bytes
    headers: tuple[tuple[str, str], ...] = ()
    """Headers sent besides (or instead of) Content-Type: application/json."""
    reference: tuple[tuple[int, ...], int] | None = None
    """The prompt ids and max_new_tokens of its greedy answer (full answers only)."""


@dataclass
class Outcome:
    planned: Planned
    statuses: list[int]
    """Every status answered, 503s before the last; 0 for a broken connection or stream."""
    text: str | None = None
    seconds: float = 0.0
    problem: str | None = None


def plan_requests(count: int, reference: Renders, *, words: list[str], default_max_tokens: int,
                  seed: int) -> list[Planned]:
    """`count` requests in the mix of SHARES, in a shuffled order fixed by `seed`."""
    draw = random.Random(seed)
    kinds = [kind for kind, share in SHARES.items() for _ in range(max(1, round(count * share)))]
    kinds = (kinds + ["answer"] * count)[:count]
    draw.shuffle(kinds)
    return [_planned(kind, draw, reference, words=words, default_max_tokens=default_max_tokens) for kind in kinds]


def _planned(kind: str, draw: random.Random, reference: Renders, *, words: list[str],
             default_max_tokens: int) -> Planned:
    text = lambda n: " ".join(draw.choice(words) for _ in range(n))  # noqa: E731
    system = text(6) if draw.random() < 0.3 else None
    messages = [{"role": "user", "content": text(draw.choice(PROMPT_WORDS))}]
    if draw.random() < 0.3:
        messages = [{"role": "user", "content": text(8)}, {"role": "assistant", "content": text(8)}, *messages]
    max_tokens = draw.choice(MAX_TOKENS)
    if kind == "disconnect":
        max_tokens = DISCONNECT_MAX_TOKENS
    elif kind == "near_context":
        messages, max_tokens = [_filling(reference, words, draw, system, margin=3)], NEAR_CONTEXT_MAX_TOKENS
    elif kind == "over_context":
        messages = [_filling(reference, words, draw, system, margin=-64)]
    body: dict = {"model": "tiny", "messages": ([{"role": "system", "content": system}] if system else []) + messages,
                  "stream": kind in STREAMED}
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    if kind == "many_stops":
        body["stop"] = [f"stop{i:03d}" for i in range(LIMITS.stop_strings + 1)]
    elif kind == "many_messages":
        body["messages"] = [{"role": ("user", "assistant")[i % 2], "content": text(2)} for i in range(LIMITS.messages + 1)]
    elif kind == "big_body":
        filler = text(40) + " "
        body["messages"][-1]["content"] = filler * (LIMITS.body_bytes // len(filler) + 1)
    if kind not in ANSWERED:
        return Planned(kind, json.dumps(body).encode(), tuple(HEADERS.get(kind, {}).items()))
    prompt = reference.prompt_ids(messages, system)
    room = reference.context - len(prompt)
    return Planned(kind, json.dumps(body).encode(), reference=(prompt, min(max_tokens or default_max_tokens, room)))


def _filling(reference: Renders, words: list[str], draw: random.Random, system: str | None, *,
             margin: int) -> dict[str, str]:
    """A user message whose rendered prompt ends `margin` tokens or a little less short of the context
    (past it, for a negative margin)."""
    chosen: list[str] = []
    for step in (64, 1):  # 64 words at a time, then one at a time from the last length that fitted
        while True:
            longer = [*chosen, *(draw.choice(words) for _ in range(step))]
            message = {"role": "user", "content": " ".join(longer)}
            if len(reference.prompt_ids([message], system)) > reference.context - margin:
                if step == 1:
                    return message if margin < 0 else {"role": "user", "content": " ".join(chosen)}
                break
            chosen = longer
    raise AssertionError("unreachable")


def send(connection: http.client.HTTPConnection, planned: Planned) -> Outcome:
    """`planned` sent until it is answered with something else than 503 (each 503 waits its Retry-After)."""
    outcome, started = Outcome(planned, []), time.perf_counter()
    for _ in range(MAX_RETRIES):
        try:
            status, outcome.text, wait = _send_once(connection, planned)
        except (http.client.HTTPException, OSError, ValueError, KeyError) as e:
            connection.close()  # the next request opens a new connection
            status, outcome.problem, wait = 0, f"{type(e).__name__}: {e}", 0.0
        outcome.statuses.append(status)
        if status != 503:
            break
        time.sleep(wait)
    outcome.seconds = time.perf_counter() - started
    return outcome


def _send_once(connection: http.client.HTTPConnection, planned: Planned) -> tuple[int, str | None, float]:
    headers = {"Content-Type": "application/json", **dict(planned.headers)}  # a Host given replaces the real one
    connection.request("POST", CHAT_PATH, body=planned.body, headers=headers)
    response = connection.getresponse()
    if response.status != 200 or planned.kind not in STREAMED:
        body = response.read()
        text = json.loads(body)["choices"][0]["message"]["content"] if response.status == 200 else None
        return response.status, text, _retry_after(response)
    pieces: list[str] = []
    while raw := response.readline():
        line = raw.decode().rstrip("\r\n")
        if not line.startswith("data: "):
            continue
        if line == "data: [DONE]":
            response.read()  # the chunked body's end, so the connection serves the next request
            return 200, "".join(pieces), 0.0
        event = json.loads(line.removeprefix("data: "))
        if "error" in event:
            raise ValueError(f"error event in the stream: {event['error'].get('message')}")
        if event.get("choices"):  # the usage chunk has none
            pieces.append(event["choices"][0]["delta"].get("content") or "")
        if planned.kind == "disconnect" and len(pieces) >= 2:
            connection.close()  # mid-answer
            return 200, None, 0.0
    raise ValueError("the stream ended without [DONE]")


def _retry_after(response: http.client.HTTPResponse) -> float:
    try:
        return min(float(response.getheader("retry-after") or "1"), 5.0)
    except ValueError:
        return 1.0


def run_all(url: str, plan: list[Planned], *, clients: int) -> tuple[list[Outcome], float]:
    """Every planned request sent by `clients` concurrent clients (one keep-alive connection each); the wall
    time. The standard library's client costs a fraction of the CPU of a richer one, and the clients share
    the server's cores."""
    address = urlsplit(url)
    local = threading.local()
    made: list[http.client.HTTPConnection] = []

    def work(planned: Planned) -> Outcome:
        if not hasattr(local, "connection"):
            local.connection = http.client.HTTPConnection(address.hostname, address.port, timeout=300)
            made.append(local.connection)
        return send(local.connection, planned)

    started = time.perf_counter()
    pool = ThreadPoolExecutor(max_workers=clients, thread_name_prefix="client")
    try:
        outcomes = list(pool.map(work, plan))
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    wall = time.perf_counter() - started
    for connection in made:
        connection.close()
    return outcomes, wall


class Probe(threading.Thread):
    """GET /v1/models every PROBE_EVERY seconds until stopped; the latencies (inf for a failure)."""

    def __init__(self, url: str) -> None:
        super().__init__(name="probe", daemon=True)
        self.url, self.latencies, self.stopped = url, [], threading.Event()

    def run(self) -> None:
        import httpx

        with httpx.Client(timeout=10) as client:
            while not self.stopped.is_set():
                started = time.perf_counter()
                try:
                    ok = client.get(f"{self.url}/v1/models").status_code == 200
                except httpx.HTTPError:
                    ok = False
                seconds = time.perf_counter() - started
                self.latencies.append(seconds if ok else float("inf"))
                self.stopped.wait(max(0.0, PROBE_EVERY - seconds))
