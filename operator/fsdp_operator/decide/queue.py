"""Kueue's side of a queued job's life (`queueName`): Queued, admitted, Preempted, Queued again. Pure, no I/O.

A queued job's RayCluster is created suspended (`render.raycluster`); Kueue admits it as one gang by setting
`spec.suspend: false` and evicts it by setting it true again (KubeRay then deletes its pods). So the cluster's
`spec.suspend` says what Kueue decided, and the Workload (`decide/workload.py`) says why:

- Pending -> Queued: the cluster is created, suspended; the message carries the Workload's pending condition.
- Queued -> Provisioning (reason Admitted): `activeDeadlineSeconds` and `waitForWorkersTimeoutSeconds` count from
  here, not from creation (a batch/v1 Job resumed from suspension also restarts its `startTime`), and the wait
  is added to `status.queue.queuedSeconds`.
- Provisioning (nothing submitted yet) -> Queued when Kueue evicts it: nothing ran.
- Submitting / Running -> Preempted: the Ray job is stopped (its head is being deleted anyway) and a new attempt
  is recorded, which does not count against `backoffLimit`; the checkpoints stay where they are, and the next
  attempt resumes from the latest one (as after `runPolicy.suspend`). Preempted -> Queued on the next pass.

`runPolicy.suspend` (the user's suspension, which deletes the cluster) is checked before any of this and wins.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from datetime import datetime

from fsdp_operator.api import queueing
from fsdp_operator.api.spec import Job
from fsdp_operator.decide.guards import (
    _foreign,
    _job_submitted_false,
    _left_by_namesake,
    _name_taken,
    _next_attempt,
)
from fsdp_operator.decide.observed import (
    Action,
    ChildView,
    ClusterView,
    Decision,
    DeleteLeftover,
    DeleteRayCluster,
    Observed,
    StopJob,
    _count,
)
from fsdp_operator.decide.status import ConditionType, JobStatus, Phase, Reason, format_time, set_condition

QUEUE_PHASES = frozenset({Phase.QUEUED, Phase.PREEMPTED})
ADMITTED_PHASES = frozenset({Phase.PROVISIONING, Phase.SUBMITTING, Phase.RUNNING})


def queue_of(job: Job) -> str:
    return queueing.queue_name(job.spec.queue_name, job.labels)


def enqueued(job: Job, provisioned: Decision, now: datetime) -> Decision:
    """The first pass of a queued job: `_provision`'s decision (the cluster's creates) with phase Queued."""
    status = provisioned.status
    new = replace(
        status,
        phase=Phase.QUEUED,
        reason=Reason.QUEUED,
        message=f"creating RayCluster {status.ray_cluster_name} suspended, for Kueue's LocalQueue {queue_of(job)}",
        provisioning_since=None,
        queued_since=now,
        queue={**status.queue, "localQueue": queue_of(job)},
        workers="",
    )
    return replace(provisioned, status=new)


def check_queue(
    job: Job, status: JobStatus, obs: Observed, create: Callable[[], tuple[Action, ...]]
) -> Decision | None:
    """The queue guard: a decision for a queued job waiting for, or evicted by, Kueue; None otherwise.

    `create` is what (re)creates the job's RayCluster (its Secret and NetworkPolicy first)."""
    queue = queue_of(job)
    if not queue:
        return _unqueued(job, status, obs) if status.phase in QUEUE_PHASES else None
    if status.phase == Phase.QUEUED:
        return _wait_in_queue(job, status, obs, create, queue)
    if status.phase == Phase.PREEMPTED:
        return _queued_again(job, status, obs, queue)
    cluster = obs.cluster
    ours = cluster is not None and not cluster.deleting and not _foreign(cluster, job.uid)
    if status.phase in ADMITTED_PHASES and ours and cluster is not None and cluster.suspended:
        return _evicted(job, status, obs, queue)
    return None


def _unqueued(job: Job, status: JobStatus, obs: Observed) -> Decision:
    """queueName removed while queued: the suspended cluster goes, and one that is not queued replaces it."""
    actions: tuple[Action, ...] = ()
    if obs.cluster is not None and not obs.cluster.deleting and not _foreign(obs.cluster, job.uid):
        actions = (DeleteRayCluster(job.namespace, status.ray_cluster_name),)
    message = "queueName removed: the suspended RayCluster is replaced by one outside Kueue's queues"
    new = replace(status, phase=Phase.PENDING, reason=Reason.CREATED, message=message, queued_since=None)
    return Decision(new, actions)


def _waiting_message(status: JobStatus, obs: Observed, queue: str) -> tuple[Reason, str]:
    since = format_time(status.queued_since or obs.now)
    where = f"RayCluster {status.ray_cluster_name} waits in LocalQueue {queue} since {since}"
    if obs.workload_error:
        return Reason.QUEUE_UNAVAILABLE, f"{where}, but {obs.workload_error}"
    workload = obs.workload
    if workload is None:
        return Reason.QUEUED, f"{where}; Kueue has not made a Workload for it yet"
    said = workload.pending or ("quota reserved, admission pending" if workload.quota_reserved else "pending")
    return Reason.QUEUED, f"{where}: Workload {workload.name}: {said}"


def _with_workload(status: JobStatus, obs: Observed) -> dict[str, object]:
    queue = dict(status.queue)
    if obs.workload is not None and obs.workload.name:
        queue["workload"] = obs.workload.name
    if obs.workload is not None and obs.workload.cluster_queue:
        queue["clusterQueue"] = obs.workload.cluster_queue
    return queue


def _wait_in_queue(
    job: Job, status: JobStatus, obs: Observed, create: Callable[[], tuple[Action, ...]], queue: str
) -> Decision:
    if (taken := _name_taken(job, status, obs)) is not None:
        return taken
    status = replace(status, queued_since=status.queued_since or obs.now, queue={**status.queue, "localQueue": queue})
    cluster = obs.cluster
    leftovers: list[tuple[str, ClusterView | ChildView]] = []
    if cluster is not None and _foreign(cluster, job.uid):
        leftovers.append(("RayCluster", cluster))
    leftovers += [(child.kind, child) for child in obs.children if _left_by_namesake(job, child)]
    if leftovers:
        # Left by a deleted job of the same name (`_name_taken` fails on anyone else's): deleted, then created anew.
        actions = tuple(DeleteLeftover(kind, job.namespace, c.name, c.uid) for kind, c in leftovers if not c.deleting)
        names = ", ".join(f"{kind} {c.name}" for kind, c in leftovers)
        message = f"replacing {names}: left by a deleted FSDPTrainingJob of the same name"
        return Decision(replace(status, reason=Reason.QUEUED, message=message), actions, requeue_after=1.0)
    if cluster is None or cluster.deleting:
        reason, message = (
            Reason.QUEUED,
            f"creating RayCluster {status.ray_cluster_name} suspended, for LocalQueue {queue}",
        )
        if obs.create_refused:  # RBAC, admission, quota: a retry alone changes nothing, so the status says it
            reason, message = (
                Reason.CREATE_REFUSED,
                f"creating RayCluster {status.ray_cluster_name}: {obs.create_refused}",
            )
        return Decision(replace(status, reason=reason, message=message), () if cluster else create())
    if cluster.suspended:
        reason, message = _waiting_message(status, obs, queue)
        return Decision(replace(status, reason=reason, message=message, queue=_with_workload(status, obs)))
    # Admitted: Kueue set spec.suspend: false. The clocks of the run start now.
    waited = max(0, round((obs.now - (status.queued_since or obs.now)).total_seconds()))
    queue_status = _with_workload(status, obs)
    queue_status["queuedSeconds"] = _count(queue_status.get("queuedSeconds")) + waited
    queue_status["admissions"] = _count(queue_status.get("admissions")) + 1
    by = f" (ClusterQueue {queue_status['clusterQueue']})" if queue_status.get("clusterQueue") else ""
    new = replace(
        status,
        phase=Phase.PROVISIONING,
        reason=Reason.ADMITTED,
        message=f"Kueue admitted RayCluster {status.ray_cluster_name}{by} after {waited}s in LocalQueue {queue}",
        queued_since=None,
        queue=queue_status,
        provisioning_since=obs.now,
        start_time=obs.now,  # activeDeadlineSeconds counts from admission
        workers=f"0/{job.spec.workers.replicas}",
    )
    return Decision(new)


def _evicted(job: Job, status: JobStatus, obs: Observed, queue: str) -> Decision:
    """Kueue suspended the admitted cluster: back to the queue; a submitted Ray job is stopped (Preempted)."""
    why = f"Kueue evicted RayCluster {status.ray_cluster_name}"
    if obs.workload is not None and obs.workload.evicted:
        why += f" ({obs.workload.evicted})"
    queue_status = _with_workload(status, obs)
    queue_status["preemptions"] = _count(queue_status.get("preemptions")) + 1
    conditions = set_condition(
        status.conditions, ConditionType.WORKERS_READY, "False", Reason.PREEMPTED, why,
        now=obs.now, generation=job.generation,
    )  # fmt: skip
    if status.phase == Phase.PROVISIONING:
        # Nothing was submitted: the same attempt waits for readmission.
        message = f"{why} before the job was submitted; waiting in LocalQueue {queue} for readmission"
        new = replace(
            status, phase=Phase.QUEUED, reason=Reason.QUEUED, message=message, queued_since=obs.now,
            provisioning_since=None, queue=queue_status, conditions=conditions, workers="",
        )  # fmt: skip
        return Decision(new)
    # The run so far is not a failure: a new attempt (a new submission id) that backoffLimit does not count. Its
    # ranks resume from the latest checkpoint; until they report, status.checkpoint shows the one they resume from.
    fresh = _next_attempt(job, replace(status, conditions=conditions))
    conditions = fresh.conditions
    if any(c.get("type") == ConditionType.JOB_SUBMITTED for c in conditions):
        conditions = _job_submitted_false(fresh, Reason.PREEMPTED, why, obs.now, job.generation)
    new = replace(
        fresh,
        phase=Phase.PREEMPTED,
        reason=Reason.PREEMPTED,
        message=f"{why}; the Ray job of attempt {status.attempts} is stopped, attempt {fresh.attempts} resumes from "
        "the latest checkpoint once Kueue admits the cluster again",
        provisioning_since=None,
        queue=queue_status,
        conditions=conditions,
        checkpoint=status.checkpoint,
        workers="",
    )
    # Best effort: KubeRay deletes the head (and with it the Ray job); a head still up must not keep training.
    return Decision(new, (StopJob(status.submission_id),))


def _queued_again(job: Job, status: JobStatus, obs: Observed, queue: str) -> Decision:
    reason, message = _waiting_message(replace(status, queued_since=obs.now), obs, queue)
    new = replace(status, phase=Phase.QUEUED, reason=reason, message=message, queued_since=obs.now)
    return Decision(new)
