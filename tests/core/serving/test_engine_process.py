"""The decoding engine in a child process (`tuneline api`'s engine): the same answers, text and ends as the
engine in this process; the queue bounded in the server's process; a cancel that reaches the child; a
child that dies ends the open requests with an error naming it; a model that cannot load is reported with
its own error; `close` leaves no process behind; the child is spawned from a process that runs other
threads and forked from one that runs none."""

from __future__ import annotations

import os
import shutil
import signal
import threading
from pathlib import Path

import pytest

from tuneline.core.config import GeneratingConfig
from tuneline.core.errors import ConfigError
from tuneline.core.serving.backends import Answer, Cancelled, QueueFull
from tuneline.core.serving.protocol import parse_chat_request

pytestmark = pytest.mark.slow

GREEDY = GeneratingConfig(max_new_tokens=12, do_sample=False, repetition_penalty=3.0)
PROMPTS = ("What is 2 plus 2?", "Name a colour.", "the model reads every token of the prompt before it writes a word")


def served_tiny(folder: Path, generating: GeneratingConfig = GREEDY):
    from tuneline.core.inference.chat import ModelSource
    from tuneline.core.serving.sources import ServedModel

    return ServedModel(ModelSource(str(folder), None, str(folder)), name="tiny", template="chatml", generating=generating)


def start(served, *, max_batch: int = 4, queue_size: int = 8):
    from tuneline.core.serving.engine_process import EngineProcess

    engine = EngineProcess(served, max_batch=max_batch, queue_size=queue_size, torch_threads=1)
    engine.wait_until_ready()
    return engine


def chat(prompt: str, **extra) -> object:
    import json

    return parse_chat_request(json.dumps({"model": "tiny", "messages": [{"role": "user", "content": prompt}], **extra}).encode())


class Collected:
    """What a submitted request wrote and how it ended."""

    def __init__(self) -> None:
        self.pieces: list[str] = []
        self.outcome: Answer | BaseException | None = None
        self.ended = threading.Event()

    def write(self, piece: str) -> None:
        self.pieces.append(piece)

    def done(self, outcome: Answer | BaseException) -> None:
        self.outcome = outcome
        self.ended.set()

    def wait(self) -> Answer | BaseException:
        assert self.ended.wait(60), "the request never ended"
        return self.outcome


@pytest.fixture(scope="module")
def child(tiny_base: Path):
    """An engine started while another thread of this process runs, as in an application that embeds it."""
    another_thread_ends = threading.Event()
    threading.Thread(target=another_thread_ends.wait, name="another thread", daemon=True).start()
    try:
        engine = start(served_tiny(tiny_base))
    finally:
        another_thread_ends.set()
    yield engine
    engine.close()


def child_command_line(pid: int) -> str:
    import psutil

    return " ".join(psutil.Process(pid).cmdline())


def test_answers_and_streamed_text_equal_the_engine_in_this_process(child, tiny_base: Path):
    from tuneline.core.serving.engine import load_engine

    # spawned: a fork would copy whatever the other thread held (a process running no other thread forks,
    # see the last test)
    assert "multiprocessing.spawn" in child_command_line(child.pid)
    here = load_engine(served_tiny(tiny_base), max_batch=4)
    try:
        for prompt in PROMPTS:
            expected = here.generate(here.prepare(chat(prompt)))
            prepared = child.prepare(chat(prompt))
            assert prepared == here.prepare(chat(prompt))  # rendered and bounded alike
            streamed, whole = Collected(), Collected()
            child.submit(prepared, write=streamed.write, done=streamed.done)
            child.submit(prepared, done=whole.done)
            assert streamed.wait() == expected and whole.wait() == expected
            assert "".join(streamed.pieces) == expected.text and whole.pieces == []
    finally:
        here.close()


def test_the_queue_is_bounded_here_and_a_cancel_reaches_the_child_and_close_leaves_no_process(tiny_base: Path):
    import psutil

    long = GeneratingConfig(max_new_tokens=600, do_sample=False, repetition_penalty=1.0)  # runs for seconds
    engine = start(served_tiny(tiny_base, long), max_batch=1, queue_size=1)
    pid = engine.pid
    try:
        prepared = engine.prepare(chat("Count on and on."))
        running, waiting = Collected(), Collected()
        [first] = engine.submit(prepared, done=running.done)
        [second] = engine.submit(prepared, done=waiting.done)
        with pytest.raises(QueueFull) as refused:
            engine.submit(prepared, done=Collected().done)
        assert refused.value.waiting == 1 and refused.value.retry_after >= 1
        engine.cancel(second)
        engine.cancel(first)
        assert isinstance(waiting.wait(), Cancelled) and isinstance(running.wait(), Cancelled)
        after = Collected()
        engine.submit(engine.prepare(chat("Name a colour.", max_tokens=3)), done=after.done)
        assert isinstance(after.wait(), Answer)  # the places the cancelled ones held are free again
    finally:
        engine.close()
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE  # close leaves no process


def test_a_child_that_dies_ends_open_requests_with_an_error_naming_it(tiny_base: Path):
    long = GeneratingConfig(max_new_tokens=600, do_sample=False, repetition_penalty=1.0)
    engine = start(served_tiny(tiny_base, long))
    pid = engine.pid
    try:
        open_request = Collected()
        engine.submit(engine.prepare(chat("Count on and on.")), done=open_request.done)
        os.kill(pid, signal.SIGKILL)
        ended = open_request.wait()
        assert isinstance(ended, RuntimeError) and f"pid {pid}" in str(ended)
        with pytest.raises(RuntimeError, match=f"pid {pid}"):
            engine.submit(engine.prepare(chat("Name a colour.")), done=Collected().done)
    finally:
        engine.close()


def test_a_model_that_cannot_load_is_reported_with_its_own_error_and_leaves_no_process(tiny_base: Path, tmp_path: Path):
    import psutil

    tokenizer_only = tmp_path / "tokenizer_only"
    shutil.copytree(tiny_base, tokenizer_only, ignore=shutil.ignore_patterns("*.safetensors", "*.bin"))
    from tuneline.core.serving.engine_process import EngineProcess

    engine = EngineProcess(served_tiny(tokenizer_only), max_batch=2, queue_size=2, torch_threads=1)
    with pytest.raises(ConfigError):
        engine.wait_until_ready()
    assert not psutil.pid_exists(engine.pid) or psutil.Process(engine.pid).status() == psutil.STATUS_ZOMBIE


SERVER_THAT_WAITS = """
import sys
from pathlib import Path
from tuneline.core.config import GeneratingConfig
from tuneline.core.inference.chat import ModelSource
from tuneline.core.serving.engine_process import EngineProcess
from tuneline.core.serving.sources import ServedModel

folder = sys.argv[1]
served = ServedModel(ModelSource(folder, None, folder), name="tiny", template="chatml", generating=GeneratingConfig())
engine = EngineProcess(served, max_batch=2, queue_size=2, torch_threads=1)
engine.wait_until_ready()
print(engine.pid, flush=True)
sys.stdin.read()
"""


def test_the_child_ends_when_the_server_is_killed(tiny_base: Path):
    import subprocess
    import sys

    import psutil

    server = subprocess.Popen([sys.executable, "-c", SERVER_THAT_WAITS, str(tiny_base)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    child = None
    try:
        child = psutil.Process(int(server.stdout.readline()))
        assert child.is_running()
        assert "multiprocessing.spawn" not in child_command_line(child.pid)  # forked: the server runs no other thread
        server.kill()  # SIGKILL: no close, no atexit
        server.wait(10)
        child.wait(15)  # the pipe ends with the server, and so does the child
    finally:
        if server.poll() is None:
            server.kill()
        if child is not None and child.is_running():
            child.kill()
            raise AssertionError(f"the decoding process {child.pid} outlived the server")
