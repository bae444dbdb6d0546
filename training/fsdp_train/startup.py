"""Time to first step: where a rank's start goes, and the persistent compile cache that shortens it.

Pure Python (no torch): the clock starts before torch is imported.
"""

from __future__ import annotations

import os
import time
from collections.abc import MutableMapping
from dataclasses import dataclass, field
from pathlib import Path

from fsdp_train.events import Timings

INDUCTOR_CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"
TRITON_CACHE_ENV = "TRITON_CACHE_DIR"


def process_start_time() -> float | None:
    """Unix time at which this process started (Linux ``/proc``), or None where it cannot be read."""
    try:
        stat = Path("/proc/self/stat").read_text()
        # Field 22 (start time in clock ticks after boot) counts from after the parenthesised command name.
        ticks = int(stat[stat.rindex(")") + 2 :].split()[19])
        boot = next(
            float(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines() if line.startswith("btime ")
        )
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def configure_compile_cache(path: str, env: MutableMapping[str, str]) -> str:
    """Point Inductor's and Triton's on-disk caches at ``path`` (a directory every run of the job can reach).

    Returns the cache's state as this rank found it: ``""`` (no persistent cache configured),
    ``cold`` (empty: this run compiles and fills it) or ``warm`` (earlier runs left entries).
    Inductor's FX-graph and AOTAutograd caches are on by default and keyed by the graph, the
    torch version and the device, so a warm cache holding another model or version is only unused.
    """
    if not path:
        return ""
    root = Path(path)
    inductor, triton = root / "inductor", root / "triton"
    warm = inductor.is_dir() and any(inductor.iterdir())
    inductor.mkdir(parents=True, exist_ok=True)
    triton.mkdir(parents=True, exist_ok=True)
    env[INDUCTOR_CACHE_ENV] = str(inductor)
    env[TRITON_CACHE_ENV] = str(triton)
    return "warm" if warm else "cold"


@dataclass(slots=True)
class StartupClock:
    """Marks the phases of a rank's start; ``timings`` turns them into the ``Timings`` event."""

    origin: float
    """Unix time of process start (or of the clock's creation where that is unknown)."""
    entered: float = field(default_factory=time.time)
    """Unix time at which the training function began (after interpreter start, imports, process group)."""
    marks: dict[str, float] = field(default_factory=dict)

    @classmethod
    def start(cls) -> StartupClock:
        now = time.time()
        origin = process_start_time()
        return cls(origin=origin if origin is not None and origin <= now else now, entered=now)

    def mark(self, phase: str) -> None:
        """The phase named ``phase`` ends now (phases follow each other in the order marked)."""
        self.marks[phase] = time.time()

    def seconds(self, phase: str) -> float:
        ends = list(self.marks.items())
        for i, (name, end) in enumerate(ends):
            if name == phase:
                begin = ends[i - 1][1] if i else self.entered
                return max(0.0, end - begin)
        return 0.0

    def timings(self, rank: int, compile_cache: str) -> Timings:
        last = max(self.marks.values(), default=self.entered)
        return Timings(
            rank=rank,
            to_first_step_seconds=last - self.origin,
            startup_seconds=self.entered - self.origin,
            probe_seconds=self.seconds("probe"),
            build_seconds=self.seconds("build"),
            first_step_seconds=self.seconds("first_step"),
            compile_cache=compile_cache,
        )
