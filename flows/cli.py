"""The `tuneline` command (docs/ARCHITECTURE.md, "Interfaces").

    tuneline demo [--workspace DIR] [--work-pool NAME] [key=value ...]
    tuneline run PIPELINE.yaml [--workspace DIR] [key=value ...]
    tuneline deploy [--prefect-file FILE] [--pool NAME]
    tuneline deploy PIPELINE.yaml [key=value ...]
    tuneline train CONFIG.yaml [key=value ...]
    tuneline data preprocess CONFIG.yaml --output DIR [key=value ...]
    tuneline data preview CONFIG.yaml [--count N] [key=value ...]
    tuneline export CONFIG.yaml [key=value ...]
    tuneline chat PATH|CONFIG.yaml [--system TEXT] [--max-new-tokens N] [--do-sample] [--temperature T] ...
    tuneline api|webchat CONFIG.yaml|MODEL_PATH|models:/NAME@ALIAS [--host H] [--port P] [--allow-no-key]
        [--max-batch N] [--queue-size N] [key=value ...]
    tuneline promote MODEL_NAME VERSION [--workspace DIR | --tracking-uri URI]
    tuneline rollback MODEL_NAME [--workspace DIR | --tracking-uri URI]
    tuneline verify [--workspace DIR|URL]
    tuneline gc [--workspace DIR|URL] [--keep-runs N] [--yes]

Exit status: 0 success, 2 bad configuration or input (one paragraph, no traceback), 1 otherwise
(`verify`: 1 when an artifact is damaged).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from importlib.resources import files
from pathlib import Path
from typing import TYPE_CHECKING

from tuneline.flows.eval_command import add_eval_parser
from tuneline.flows.serve_commands import add_serve_parsers

if TYPE_CHECKING:
    from types import TracebackType

    from tuneline.core.config import GeneratingConfig

# Telemetry off and quiet libraries before Prefect, MLflow or transformers are imported.
_QUIET_ENV = {
    "DO_NOT_TRACK": "true",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "HF_DATASETS_DISABLE_PROGRESS_BARS": "1",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "TRANSFORMERS_VERBOSITY": "error",
    "PREFECT_LOGGING_LEVEL": "WARNING",
    "MLFLOW_LOGGING_LEVEL": "WARNING",
}
# Shipped as package data (the repository's data/), so the demo runs from an installed wheel too.
DEMO_PIPELINE = Path(str(files("tuneline.data") / "demo_pipeline.yaml"))


def parse_arguments(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """Parsed arguments; `key=value` overrides may also come after options such as --workspace
    (argparse alone stops collecting a trailing positional list at the first option)."""
    args, extra = parser.parse_known_args(argv)
    if extra and hasattr(args, "overrides") and all("=" in item and not item.startswith("-") for item in extra):
        args.overrides = [*args.overrides, *extra]
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def main(argv: list[str] | None = None) -> int:
    for name, value in _QUIET_ENV.items():
        os.environ.setdefault(name, value)
    args = parse_arguments(build_parser(), argv)
    if args.verbose:
        os.environ["PREFECT_LOGGING_LEVEL"] = "INFO"
    from tuneline.core.errors import TunelineError
    from tuneline.core.tracking.privacy import mask_password

    sys.excepthook = _print_masked_traceback
    try:
        return args.handler(args)
    except TunelineError as e:
        print(f"error: {mask_password(str(e))}", file=sys.stderr)  # a message may quote a URI holding a password
        return e.exit_code
    except KeyboardInterrupt:
        print("interrupted; rerun the same command to resume from the last finished stage.", file=sys.stderr)
        return 130


def _print_masked_traceback(kind: type[BaseException], error: BaseException, trace: TracebackType | None) -> None:
    """Python's report of an uncaught exception, with every URI's password masked: MLflow's request
    errors quote the tracking URI whole."""
    import traceback

    from tuneline.core.tracking.privacy import mask_password

    sys.stderr.write(mask_password("".join(traceback.format_exception(kind, error, trace))))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tuneline", description="Fine-tune LLMs as a cached Prefect pipeline tracked in MLflow.")
    parser.add_argument("-v", "--verbose", action="store_true", help="show Prefect's and the trainer's logs")
    commands = parser.add_subparsers(dest="command", required=True)

    demo = commands.add_parser("demo", help="build a tiny model and run the whole chain on the demo data")
    demo.add_argument("--workspace", default="workspace", help="folder for artifacts and the MLflow store (default: ./workspace)")
    demo.add_argument("--work-pool", default=None, metavar="NAME",
                      help="run every stage as a flow run on a worker of this Prefect work pool (see `tuneline deploy`)")
    demo.add_argument("overrides", nargs="*", metavar="key=value", help="override a default, or one stage's key as stage.key=value")
    demo.set_defaults(handler=run_demo)

    run = commands.add_parser("run", help="run a pipeline YAML through its Prefect flow")
    run.add_argument("pipeline", help="pipeline YAML")
    run.add_argument("--workspace", default=None, help="overrides the YAML's workspace")
    run.add_argument("overrides", nargs="*", metavar="key=value")
    run.set_defaults(handler=run_pipeline)

    deploy = commands.add_parser("deploy", help="create the work pool and register deployments/prefect.yaml with the Prefect server")
    deploy.add_argument("--prefect-file", default=None, help="deployments file (default: deployments/prefect.yaml)")
    deploy.add_argument("--pool", default=None, help="process work pool for every deployment (default: the file's)")
    deploy.add_argument("pipeline", nargs="?", default=None,
                        help="instead: register the one-stage flow on every work pool this pipeline YAML names")
    deploy.add_argument("overrides", nargs="*", metavar="key=value", help="with a pipeline: its overrides (work_pool=NAME, ...)")
    deploy.set_defaults(handler=run_deploy)

    train = commands.add_parser("train", help="train one stage from a LLaMA-Factory-style YAML")
    train.add_argument("config", help="stage YAML (LLaMA-Factory keys)")
    train.add_argument("overrides", nargs="*", metavar="key=value")
    train.set_defaults(handler=run_train)

    data = commands.add_parser("data", help="dataset tools").add_subparsers(dest="data_command", required=True)
    preprocess = data.add_parser("preprocess", help="tokenize a config's datasets to Arrow")
    preprocess.add_argument("config")
    preprocess.add_argument("--output", required=True, help="folder to write (loadable with datasets.load_from_disk)")
    preprocess.add_argument("overrides", nargs="*", metavar="key=value")
    preprocess.set_defaults(handler=run_preprocess)

    preview = data.add_parser("preview", help="show the first examples as the model sees them, with the counters")
    preview.add_argument("config")
    preview.add_argument("--count", type=int, default=3, help="examples to show (default 3)")
    preview.add_argument("overrides", nargs="*", metavar="key=value")
    preview.set_defaults(handler=run_preview)

    export = commands.add_parser("export", help="merge an adapter and write a Hugging Face model folder to export_dir")
    export.add_argument("config")
    export.add_argument("overrides", nargs="*", metavar="key=value")
    export.set_defaults(handler=run_export)
    add_chat_parser(commands)
    add_eval_parser(commands)
    add_registry_parsers(commands)
    add_store_parsers(commands)
    add_serve_parsers(commands)
    return parser


def add_store_parsers(commands: argparse._SubParsersAction) -> None:
    from tuneline.core.tracking.references import DEFAULT_KEEP_RUNS
    from tuneline.flows.store_commands import run_gc, run_verify

    also = "and the tokenized-data cache under $TUNELINE_CACHE"
    verify = commands.add_parser("verify", help=f"re-hash every artifact of the workspace {also} against its manifest; list "
                                                "(and mark for recomputing) the damaged")
    verify.add_argument("--workspace", default=None, help="workspace to check: a folder, or a URL such as s3://bucket/prefix "
                        "(default: ./workspace, when it exists)")
    verify.set_defaults(handler=run_verify)
    gc = commands.add_parser("gc", help=f"list the artifacts and drafts of the workspace {also} that no recent run or "
                                        "registered model needs; --yes removes them")
    gc.add_argument("--workspace", default=None, help="workspace to clean: a folder, or a URL such as s3://bucket/prefix "
                    "(default: ./workspace, when it exists)")
    gc.add_argument("--keep-runs", type=int, default=DEFAULT_KEEP_RUNS, metavar="N",
                    help=f"keep what each pipeline's last N runs used, and the cache's N most recently used tokenized "
                         f"data (default: {DEFAULT_KEEP_RUNS})")
    gc.add_argument("--yes", action="store_true", help="remove what is listed")
    gc.set_defaults(handler=run_gc)


def add_registry_parsers(commands: argparse._SubParsersAction) -> None:
    promote = commands.add_parser("promote", help="move a registered model's champion alias to VERSION (the previous one is remembered)")
    promote.add_argument("model_name", metavar="MODEL_NAME")
    promote.add_argument("version", metavar="VERSION")
    rollback = commands.add_parser("rollback", help="move a registered model's champion alias back to the previous champion")
    rollback.add_argument("model_name", metavar="MODEL_NAME")
    for command, handler in ((promote, run_promote), (rollback, run_rollback)):
        store = command.add_mutually_exclusive_group()
        store.add_argument("--workspace", default="workspace", help="workspace whose mlflow.db holds the model (default: ./workspace)")
        store.add_argument("--tracking-uri", default=None, help="MLflow tracking/registry URI instead of a workspace")
        command.add_argument("--alias", default="champion", help="the alias to move (default: champion)")
        command.set_defaults(handler=handler)


def add_chat_parser(commands: argparse._SubParsersAction) -> None:
    from tuneline.core.config import GeneratingConfig

    defaults = GeneratingConfig()
    chat = commands.add_parser("chat", help="chat with a model, adapter or stage artifact in the terminal (reads stdin line by line)")
    chat.add_argument("path", help="model folder, adapter folder, a stage's artifact folder in a workspace, a "
                                   "LLaMA-Factory inference YAML (its generation keys apply where no flag is given), or a "
                                   "registered version models:/NAME@ALIAS")
    store = chat.add_mutually_exclusive_group()
    store.add_argument("--workspace", default="workspace",
                       help="for models:/ paths: workspace whose mlflow.db holds the registry (default: ./workspace)")
    store.add_argument("--tracking-uri", default=None, help="for models:/ paths: MLflow tracking/registry URI")
    chat.add_argument("--system", default=None, help="system prompt")
    chat.add_argument("--template", default=None, help="render with this tuneline template instead of the tokenizer's own")
    chat.add_argument("--max-new-tokens", type=int, default=defaults.max_new_tokens, help=f"(default {defaults.max_new_tokens})")
    chat.add_argument("--do-sample", action=argparse.BooleanOptionalAction, default=defaults.do_sample,
                      help=f"sample, or --no-do-sample for greedy decoding (default {defaults.do_sample})")
    chat.add_argument("--temperature", type=float, default=defaults.temperature, help=f"(default {defaults.temperature})")
    chat.add_argument("--top-p", type=float, default=defaults.top_p, help=f"(default {defaults.top_p})")
    chat.add_argument("--top-k", type=int, default=defaults.top_k, help=f"(default {defaults.top_k})")
    chat.add_argument("--repetition-penalty", type=float, default=defaults.repetition_penalty,
                      help=f"(default {defaults.repetition_penalty})")
    chat.add_argument("--image", action="append", default=[], metavar="FILE",
                      help="show a vision-language model this image with the first message (repeat for more)")
    chat.add_argument("--video", action="append", default=[], metavar="FILE",
                      help="show a model that takes videos (Qwen2-VL, Qwen2.5-VL) this video with the first message")
    chat.add_argument("--audio", action="append", default=[], metavar="FILE",
                      help="let a model that takes sound (Qwen2-Audio) hear this file with the first message")
    chat.set_defaults(handler=run_chat)


def run_demo(args: argparse.Namespace) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    overrides = [f"dataset_dir={DEMO_PIPELINE.parent}", *([f"work_pool={args.work_pool}"] if args.work_pool else []),
                 *args.overrides]
    return _run_flow(str(DEMO_PIPELINE), overrides, args.workspace)


def run_pipeline(args: argparse.Namespace) -> int:
    return _run_flow(args.pipeline, args.overrides, args.workspace)


def _run_flow(pipeline: str, overrides: list[str], workspace: str | None) -> int:
    from tuneline.core.pipeline.keys import check_pipeline_datasets
    from tuneline.core.pipeline.spec import load_pipeline

    # Config and dataset-entry errors surface before Prefect starts; the flow takes the pipeline as
    # read here and hashes the data, once.
    checked = load_pipeline(pipeline, overrides, workspace=workspace)
    check_pipeline_datasets(checked)
    from tuneline.flows.pipeline import run_checked_pipeline
    from tuneline.flows.prefect_api import start_prefect_api
    from tuneline.flows.report import print_summary

    _hide_tracebacks_of_input_errors()
    start_prefect_api()
    started = time.monotonic()
    summary = run_checked_pipeline(checked, pipeline_path=pipeline, overrides=overrides, workspace=workspace)
    print_summary(summary, seconds=time.monotonic() - started)
    return 0


class _InputErrorFilter(logging.Filter):
    """Drop Prefect's traceback records for input errors: the CLI prints those as one paragraph."""

    def filter(self, record: logging.LogRecord) -> bool:
        from tuneline.core.errors import TunelineError

        return not (record.exc_info and isinstance(record.exc_info[1], TunelineError))


def _hide_tracebacks_of_input_errors() -> None:
    for name in ("prefect.task_runs", "prefect.flow_runs", "prefect.flow_engine", "prefect.task_engine"):
        logging.getLogger(name).addFilter(_InputErrorFilter())


def run_deploy(args: argparse.Namespace) -> int:
    from tuneline.flows.deploy import deploy, deploy_stage_flows, pipeline_pools

    if args.pipeline:
        from tuneline.core.pipeline.spec import load_pipeline

        pools = pipeline_pools(load_pipeline(args.pipeline, args.overrides))
        names = deploy_stage_flows(pools)
        print(f"deployed {', '.join(names)}")
        print("start a worker on each machine: " + "; ".join(f"prefect worker start --pool {pool} --type process" for pool in pools))
        return 0
    names, pools = deploy(args.prefect_file, pool=args.pool)
    print(f"deployed {', '.join(names)} to work pool {', '.join(pools)}")
    print(f"start a worker: prefect worker start --pool {pools[0]}")
    print(f"run one:        prefect deployment run {names[0]} --watch")
    return 0


def run_train(args: argparse.Namespace) -> int:
    from tuneline.flows.single import train_stage

    metrics = train_stage(args.config, args.overrides)
    print(" ".join(f"{k}={v:.4g}" for k, v in sorted(metrics.items()) if isinstance(v, (int, float))))
    return 0


def run_preprocess(args: argparse.Namespace) -> int:
    from tuneline.flows.single import preprocess

    counters = preprocess(args.config, args.overrides, output=args.output)
    print(f"tokenized to {args.output}: " + ", ".join(f"{k}={v}" for k, v in counters.items()))
    return 0


def run_preview(args: argparse.Namespace) -> int:
    from tuneline.flows.single import preview

    print(preview(args.config, args.overrides, count=args.count))
    return 0


def run_export(args: argparse.Namespace) -> int:
    from tuneline.flows.single import export

    print(f"exported to {export(args.config, args.overrides)}")
    return 0


def run_promote(args: argparse.Namespace) -> int:
    from tuneline.core.tracking.model_registry import promote, registry_uri

    uri = registry_uri(args.workspace, tracking_uri=args.tracking_uri, source="tuneline promote")
    print(promote(uri, name=args.model_name, version=args.version, alias=args.alias))
    return 0


def run_rollback(args: argparse.Namespace) -> int:
    from tuneline.core.tracking.model_registry import registry_uri, rollback

    uri = registry_uri(args.workspace, tracking_uri=args.tracking_uri, source="tuneline rollback")
    print(rollback(uri, name=args.model_name, alias=args.alias))
    return 0


def run_chat(args: argparse.Namespace) -> int:
    from tuneline.core.config import GeneratingConfig
    from tuneline.core.data.media.columns import MEDIA_COLUMNS
    from tuneline.core.inference.chat import ChatSession, chat_loop, chat_media, load_chat_model
    from tuneline.core.store.readers import reading_artifacts
    from tuneline.core.tracking.model_registry import registry_uri
    from tuneline.flows.serve_commands import chat_target

    generating = GeneratingConfig(max_new_tokens=args.max_new_tokens, do_sample=args.do_sample, temperature=args.temperature,
                                  top_p=args.top_p, top_k=args.top_k, repetition_penalty=args.repetition_penalty)
    target = chat_target(args.path, template=args.template, generating=generating,
                         tracking_uri=lambda: registry_uri(args.workspace, tracking_uri=args.tracking_uri, source="tuneline chat"))
    source, generating = target.source, target.generating
    _check_generating(generating)
    with reading_artifacts([source.model, source.adapter, source.tokenizer]):  # kept by `tuneline gc` while chatting
        media = chat_media(source, images=args.image, videos=args.video, audios=args.audio, template=target.template)
        model, tokenizer = load_chat_model(source, template=target.template, keys=target.keys, model_config=target.model_config)
        shown = {column: [str(Path(path).resolve()) for path in paths]
                 for column, paths in zip(MEDIA_COLUMNS, (args.image, args.video, args.audio)) if paths}
        session = ChatSession(model, tokenizer, generating, name=source.describe(), system=args.system, media=media, shown=shown)
        interactive = sys.stdin.isatty()
        try:
            return chat_loop(session, _typed_lines() if interactive else sys.stdin, write=_write, echo=not interactive)
        except KeyboardInterrupt:
            _write("\n")
            return 0


def _check_generating(generating: GeneratingConfig) -> None:
    problems = []
    if generating.max_new_tokens <= 0:
        problems.append(f"--max-new-tokens must be positive, got {generating.max_new_tokens}.")
    if generating.do_sample and generating.temperature <= 0:
        problems.append(f"--temperature must be positive when sampling, got {generating.temperature}.")
    if not 0 < generating.top_p <= 1:
        problems.append(f"--top-p must be in (0, 1], got {generating.top_p}.")
    if generating.repetition_penalty <= 0:
        problems.append(f"--repetition-penalty must be positive, got {generating.repetition_penalty}.")
    if problems:
        from tuneline.core.errors import ConfigError

        raise ConfigError(problems, source="tuneline chat")


def _typed_lines():
    """Lines typed at the terminal, each after a 'User: ' prompt, until end of input."""
    while True:
        try:
            yield input("User: ")
        except EOFError:
            return


def _write(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


if __name__ == "__main__":
    sys.exit(main())
