"""Time to first step: where a rank's start goes, and the persistent compile cache that shortens it.

Pure Python (no torch): the clock starts before torch is imported.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterable, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path

from fsdp_train.contract.events import Timings

INDUCTOR_CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"
TRITON_CACHE_ENV = "TRITON_CACHE_DIR"
BYTECODE_DIR = "bytecode"
"""Under the compile cache: Python's bytecode of every module a run imported (``sys.pycache_prefix``)."""


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


def use_bytecode_cache(path: str) -> bool:
    """Before torch is imported: read Python's bytecode from ``path``/bytecode when an earlier run filled it.

    An image that ships no ``.pyc`` files, or sets ``PYTHONDONTWRITEBYTECODE``, has every rank compile the
    sources of torch, transformers and their imports on every start (9 s of an H200 run's start, measured).
    Returns whether the cache is in use; where it is not (no directory set, or not yet filled), nothing
    changes: a prefix ignores the ``.pyc`` files beside the sources, so an empty one would cost the first run.
    """
    prefix = Path(path) / BYTECODE_DIR if path else None
    if prefix is None or not prefix.is_dir():
        return False
    sys.pycache_prefix = str(prefix)
    sys.dont_write_bytecode = False  # a module first imported now is written there too
    return True


def fill_bytecode_cache(path: str, modules: Iterable[object]) -> subprocess.Popen[bytes] | None:
    """Compile the sources of ``modules`` (all this process imported) into ``path``/bytecode, in the background.

    ``compileall`` runs as its own process at the lowest priority, so the training loop loses no time to it;
    it writes each file atomically, so ranks of several nodes may fill one shared directory at once.
    """
    if not path:
        return None
    sources = sorted({f for m in modules if isinstance(f := getattr(m, "__file__", None), str) and f.endswith(".py")})
    prefix = Path(path) / BYTECODE_DIR
    prefix.mkdir(parents=True, exist_ok=True)
    listing = prefix / f"modules-{os.getpid()}.txt"
    listing.write_text("\n".join(sources) + "\n")
    job = subprocess.Popen(
        [sys.executable, "-m", "compileall", "-q", "-i", str(listing)],
        env={**os.environ, "PYTHONPYCACHEPREFIX": str(prefix)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    with contextlib.suppress(OSError):  # set from here: a preexec_fn is unsafe in a threaded process
        os.setpriority(os.PRIO_PROCESS, job.pid, 19)
    return job


def finish_bytecode_cache(job: subprocess.Popen[bytes] | None, timeout: float = 120.0) -> None:
    """Let a background fill end before the process does (short jobs); past ``timeout`` it is left to run."""
    if job is None:
        return
    with contextlib.suppress(subprocess.TimeoutExpired):
        job.wait(timeout)


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
