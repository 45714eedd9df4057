"""Serving a `ServedModel` over HTTP with uvicorn: `tuneline api` and `tuneline webchat`.

Settings come from the environment as LLaMA-Factory's API reads them: `API_HOST` (default
127.0.0.1 here, so nothing outside the machine reaches the model unless asked), `API_PORT`
(default 8000), `API_KEY` (required as a bearer token when set), `API_MODEL_NAME` (the id
/v1/models lists; default: the served model's name) and `FASTAPI_ROOT_PATH` (behind a proxy);
flags win over them. The request limits are tuneline's own settings (`LIMIT_SETTINGS`, e.g.
API_MAX_BODY_BYTES), as is `API_ALLOWED_HOSTS`, names a server bound to a loopback address answers to
besides localhost and the loopback addresses (`guards.py`). A host other than a loopback one without
API_KEY is refused unless `allow_no_key` (--allow-no-key), then warned about. `API_MAX_BATCH`
(--max-batch, default 16) requests are decoded together, and `API_QUEUE_SIZE` (--queue-size, default
64) more may wait; the next is answered 503 with Retry-After. Torch computes on one core fewer than the
machine has, unless OMP_NUM_THREADS says otherwise (`torch_threads`). The port is bound before
the model loads, so a taken port fails at once; one line with the URL is printed when the server
accepts requests.
"""

from __future__ import annotations

import dataclasses
import socket
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tuneline.core.errors import ConfigError
from tuneline.core.serving.batching import DEFAULT_MAX_BATCH, DEFAULT_QUEUE_SIZE
from tuneline.core.serving.guards import is_loopback
from tuneline.core.serving.protocol import RequestLimits

if TYPE_CHECKING:
    from tuneline.core.serving.sources import ServedModel

DEFAULT_HOST, DEFAULT_PORT = "127.0.0.1", 8000
LIMIT_SETTINGS = {"API_MAX_BODY_BYTES": "body_bytes", "API_MAX_MESSAGES": "messages",
                  "API_MAX_STOP_STRINGS": "stop_strings", "API_MAX_STOP_LENGTH": "stop_length", "API_MAX_N": "choices",
                  "API_MAX_SCORE_TEXTS": "score_texts"}
"""The environment variable of each `RequestLimits` field."""


@dataclass(frozen=True)
class ServerSettings:
    host: str = DEFAULT_HOST
    """Address to listen on (--host, API_HOST)."""
    port: int = DEFAULT_PORT
    """Port (--port, API_PORT); 0 takes any free one."""
    api_key: str | None = None
    """Bearer token every /v1 request must carry (API_KEY); None: none needed."""
    model_name: str | None = None
    """The model id /v1/models lists (API_MODEL_NAME); None: the served model's name."""
    root_path: str = ""
    """The path prefix a proxy serves the app under (FASTAPI_ROOT_PATH)."""
    limits: RequestLimits = field(default_factory=RequestLimits)
    """What one request may hold (API_MAX_BODY_BYTES, API_MAX_MESSAGES, ...: `LIMIT_SETTINGS`)."""
    allowed_hosts: tuple[str, ...] = ()
    """Host names answered besides the loopback ones (API_ALLOWED_HOSTS, comma-separated); on a
    host other than a loopback one, the Host header is checked only when some are given."""
    allow_no_key: bool = False
    """Serve on a host other than a loopback one without API_KEY (--allow-no-key), with a warning."""
    max_batch: int = DEFAULT_MAX_BATCH
    """Requests decoded together in one batch (--max-batch, API_MAX_BATCH)."""
    queue_size: int = DEFAULT_QUEUE_SIZE
    """Requests that may wait for a place in the batch (--queue-size, API_QUEUE_SIZE); one more is answered
    503 with Retry-After."""

    @property
    def checked_hosts(self) -> tuple[str, ...] | None:
        """The names besides the loopback ones a Host header may carry; None: any (not checked)."""
        return self.allowed_hosts if is_loopback(self.host) or self.allowed_hosts else None

    @property
    def exposed_without_key(self) -> bool:
        return not is_loopback(self.host) and not self.api_key


def server_settings(env: Mapping[str, str], *, host: str | None = None, port: int | None = None,
                    allow_no_key: bool = False) -> ServerSettings:
    """The settings of the flags (`host`, `port`, `allow_no_key`) and else of `env` (API_HOST, API_PORT, API_KEY, ...)."""
    raw_port = env.get("API_PORT") or str(DEFAULT_PORT)
    if port is None and not (raw_port.isdigit() and 0 <= int(raw_port) < 65536):
        raise ConfigError(f"API_PORT={raw_port!r} is not a port number; set it to a number from 0 to 65535, or pass --port.")
    chosen = port if port is not None else int(raw_port)
    if not 0 <= chosen < 65536:
        raise ConfigError(f"--port {chosen} is not a port number; pass one from 0 to 65535.")
    allowed_hosts = tuple(name.strip().lower() for name in env.get("API_ALLOWED_HOSTS", "").split(",") if name.strip())
    settings = ServerSettings(host=host or env.get("API_HOST") or DEFAULT_HOST, port=chosen,
                              api_key=env.get("API_KEY") or None, model_name=env.get("API_MODEL_NAME") or None,
                              root_path=env.get("FASTAPI_ROOT_PATH", ""), limits=request_limits(env),
                              allowed_hosts=allowed_hosts, allow_no_key=allow_no_key)
    if settings.exposed_without_key and not allow_no_key:
        raise ConfigError(f"the host {settings.host} (--host, API_HOST) is not a loopback address, so anyone who can "
                          "reach this machine could use the model, and API_KEY is not set. Set API_KEY=<a secret> (clients then send "
                          "'Authorization: Bearer <secret>'), or serve on 127.0.0.1 (the default) and reach it through "
                          "an SSH tunnel or a proxy, or pass --allow-no-key to serve it to everyone anyway.")
    return settings


def request_limits(env: Mapping[str, str]) -> RequestLimits:
    """The request limits `env` sets (`LIMIT_SETTINGS`), the others at their defaults; all wrong ones listed at once."""
    defaults = RequestLimits()
    raw = {name: env.get(name, "").strip() for name in LIMIT_SETTINGS}
    values = _positive_whole_numbers((key, f"{name}={raw[name]!r}", raw[name], getattr(defaults, key))
                                     for name, key in LIMIT_SETTINGS.items())
    return dataclasses.replace(defaults, **values)


def exposure_warning(settings: ServerSettings) -> str | None:
    """The warning line for a server anyone who reaches the machine may use, if it is one."""
    if not settings.exposed_without_key:
        return None
    return (f"warning: serving on {settings.host} without API_KEY (--allow-no-key): anyone who can reach this machine "
            "can use the model.")


def with_decoding(settings: ServerSettings, env: Mapping[str, str], *, max_batch: int | None = None,
                  queue_size: int | None = None) -> ServerSettings:
    """`settings` with the batch and queue sizes of the flags, else of `env` (API_MAX_BATCH, API_QUEUE_SIZE)."""
    chosen = []
    for key, flag, name, given in (("max_batch", "--max-batch", "API_MAX_BATCH", max_batch),
                                   ("queue_size", "--queue-size", "API_QUEUE_SIZE", queue_size)):
        raw = str(given) if given is not None else env.get(name, "").strip()
        label = f"{flag} {raw}" if given is not None else f"{name}={raw!r}"
        chosen.append((key, label, raw, getattr(ServerSettings, key)))
    return dataclasses.replace(settings, **_positive_whole_numbers(chosen))


def _positive_whole_numbers(settings: Iterable[tuple[str, str, str, int]]) -> dict[str, int]:
    """The value of each (key, label, raw text, default) setting given (raw text not empty); a ConfigError
    listing every one that is not a positive whole number."""
    values, problems = {}, []
    for key, label, raw, default in settings:
        if raw and (not raw.isdigit() or int(raw) < 1):
            problems.append(f"{label} is not a positive whole number; set it to one, or leave it out for the default "
                            f"({default}).")
        elif raw:
            values[key] = int(raw)
    if problems:
        raise ConfigError(problems)
    return values


def bind(settings: ServerSettings) -> socket.socket:
    """A listening socket on the host and port, or a ConfigError saying the port is taken."""
    family = socket.AF_INET6 if ":" in settings.host else socket.AF_INET
    # IPPROTO_TCP named: asyncio turns Nagle's algorithm off only on sockets that say so, and with it on, a
    # keep-alive client's next answer waits for a delayed ACK (40 ms)
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((settings.host, settings.port))
    except OSError as e:
        sock.close()
        raise ConfigError(f"cannot listen on {settings.host}:{settings.port} ({e.strerror}); pass another --port (or "
                          "API_PORT), or stop the process that holds it.") from e
    sock.listen(128)
    return sock


def url_of(sock: socket.socket, host: str) -> str:
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{sock.getsockname()[1]}"


def torch_threads(env: Mapping[str, str], *, cores: int) -> int | None:
    """Torch's CPU threads for a server on `cores` cores: one fewer (at least one), leaving a core to the
    event loop that answers HTTP, unless OMP_NUM_THREADS sets them (None). A torch thread waiting for the
    core the loop holds stalls every operation of the others: on two busy cores, decoding with two
    threads ran some twenty times slower than with one."""
    return None if env.get("OMP_NUM_THREADS") else max(1, cores - 1)


def serve(served: ServedModel, settings: ServerSettings, *, page: bool) -> int:
    """Load the model and serve it until interrupted; prints the URL once requests are accepted. A model that
    generates decodes in a child process (`engine_process.py`) while this one answers HTTP."""
    import os

    import uvicorn

    from tuneline.core.serving.app import create_app
    from tuneline.core.serving.engine_process import EngineProcess
    from tuneline.core.serving.scoring import is_reward_model, load_scoring_engine

    cores = len(os.sched_getaffinity(0)) if sys.platform == "linux" else os.cpu_count() or 1  # the cores this process may use
    threads = torch_threads(os.environ, cores=cores)
    rewarding = is_reward_model(served.source)
    if rewarding and page:
        raise ConfigError(f"'{served.source.describe()}' is a reward model, which scores texts and writes none, so there is "
                          "nothing to chat with; serve it with `tuneline api` (POST /v1/score/evaluation).")
    warning = exposure_warning(settings)
    if warning:
        print(warning, file=sys.stderr, flush=True)
    # the decoding process starts first: forked before this one runs torch, it loads the model while the port is bound
    engine = None if rewarding else EngineProcess(served, max_batch=settings.max_batch, queue_size=settings.queue_size,
                                                   torch_threads=threads)
    try:
        sock = bind(settings)
        if engine is not None:
            engine.wait_until_ready()
            scorer = None
        else:
            import torch

            if threads:
                torch.set_num_threads(threads)
            scorer = load_scoring_engine(served.source, model_config=served.model_config)
        name = settings.model_name or served.name
        if served.origin:
            print(f"tuneline {'webchat' if page else 'api'}: {served.name} is {served.origin}", flush=True)
        app = create_app(engine, model_name=name, api_key=settings.api_key, page=page, root_path=settings.root_path,
                         scorer=scorer, limits=settings.limits, allowed_hosts=settings.checked_hosts)
        url = url_of(sock, settings.host)
        announce = (f"tuneline webchat: chat with {name} at {url}/" if page
                    else f"tuneline api: scoring with the reward model {name} at {url}/v1/score/evaluation" if rewarding
                    else f"tuneline api: serving {name} at {url}/v1 (OpenAI-compatible)")

        class AnnouncingServer(uvicorn.Server):
            async def startup(self, sockets: list[socket.socket] | None = None) -> None:
                await super().startup(sockets=sockets)
                if self.started:
                    print(announce, flush=True)

        config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=5)
        AnnouncingServer(config).run(sockets=[sock])
    finally:
        if engine is not None:
            engine.close()
    sys.stdout.flush()
    return 0
