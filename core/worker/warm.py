"""One warm worker per orchestrator: a process that has imported what every stage trains with and
forks a fresh child for each single-process job (docs/ARCHITECTURE.md, "Training runs in a worker").

A new worker process spends seconds importing torch, transformers, peft and TRL before it reads its
job; a chain of five training stages paid that five times. The warm worker pays it once: started
with the orchestrator's environment (`python -m tuneline.core.worker.warm SOCKET`), it binds a Unix
socket at once, imports, and then, for each request, forks a child that runs the job as
`python -m tuneline.core.worker JOB.json` would, its standard output and error on a pipe whose
write end came with the request. The child's last line on that pipe is its exit status
(`EXIT_PREFIX`); a child killed before it could write one reads as killed.

It holds no CUDA state (importing torch does not start CUDA), so each child starts CUDA itself as a
new process would. It runs with exactly its jobs' environment, so a job with another one gets a new
warm worker; jobs that need bitsandbytes, run through torchrun or carry secrets get a new process of
their own (`launch.py`). The warm worker ends when its standard input closes: with its orchestrator.
"""

from __future__ import annotations

import json
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import traceback
from collections.abc import Iterator, Mapping
from pathlib import Path

EXIT_PREFIX = "TUNELINE_EXIT "
# Off switch, for comparing with a new process per job or ruling the warm worker out of a problem.
DISABLE_ENV = "TUNELINE_WARM_WORKER"
KILLED = -int(signal.SIGKILL)  # what a child that ended without its status line reports, as subprocess would


class WarmChild:
    """A job running in a child of the warm worker, read as a `subprocess.Popen` is: `stdout` yields
    its output lines, `wait()` its exit status, `kill()` ends it."""

    def __init__(self, pid: int, output_fd: int):
        self.pid = pid
        self.returncode: int | None = None
        self._lines = open(output_fd, encoding="utf-8", errors="replace")
        self.stdout = self._read()

    def _read(self) -> Iterator[str]:
        with self._lines:
            for line in self._lines:
                at = line.find(EXIT_PREFIX)
                if at < 0:
                    yield line
                    continue
                if line[:at]:  # output that ended without a newline
                    yield line[:at] + "\n"
                self.returncode = int(line[at + len(EXIT_PREFIX):])

    def wait(self) -> int:
        for _ in self.stdout:  # what is left unread, up to the pipe's end
            pass
        if self.returncode is None:
            self.returncode = KILLED
        return self.returncode

    def kill(self) -> None:
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


class WarmWorker:
    """The warm worker process and the environment it was started with."""

    def __init__(self, env: Mapping[str, str]):
        self.env = dict(env)
        self._folder = tempfile.TemporaryDirectory(prefix="tuneline-warm-")
        self.socket_path = str(Path(self._folder.name) / "worker.sock")
        # its standard input is the lifeline: it ends when this process closes it or dies
        self.process = subprocess.Popen([sys.executable, "-m", __name__, self.socket_path], stdin=subprocess.PIPE,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=self.env)

    def start(self, job_path: str) -> WarmChild | None:
        """The job running in a new child, or None when the warm worker cannot take it (it ended)."""
        if self.process.poll() is not None:
            return None
        read_end, write_end = os.pipe()
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
                connection.connect(self._wait_for_socket())
                request = json.dumps({"job": job_path, "cwd": os.getcwd()}).encode()
                socket.send_fds(connection, [request], [write_end])
                reply = connection.makefile("r").readline()  # sent once the imports are done and the child forked
            pid = int(reply)
        except (OSError, ValueError):
            os.close(read_end)
            return None
        finally:
            os.close(write_end)
        return WarmChild(pid, read_end)

    def _wait_for_socket(self) -> str:
        for _ in range(600):  # the socket is bound before the imports start: this waits for Python's start only
            if os.path.exists(self.socket_path) or self.process.poll() is not None:
                break
            select.select([], [], [], 0.05)
        return self.socket_path

    def stop(self) -> None:
        """End it now, imports done or not: it holds nothing to save, and its children live on."""
        self.process.kill()
        self.process.wait()
        self.process.stdin.close()  # type: ignore[union-attr]
        self._folder.cleanup()


_lock = threading.Lock()
_warm: WarmWorker | None = None


def warm_worker(env: Mapping[str, str]) -> WarmWorker | None:
    """This process's warm worker for jobs with environment `env`; None when it is switched off.

    One started with another environment is replaced: settings read as modules import (HF_HOME,
    OMP_NUM_THREADS, ...) must be the job's, so the warm worker runs with exactly the job's
    environment. The children it already forked go on without it."""
    global _warm
    if env.get(DISABLE_ENV, "1") == "0" or sys.platform == "win32":
        return None
    with _lock:
        if _warm is not None and (_warm.process.poll() is not None or _warm.env != dict(env)):
            _warm.stop()
            _warm = None
        if _warm is None:
            _warm = WarmWorker(env)
        return _warm


def stop_warm_worker() -> None:
    global _warm
    with _lock:
        if _warm is not None:
            _warm.stop()
            _warm = None


# --- the warm worker's own process ------------------------------------------------------------


def serve(socket_path: str) -> None:
    from tuneline.core.stages.registry import KINDS
    from tuneline.core.worker.preload import keep_out_bitsandbytes, preload

    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(socket_path)
    listener.listen(16)  # requests wait here while the imports below run
    # watched from the start: an orchestrator that ends during the imports (a refused config) must not
    # leave them running for nothing
    threading.Thread(target=_exit_when_orphaned, daemon=True).start()
    keep_out_bitsandbytes()
    preload(sorted({module for kind in KINDS.values() for module in kind.trainer_modules}))
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps the children; their status travels on their pipe
    while True:
        connection, _ = listener.accept()
        with connection:
            _fork_child(connection, listener)


def _exit_when_orphaned() -> None:
    """Ends the warm worker when its standard input closes (nothing is ever written to it); the
    children it forked live on."""
    while os.read(sys.stdin.fileno(), 4096):
        pass
    os._exit(0)


def _fork_child(connection: socket.socket, listener: socket.socket) -> None:
    message, fds, _, _ = socket.recv_fds(connection, 1 << 16, 1)
    if len(fds) != 1:
        for fd in fds:
            os.close(fd)
        return
    request = json.loads(message)
    pid = os.fork()
    if pid == 0:
        listener.close()
        connection.close()
        _run_child(request, fds[0])
    os.close(fds[0])
    connection.sendall(f"{pid}\n".encode())


def _run_child(request: dict, output_fd: int) -> None:
    """In the forked child: the job as the worker's `main` runs it, then the status line; never returns."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the job waits for processes of its own
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(output_fd, 1)
    os.dup2(output_fd, 2)
    for fd in (devnull, output_fd):
        os.close(fd)
    code = 1
    try:
        os.chdir(request["cwd"])
        from tuneline.core.worker.__main__ import train

        code = train(request["job"])
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except BaseException:  # noqa: BLE001 - reported as the worker process would, in its output
        traceback.print_exc()
    finally:
        try:
            logging.shutdown()  # what the job's logging handlers still hold (a new process's exit would flush it)
            sys.stdout.flush()
            sys.stderr.flush()
            os.write(1, f"{EXIT_PREFIX}{code}\n".encode())
        finally:
            os._exit(code)  # not back into the warm worker's loop


if __name__ == "__main__":
    serve(sys.argv[1])
