"""The step loop's hot-path helpers: losses read one step late, and Python's garbage collector on a schedule.

Reading a step's loss (``.item()``) makes the host wait for the device. Read at the end of the step that
produced it, the device then idles while the host starts queueing the next step (4-5 ms a step on one
H200 at 1.5B, docs/performance.md). ``LaggedSteps`` reads step N's loss after step N+1 is queued: the wait
overlaps with device work, and the figures are the same numbers, only reported a step later.

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

from fsdp_train.events import Step
from fsdp_train.metrics import Metrics, StepMetrics

GC_EVERY_STEPS = 50
"""Steps between two garbage collections (generation 1) while the loop runs."""


@dataclass(slots=True)
class _Queued:
    step: int
    loss: torch.Tensor
    started: float
    progress: dict[str, Any]


@dataclass(slots=True)
class LaggedSteps:
    """Steps whose loss is still on the device, logged through ``metrics`` once read back.

    A step's time is from when it started (or the previous step's result was read, if later) to when
    its own result was read: in steady state the device's time per step, with host waits overlapped.
    """

    metrics: Metrics
    device: torch.device
    tokens_per_step: int
    _queued: list[_Queued] = field(default_factory=list)
    _last_read: float = 0.0

    def launched(self, step: int, loss: torch.Tensor, started: float, progress: dict[str, Any]) -> Step | None:
        """Queue ``step`` (its loss, or ``[loss, grad norm]``, still on the device) and log the step before it, if
        one is waiting."""
        event = self.finish() if self._queued else None
        self._queued.append(_Queued(step, loss, started, progress))
        return event

    def finish(self) -> Step:
        """Read back the oldest queued step's loss (waiting for the device) and log it."""
        queued = self._queued.pop(0)
        loss, *rest = queued.loss.reshape(-1).tolist()  # one wait for the loss and the grad norm
        grad_norm = float(rest[0]) if rest else None
        now = time.perf_counter()
        seconds = now - max(self._last_read, queued.started)
        self._last_read = now
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
