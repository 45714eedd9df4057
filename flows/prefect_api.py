"""Which Prefect API a `tuneline` command talks to, and starting the temporary one safely.

Without `PREFECT_API_URL`, Prefect starts a temporary server per process (bound to 127.0.0.1) on
the SQLite database in `PREFECT_HOME`. Two `tuneline run` processes starting at once on a new
database both run its migrations, and one server fails to start ("Circular dependency detected");
Prefect happens to retry, but the database has been migrated twice at once. Starting the server
under a lock in `PREFECT_HOME` makes the second process find the database ready. The folder and
the database are created owner-only (core/tracking/privacy.py).
"""

from __future__ import annotations

from pathlib import Path

from tuneline.core.store.locks import file_lock
from tuneline.core.tracking.privacy import create_owner_only

EPHEMERAL_LOCK = ".tuneline-ephemeral-start.lock"


def start_prefect_api() -> None:
    """Start this process's temporary Prefect server now, one process at a time, unless
    `PREFECT_API_URL` names a server; the flow then uses the server already running."""
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, PREFECT_HOME

    if PREFECT_API_URL.value():
        return
    home = Path(PREFECT_HOME.value())
    home.mkdir(mode=0o700, parents=True, exist_ok=True)  # as Prefect makes it; the lock below would make it with the umask
    with file_lock(home / EPHEMERAL_LOCK):
        _create_database_owner_only()
        with get_client(sync_client=True) as client:
            client.api_healthcheck()


def _create_database_owner_only() -> None:
    """Prefect's SQLite database (every flow run's parameters and logs), created owner-only before
    the temporary server's migrations fill it; a database that exists keeps its mode."""
    from prefect.settings import get_current_settings

    url = get_current_settings().server.database.connection_url
    text = url.get_secret_value() if url is not None else ""
    for prefix in ("sqlite+aiosqlite:///", "sqlite:///"):
        path = text.removeprefix(prefix).split("?", 1)[0] if text.startswith(prefix) else ""
        if path and path != ":memory:":
            create_owner_only(Path(path))
