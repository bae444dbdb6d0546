"""The step loop's hot-path helpers: losses read one step late, and Python's garbage collector on a schedule.

Reading a step's loss (``.item()``) makes the host wait for the device. Read at the end of the step that
produced it, the device then idles while the host starts queueing the next step (4-5 ms a step on one
H200 at 1.5B, docs/performance.md). ``LaggedSteps`` reads step N's loss after step N+1 is queued: the wait
overlaps with device work, and the figures are the same numbers, only reported a step later. On a GPU the loss
is copied to pinned host memory behind step N's work and an event marks that point: reading it waits for step N
alone. A plain read (``.tolist()`` of the device tensor) waits for everything queued on the stream, step N+1
included: the device then idled at every step's start as before, and a step read right after the one before it
(the last step, a step before a checkpoint) got the time of a read, under a millisecond (21.7 million tokens/s
for the last step of a 1.5B run on an H200). A step's time comes from device events (``LaggedSteps``); where the
host runs the work itself (the CPU), it ends when the step's work was queued, never when its result was read: read
times said as little there (a checkpoint's step and the last step read in 0.0002 s, the step after them booked both).

Python's cyclic garbage collector can pause the host mid-step for hundreds of milliseconds (a 1.5B model's
modules, hooks and compiled graphs are many objects); ``collected_every`` turns the automatic collector off
for the loop and collects the young generations every N steps instead, as torchtitan does.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from fsdp_train.contract.events import Step
from fsdp_train.watch.metrics import Metrics, StepMetrics

GC_EVERY_STEPS = 50
"""Steps between two garbage collections (generation 1) while the loop runs."""


@dataclass(frozen=True, slots=True)
class StepStart:
    """When a step began: the host's clock, and on a GPU an event queued behind the work before it (it completes
    when the device is done with the steps before, or at once when the device was idle)."""

    host: float
    device: torch.cuda.Event | None = None


@dataclass(slots=True)
class _Queued:
    step: int
    values: torch.Tensor
    """The loss (or [loss, grad norm]): on the host, filled by an asynchronous copy on a GPU."""
    start: StepStart
    end: torch.cuda.Event | None
    """On a GPU: recorded behind the step's work and the copy of its values."""
    queued_at: float
    """The host's clock when the step's work was queued: on the CPU, when that work was done."""
    progress: dict[str, Any]


@dataclass(slots=True)
class LaggedSteps:
    """Steps whose loss is still on the device, logged through ``metrics`` once read back.

    A step's time is from when it started (or the device finished the step before, if later) to when the device
    finished it, measured by the device's events on a GPU: the host reads a step's result whenever the next step's
    queueing lets it, which says little of when the device was done (the last step, read right after the one before
    it, took 0.11 s by the host's clock against 0.33 s of device work). Elsewhere (the CPU, which runs each step's
    work as it is queued) the host's clock from the step's start to when ``launched`` was called. Either way a
    step read late or early keeps its own time: a read is never part of it.
    """

    metrics: Metrics
    device: torch.device
    tokens_per_step: int
    clock: Callable[[], float] = time.perf_counter
    """The host's clock (a test's own clock drives the host path)."""
    _queued: list[_Queued] = field(default_factory=list)

    def start(self) -> StepStart:
        """Mark a step's beginning (before its data is read and its work queued)."""
        event = None
        if self.device.type == "cuda":
            event = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            event.record()
        return StepStart(self.clock(), event)

    def launched(self, step: int, loss: torch.Tensor, start: StepStart, progress: dict[str, Any]) -> Step | None:
        """Queue ``step`` (its loss, or ``[loss, grad norm]``, still on the device) and log the step before it, if
        one is waiting."""
        values, end, queued_at = loss, None, self.clock()
        if loss.device.type == "cuda":
            values = torch.empty(loss.shape, dtype=loss.dtype, pin_memory=True)
            values.copy_(loss, non_blocking=True)
            end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            end.record()
        event = self.finish() if self._queued else None
        self._queued.append(_Queued(step, values, start, end, queued_at, progress))
        return event

    def finish(self) -> Step:
        """Read back the oldest queued step's loss (waiting for the device to finish that step) and log it."""
        queued = self._queued.pop(0)
        if queued.end is not None:
            queued.end.synchronize()  # this step's work and the copy of its values, not the steps queued after
        loss, *rest = queued.values.reshape(-1).tolist()  # the loss and the grad norm together
        grad_norm = float(rest[0]) if rest else None
        if queued.end is not None and queued.start.device is not None:
            seconds = queued.start.device.elapsed_time(queued.end) / 1000.0
        else:
            seconds = queued.queued_at - queued.start.host
        peak = torch.cuda.max_memory_allocated(self.device) if self.device.type == "cuda" else 0
        figures = StepMetrics(queued.step, float(loss), seconds, self.tokens_per_step, peak, grad_norm=grad_norm)
        return self.metrics.log(dataclasses.replace(figures, **queued.progress))

    @property
    def pending(self) -> int:
        return len(self._queued)


@contextlib.contextmanager
def collected_every(steps: int) -> Iterator[Callable[[int], None]]:
    """Python's automatic garbage collection off inside; the yielded ``collect(step)`` collects every ``steps``.

    The collector's previous state is restored on the way out, also on an exception.
    """
    was_enabled = gc.isenabled()
    gc.disable()

    def collect(step: int) -> None:
        if steps > 0 and step > 1 and step % steps == 0:
            gc.collect(1)

    try:
        yield collect
    finally:
        if was_enabled:
            gc.enable()
