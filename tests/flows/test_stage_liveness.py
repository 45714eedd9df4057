"""The pipeline's watch on a stage's flow run, against a real Prefect server: a run whose worker
is silent is found dead once that silence lasts 3 heartbeat intervals, and not before; a run left
Pending by a worker that never named itself on it, likewise. (A worker SIGKILLed mid-stage, with
the lease and the resumed stage, is tests/flows/test_s3_workspace.py's.)"""

from __future__ import annotations

import time

import pytest

# Prefect is imported inside the test: Prefect reads its settings from the environment once, as it
# is first imported, and this module is imported while tests are collected, before the session's
# Prefect server has set PREFECT_API_URL.
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_server")]
HEARTBEAT_S = 0.2  # a silence of 3 of these (0.6 s) is death
POOL = "liveness-pool"


def looked_at_until_dead(client, watch, flow_run_id, *, for_s: float) -> tuple[str | None, float]:
    started = time.monotonic()
    while time.monotonic() - started < for_s:
        if (why := watch.dead(client.read_flow_run(flow_run_id))) is not None:
            return why, time.monotonic() - started
        time.sleep(0.05)
    return None, for_s


def test_a_run_is_found_dead_after_three_silent_heartbeats_of_its_worker_and_not_before():
    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.settings import PREFECT_WORKER_HEARTBEAT_SECONDS, temporary_settings
    from prefect.states import Pending, Running

    from tuneline.flows.stage_liveness import WORKER_LABEL, StageRunWatch

    @flow(name="liveness-probe")
    def probe() -> None:
        """Never run: its flow runs are only set Pending and Running, as a worker would."""

    with temporary_settings({PREFECT_WORKER_HEARTBEAT_SECONDS: HEARTBEAT_S}), get_client(sync_client=True) as client:
        client.create_work_pool(WorkPoolCreate(name=POOL, type="process"), overwrite=True)  # no worker in it
        named = client.create_flow_run(probe, name="sft-named")
        client.set_flow_run_state(named.id, Pending(), force=True)
        client.update_flow_run_labels(named.id, {WORKER_LABEL: "machine-gone"})
        client.set_flow_run_state(named.id, Running(), force=True)
        why, after_s = looked_at_until_dead(client, StageRunWatch(client, POOL, lease=None), named.id, for_s=5)
        assert why is not None and why.startswith(f"found dead: its worker machine-gone has sent pool {POOL} no heartbeat for ")
        assert why.endswith(" s (it is no longer listed there)")
        assert 3 * HEARTBEAT_S <= after_s < 3

        unnamed = client.create_flow_run(probe, name="sft-unnamed")
        client.set_flow_run_state(unnamed.id, Pending(), force=True)
        why, after_s = looked_at_until_dead(client, StageRunWatch(client, POOL, lease=None), unnamed.id, for_s=5)
        assert why is not None and why.startswith("found dead: it has been Pending for ")
        assert 3 * HEARTBEAT_S <= after_s < 3

        client.set_flow_run_state(unnamed.id, Running(), force=True)  # Running with no worker's name: no worker to judge by
        assert looked_at_until_dead(client, StageRunWatch(client, POOL, lease=None), unnamed.id, for_s=1)[0] is None
