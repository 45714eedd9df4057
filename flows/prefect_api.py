"""Which Prefect API a `tuneline` command talks to, and starting the temporary one safely.

Without `PREFECT_API_URL`, Prefect starts a temporary server per process (bound to 127.0.0.1) on
the SQLite database in `PREFECT_HOME`. Two `tuneline run` processes starting at once on a new
database both run its migrations, and one server fails to start ("Circular dependency detected");
Prefect happens to retry, but the database has been migrated twice at once. Starting the server
under a lock in `PREFECT_HOME` makes the second process find the database ready.
"""

from __future__ import annotations

from pathlib import Path

from tuneline.core.store.locks import file_lock

EPHEMERAL_LOCK = ".tuneline-ephemeral-start.lock"


def start_prefect_api() -> None:
    """Start this process's temporary Prefect server now, one process at a time, unless
    `PREFECT_API_URL` names a server; the flow then uses the server already running."""
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, PREFECT_HOME

    if PREFECT_API_URL.value():
        return
    with file_lock(Path(PREFECT_HOME.value()) / EPHEMERAL_LOCK):
        with get_client(sync_client=True) as client:
            client.api_healthcheck()
