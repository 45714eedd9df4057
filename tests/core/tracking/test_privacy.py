"""URI passwords masked in text, and files created owner-only whatever the umask."""

from __future__ import annotations

import os
from pathlib import Path

from tuneline.core.tracking.privacy import create_owner_only, mask_password


def test_every_uri_password_in_a_text_is_masked_and_the_rest_kept():
    text = ("API request to http://user:s3cret@host:5000/api/2.0 failed; store postgresql://mlflow:pw%40x@db/mlflow; "
            "sqlite:////ws/mlflow.db and user:pass outside a URI stay")
    assert mask_password(text) == (
        "API request to http://user:***@host:5000/api/2.0 failed; store postgresql://mlflow:***@db/mlflow; "
        "sqlite:////ws/mlflow.db and user:pass outside a URI stay")


def test_a_new_file_is_owner_only_under_any_umask_and_an_existing_one_keeps_its_mode(tmp_path: Path):
    previous = os.umask(0o277)  # would leave os.open's 0600 at 0400
    try:
        create_owner_only(tmp_path / "new" / "mlflow.db")
    finally:
        os.umask(previous)
    assert (tmp_path / "new" / "mlflow.db").stat().st_mode & 0o777 == 0o600
    shared = tmp_path / "shared.db"
    shared.write_bytes(b"tables")
    shared.chmod(0o640)
    create_owner_only(shared)
    assert shared.stat().st_mode & 0o777 == 0o640 and shared.read_bytes() == b"tables"
