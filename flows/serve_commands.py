"""`tuneline api`, `tuneline webchat`, and what `tuneline chat` reads from an inference YAML.

    tuneline api CONFIG.yaml | MODEL_PATH | models:/NAME@ALIAS [--host H] [--port P] [--allow-no-key] [--template T]
                 [key=value ...]
    tuneline webchat (the same TARGET and options)

TARGET is read by `core/serving/sources.py`; a `models:/` TARGET is looked up in the registry of
--tracking-uri, else MLFLOW_TRACKING_URI, else the workspace's mlflow.db (as `tuneline promote`).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tuneline.core.config import DataConfig, GeneratingConfig, ModelConfig
    from tuneline.core.inference.chat import ModelSource

TARGET_HELP = ("a LLaMA-Factory inference YAML (model_name_or_path, adapter_name_or_path, template, infer_backend, "
               "generation keys as defaults), a model, adapter or artifact folder, or a registered version "
               "models:/NAME@ALIAS (or models:/NAME/VERSION)")


def add_serve_parsers(commands: argparse._SubParsersAction) -> None:
    api = commands.add_parser("api", help="serve a model with an OpenAI-compatible API (/v1/chat/completions, /v1/models)")
    webchat = commands.add_parser("webchat", help="serve a model with a chat page in the browser (and the same API)")
    for command, handler in ((api, run_api), (webchat, run_webchat)):
        command.add_argument("target", metavar="TARGET", help=TARGET_HELP)
        command.add_argument("--host", default=None, help="address to listen on (default: API_HOST, else 127.0.0.1)")
        command.add_argument("--port", type=int, default=None, help="port (default: API_PORT, else 8000; 0: any free port)")
        command.add_argument("--allow-no-key", action="store_true",
                             help="serve on a host other than a loopback one without API_KEY (refused otherwise)")
        command.add_argument("--max-batch", type=int, default=None,
                             help="requests decoded together (default: API_MAX_BATCH, else 16)")
        command.add_argument("--queue-size", type=int, default=None,
                             help="requests that may wait for the model before more get 503 (default: API_QUEUE_SIZE, else 64)")
        command.add_argument("--template", default=None, help="render with this tuneline template (the training template: "
                                                              "needed for tools when the model's tokenizer has another)")
        store = command.add_mutually_exclusive_group()
        store.add_argument("--workspace", default="workspace",
                           help="for models:/ TARGETs: workspace whose mlflow.db holds the registry (default: ./workspace)")
        store.add_argument("--tracking-uri", default=None, help="for models:/ TARGETs: MLflow tracking/registry URI")
        command.add_argument("overrides", nargs="*", metavar="key=value", help="override an inference key")
        command.set_defaults(handler=handler)


def run_api(args: argparse.Namespace) -> int:
    return _serve(args, page=False)


def run_webchat(args: argparse.Namespace) -> int:
    return _serve(args, page=True)


def _serve(args: argparse.Namespace, *, page: bool) -> int:
    from tuneline.core.serving.server import serve, server_settings, with_decoding
    from tuneline.core.serving.sources import served_model
    from tuneline.core.store.readers import reading_artifacts
    from tuneline.core.tracking.model_registry import registry_uri

    settings = server_settings(os.environ, host=args.host, port=args.port, allow_no_key=args.allow_no_key)
    settings = with_decoding(settings, os.environ, max_batch=args.max_batch, queue_size=args.queue_size)
    command = f"tuneline {args.command}"
    served = served_model(args.target, template=args.template, overrides=args.overrides, command=command,
                          tracking_uri=lambda: registry_uri(args.workspace, tracking_uri=args.tracking_uri, source=command))
    with reading_artifacts([served.source.model, served.source.adapter, served.source.tokenizer]):
        return serve(served, settings, page=page)  # a served artifact is kept by `tuneline gc` until the server stops


@dataclass(frozen=True)
class ChatTarget:
    """What `tuneline chat` talks to, and with which settings."""

    source: ModelSource
    template: str | None
    keys: DataConfig | None
    model_config: ModelConfig | None
    generating: GeneratingConfig


def chat_target(path: str, *, template: str | None, generating: GeneratingConfig,
                tracking_uri: Callable[[], str] | None = None) -> ChatTarget:
    """PATH as `tuneline chat` had it (a folder); a registered version (`models:/NAME@ALIAS`, looked up in
    the registry `tracking_uri()` gives); or an inference YAML: its model, adapter, template and
    template keys, and its generation keys where the command's flags were left at their defaults."""
    from tuneline.core.config import GeneratingConfig
    from tuneline.core.inference.chat import resolve_source
    from tuneline.core.serving.sources import YAML_SUFFIXES, served_model
    from tuneline.core.tracking.model_uris import is_model_uri

    if is_model_uri(path):
        served = served_model(path, template=template, tracking_uri=tracking_uri, command="tuneline chat")
        return ChatTarget(served.source, served.template, served.keys, served.model_config, generating)
    if Path(path).suffix.lower() not in YAML_SUFFIXES:
        return ChatTarget(resolve_source(path), template, None, None, generating)
    served = served_model(path, template=template, command="tuneline chat")
    defaults = GeneratingConfig()
    flags = {f.name: getattr(generating, f.name) for f in dataclasses.fields(generating)
             if getattr(generating, f.name) != getattr(defaults, f.name)}
    return ChatTarget(served.source, served.template, served.keys, served.model_config,
                      dataclasses.replace(served.generating, **flags))
