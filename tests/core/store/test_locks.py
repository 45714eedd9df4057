"""Artifact locks between processes: a second process waits while the first holds the key, and a
killed holder frees it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tuneline.core.store.artifacts import artifact_lock, lock_path

HOLD = """
import sys, time
from tuneline.core.store.artifacts import artifact_lock
with artifact_lock(sys.argv[1], "trained", "sft-1"):
    print("locked", flush=True)
    time.sleep(float(sys.argv[2]))
"""


def hold(workspace: Path, seconds: float) -> subprocess.Popen:
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(workspace), str(seconds)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "locked"
    return holder


def test_a_second_process_waits_for_the_holder(tmp_path):
    holder = hold(tmp_path, 1.5)
    waited = []
    started = time.monotonic()
    with artifact_lock(tmp_path, "trained", "sft-1", on_wait=lambda: waited.append(True)):
        seconds = time.monotonic() - started
    holder.wait(timeout=10)
    assert waited == [True] and seconds > 0.5
    assert lock_path(tmp_path, "trained", "sft-1").is_file()
    with artifact_lock(tmp_path, "trained", "sft-1", on_wait=lambda: waited.append(True)):
        pass
    assert waited == [True]  # free now: no wait


def test_a_killed_holder_frees_the_lock(tmp_path):
    holder = hold(tmp_path, 600)
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait(timeout=10)
    started = time.monotonic()
    with artifact_lock(tmp_path, "trained", "sft-1"):
        assert time.monotonic() - started < 1
