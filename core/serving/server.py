"""Serving a `ServedModel` over HTTP with uvicorn: `tuneline api` and `tuneline webchat`.

Settings come from the environment as LLaMA-Factory's API reads them: `API_HOST` (default
127.0.0.1 here, so nothing outside the machine reaches the model unless asked), `API_PORT`
(default 8000), `API_KEY` (required as a bearer token when set), `API_MODEL_NAME` (the id
/v1/models lists; default: the served model's name) and `FASTAPI_ROOT_PATH` (behind a proxy);
flags win over them. The port is bound before the model loads, so a taken port fails at once; one
line with the URL is printed when the server accepts requests.
"""

from __future__ import annotations

import socket
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tuneline.core.errors import ConfigError

if TYPE_CHECKING:
    from tuneline.core.serving.engine import HuggingFaceEngine
    from tuneline.core.serving.sources import ServedModel

DEFAULT_HOST, DEFAULT_PORT = "127.0.0.1", 8000


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


def server_settings(env: Mapping[str, str], *, host: str | None = None, port: int | None = None) -> ServerSettings:
    """The settings of the flags (`host`, `port`) and else of `env` (API_HOST, API_PORT, API_KEY, ...)."""
    raw_port = env.get("API_PORT") or str(DEFAULT_PORT)
    if port is None and not (raw_port.isdigit() and 0 <= int(raw_port) < 65536):
        raise ConfigError(f"API_PORT={raw_port!r} is not a port number; set it to a number from 0 to 65535, or pass --port.")
    chosen = port if port is not None else int(raw_port)
    if not 0 <= chosen < 65536:
        raise ConfigError(f"--port {chosen} is not a port number; pass one from 0 to 65535.")
    return ServerSettings(host=host or env.get("API_HOST") or DEFAULT_HOST, port=chosen, api_key=env.get("API_KEY") or None,
                          model_name=env.get("API_MODEL_NAME") or None, root_path=env.get("FASTAPI_ROOT_PATH", ""))


def bind(settings: ServerSettings) -> socket.socket:
    """A listening socket on the host and port, or a ConfigError saying the port is taken."""
    family = socket.AF_INET6 if ":" in settings.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
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


def load_engine(served: ServedModel) -> HuggingFaceEngine:
    """The served model loaded, its prompts rendered as its training template writes them (or with its
    tokenizer's saved chat template when no template is named)."""
    import torch

    from tuneline.core.inference.chat import chat_template, load_chat_model
    from tuneline.core.inference.prompts import PromptRenderer
    from tuneline.core.serving.engine import HuggingFaceEngine

    model, tokenizer = load_chat_model(served.source, template=served.template, keys=served.keys,
                                       model_config=served.model_config)
    if served.inference.infer_dtype != "auto":
        model = model.to(getattr(torch, served.inference.infer_dtype))
    template = chat_template(served.template, tokenizer, keys=served.keys) if served.template else None
    return HuggingFaceEngine(model, PromptRenderer(tokenizer, template), defaults=served.generating)


def serve(served: ServedModel, settings: ServerSettings, *, page: bool) -> int:
    """Load the model and serve it until interrupted; prints the URL once requests are accepted."""
    import uvicorn

    from tuneline.core.serving.app import create_app

    from tuneline.core.serving.scoring import is_reward_model, load_scoring_engine

    rewarding = is_reward_model(served.source)
    if rewarding and page:
        raise ConfigError(f"'{served.source.describe()}' is a reward model, which scores texts and writes none, so there is "
                          "nothing to chat with; serve it with `tuneline api` (POST /v1/score/evaluation).")
    sock = bind(settings)
    engine, scorer = (None, load_scoring_engine(served.source, model_config=served.model_config)) if rewarding \
        else (load_engine(served), None)
    name = settings.model_name or served.name
    if served.origin:
        print(f"tuneline {'webchat' if page else 'api'}: {served.name} is {served.origin}", flush=True)
    app = create_app(engine, model_name=name, api_key=settings.api_key, page=page, root_path=settings.root_path,
                     scorer=scorer)
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
    sys.stdout.flush()
    return 0
