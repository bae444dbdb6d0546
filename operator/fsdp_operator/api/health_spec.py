"""`spec.health`: when a rank counts as stalled or as a straggler, and what a stall does to the job.

Declared here (the spec's own module keeps to the project's module size) and used as one group of `Spec`.
The ranks apply the hang timeout themselves (`fsdp_train.watch.health`); the operator folds what they report
(`decide/health.py`). docs/health.md says what each signal costs and what it cannot see.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from fsdp_operator.api.fields import field as declare

OnHang = Literal["Restart", "Fail"]

DERIVED_TIMEOUT_DOC = (
    "Unset: derived on each rank from its own step time, 10x the median of its recent steps and never less "
    "than 300 s (600 s inside an evaluation, a checkpoint or an export)."
)


@dataclass(frozen=True, slots=True)
class Health:
    """How a stalled rank (no progress) and a straggler (slower than the others) are judged (docs/health.md)."""

    hang_timeout_seconds: int | None = declare(
        "A rank that finishes no step (for spec.trainFunction: makes no ray.train.report call) for this long is "
        "stalled; it reports where it is, and the job follows onHang. Counted from its first step (start-up and "
        "compilation are not judged). " + DERIVED_TIMEOUT_DOC,
        minimum=10,
        maximum=86400,
    )
    on_hang: OnHang = declare(
        "What a stalled rank does to the job: Restart stops the attempt and starts a new one from the latest "
        "checkpoint, counted against runPolicy.backoffLimit (Failed once it is spent); Fail ends the job Failed. "
        "Either way status.health keeps where each rank was.",
        default="Restart",
    )
    straggler_ratio: float = declare(
        "A rank whose own work per step (its median step time less its time waiting in collectives) is this many "
        "times the median rank's is a straggler (condition Straggler=True; the job goes on).",
        default=1.5,
        minimum=1.1,
        maximum=100.0,
    )
    straggler_window_steps: int = declare(
        "Steps each rank's health report covers (at least; and at least 10 s): the straggler verdict is over "
        "one such window of every rank, medians within it.",
        default=20,
        minimum=5,
        maximum=100000,
    )

    def for_ranks(self) -> dict[str, Any]:
        """The entrypoint's `health` (`fsdp_train.watch.health.HealthConfig`)."""
        return {
            "enabled": True,
            "hang_timeout_seconds": self.hang_timeout_seconds,
            "window_steps": self.straggler_window_steps,
        }
