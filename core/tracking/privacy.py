"""What stays with the owner: a URI's password wherever tuneline prints or logs the URI, and the
databases tuneline creates (MLflow's `mlflow.db`, Prefect's), which hold every run's parameters,
metrics and the model registry, readable and writable by their owner alone whatever the umask.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

REDACTED = "***"
OWNER_ONLY = 0o600
_URI_PASSWORD = re.compile(r"(?P<scheme>[a-z][a-z0-9+.-]*://)(?P<user>[^:/@\s]*):(?P<password>[^@/\s]+)@", re.IGNORECASE)


def mask_password(text: str) -> str:
    """`text` with the password of every URI in it masked: `http://user:secret@host/` becomes
    `http://user:***@host/`; a URI without a password is left as it is."""
    return _URI_PASSWORD.sub(lambda m: f"{m['scheme']}{m['user']}:{REDACTED}@", text)


def create_owner_only(path: Path) -> None:
    """Create `path` as an empty file with mode 0600 unless it exists. SQLite opens an empty file as a
    new database and gives its journal and WAL files the database's mode, so the tables MLflow or
    Prefect then create there stay owner-only. An existing file keeps the mode its owner gave it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        descriptor = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, OWNER_ONLY)
    except FileExistsError:
        return
    try:
        os.fchmod(descriptor, OWNER_ONLY)  # os.open's mode passes through the umask, which may clear more bits
    finally:
        os.close(descriptor)
