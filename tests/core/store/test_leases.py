"""Leases on a real S3 store (SeaweedFS): one holder at a time across threads and processes, a
killed holder's lease taken after its ttl and not before, renewal past several ttls, a lease
never deleted or overwritten by one who no longer holds it, and a watch from another host that
tells a renewed lease from one whose holder stopped."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from tuneline.core.errors import ConfigError, ObjectStoreError
from tuneline.core.store.leases import LeaseObject, LeaseRecord, LeaseWatch, lease_url, new_record, remote_lease
from tuneline.core.store.location import parse_workspace
from tuneline.core.store.remote import RemoteWorkspace, RetryPolicy

pytestmark = pytest.mark.slow

HOLD = """
import os, sys, time
from tuneline.core.store.leases import remote_lease
from tuneline.core.store.location import parse_workspace
from tuneline.core.store.remote import RemoteWorkspace, RetryPolicy
url, ttl_s, hold_s, rounds, log, go = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]), *sys.argv[5:]
workspace = RemoteWorkspace(parse_workspace(url))  # endpoint and keys from the AWS_* variables
workspace.filesystem.exists(url)  # connected before the start
print("ready", flush=True)
while not os.path.exists(go):
    time.sleep(0.01)
for _ in range(rounds):
    with remote_lease(workspace, "trained", "sft-1", ttl_s=ttl_s, on_wait=lambda: print("waiting", flush=True)):
        with open(log, "a") as out:
            out.write(f"enter {os.getpid()}\\n")
        print("held", flush=True)
        time.sleep(hold_s)
        with open(log, "a") as out:
            out.write(f"leave {os.getpid()}\\n")
print("done", flush=True)
"""


@pytest.fixture(scope="module")
def bucket(s3_store):
    return s3_store.filesystem(), s3_store.make_bucket("leases")


@pytest.fixture()
def workspace(bucket, request) -> RemoteWorkspace:
    """A workspace of its own for each test, in the module's bucket, through one client."""
    fs, url = bucket
    return RemoteWorkspace(parse_workspace(f"{url}/{request.node.name}"), filesystem=fs)


def holder_process(s3_store, bucket: str, *, ttl_s: float, hold_s: float, rounds: int, log: Path, go: Path) -> subprocess.Popen:
    """A process that takes the lease `rounds` times once the file `go` exists, holding it `hold_s`
    each time and writing its entries to `log`; it says "ready" when connected."""
    env = {**os.environ, **s3_store.env()}
    command = [sys.executable, "-c", HOLD, bucket, str(ttl_s), str(hold_s), str(rounds), str(log), str(go)]
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True)


def the_lease(workspace: RemoteWorkspace) -> LeaseObject:
    return LeaseObject(workspace, lease_url(workspace.location.url, "trained", "sft-1"))


def test_threads_hold_it_one_at_a_time(workspace):
    inside, most_inside, entries = [], [], []
    guard = threading.Lock()

    def compute(name: str) -> None:
        for _ in range(2):
            with remote_lease(workspace, "trained", "sft-1", ttl_s=2):
                with guard:
                    inside.append(name)
                    most_inside.append(len(inside))
                    entries.append(name)
                time.sleep(0.05)
                with guard:
                    inside.remove(name)

    threads = [threading.Thread(target=compute, args=(name,)) for name in ("a", "b", "c")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert sorted(entries) == ["a", "a", "b", "b", "c", "c"]
    assert max(most_inside) == 1
    assert the_lease(workspace).read() is None  # the last holder deleted it


def test_processes_hold_it_one_at_a_time(workspace, s3_store, tmp_path):
    log, go = tmp_path / "entries.log", tmp_path / "go"
    holders = [holder_process(s3_store, workspace.location.url, ttl_s=2, hold_s=0.15, rounds=2, log=log, go=go) for _ in range(2)]
    assert [holder.stdout.readline().strip() for holder in holders] == ["ready", "ready"]
    go.touch()  # both contend from the same moment
    outputs = [holder.communicate(timeout=60)[0] for holder in holders]
    assert [holder.returncode for holder in holders] == [0, 0]
    lines = log.read_text().split("\n")[:-1]
    assert len(lines) == 8
    for enter, leave in zip(lines[0::2], lines[1::2]):  # each entry left before the next begins
        assert enter.startswith("enter ") and leave == "leave " + enter.removeprefix("enter ")
    assert {line.split()[1] for line in lines} == {str(holder.pid) for holder in holders}
    assert any("waiting" in output for output in outputs)


def test_a_killed_holder_blocks_the_next_for_its_ttl_and_no_longer(workspace, s3_store, tmp_path):
    ttl_s = 1.5
    go = tmp_path / "go"
    go.touch()
    holder = holder_process(s3_store, workspace.location.url, ttl_s=ttl_s, hold_s=600, rounds=1, log=tmp_path / "log", go=go)
    assert holder.stdout.readline().strip() == "ready" and holder.stdout.readline().strip() == "held"
    time.sleep(0.6)  # renewed at least once (every ttl/3)
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait(timeout=10)
    killed = time.monotonic()
    left = the_lease(workspace).read().record
    assert left.pid == holder.pid and left.expires > datetime.now(timezone.utc)
    waited = []
    with remote_lease(workspace, "trained", "sft-1", ttl_s=ttl_s, on_wait=lambda: waited.append(True)) as lease:
        blocked_s = time.monotonic() - killed
        taken = datetime.now(timezone.utc)
        assert the_lease(workspace).read().record.holder == lease.holder
    assert waited == [True]
    assert taken >= left.expires  # not before the killed holder's lease ran out
    assert ttl_s <= blocked_s < ttl_s + 1.0


def test_renewal_keeps_a_long_holder_past_several_ttls(workspace):
    ttl_s, hold_s = 1.0, 2.5
    held, released, taken, waited = threading.Event(), [], [], []

    def hold() -> None:
        with remote_lease(workspace, "trained", "sft-1", ttl_s=ttl_s) as lease:
            first = the_lease(workspace).read()
            held.set()
            time.sleep(hold_s)
            last = the_lease(workspace).read()
            released.append((lease.lost, first, last))
            released.append(time.monotonic())

    holder = threading.Thread(target=hold)
    holder.start()
    held.wait(timeout=30)
    with remote_lease(workspace, "trained", "sft-1", ttl_s=ttl_s, on_wait=lambda: waited.append(True)):
        taken.append(time.monotonic())
    holder.join(timeout=30)
    (lost, first, last), released_at = released
    assert lost is None and waited == [True]
    assert taken[0] >= released_at  # waited the whole hold, two and a half ttls
    assert last.record.holder == first.record.holder and last.etag != first.etag
    assert last.record.expires - first.record.expires > timedelta(seconds=hold_s - ttl_s)


def test_a_lease_taken_by_another_is_neither_renewed_nor_deleted(workspace):
    other = new_record("another-holder", 60.0)
    with remote_lease(workspace, "trained", "sft-1", ttl_s=0.6) as lease:
        workspace.filesystem.pipe_file(lease.url, other.to_bytes())  # another host's take-over, as the store sees it
        time.sleep(0.5)  # a renewal finds it
        assert lease.lost is not None and "another-holder" in lease.lost
    assert the_lease(workspace).read().record == other

    # released before any renewal looks: the delete, conditional on its own ETag, leaves it too
    workspace.filesystem.rm_file(lease.url)
    with remote_lease(workspace, "trained", "sft-1", ttl_s=60) as lease:
        workspace.filesystem.pipe_file(lease.url, other.to_bytes())
    assert lease.lost is None and the_lease(workspace).read().record == other


def test_a_lease_expired_long_ago_is_taken_at_once(workspace):
    past = datetime.now(timezone.utc) - timedelta(hours=1)
    stale = LeaseRecord("gone", "old-host", 1, created=past, expires=past + timedelta(seconds=30), ttl_s=30.0)
    assert the_lease(workspace).create(stale) is not None
    waited = []
    started = time.monotonic()
    with remote_lease(workspace, "trained", "sft-1", ttl_s=30, on_wait=lambda: waited.append(True)) as lease:
        assert time.monotonic() - started < 1.0 and waited == []
        assert the_lease(workspace).read().record.holder == lease.holder
    assert the_lease(workspace).read() is None


def test_a_store_that_does_not_answer_is_named(s3_store):
    import s3fs

    from object_store_server import free_port

    unreachable = s3fs.S3FileSystem(key="k", secret="s", endpoint_url=f"http://127.0.0.1:{free_port()}", skip_instance_cache=True,
                                    config_kwargs={"retries": {"max_attempts": 1}}, client_kwargs={"region_name": "us-east-1"})
    unreachable.retries = 1
    workspace = RemoteWorkspace(parse_workspace("s3://gone/team"), filesystem=unreachable, retry=RetryPolicy(attempts=1))
    with pytest.raises(ObjectStoreError, match="taking the lease s3://gone/team/artifacts/trained/.sft-1.lease failed 1 times"):
        with remote_lease(workspace, "trained", "sft-1"):
            pass


def test_only_s3_workspaces_take_leases(tmp_path):
    with pytest.raises(ConfigError, match="gs://bucket/team: .* s3:// workspace"):
        with remote_lease(parse_workspace("gs://bucket/team"), "trained", "sft-1"):
            pass
    with pytest.raises(ValueError, match="local workspace: its lock is artifact_lock"):
        with remote_lease(parse_workspace(str(tmp_path)), "trained", "sft-1"):
            pass


def test_an_object_that_is_no_lease_is_taken_once_unchanged_for_a_ttl(workspace):
    workspace.filesystem.pipe_file(the_lease(workspace).url, b"not a lease")
    waited = []
    started = time.monotonic()
    with remote_lease(workspace, "trained", "sft-1", ttl_s=0.5, on_wait=lambda: waited.append(True)) as lease:
        assert 0.5 <= time.monotonic() - started < 1.5 and waited == [True]
        assert the_lease(workspace).read().record.holder == lease.holder


def test_a_watch_sees_the_lease_live_while_renewed_and_dead_a_ttl_after_its_holder_stopped(workspace):
    watch = LeaseWatch(workspace, "trained", "sft-1")
    assert not watch.live()  # nobody holds it
    with remote_lease(workspace, "trained", "sft-1", ttl_s=1.0):
        looks = []
        for _ in range(9):  # over two ttls: each renewal a new ETag
            looks.append(watch.live())
            time.sleep(0.25)
    assert looks == [True] * 9
    assert not watch.live()  # released

    assert the_lease(workspace).create(new_record("killed-holder", 1.0)) is not None  # never renewed
    assert watch.live()
    time.sleep(1.1)
    assert not watch.live()
    assert watch.holder is not None and watch.holder.holder == "killed-holder"
