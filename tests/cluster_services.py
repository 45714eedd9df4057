"""The services a cluster test starts, each on 127.0.0.1 at a free port, in its own process group,
waited for until it answers and stopped through that group (never by name):

    server, api = start_prefect_server(home, env)                  # `prefect server start`
    worker = start_prefect_worker("pool", folder=..., api=api, name="worker-a")
    worker.kill()                                                  # SIGKILL, as a machine dies
    mlflow = start_mlflow_server(folder, store=s3_store, bucket="s3://b")   # artifacts in the object store
    stop_process(server)

tests/conftest.py registers them as fixtures: `prefect_server` (the session's), `prefect_workers`
(a starter; every worker stopped after the module) and `mlflow_server` (one per module). Each runs the
command deployments/compose.yaml gives its service, changed only in program path, ports and folders
(tests/compose_commands.py).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from compose_commands import service_command
from object_store_server import ObjectStoreServer, free_port

REPO_ROOT = Path(__file__).resolve().parent.parent
START_TIMEOUT_S = 90.0


def start_process(command: list[str], env: dict[str, str], log: Path, *, cwd: Path = REPO_ROOT) -> subprocess.Popen:
    """A background process in its own process group (so its children can be stopped with it)."""
    return subprocess.Popen(command, env=env, cwd=cwd, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)


def stop_process(process: subprocess.Popen) -> None:
    """SIGTERM to the process group, SIGKILL if its leader has not exited 10 s later; then SIGKILL to
    whatever of the group outlived its leader (a server's worker processes, say)."""
    for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=wait)
            break
        except subprocess.TimeoutExpired:
            continue
    kill_group(process)


def kill_group(process: subprocess.Popen) -> None:
    """SIGKILL the process group at once (a service whose data is thrown away has nothing to flush)."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()


def kill_tree(process: subprocess.Popen) -> None:
    """SIGKILL `process` and every process descended from it, those in sessions of their own included
    (a Prefect worker starts each flow run in a new session): each is stopped (SIGSTOP) as it is found,
    so none can start another unseen, then all are killed."""
    import psutil

    found: dict[int, psutil.Process] = {}
    pending = [process.pid]
    while pending:
        try:
            current = psutil.Process(pending.pop())
            current.suspend()
            found[current.pid] = current
            pending.extend(child.pid for child in current.children() if child.pid not in found)
        except psutil.NoSuchProcess:
            continue
    for victim in found.values():
        try:
            victim.kill()
        except psutil.NoSuchProcess:
            pass
    kill_group(process)


def wait_until_ok(url: str, process: subprocess.Popen, log: Path, *, what: str, timeout: float = START_TIMEOUT_S) -> None:
    """Poll `url` until it answers 200, failing with the end of `log` if the process exits or time runs out."""
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, f"{what} exited with {process.returncode}:\n{log.read_text()[-3000:]}"
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise AssertionError(f"{what} did not answer at {url} in {timeout:.0f} s:\n{log.read_text()[-3000:]}")


# -- Prefect --------------------------------------------------------------------------------------

def start_prefect_server(home: Path, env: dict[str, str]) -> tuple[subprocess.Popen, str]:
    """`prefect server start` on 127.0.0.1 at a free port with PREFECT_HOME `home`; the process and its API URL."""
    port = free_port()
    api = f"http://127.0.0.1:{port}/api"
    server_env = {**env, "PREFECT_HOME": str(home), "PREFECT_API_URL": api, "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    server_env.pop("PREFECT_PROFILE", None)
    server = start_process(prefect_server_command(port), server_env, home / "server.log")
    wait_until_ok(f"{api}/health", server, home / "server.log", what="Prefect server")
    return server, api


def prefect_server_command(port: int) -> list[str]:
    """deployments/compose.yaml's `prefect server start` on 127.0.0.1:`port`, without the UI."""
    return service_command("prefect-server", program=[sys.executable, "-m", "prefect"],
                           values={"--host": "127.0.0.1", "--port": str(port)}, extra=["--no-ui"])


@dataclass
class PrefectWorker:
    """A `prefect worker start --type process` in a folder of its own: its HOME, TMPDIR, TUNELINE_CACHE
    and working directory are under `folder`, and TUNELINE_WORKER is its `name`."""

    name: str
    pool: str
    folder: Path
    process: subprocess.Popen

    @property
    def log(self) -> Path:
        return self.folder / "worker.log"

    @property
    def cache(self) -> Path:
        return self.folder / "cache"

    def kill(self) -> None:
        """SIGKILL the worker and the flow runs it started, with their own processes, as when its machine
        dies (also how it is stopped after a test: nothing of it is kept)."""
        kill_tree(self.process)

    stop = kill


def worker_environment(folder: Path, *, name: str, api: str, env: dict[str, str]) -> dict[str, str]:
    """`env` with every per-machine path moved under `folder`, so that two workers share no path."""
    paths = {"HOME": folder / "home", "TMPDIR": folder / "tmp", "TUNELINE_CACHE": folder / "cache"}
    for path in paths.values():
        path.mkdir(parents=True, exist_ok=True)
    own = {key: str(path) for key, path in paths.items()}
    worker_env = {**env, **own, "TUNELINE_WORKER": name, "PREFECT_API_URL": api, "PREFECT_HOME": str(folder / "home" / ".prefect"),
                  "PREFECT_WORKER_QUERY_SECONDS": "1", "PREFECT_WORKER_PREFETCH_SECONDS": "1",
                  "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "DO_NOT_TRACK": "true"}
    worker_env.pop("PREFECT_PROFILE", None)
    return worker_env


def start_prefect_worker(pool: str, *, folder: Path, api: str, name: str, env: dict[str, str] | None = None,
                         timeout: float = START_TIMEOUT_S) -> PrefectWorker:
    """Start a process worker of `pool` (created if missing) named `name` in `folder`, and wait until the
    server lists it as online in the pool. `env` (default: this process's) is its environment before
    its own paths are set."""
    folder.mkdir(parents=True, exist_ok=True)
    worker_env = worker_environment(folder, name=name, api=api, env=dict(os.environ if env is None else env))
    command = prefect_worker_command(pool, name=name)
    worker = PrefectWorker(name, pool, folder, start_process(command, worker_env, folder / "worker.log", cwd=folder))
    try:
        _wait_until_online(worker, api, timeout=timeout)
    except BaseException:
        worker.stop()
        raise
    return worker


def prefect_worker_command(pool: str, *, name: str | None = None) -> list[str]:
    """deployments/compose.yaml's worker command for `pool`, run by this interpreter's Prefect (named `name`)."""
    return service_command("worker", program=[sys.executable, "-m", "prefect"], values={"--pool": pool},
                           extra=["--name", name] if name else [])


def _wait_until_online(worker: PrefectWorker, api: str, *, timeout: float) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert worker.process.poll() is None, f"worker {worker.name} exited with {worker.process.returncode}:\n" \
                                              f"{worker.log.read_text()[-3000:]}"
        try:
            answer = httpx.post(f"{api}/work_pools/{worker.pool}/workers/filter", json={}, timeout=2)
            if answer.status_code == 200 and any(w["name"] == worker.name and w.get("status") == "ONLINE" for w in answer.json()):
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise AssertionError(f"worker {worker.name} did not come online in pool {worker.pool} in {timeout:.0f} s:\n"
                         f"{worker.log.read_text()[-3000:]}")


# -- MLflow ---------------------------------------------------------------------------------------

ARTIFACTS_PREFIX = "mlartifacts"


@dataclass
class MlflowServer:
    """A `mlflow server` whose runs and registry are in a SQLite file under `folder` and whose artifacts
    go, through the server (proxied artifact serving), to `artifacts` in the object store: a client
    needs only `uri`, no object-store credentials."""

    uri: str
    """http://127.0.0.1:PORT"""
    artifacts: str
    """s3://BUCKET/mlartifacts"""
    folder: Path
    """its SQLite store and its log, mlflow.log"""
    process: subprocess.Popen

    def stop(self) -> None:
        kill_group(self.process)  # its SQLite store commits each request; a graceful stop only waits for idle clients


def mlflow_server_command(*, program: str, backend_store_uri: str, artifacts_destination: str, host: str, port: int) -> list[str]:
    """deployments/compose.yaml's `mlflow server` (every artifact uploaded and downloaded through the
    server) with its runs and registry in `backend_store_uri`, its artifacts under
    `artifacts_destination`, and one worker process."""
    return service_command("mlflow", program=[program], values={
        "--backend-store-uri": backend_store_uri, "--artifacts-destination": artifacts_destination, "--host": host,
        "--port": str(port), "--workers": "1"})


def start_mlflow_server(folder: Path, *, store: ObjectStoreServer, bucket: str, env: dict[str, str] | None = None,
                        timeout: float = START_TIMEOUT_S) -> MlflowServer:
    """Start `mlflow server` on 127.0.0.1 at a free port, its SQLite store in `folder` and its artifacts
    in `bucket` (s3://NAME) of `store`, and wait until it answers. Only the server gets the store's AWS_*
    variables."""
    folder.mkdir(parents=True, exist_ok=True)
    port = free_port()
    artifacts = f"{bucket}/{ARTIFACTS_PREFIX}"
    command = mlflow_server_command(program=str(Path(sys.executable).with_name("mlflow")),
                                    backend_store_uri=f"sqlite:///{folder / 'mlflow.db'}", artifacts_destination=artifacts,
                                    host="127.0.0.1", port=port)
    # no job runner: its consumer processes serve MLflow's GenAI jobs, which tuneline never starts
    server_env = {**(os.environ if env is None else env), **store.env(), "MLFLOW_DISABLE_TELEMETRY": "true",
                  "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    log = folder / "mlflow.log"
    server = MlflowServer(f"http://127.0.0.1:{port}", artifacts, folder, start_process(command, server_env, log, cwd=folder))
    try:
        wait_until_ok(f"{server.uri}/health", server.process, log, what="mlflow server", timeout=timeout)
    except BaseException:
        server.stop()
        raise
    return server


# -- fixtures (registered for every test in tests/conftest.py) ------------------------------------

@pytest.fixture(scope="session")
def mlflow_server(s3_store: ObjectStoreServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[MlflowServer]:
    """One tracking server for the session (it takes seconds to start), its artifacts in a bucket of the
    session's store; each module's runs go to an experiment of its own name. Nothing global is set: a
    test hands `mlflow_server.uri` as MLFLOW_TRACKING_URI to what it runs."""
    server = start_mlflow_server(tmp_path_factory.mktemp("mlflow_server"), store=s3_store, bucket=s3_store.make_bucket("mlflow"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def prefect_workers(prefect_server: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., PrefectWorker]]:
    """`start(pool, name, env=None)`: a process worker of the session's Prefect server in a new folder of
    its own (see `start_prefect_worker`); every worker still running is stopped after the module."""
    started: list[PrefectWorker] = []

    def start(pool: str, name: str, env: dict[str, str] | None = None) -> PrefectWorker:
        folder = tmp_path_factory.mktemp(f"worker-{name}")
        started.append(start_prefect_worker(pool, folder=folder, api=prefect_server, name=name, env=env))
        return started[-1]

    try:
        yield start
    finally:
        for worker in reversed(started):
            worker.stop()
