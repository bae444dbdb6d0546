"""The events of a rank's health (``fsdp_train.watch.health``): its step timings, and where it stands when it stalls.

Declared apart from ``fsdp_train.contract.events`` (which keeps to the project's module size); its schema lists them, so
they are parsed by the same total, bounded parser (every field typed and cut to the bounds of
``fsdp_train.contract.wire``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from fsdp_train.contract.event_base import Event

SAMPLE_SECONDS = 0.05
"""Interval between two samples of the training thread's stack (20 per second: ~1 ms of one core per second); the
operator reads it too (own work per step below it is under what the samples resolve)."""

Where = Literal["collective", "code", "unknown"]
"""Where a stalled rank's training thread is: inside a ``torch.distributed`` call (waiting for its peers), in
code outside torch and Ray (its own work: a data reader, a user function), or not known (no frame to read)."""


@dataclass(kw_only=True, slots=True)
class RankHealth(Event):
    """One rank's step timings over the steps since its previous report (at most one report per interval)."""

    kind: ClassVar[str] = "health"
    step: int
    """The last step this rank finished (for a user function: ``ray.train.report`` calls)."""
    steps: int
    """Steps the figures are over."""
    step_seconds: float
    """Median wall time of one step on this rank (host clock, no device synchronisation)."""
    data_seconds: float = 0.0
    """Mean time per step waiting for the next batch (bundled function; 0 where not measured)."""
    collective_fraction: float = 0.0
    """Share of the training thread's sampled stacks inside a collective (``torch.distributed``, Ray Train's
    barriers): time exposed waiting for peers."""
    samples: int = 0
    """Stack samples the fraction is over."""
    hang_timeout_seconds: float = 0.0
    """The stall threshold this rank applies now (configured, or derived from its step time)."""


@dataclass(kw_only=True, slots=True)
class Stall(Event):
    """This rank made no progress for its hang timeout: where its training thread is, and its stack."""

    kind: ClassVar[str] = "stall"
    step: int
    """The last step this rank finished."""
    seconds: float
    """Since its last progress."""
    where: Where
    at: str = ""
    """``file.py:line in function`` of the innermost frame that says where (see ``fsdp_train.watch.health.locate``)."""
    collective: str = ""
    """For ``collective``: the ``torch.distributed`` call (``all_reduce``) or Ray Train's barrier
    (``ray.train.report``); for torch's, with NCCL's flight recorder, its summary (``all_reduce #12 entered, #11
    completed``)."""
    stack: str = ""
    """The training thread's innermost frames, innermost last, ``|``-separated; then the other threads' tops."""
    threads: int = 0
