"""How the pipeline finds dead a stage's flow run whose machine died, so that it can submit it again.

A process worker killed with its machine (SIGKILL, power loss) takes the flow run's process with it,
and nothing is left to report the run's end: Prefect keeps it Running, or Pending, for ever. The
pipeline looks at each flow run it sent once a second and finds it dead when both

- the worker that took it, named by the run's `prefect.worker.name` label, has sent the work pool no
  heartbeat for `inactivity_heartbeat_multiple` of its heartbeat intervals (3 x
  `PREFECT_WORKER_HEARTBEAT_SECONDS`, 30 s by default), or the server already lists it offline: the
  rule by which Prefect's server marks a worker offline, timed on this machine's clock; and
- the lease on the stage's key in an s3:// workspace is not live: there is none, or its holder has
  not renewed it for its ttl (`TUNELINE_LEASE_TTL_S`).

A run left Pending with no worker's name on it for as long (3 x this machine's
`PREFECT_WORKER_HEARTBEAT_SECONDS`) was taken by a worker that died before naming itself: dead too.

A process worker runs its flow runs on its own machine, so its heartbeats stopping says theirs
stopped too, from the moment it took the run, before the stage takes its lease; the lease keeps
alive a run whose process goes on computing when only its worker died. Prefect's own flow-run
heartbeats would come at most once in 30 s (their least interval) and only once a run is Running.
A run found dead is set Crashed (forced: its worker can no longer say so) with a message naming the
worker and the lease's last holder (host and pid); the pipeline then submits the stage again, and
another worker resumes it from its newest uploaded checkpoint.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from prefect.client.schemas.objects import StateType, WorkerStatus
from prefect.settings import get_current_settings
from prefect.states import Crashed

from tuneline.core.pipeline.references import StageStore
from tuneline.core.pipeline.remote_store import RemoteStageStore
from tuneline.core.store.leases import LeaseWatch, watch_lease

if TYPE_CHECKING:
    from uuid import UUID

    from prefect.client.orchestration import SyncPrefectClient
    from prefect.client.schemas.objects import FlowRun, Worker

WORKER_LABEL = "prefect.worker.name"  # the label a worker gives each flow run it takes
POLL_S = 1.0
_TAKEN = (StateType.PENDING, StateType.RUNNING)  # a worker took it; a Scheduled run waits for one


class StageRunWatch:
    """Looks at one flow run of a stage, look after look, for signs that it is still alive."""

    def __init__(self, client: SyncPrefectClient, pool: str, lease: LeaseWatch | None) -> None:
        self._client = client
        self._pool = pool
        self._lease = lease
        self._heartbeat: object = None  # the worker's last heartbeat time as last read, and when it was read
        self._heartbeat_seen = time.monotonic()
        self._unnamed_since: float | None = None  # when it was first seen Pending with no worker's name

    def dead(self, flow_run: FlowRun) -> str | None:
        """Why `flow_run` is dead, or None while it may be alive."""
        if flow_run.state is None or flow_run.state.type not in _TAKEN:
            return None
        worker_name = flow_run.labels.get(WORKER_LABEL) if flow_run.labels else None
        if not isinstance(worker_name, str):
            return self._unnamed_dead(flow_run)
        # both looked at every time, so that the two silences run side by side
        worker = next((w for w in self._client.read_workers_for_work_pool(self._pool) if w.name == worker_name), None)
        silent_s, allowed_s = self._silence(worker)
        leased = self._lease is not None and self._lease.live()
        offline = worker is not None and worker.status == WorkerStatus.OFFLINE
        if leased or (silent_s < allowed_s and not offline):
            return None
        why = (f"its worker {worker_name} has sent pool {self._pool} no heartbeat for {silent_s:.0f} s"
               + (" (it is no longer listed there)" if worker is None else " and the server lists it offline" if offline
                  else f" (allowed: {allowed_s:g} s)"))
        if self._lease is not None and (holder := self._lease.holder) is not None:
            why += f", and the stage's lease, last held by pid {holder.pid} on {holder.host}, is no longer renewed"
        return f"found dead: {why}"

    def _unnamed_dead(self, flow_run: FlowRun) -> str | None:
        """A worker names itself on a run right after it sets it Pending; one Pending and unnamed for as
        long as a worker may stay silent was taken by a worker that died in between. (A Running run
        without the name was not started by a worker: there is nothing to judge it by.)"""
        if flow_run.state is None or flow_run.state.type != StateType.PENDING:
            return None
        now = time.monotonic()
        self._unnamed_since = self._unnamed_since if self._unnamed_since is not None else now
        settings = get_current_settings()
        allowed_s = settings.server.services.foreman.inactivity_heartbeat_multiple * settings.worker.heartbeat_seconds
        if now - self._unnamed_since < allowed_s or (self._lease is not None and self._lease.live()):
            return None
        return (f"found dead: it has been Pending for {now - self._unnamed_since:.0f} s and no worker of pool {self._pool} "
                "has named itself on it")

    def _silence(self, worker: Worker | None) -> tuple[float, float]:
        """How long the worker's heartbeat has stood still as seen from here, and how long it may."""
        settings = get_current_settings()
        heartbeat = worker.last_heartbeat_time if worker is not None else None
        now = time.monotonic()
        if heartbeat != self._heartbeat:
            self._heartbeat, self._heartbeat_seen = heartbeat, now
        interval_s = (worker.heartbeat_interval_seconds if worker is not None else None) or settings.worker.heartbeat_seconds
        return now - self._heartbeat_seen, settings.server.services.foreman.inactivity_heartbeat_multiple * interval_s


def stage_lease_watch(store: StageStore, kind: str, key: str) -> LeaseWatch | None:
    """A watch on the lease the stage takes in the workspace's store, where it takes one."""
    return watch_lease(store.remote, kind, key) if isinstance(store, RemoteStageStore) else None


def wait_for_stage_run(client: SyncPrefectClient, flow_run_id: UUID, watch: StageRunWatch) -> FlowRun:
    """The flow run once it has ended, or once it was found dead and set Crashed with the reason."""
    while True:
        flow_run = client.read_flow_run(flow_run_id)
        if flow_run.state is not None and flow_run.state.is_final():
            return flow_run
        if (why := watch.dead(flow_run)) is not None:
            client.set_flow_run_state(flow_run_id, Crashed(message=why), force=True)
            return client.read_flow_run(flow_run_id)
        time.sleep(POLL_S)
