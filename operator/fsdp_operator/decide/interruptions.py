"""A worker's node going away: the ranks' reports folded into `status.interruptions`, and the next attempt. Pure.

The ranks (``fsdp_train.watch.notice``) stop after the same step once a worker pod has been told it goes away (its
``preStop`` hook; the operator deletes the pod of a node with a termination taint, `nodes.py` in runtime/),
save a checkpoint when it fits, and the local rank 0 of each pod that had the notice reports an ``Interruption``
event. Each becomes one entry here, keyed by attempt and pod: where the ranks stopped, whether the checkpoint was
saved, the checkpoint the next attempt resumes from, the steps lost (stopped step minus that checkpoint: 0 when
the save was made, the step in flight having been finished), and the seconds from the notice to the checkpoint.

An attempt whose Ray job ends after such a report goes on as the next attempt, back to Provisioning (the workers,
the replaced pod among them, are waited for again), and does not count against `runPolicy.backoffLimit`.
docs/reliability.md, "A node that goes away".
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from fsdp_train.contract.events import Interruption, clean_text

from fsdp_operator.api.spec import Job
from fsdp_operator.decide.guards import _job_submitted_false, _next_attempt
from fsdp_operator.decide.observed import Action, Decision, DeletePod, Observed, PostEvent
from fsdp_operator.decide.status import JobStatus, Phase, Reason, format_time

KEPT = 16
"""`status.interruptions` keeps the newest this many entries."""


def folded(entries: list[dict[str, Any]], event: Interruption, attempt: int, total_steps: int) -> list[dict[str, Any]]:
    """`entries` with `event` (one pod's report in `attempt`) in, replacing that pod's earlier report of it."""
    if not 0 <= event.checkpoint_step <= event.step <= total_steps or not event.seconds >= 0:
        return entries  # no run reports that: never a status entry
    try:
        noticed = format_time(datetime.fromtimestamp(event.notice_time, UTC)) if event.notice_time > 0 else None
    except (OverflowError, OSError, ValueError):
        noticed = None
    entry: dict[str, Any] = {
        "attempt": attempt,
        "pod": clean_text(event.pod, 253),
        "node": clean_text(event.node, 253),
        "reason": clean_text(event.reason, 64) or "preStop",
        "noticeTime": noticed,
        "step": event.step,
        "saved": event.saved,
        "checkpointStep": event.checkpoint_step,
        "stepsLost": event.step - event.checkpoint_step,
        "secondsToSaved": round(event.seconds, 2) if event.saved else None,
        "secondsToDecision": None if event.saved else round(event.seconds, 2),
        "message": clean_text(event.message, 512),
    }
    entry = {k: v for k, v in entry.items() if v not in (None, "")}
    key = (attempt, entry.get("pod"))
    for earlier in entries:
        if (
            (earlier.get("attempt"), earlier.get("pod")) == key
            and earlier.get("by") == "operator"
            and (earlier.get("reason") != "PodDeleted")
        ):
            # The operator saw the node's taint first: its reason and time of notice stand.
            entry.update({k: earlier[k] for k in ("reason", "noticeTime", "by") if k in earlier})
    kept = [e for e in entries if (e.get("attempt"), e.get("pod")) != key]
    return [*kept, entry][-KEPT:]


def on_node_notices(job: Job, status: JobStatus, obs: Observed) -> tuple[JobStatus, tuple[Action, ...]]:
    """Worker pods on nodes a termination taint marks: each deleted once (its preStop hook starts the save), and
    an entry saying which node, which taint, when; the ranks' report completes it."""
    seen = {e.get("pod") for e in of_attempt(status)}
    fresh = [n for n in obs.node_notices if n.pod not in seen]
    if not fresh:
        return status, ()
    entries = list(status.interruptions)
    for notice in fresh:
        # A pod seen being deleted: its attempt ends uncounted even when its ranks could not report (killed first).
        entries.append({"attempt": status.attempts, "pod": notice.pod, "node": notice.node, "by": "operator",
                        "reason": notice.taint or "PodDeleted", "noticeTime": format_time(obs.now)})  # fmt: skip
    tainted = [n for n in fresh if not n.deleting]
    actions: tuple[Action, ...] = tuple(DeletePod(job.namespace, n.pod, n.uid) for n in tainted)
    if tainted:
        names = ", ".join(f"{n.pod} (node {n.node}: {n.taint})" for n in tainted)
        message = f"worker pods on nodes that go away deleted so that they checkpoint first: {names}"
        actions += (PostEvent("Normal", "NodeNotice", message),)
    return replace(status, interruptions=entries[-KEPT:]), actions


def of_attempt(status: JobStatus) -> list[dict[str, Any]]:
    """The interruptions the ranks reported in the current attempt."""
    return [e for e in status.interruptions if e.get("attempt") == status.attempts]


def with_checkpoint_step(status: JobStatus) -> JobStatus:
    """A user's function reports its checkpoint itself (`ray.train.report`): an entry without a step takes the
    step of the checkpoint this attempt reported last."""
    step = status.checkpoint.get("step")
    if not isinstance(step, int) or isinstance(step, bool):
        return status
    entries = [
        {**e, "step": step, "checkpointStep": step, "stepsLost": 0}
        if e.get("attempt") == status.attempts and e.get("saved") and not e.get("step")
        else e
        for e in status.interruptions
    ]
    return replace(status, interruptions=entries)


def with_unreported(status: JobStatus) -> JobStatus:
    """A pod seen deleted whose ranks never reported (stopped before they could): not saved, and the next attempt
    resumes from the newest checkpoint this attempt reported."""
    step = status.checkpoint.get("step")
    step = step if isinstance(step, int) and not isinstance(step, bool) else 0
    message = "the ranks did not report: stopped before they could save"
    entries = [
        {**e, "saved": False, "checkpointStep": step, "message": message}
        if e.get("attempt") == status.attempts and "saved" not in e
        else e
        for e in status.interruptions
    ]
    return replace(status, interruptions=entries)


def next_attempt(
    job: Job, status: JobStatus, obs: Observed, cluster_actions: Callable[[JobStatus], tuple[Action, ...]]
) -> Decision:
    """The attempt ended for a node that goes away: the next one resumes from its checkpoint, uncounted."""
    status = with_unreported(with_checkpoint_step(status))
    reports = of_attempt(status)
    saved = [e for e in reports if e.get("saved")]
    where = ", ".join(f"{e.get('pod') or 'a worker'} on {e.get('node') or 'its node'}" for e in reports)
    first = saved[0] if saved else reports[0]
    step = first.get("checkpointStep", 0)
    if saved:
        what = f"checkpoint of step {step} saved {first.get('secondsToSaved')} s after the notice"
    else:
        what = f"no checkpoint in time ({first.get('message') or 'not saved'}); resuming from step {step}"
    fresh = _next_attempt(job, status)
    message = (
        f"attempt {status.attempts} interrupted: {where} going away; {what}; attempt {fresh.attempts} resumes "
        "(not counted against backoffLimit)"
    )
    new = replace(
        fresh,
        phase=Phase.PROVISIONING,
        reason=Reason.INTERRUPTED,
        message=message,
        provisioning_since=obs.now,
        conditions=_job_submitted_false(fresh, Reason.INTERRUPTED, message, obs.now, job.generation),
    )
    return Decision(new, cluster_actions(new))
