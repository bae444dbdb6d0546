"""Many event lines of a job log, parsed and folded in a worker process, off the operator's event loop."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from fsdp_train.contract.events import Verifier, parse_log

from fsdp_operator.decide.observed import (
    Decision,
    Observed,
)
from fsdp_operator.decide.reconcile import reconcile
from fsdp_operator.decide.status import JobStatus

Obj = dict[str, Any]


@dataclass(frozen=True, slots=True)
class LogChunk:
    """Whole lines of one log chunk waiting to be parsed, and the verifier state they are checked against."""

    text: str
    key: bytes
    last_seq: dict[int, int]


def parse_and_reconcile(
    chunk: LogChunk, obj: Obj, status: JobStatus, observed: Observed, settings: dict[str, Any]
) -> tuple[Decision, Observed, dict[int, int]]:
    """Parse `chunk` into `observed` and decide: (the decision, what was observed without the events, the
    verifier's state after the chunk). Pure; run in the log worker process for large chunks."""
    verifier = Verifier(chunk.key)
    verifier.last_seq = dict(chunk.last_seq)
    parsed = parse_log(chunk.text.splitlines(), verifier)
    observed = replace(
        observed,
        events=parsed.events,
        skipped_lines=observed.skipped_lines + parsed.malformed,
        forged_lines=observed.forged_lines + parsed.forged,
    )
    decision = reconcile(obj, status, observed, **settings)
    return decision, replace(observed, events=()), verifier.last_seq
