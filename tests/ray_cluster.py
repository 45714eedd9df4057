"""A real Ray cluster of two nodes on 127.0.0.1, one CPU each, for the tests that train on Ray.

Each node is `ray start ... --block`, a child process in a process group of its own, stopped by
that group in teardown (also when a test fails): `ray stop` would end every Ray process on the
machine, not only these. Every port is picked free, so clusters of other test runs do not meet it.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from cluster_services import free_port


@dataclass(frozen=True)
class RayCluster:
    address: str  # host:port of the head node's GCS, what RAY_ADDRESS holds
    nodes: tuple[subprocess.Popen, ...]

    def process_groups(self) -> list[int]:
        return [node.pid for node in self.nodes]


def node_command(*, head_port: int, head: bool, temp_dir: Path) -> list[str]:
    ray = str(Path(sys.executable).with_name("ray"))
    ports = {flag: free_port() for flag in ("--node-manager-port", "--object-manager-port", "--metrics-export-port",
                                            "--dashboard-agent-listen-port", "--dashboard-agent-grpc-port",
                                            "--runtime-env-agent-port")}
    low = free_port()
    command = [ray, "start", "--block", "--num-cpus", "1", "--num-gpus", "0", "--node-ip-address", "127.0.0.1",
               "--disable-usage-stats", "--object-store-memory", str(100 * 1024 * 1024),
               "--min-worker-port", str(low), "--max-worker-port", str(low + 40),
               *[str(part) for flag, port in ports.items() for part in (flag, port)]]
    if head:
        return [*command, "--head", "--port", str(head_port), "--include-dashboard", "false",
                "--dashboard-port", str(free_port()), "--ray-client-server-port", str(free_port()), "--temp-dir", str(temp_dir)]
    return [*command, "--address", f"127.0.0.1:{head_port}"]


def wait_for_nodes(address: str, count: int, *, nodes: list[subprocess.Popen], timeout: float = 120) -> None:
    """Until `count` nodes are alive in the cluster at `address` (asked in a process of its own,
    so this one never joins the cluster)."""
    probe = ("import ray, sys; ray.init(address=sys.argv[1], logging_level='ERROR', log_to_driver=False); "
             "print(sum(1 for n in ray.nodes() if n['Alive']))")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        dead = [node.args for node in nodes if node.poll() is not None]
        assert not dead, f"a Ray node ended while starting: {dead}"
        result = subprocess.run([sys.executable, "-c", probe, address], capture_output=True, text=True, timeout=60)
        if result.returncode == 0 and int(result.stdout.split()[-1]) >= count:
            return
        time.sleep(1)
    raise AssertionError(f"the Ray cluster at {address} did not get {count} nodes in {timeout} s")


def stop_nodes(nodes: list[subprocess.Popen]) -> None:
    """Each node's process group, the worker node first. `ray start --block` stops its node's processes
    on SIGTERM, the head's taking half a minute, so after a few seconds the groups are killed, and with
    them the node's Ray workers, which sit in process groups of their own (found as the nodes' descendants)."""
    import psutil

    descendants = []
    for node in nodes:
        try:
            descendants += psutil.Process(node.pid).children(recursive=True)
        except psutil.Error:
            pass
    for node in reversed(nodes):
        _signal_group(node, signal.SIGTERM)
        try:
            node.wait(timeout=5)
        except subprocess.TimeoutExpired:
            _signal_group(node, signal.SIGKILL)
            node.wait()
    for process in descendants:
        try:
            process.kill()
        except psutil.Error:  # it has ended already
            pass
    psutil.wait_procs(descendants, timeout=10)  # before their folder goes: a dying raylet still writes its logs


def _signal_group(node: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(node.pid, sig)
    except ProcessLookupError:
        pass


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[RayCluster]:
    """Two Ray nodes of one CPU each on 127.0.0.1; RAY_ADDRESS names the head for the commands a test starts."""
    pytest.importorskip("ray", reason="the ray extra is not installed: pip install -e '.[ray]'")
    head_port = free_port()
    # Ray's unix sockets live under the temp dir; a short path keeps them under the system's length limit
    temp_dir = Path(tempfile.mkdtemp(prefix="tlray"))
    # A local Ray started on this machine (Ray 2.60 and later) leaves ~/.ray/auth_token, which would turn on
    # token authentication for every node and client started after it: the test cluster and the
    # commands the tests run against it say they run without.
    auth_mode = os.environ.get("RAY_AUTH_MODE")
    os.environ["RAY_AUTH_MODE"] = "disabled"
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_ADDRESS": ""}
    nodes: list[subprocess.Popen] = []
    log = open(temp_dir / "nodes.log", "w")
    try:
        for head in (True, False):
            nodes.append(subprocess.Popen(node_command(head_port=head_port, head=head, temp_dir=temp_dir), env=env,
                                          stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
            if head:
                wait_for_nodes(f"127.0.0.1:{head_port}", 1, nodes=nodes)
        wait_for_nodes(f"127.0.0.1:{head_port}", 2, nodes=nodes)
        yield RayCluster(address=f"127.0.0.1:{head_port}", nodes=tuple(nodes))
    finally:
        stop_nodes(nodes)
        log.close()
        shutil.rmtree(temp_dir, ignore_errors=True)
        if auth_mode is None:
            os.environ.pop("RAY_AUTH_MODE", None)
        else:
            os.environ["RAY_AUTH_MODE"] = auth_mode
