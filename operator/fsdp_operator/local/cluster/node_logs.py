"""What a Ray node's own logs say about its end: the fatal line of `ray start`'s output or of its session's GCS and
raylet logs, in Ray's words without its colours and prefixes, and which failures a new start mends."""

from __future__ import annotations

import os
import re
from pathlib import Path

FATAL_MARKERS = (
    "Some Ray subprocesses exited unexpectedly",
    "[FATAL]",
    "Check failed:",
    "Fatal Python error",
    "*** SIGSEGV",
    "*** SIGABRT",
)
"""Lines of a head's log that mean it is gone (Ray's own words, and its C++ and Python crash reports)."""
FATAL_TAIL_BYTES = 64 * 1024


def fatal_line(log_path: Path) -> str:
    """The last line of the end of a Ray node's log that says it died (see FATAL_MARKERS), cut to 200; else ''."""
    try:
        with log_path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(f.tell() - FATAL_TAIL_BYTES, 0))
            tail = f.read().decode(errors="replace")
    except OSError:
        return ""
    lines = tail.splitlines()
    found = [i for i, line in enumerate(lines) if any(marker in line for marker in FATAL_MARKERS)]
    if not found:
        return ""

    said = clean(lines[found[-1]])
    if said.endswith(":") and found[-1] + 1 < len(lines):  # Ray names the subprocess on the next line
        said += " " + clean(lines[found[-1] + 1])
    return said[:200]


def clean(line: str) -> str:
    """A log line without Ray's colours and its `2026-12-03 08:24:00,462 ERR scripts.py:1304 -- `; a C++ component's
    `[2026-12-06 11:42:41,134 C 14525 14525] (gcs_server) grpc_server.cc:134: ...` as `gcs_server: ` and what its
    check said (Ray puts a paragraph of boilerplate before `Check failed:`)."""
    line = " ".join(_RAY_LOG_PREFIX.sub("", _ANSI.sub("", line.strip())).split())
    if component := _CPP_LOG_PREFIX.match(line):
        rest = line[component.end() :]
        rest = rest[rest.index("Check failed:") :] if "Check failed:" in rest else rest
        line = f"{component['name']}: {rest}"
    return line


_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_RAY_LOG_PREFIX = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+\s+\S+\s+\S+ -- ")
_CPP_LOG_PREFIX = re.compile(r"^\[\d{4}-\d\d-\d\d [^\]]*\] \((?P<name>[\w-]+)\) \S+:\d+:\s*")
PYTHON_ERROR = re.compile(r"^(?:[\w.]+\.)?\w*(?:Error|Exception|Exit)\b.*")
SESSION_LOGS = ("gcs_server.out", "raylet.out")
"""A head's component logs in its session (`<temp dir>/session_latest/logs`): the GCS and raylet say why they died
there at once, while `ray start` waits up to a minute for them before it prints it and exits."""
MENDED_BY_A_NEW_START = ("already in use", "already occupied", "timed out during startup", "Timed out waiting for file")
"""What a head's failed start may say that starting it again mends: a port taken (all pods here share the machine's;
a new start gets new ports) and Ray's own start-up timeouts on a loaded machine. Any other failure comes again."""


def mended_by_a_new_start(why: str) -> bool:
    return any(said in why for said in MENDED_BY_A_NEW_START)
