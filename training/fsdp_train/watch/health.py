"""A rank's health: cheap step timings, and a watchdog thread that says where the rank is when it stops progressing.

What runs on the training thread is a few clock reads per step (:meth:`Monitor.step`, :meth:`Monitor.data`): no
device synchronisation, no hooks, no profiler. Everything else runs on one daemon thread per rank:

- it samples the training thread's Python stack every :data:`SAMPLE_SECONDS` (``sys._current_frames``) and counts
  the samples inside a collective (``torch.distributed``, or Ray Train's own barriers: the one in every
  ``ray.train.report``, ``ray.train.collective``): the share of time exposed waiting for peers, the figure that
  tells a straggler (which waits least) from the ranks that wait for it;
- when the rank made no progress for its hang timeout it takes every thread's stack and emits a signed ``Stall``
  event naming where the training thread is: waiting in a collective (``all_reduce``), or in code at
  ``file:line`` (:func:`locate`); with NCCL, the flight recorder's last collectives (``fsdp_train.watch.flight``).

Why in-process and not py-spy: py-spy needs ``CAP_SYS_PTRACE`` in the pod and a binary of its own; reading the
interpreter's own frames needs neither. What it cannot see: a thread that holds the GIL and never returns to the
interpreter (then the watchdog cannot run; the operator sees the rank silent instead). docs/health.md.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from types import CodeType, FrameType
from typing import Any

from fsdp_train.contract.events import Event, emit
from fsdp_train.contract.health_events import SAMPLE_SECONDS, RankHealth, Stall, Where
from fsdp_train.contract.wire import TEXT_LIMITS

REPORT_EVERY_SECONDS = 10.0
"""Least time between two ``RankHealth`` reports of a rank (each also needs :attr:`HealthConfig.window_steps`
steps): at most 6 lines a minute per rank, whatever the step rate."""
DERIVED_TIMEOUT_FACTOR = 10.0
"""Unset ``hangTimeoutSeconds``: this many times the rank's median step time ..."""
DERIVED_TIMEOUT_FLOOR = 300.0
"""... and never less than this (a checkpoint or a slow step must not read as a hang)."""
LONG_SECTION_FLOOR = 600.0
"""Inside an evaluation, a checkpoint or an export the timeout is at least this: they take many steps' time."""
ENABLED_ENV = "FSDP_TRAIN_HEALTH"
"""Under torchrun (no operator): ``0`` turns the timings and the watchdog off (the overhead benchmark's baseline)."""
STACK_FRAMES = 12
"""Innermost frames of the training thread kept in a ``Stall`` (its whole stack goes to stderr)."""

_COLLECTIVE_DIRS = (f"{os.sep}torch{os.sep}distributed{os.sep}",)
_RAY_TRAIN_DIRS = (f"{os.sep}ray{os.sep}train{os.sep}",)
_RAY_TRAIN_BARRIERS = {
    "_sync_checkpoint_dir_name_across_ranks": "ray.train.report",
    "barrier": "ray.train.collective.barrier",
    "broadcast_from_rank_zero": "ray.train.collective.broadcast_from_rank_zero",
}
"""Ray Train's functions that wait for every rank (its synchronization actor), by the name a user knows: every
``ray.train.report`` passes one, so a rank slow before its report makes the others wait there, not in torch."""
_LIBRARY_DIRS = (
    f"{os.sep}torch{os.sep}",
    f"{os.sep}ray{os.sep}",
    f"{os.sep}threading.py",
    f"{os.sep}concurrent{os.sep}",
    "<frozen ",
)
_PLUMBING = frozenset({"health.py", "user_function.py", "ray_entry.py", "steps.py"})
"""The project's own files that only carry the training function (never where a rank is stuck)."""
_WRAPPERS = frozenset({"wrapper", "inner", "_fn", "decorate_context", "_wrapped_call_impl", "_call_impl"})


@dataclass(frozen=True, slots=True)
class HealthConfig:
    """What the operator hands the ranks from ``spec.health`` (the entrypoint's ``health``)."""

    enabled: bool = True
    hang_timeout_seconds: float | None = None
    """None: derived (:data:`DERIVED_TIMEOUT_FACTOR` x the median step time, at least :data:`DERIVED_TIMEOUT_FLOOR`)."""
    window_steps: int = 20
    """Steps (at least) that one ``RankHealth`` report covers."""

    @classmethod
    def from_dict(cls, d: Any) -> HealthConfig:
        if d is None:
            return cls()
        if not isinstance(d, dict):
            raise ValueError("health must be a mapping.")
        unknown = sorted(set(d) - {"enabled", "hang_timeout_seconds", "window_steps"})
        if unknown:
            raise ValueError(f"health.{unknown[0]} is not a known field.")
        enabled = d.get("enabled", True)
        timeout = d.get("hang_timeout_seconds")
        window = d.get("window_steps", 20)
        if not isinstance(enabled, bool):
            raise ValueError(f"health.enabled must be true or false, got {enabled!r}.")
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0):
            raise ValueError(f"health.hang_timeout_seconds must be a number above 0, got {timeout!r}.")
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise ValueError(f"health.window_steps must be an integer of 1 or more, got {window!r}.")
        return cls(enabled=enabled, hang_timeout_seconds=float(timeout) if timeout else None, window_steps=window)

    def to_dict(self) -> dict[str, Any]:
        return {
            "enabled": self.enabled,
            "hang_timeout_seconds": self.hang_timeout_seconds,
            "window_steps": self.window_steps,
        }


# --- where a thread is --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Location:
    where: Where
    at: str
    """``file.py:line in function``: the collective's call site for ``collective``, the code's frame otherwise."""
    collective: str = ""


def _short(frame: FrameType) -> str:
    code = frame.f_code
    return f"{os.path.basename(code.co_filename)}:{frame.f_lineno} in {code.co_name}"


def _stack(frame: FrameType | None) -> list[FrameType]:
    """The frames from `frame` outwards (innermost first)."""
    frames = []
    while frame is not None:
        frames.append(frame)
        frame = frame.f_back
    return frames


def _in(filename: str, dirs: tuple[str, ...]) -> bool:
    return any(d in filename for d in dirs)


def collective_name(code: CodeType) -> str | None:
    """The collective a frame of `code` is part of: a ``torch.distributed`` function (not a decorator's wrapper) by
    its name, a Ray Train barrier by its public name; None for any other code."""
    if _in(code.co_filename, _COLLECTIVE_DIRS):
        return None if code.co_name in _WRAPPERS else code.co_name
    if _in(code.co_filename, _RAY_TRAIN_DIRS):
        return _RAY_TRAIN_BARRIERS.get(code.co_name)
    return None


def _code(filename: str) -> bool:
    """A frame of code that can be where a rank is stuck: not torch, Ray or the standard library's threading, and
    not the project's plumbing around the training function."""
    return not _in(filename, _LIBRARY_DIRS) and os.path.basename(filename) not in _PLUMBING


def locate(frame: FrameType | None) -> Location:
    """Where a thread whose innermost frame is `frame` stands.

    ``collective`` when a collective's frame is on its stack: named by the innermost one (:func:`collective_name`:
    ``all_reduce``, FSDP's ``wait_for_unshard``, ``ray.train.report``), ``at`` the innermost code frame that called
    into it. Else ``code`` at the innermost frame outside torch, Ray and the project's plumbing; ``unknown`` with no
    such frame.
    """
    frames = _stack(frame)
    collective = next(((f, name) for f in frames if (name := collective_name(f.f_code)) is not None), None)
    code = next((f for f in frames if _code(f.f_code.co_filename)), None)
    if collective is not None:
        inner, name = collective
        return Location("collective", _short(code if code is not None else inner), name)
    if code is not None:
        return Location("code", _short(code))
    return Location("unknown", _short(frames[0]) if frames else "")


class _Classifier:
    """Whether a frame's code is part of a collective (:func:`collective_name`), cached per code object (the
    sampler's hot path)."""

    def __init__(self) -> None:
        self._seen: dict[CodeType, bool] = {}

    def in_collective(self, frame: FrameType | None) -> bool:
        while frame is not None:
            code = frame.f_code
            hit = self._seen.get(code)
            if hit is None:
                if len(self._seen) > 65536:
                    self._seen.clear()
                hit = self._seen[code] = collective_name(code) is not None
            if hit:
                return True
            frame = frame.f_back
        return False


def stack_text(frames: Mapping[int, FrameType], training: int, limit: int = TEXT_LIMITS["stack"]) -> str:
    """The training thread's innermost :data:`STACK_FRAMES` frames (innermost last), then each other thread's
    innermost frame; ``|``-separated, one line."""
    own = [_short(f) for f in reversed(_stack(frames.get(training))[:STACK_FRAMES])]
    others = [f"thread {ident}: {_short(f)}" for ident, f in frames.items() if ident != training]
    return " | ".join([*own, *others])[:limit]


_ACTIVE: set[Monitor] = set()
"""The monitors running in this process (:func:`stop_monitors`)."""


def stop_monitors() -> None:
    """Stop every monitor of this process: its training function ended (a failed rank is no stalled one)."""
    for monitor in list(_ACTIVE):
        monitor.stop()


def flight_for(device: Any = None) -> Callable[[], str] | None:
    """The flight recorder's summary of this rank's last collectives where it records (a buffer size set: NCCL's,
    and gloo's in torch 2.13); else None."""
    from fsdp_train.watch import flight

    return flight.summary if flight.recording() else None


FLIGHT_SECONDS = 5.0
"""Longest wait for the flight recorder's dump: a stall is reported without it rather than not at all."""


def _within(seconds: float, read: Callable[[], str]) -> str:
    """`read()` on a thread of its own, its result if it came within `seconds` without raising; else empty."""
    result: list[str] = []

    def run() -> None:
        with contextlib.suppress(Exception):  # the flight recorder is evidence, never a reason to fail
            result.append(read())

    worker = threading.Thread(target=run, name="fsdp-health-flight", daemon=True)
    worker.start()
    worker.join(seconds)
    return result[0] if result else ""


# --- the monitor --------------------------------------------------------------------------------------------


@dataclass(slots=True)
class _Window:
    step_seconds: list[float]
    data_seconds: float = 0.0
    samples: int = 0
    in_collective: int = 0


class Monitor:
    """One rank's timings and watchdog. The training thread calls :meth:`step` (progress), :meth:`data` (around the
    wait for a batch), :meth:`begin_long` and :meth:`end_long` (around an evaluation, checkpoint, export); the
    watchdog thread does the rest. Everything the training thread calls is a few clock reads and list appends."""

    def __init__(
        self,
        rank: int,
        config: HealthConfig,
        *,
        clock: Callable[[], float] = time.monotonic,
        send: Callable[[Event], None] = emit,
        flight: Callable[[], str] | None = None,
    ) -> None:
        self.rank = rank
        self.config = config
        self._clock = clock
        self._send = send
        self._flight = flight
        self._training = threading.get_ident()
        self._lock = threading.Lock()
        self._step = 0
        self._last_progress: float | None = None  # None: not armed (before the first step)
        self._window = _Window([])
        self._recent: list[float] = []  # the last steps' seconds, for the derived timeout
        self._last_report = clock()
        self._long = 0
        self._stalled_at: float | None = None  # when the current stall was last reported
        self._stop = threading.Event()
        self._classifier = _Classifier()
        self._thread: threading.Thread | None = None

    # --- the training thread ---
    def start(self) -> Monitor:
        if self.config.enabled and self._thread is None:
            self._thread = threading.Thread(target=self._watch, name="fsdp-health", daemon=True)
            self._thread.start()
            _ACTIVE.add(self)
        return self

    def stop(self) -> None:
        self._stop.set()
        _ACTIVE.discard(self)
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5.0)
        self._thread = None

    def step(self, step: int) -> None:
        """Step `step` finished on this rank (or was queued: the loop's host-side step)."""
        if not self.config.enabled:
            return
        now = self._clock()
        with self._lock:
            if self._last_progress is not None:
                seconds = now - self._last_progress
                self._window.step_seconds.append(seconds)
                self._recent.append(seconds)
                if len(self._recent) > 64:
                    del self._recent[:32]
            self._step, self._last_progress, self._stalled_at = step, now, None
            report = self._report_due(now)
        if report is not None:
            self._send(report)

    @contextlib.contextmanager
    def data(self) -> Iterator[None]:
        """Around the wait for the next batch: its time is this step's data wait."""
        if not self.config.enabled:
            yield
            return
        started = self._clock()
        try:
            yield
        finally:
            self._window.data_seconds += self._clock() - started

    def begin_long(self) -> None:
        """Work that takes many steps' time begins (evaluation, checkpoint, export): the timeout is longer there."""
        self._long += 1

    def end_long(self) -> None:
        """It ended: finishing it is progress, and its time is no step's."""
        self._long = max(self._long - 1, 0)
        with self._lock:
            if self._last_progress is not None:
                self._last_progress = self._clock()

    # --- figures ---
    def timeout(self) -> float:
        """The stall threshold now: configured, or derived from the recent steps; longer inside a long section."""
        configured = self.config.hang_timeout_seconds
        if configured is not None:
            base = configured
        else:
            median = statistics.median(self._recent) if self._recent else 0.0
            base = max(DERIVED_TIMEOUT_FLOOR, DERIVED_TIMEOUT_FACTOR * median)
        return max(base, LONG_SECTION_FLOOR) if self._long else base

    def _report_due(self, now: float) -> RankHealth | None:
        window = self._window
        if len(window.step_seconds) < self.config.window_steps or now - self._last_report < REPORT_EVERY_SECONDS:
            return None
        self._window, self._last_report = _Window([]), now
        steps = len(window.step_seconds)
        return RankHealth(
            rank=self.rank,
            step=self._step,
            steps=steps,
            step_seconds=statistics.median(window.step_seconds),
            data_seconds=window.data_seconds / steps,
            collective_fraction=window.in_collective / window.samples if window.samples else 0.0,
            samples=window.samples,
            hang_timeout_seconds=self.timeout(),
        )

    # --- the watchdog thread ---
    def _watch(self) -> None:
        while not self._stop.wait(SAMPLE_SECONDS):
            try:
                self._tick()
            except Exception as e:  # the watchdog must never take the rank down; say it once and stop
                print(f"fsdp_train: health watchdog stopped: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
                return

    def _tick(self) -> None:
        frame = sys._current_frames().get(self._training)
        if frame is None:
            return  # the training thread has ended
        hit = self._classifier.in_collective(frame)
        with self._lock:
            if self._last_progress is not None:
                self._window.samples += 1
                self._window.in_collective += hit
            last = self._last_progress
        if last is None:
            return
        now = self._clock()
        timeout = self.timeout()
        if now - last < timeout:
            return
        if self._stalled_at is not None and now - self._stalled_at < max(timeout, 30.0):
            return  # reported already; again only after another timeout (a lost line is said again)
        self._stalled_at = now
        self._send(self.stall(now - last))

    def stall(self, seconds: float) -> Stall:
        """The ``Stall`` event for this moment: where the training thread is, every thread's stack (also written in
        full to stderr, by ``faulthandler``)."""
        frames = sys._current_frames()
        here = locate(frames.get(self._training))
        collective = here.collective
        if self._flight is not None and here.where == "collective" and collective not in _RAY_TRAIN_BARRIERS.values():
            collective = _within(FLIGHT_SECONDS, self._flight) or collective
        with contextlib.suppress(Exception):
            print(f"fsdp_train: rank {self.rank} made no progress for {seconds:.0f}s; its threads:", file=sys.stderr)
            sys.stderr.flush()
            faulthandler.dump_traceback(all_threads=True)
        return Stall(
            rank=self.rank,
            step=self._step,
            seconds=seconds,
            where=here.where,
            at=here.at,
            collective=collective,
            stack=stack_text(frames, self._training),
            threads=len(frames),
        )


@contextlib.contextmanager
def watching_reports(
    rank: int, config: HealthConfig, step_of: Callable[[Any, int], int] | None = None
) -> Iterator[Monitor]:
    """A user function's progress is its ``ray.train.report`` calls: inside, each call is a step of the monitor,
    numbered by ``step_of(metrics, reports so far)`` (the step the function reported, so that a resumed group's
    stall says "after step 6", not its own third report), else by the count of reports.

    ``ray.train.report`` is replaced by a wrapper for the time of the function (looked up at call time, as
    ``ray.train.report(...)`` does; a ``from ray.train import report`` made inside the function gets it too).
    """
    import ray.train

    monitor = Monitor(rank, config, flight=flight_for()).start()
    original = ray.train.report
    reports = 0

    def report(*args: Any, **kwargs: Any) -> Any:
        nonlocal reports
        try:
            return original(*args, **kwargs)
        finally:
            reports += 1
            metrics = args[0] if args else kwargs.get("metrics")
            monitor.step(step_of(metrics, reports) if step_of is not None else reports)

    ray.train.report = report
    try:
        yield monitor
    finally:
        ray.train.report = original
        monitor.stop()
