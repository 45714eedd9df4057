"""Leases between hosts on an object store: one process at a time computes an artifact of a URL
workspace, as `artifact_lock` (an `flock`, `core.store.locks`) does on a local one.

    with remote_lease(workspace, "sft", key, on_wait=say_waiting) as lease:
        ...  # compute, upload, commit; `lease.lost` says whether another host took it meanwhile

`flock` cannot guard a bucket, so the lease is an object, `<url>/artifacts/<kind>/.<key>.lease`,
written with the store's own conditional requests (S3's, through s3fs and botocore):
- taken by a create-only write (`If-None-Match: *`): of two writers the store lets one create it
  and answers the other 412 Precondition Failed;
- holding who holds it (a fresh uuid, host, pid) and until when (created and expiry times in UTC
  from the holder's clock), renewed every ttl/3 by a daemon thread with an overwrite conditional on
  the ETag it last wrote (`If-Match`), so a renewal never overwrites another holder's lease;
- released by a delete conditional on that ETag: never someone else's.

A waiter polls with backoff and takes the lease over, again with `If-Match` on the ETag it read
(two waiters cannot both win), once it is stale: its expiry is more than `CLOCK_SKEW_S` behind
the waiter's clock, or the waiter has seen the same object unchanged for the lease's whole ttl on
its own monotonic clock. The second rule needs no agreement between clocks and bounds what a
holder killed with SIGKILL costs the next taker: at most its ttl after the kill. The first serves
a lease left long ago at once. A holder that cannot renew for a whole ttl, or finds the lease
taken, records why in `lease.lost` and stops renewing; the lease saves repeated work, and the
artifact's commit (its manifest, uploaded last) stays safe without it.

Every request goes through the workspace's retries (`RemoteWorkspace.attempt`): a store that does
not answer becomes an `ObjectStoreError` naming the URL. An answer to a condition (412) is no
outage and is not retried. If a write that landed is retried after its answer was lost, the store
answers 412 to the retry; the lease then read back names this holder, which is how it is told.

A host that does not hold the lease can watch it (`LeaseWatch`): a pipeline tells so, by the
waiter's rule above, whether the stage it sent to another machine is still being computed.

A local workspace (a plain path) does not use this: `artifact_lock` is its lock, and the kernel
frees it when its holder dies.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import TypeVar

from tuneline.core.errors import ConfigError, ObjectStoreError
from tuneline.core.store.location import WorkspaceLocation
from tuneline.core.store.remote import RemoteWorkspace

LEASE_TTL_S = 30.0  # how long a lease lasts unrenewed: what a killed holder costs the next taker
CLOCK_SKEW_S = 30.0  # how far two hosts' clocks may disagree before an expiry is trusted
_POLL_START_S = 0.05
_CONDITIONAL_PROTOCOLS = ("s3", "s3a")  # stores whose conditional writes are reached (s3fs, botocore)
T = TypeVar("T")

_LOG = logging.getLogger(__name__)


@dataclass(frozen=True)
class LeaseRecord:
    """What a lease object holds (JSON): whose it is and until when."""

    holder: str
    host: str
    pid: int
    created: datetime
    expires: datetime
    ttl_s: float

    def to_bytes(self) -> bytes:
        fields = {
            "holder": self.holder,
            "host": self.host,
            "pid": self.pid,
            "created": self.created.isoformat(),
            "expires": self.expires.isoformat(),
            "ttl_s": self.ttl_s,
        }
        return json.dumps(fields).encode("utf-8")

    @classmethod
    def parse(cls, body: bytes) -> LeaseRecord | None:
        """The record in `body`, or None for one that is not a lease this module wrote (a waiter then
        judges it by how long it stays unchanged)."""
        try:
            fields = json.loads(body)
            record = cls(
                holder=str(fields["holder"]),
                host=str(fields["host"]),
                pid=int(fields["pid"]),
                created=datetime.fromisoformat(fields["created"]),
                expires=datetime.fromisoformat(fields["expires"]),
                ttl_s=float(fields["ttl_s"]),
            )
        except (ValueError, TypeError, KeyError):
            return None
        return record if record.expires.tzinfo is not None and record.ttl_s > 0 else None

    def describe(self) -> str:
        return f"holder {self.holder} (pid {self.pid} on {self.host}, expires {self.expires.isoformat()})"


def lease_url(workspace_url: str, kind: str, key: str) -> str:
    """Where the lease on one artifact key lives, beside the artifact itself."""
    return f"{workspace_url.rstrip('/')}/artifacts/{kind}/.{key}.lease"


def new_record(holder: str, ttl_s: float, *, created: datetime | None = None) -> LeaseRecord:
    now = datetime.now(timezone.utc)
    return LeaseRecord(
        holder=holder,
        host=socket.gethostname(),
        pid=os.getpid(),
        created=created or now,
        expires=now + timedelta(seconds=ttl_s),
        ttl_s=ttl_s,
    )


@dataclass(frozen=True)
class SeenLease:
    """A lease object as read: its record (None when the body is not one) and its ETag."""

    record: LeaseRecord | None
    etag: str


class LeaseObject:
    """One lease object on an S3 workspace, written and removed only under the store's conditions:
    a condition that fails is an answer (None or False); a store that does not answer is retried,
    then an ObjectStoreError."""

    def __init__(self, workspace: RemoteWorkspace, url: str) -> None:
        self.workspace = workspace
        self.url = url
        self.bucket, self.key, _ = workspace.filesystem.split_path(url)

    def create(self, record: LeaseRecord) -> str | None:
        """The new object's ETag, or None when one exists already (`If-None-Match: *`)."""
        return self._put("taking the lease", record, mode="create")

    def replace(self, record: LeaseRecord, etag: str) -> str | None:
        """The new ETag, or None when the object is gone or no longer the one with `etag`."""
        return self._put("writing the lease", record, IfMatch=etag)

    def delete(self, etag: str) -> bool:
        """Delete the object only if it is still the one with `etag`; False when it is not, or gone."""
        fs = self.workspace.filesystem

        def delete() -> bool:
            fs.call_s3("delete_object", Bucket=self.bucket, Key=self.key, IfMatch=etag)
            fs.invalidate_cache(self.url)
            return True

        try:
            return self._attempt("releasing the lease", delete, refused=False)
        except FileNotFoundError:
            return False

    def read(self) -> SeenLease | None:
        """The object with the ETag of that very body (one GET), or None when there is none."""
        from fsspec.asyn import sync

        fs = self.workspace.filesystem
        try:
            body, etag = self.workspace.attempt("reading the lease", self.url, lambda: sync(fs.loop, self._get))
        except FileNotFoundError:
            return None
        return SeenLease(LeaseRecord.parse(body), etag)

    def _put(self, what: str, record: LeaseRecord, **condition: str) -> str | None:
        fs = self.workspace.filesystem
        return self._attempt(what, lambda: fs.pipe_file(self.url, record.to_bytes(), **condition)["ETag"], refused=None)

    def _attempt(self, what: str, request: Callable[[], T], *, refused: T) -> T:
        def answered() -> T:
            try:
                return request()
            except OSError as error:
                if precondition_failed(error):
                    return refused
                raise

        return self.workspace.attempt(what, self.url, answered)

    async def _get(self) -> tuple[bytes, str]:
        response = await self.workspace.filesystem._call_s3("get_object", Bucket=self.bucket, Key=self.key)
        try:
            body = await response["Body"].read()
        finally:
            response["Body"].close()
        return body, response["ETag"]


def precondition_failed(error: OSError) -> bool:
    """Whether the store refused a write for its condition: 412 (s3fs raises FileExistsError when
    the store names the `If-None-Match` condition, an OSError otherwise), or AWS's 409
    ConditionalRequestConflict for two conditional writes at once."""
    if isinstance(error, FileExistsError):
        return True
    from botocore.exceptions import ClientError

    cause = error.__cause__
    if not isinstance(cause, ClientError):
        return False
    code = cause.response.get("Error", {}).get("Code")
    status = cause.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return code in {"PreconditionFailed", "ConditionalRequestConflict"} or status == 412


class RemoteLease:
    """A lease this process holds, renewed by a daemon thread until released. `lost` is None while
    it is this holder's, and says why once it is not (taken over, deleted, or not renewed for a
    whole ttl): the work goes on, but another host may be doing it too."""

    def __init__(self, lease: LeaseObject, record: LeaseRecord, etag: str, *, taken_at: float) -> None:
        self.url = lease.url
        self.holder = record.holder
        self._lease = lease
        self._record = record
        self._etag = etag
        self._renewed_at = taken_at
        self._lost: str | None = None
        self._released = threading.Event()
        self._renewer = threading.Thread(target=self._renew_until_released, name=f"lease {lease.url}", daemon=True)

    @property
    def lost(self) -> str | None:
        return self._lost

    def _start_renewing(self) -> None:
        self._renewer.start()

    def _renew_until_released(self) -> None:
        ttl_s = self._record.ttl_s
        while not self._released.wait(ttl_s / 3):
            started = time.monotonic()
            try:
                if not self._renew():
                    return
            except Exception as error:  # noqa: BLE001 - the store's clients raise their own classes; each is a failed renewal
                if time.monotonic() - self._renewed_at >= ttl_s:
                    self._lost = f"the lease {self.url} could not be renewed for {ttl_s:g} s ({error})"
                    return
                continue
            self._renewed_at = started

    def _renew(self) -> bool:
        record = new_record(self.holder, self._record.ttl_s, created=self._record.created)
        etag = self._lease.replace(record, self._etag)
        if etag is None:
            seen = self._lease.read()
            if seen is None or seen.record is None or seen.record.holder != self.holder:
                taker = "deleted" if seen is None else "replaced" if seen.record is None else f"taken by {seen.record.describe()}"
                self._lost = f"the lease {self.url} was {taker}"
                return False
            etag = seen.etag  # our own renewal, sent again by the client after it had landed
        self._record, self._etag = record, etag
        return True

    def _release(self) -> None:
        self._released.set()
        self._renewer.join(timeout=self._record.ttl_s)
        if self._lost is not None:
            return
        try:
            if not self._lease.delete(self._etag):
                seen = self._lease.read()
                if seen is not None and seen.record is not None and seen.record.holder == self.holder:
                    self._lease.delete(seen.etag)
        except Exception as error:  # noqa: BLE001 - as in renewal: the lease then expires on its own
            _LOG.warning("The lease %s could not be deleted (%s); it expires within %g s.", self.url, error, self._record.ttl_s)


class _Staleness:
    """Tells a stale lease: expired more than `CLOCK_SKEW_S` ago by its writer's clock, or seen
    unchanged (one ETag) for its whole ttl on this process's monotonic clock."""

    def __init__(self) -> None:
        self._etag: str | None = None
        self._since = 0.0

    def stale(self, seen: SeenLease, ttl_s: float) -> bool:
        now = time.monotonic()
        if seen.etag != self._etag:
            self._etag, self._since = seen.etag, now
        if seen.record is not None:
            if datetime.now(timezone.utc) > seen.record.expires + timedelta(seconds=CLOCK_SKEW_S):
                return True
            ttl_s = seen.record.ttl_s
        return now - self._since >= ttl_s


class LeaseWatch:
    """The lease on one key as a host that does not hold it sees it, look after look: live while its
    holder renews it, stale by the rule a waiter takes it over by (`_Staleness`). A pipeline watches
    so the stage it sent to another machine; `holder` is the newest holder seen, for its message."""

    def __init__(self, workspace: RemoteWorkspace, kind: str, key: str) -> None:
        self._lease = LeaseObject(workspace, lease_url(workspace.location.url, kind, key))
        self._staleness = _Staleness()
        self.holder: LeaseRecord | None = None

    def live(self) -> bool:
        """One look (one GET): whether a holder is renewing the lease now. A store that does not
        answer tells nothing of the holder: not live."""
        try:
            seen = self._lease.read()
        except ObjectStoreError:
            return False
        if seen is None:
            return False
        if seen.record is not None:
            self.holder = seen.record
        return not self._staleness.stale(seen, LEASE_TTL_S)


def watch_lease(workspace: RemoteWorkspace, kind: str, key: str) -> LeaseWatch | None:
    """A watch on the lease of one key, or None on a store whose leases tuneline does not take."""
    return LeaseWatch(workspace, kind, key) if workspace.location.protocol in _CONDITIONAL_PROTOCOLS else None


@contextmanager
def remote_lease(
    workspace: RemoteWorkspace | WorkspaceLocation,
    kind: str,
    key: str,
    *,
    ttl_s: float = LEASE_TTL_S,
    on_wait: Callable[[], None] | None = None,
) -> Iterator[RemoteLease]:
    """Hold the lease on one artifact key of an S3 workspace across hosts, waiting while another
    holder has it; `on_wait` is called once if this one has to wait. Renewed every `ttl_s / 3` while
    held, deleted on leaving if still this holder's. A local workspace uses `artifact_lock`."""
    if isinstance(workspace, WorkspaceLocation):
        if not workspace.is_remote:
            raise ValueError(f"{workspace} is a local workspace: its lock is artifact_lock")
        workspace = RemoteWorkspace(workspace)
    location = workspace.location
    if location.protocol not in _CONDITIONAL_PROTOCOLS:
        raise ConfigError(
            f"workspace {location.url}: stages on several hosts agree on who computes an artifact through the "
            f"store's conditional writes (If-None-Match, If-Match), which tuneline uses on S3 stores only; give an "
            f"s3:// workspace (AWS S3 or any S3-compatible store: MinIO, SeaweedFS, Ceph, R2)."
        )
    if ttl_s <= 0:
        raise ValueError(f"a lease's ttl must be positive, not {ttl_s}")
    lease = LeaseObject(workspace, lease_url(location.url, kind, key))
    held = _take_lease(lease, holder=uuid.uuid4().hex, ttl_s=ttl_s, on_wait=on_wait)
    held._start_renewing()
    try:
        yield held
    finally:
        held._release()


def _take_lease(lease: LeaseObject, *, holder: str, ttl_s: float, on_wait: Callable[[], None] | None) -> RemoteLease:
    """Create the lease object, or wait until it is gone or stale and then create or take it over."""
    staleness = _Staleness()
    delay_s = _POLL_START_S
    waiting = False
    while True:
        started = time.monotonic()
        record = new_record(holder, ttl_s)
        etag = lease.create(record)
        if etag is not None:
            return RemoteLease(lease, record, etag, taken_at=started)
        seen = lease.read()
        if seen is not None and seen.record is not None and seen.record.holder == holder:
            # our own create, sent again by the client after it had landed
            return RemoteLease(lease, seen.record, seen.etag, taken_at=started)
        if seen is not None and staleness.stale(seen, ttl_s):
            etag = lease.replace(record, seen.etag)
            if etag is not None:
                return RemoteLease(lease, record, etag, taken_at=started)
            continue  # another waiter took it over first, or its holder renewed it: look again
        if seen is not None and not waiting:
            waiting = True
            if on_wait is not None:
                on_wait()
        time.sleep(delay_s)
        lease_ttl_s = seen.record.ttl_s if seen is not None and seen.record is not None else ttl_s
        delay_s = min(delay_s * 1.5, max(0.2, min(1.0, lease_ttl_s / 6)))
