"""The processes of a stand-in Ray node, found by the marker each inherits in its environment: Ray's workers start
sessions of their own, so a node's process group does not hold them all."""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path


def marked_processes(marker: str) -> list[int]:
    """Live processes (zombies excluded) whose environment holds `marker` (a `NAME=value` string)."""
    wanted, found = marker.encode(), []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and wanted in environ:
            found.append(int(entry.name))
    return found


def kill_marked(marker: str) -> None:
    for pid in marked_processes(marker):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
