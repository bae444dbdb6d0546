"""Python's garbage collections in this process, timed: what the load test reports for each of its processes."""

from __future__ import annotations

import gc
import time
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def collector_pauses() -> Iterator[list[tuple[float, float]]]:
    """(time.monotonic at the end, seconds) of each garbage collection in this process while the block runs."""
    pauses: list[tuple[float, float]] = []
    started = [0.0]

    def record(phase: str, _: dict[str, int]) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            pauses.append((time.monotonic(), time.perf_counter() - started[0]))

    gc.callbacks.append(record)
    try:
        yield pauses
    finally:
        gc.callbacks.remove(record)


def paused_within(pauses: list[tuple[float, float]], start: float, end: float) -> float:
    """Seconds of the collections in `pauses` that ended between `start` and `end` (time.monotonic)."""
    return sum(seconds for at, seconds in pauses if start <= at <= end)
