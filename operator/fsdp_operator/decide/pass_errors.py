"""A pass that raised, or that contained an error and went on: the `ReconcileError` condition, and folding that
skips only the events it cannot fold."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

from fsdp_train.contract.events import clean_text

from fsdp_operator.api.spec import Job
from fsdp_operator.decide.folding import Folded, fold_events
from fsdp_operator.decide.observed import RAY_SUCCEEDED, Action, Decision, Observed, PostEvent
from fsdp_operator.decide.status import ConditionType, JobStatus, get_condition, set_condition


def describe(error: BaseException) -> str:
    """One line for the `ReconcileError` condition: the exception's type and its (cut) message."""
    return f"{type(error).__name__}: {str(error)[:900]}"


def error_recorded(
    before: JobStatus, new: JobStatus, error: str, now: datetime
) -> tuple[JobStatus, tuple[Action, ...]]:
    """`new` with the `ReconcileError` condition True, and a Warning event unless the same error was already told."""
    message = clean_text(error, 1024)
    previous = get_condition(before.conditions, ConditionType.RECONCILE_ERROR)
    new = replace(
        new,
        conditions=set_condition(
            new.conditions, ConditionType.RECONCILE_ERROR, "True", "PassFailed", message,
            now=now, generation=before.observed_generation,
        ),
    )  # fmt: skip
    repeated = previous is not None and previous.get("status") == "True" and previous.get("message") == message
    return new, () if repeated else (PostEvent("Warning", "ReconcileError", message),)


def error_cleared(decision: Decision, now: datetime) -> Decision:
    """A pass that went through after failed ones: `ReconcileError` turns False."""
    condition = get_condition(decision.status.conditions, ConditionType.RECONCILE_ERROR)
    if condition is None or condition.get("status") != "True":
        return decision
    conditions = set_condition(
        decision.status.conditions,
        ConditionType.RECONCILE_ERROR,
        "False",
        "PassSucceeded",
        "the last pass over the job succeeded",
        now=now,
        generation=decision.status.observed_generation,
    )
    return replace(decision, status=replace(decision.status, conditions=conditions))


def fold_contained(job: Job, status: JobStatus, obs: Observed) -> tuple[Folded, str]:
    """This pass's events folded, and the error of those whose folding raised ("" when none did).

    Folding should never raise; should it (a bug no check foresaw), the events are folded one at a time and only
    those that raise are skipped: one bad line must not take the lines read with it (a transport line lost beside
    it failed a finished job as `TransportUnverified`). Folding is idempotent and keeps its state in the status,
    so one event at a time gives what one batch gives."""
    # The requireEFA deadline at the latest: the Ray job succeeded and its whole log is folded.
    ended = obs.ray_job is not None and obs.ray_job.status == RAY_SUCCEEDED and not obs.log_pending
    try:
        return fold_events(job, status, obs.events, now=obs.now, forged=obs.forged_lines, job_ended=ended), ""
    except Exception as e:  # contained: becomes the ReconcileError condition
        error = describe(e)
    rejected, skipped = 0, 0
    for event in obs.events:
        try:
            one = fold_events(job, status, (event,), now=obs.now)
        except Exception:  # this event alone: skipped and counted
            skipped += 1
            continue
        status, rejected = one.status, rejected + one.rejected
    # The pass's own inputs once: the forged lines' count, the deadline once every event is in.
    last = fold_events(job, replace(status, skipped_events=status.skipped_events + skipped), (), now=obs.now,
                       forged=obs.forged_lines, job_ended=ended)  # fmt: skip
    return replace(last, rejected=rejected + skipped), f"{error} (folding {skipped} event(s); skipped, the rest folded)"
