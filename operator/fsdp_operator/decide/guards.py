"""The guards of a reconcile pass (validation, identity, suspend, deadline, the end of a job). Pure."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from datetime import datetime
from typing import Any

from fsdp_operator.api import render, schema
from fsdp_operator.api.spec import Job
from fsdp_operator.decide.observed import (
    RAY_TERMINAL,
    Action,
    ChildView,
    ClusterView,
    Decision,
    DeleteJob,
    DeleteRayCluster,
    Observed,
    StopJob,
    _count,
)
from fsdp_operator.decide.status import (
    ConditionType,
    JobStatus,
    Phase,
    Reason,
    cleared_run_data,
    set_condition,
)
from fsdp_operator.decide.untrusted import mapping


def _validation_failed(manifest: Mapping[str, Any], status: JobStatus, problems: str, obs: Observed) -> Decision:
    now = obs.now
    meta = mapping(manifest.get("metadata"))
    generation = _count(meta.get("generation"))
    already = status.phase == Phase.FAILED and status.reason == Reason.VALIDATION_FAILED
    # Not `done` (kopf never restarts a daemon that returned): a fixed spec must start the job over.
    if already and status.observed_generation == generation:
        return Decision(status)
    if status.terminal and not already:
        # A finished run stays as it ended, whatever the spec says now; the edit was seen (kstatus would read a
        # generation never observed as InProgress for ever).
        return Decision(replace(status, observed_generation=generation), done=True)
    message = "invalid spec: " + problems.replace("\n", "; ")
    new = replace(
        status,
        phase=Phase.FAILED,
        reason=Reason.VALIDATION_FAILED,
        message=message,
        observed_generation=generation,
        start_time=status.start_time or now,
        end_time=now,
        conditions=set_condition(
            status.conditions, ConditionType.VALIDATED, "False", "Invalid", message, now=now, generation=generation
        ),
    )
    # Nothing was created for an invalid job unless it was valid before: clean up what may exist (if ours).
    actions: tuple[Action, ...] = ()
    ours = not _foreign(obs.cluster, str(meta.get("uid") or ""))  # absent: a delete by name is a harmless 404
    if ours and status.submission_id and status.phase in (Phase.SUBMITTING, Phase.RUNNING):
        actions += (StopJob(status.submission_id),)
    if ours and status.ray_cluster_name:
        actions += (DeleteRayCluster(str(meta.get("namespace") or "default"), status.ray_cluster_name),)
    return Decision(new, actions)


def _with_identity(job: Job, status: JobStatus, now: datetime) -> JobStatus:
    """Identity first: names go into status before anything exists under them.

    The same pass goes on (its status, names included, is written before any of its actions is taken),
    so a new job's RayCluster is created by its first pass; a restart between the write and the create
    creates it under the recorded name.
    """
    attempts = max(status.attempts, 1)
    return replace(
        status,
        phase=Phase.PENDING,
        reason=Reason.CREATED,
        message="RayCluster name and submission id recorded",
        ray_cluster_name=render.raycluster_name(job.name),
        submission_id=render.submission_id(job.name, job.uid, attempts),
        attempts=attempts,
        start_time=status.start_time or now,
        conditions=set_condition(
            status.conditions,
            ConditionType.VALIDATED,
            "True",
            "Valid",
            "spec is valid",
            now=now,
            generation=job.generation,
        ),
    )


def _foreign(cluster: ClusterView | None, uid: str) -> bool:
    """The RayCluster under our name was not created for this job (no owner reference to it): never touch it.

    Never adopted, submitted into, stopped or deleted: a cluster someone else made may run someone else's work.
    """
    return cluster is not None and bool(uid) and cluster.owner_uid != uid


def _left_by_namesake(job: Job, child: ClusterView | ChildView) -> bool:
    """Owned by an earlier FSDPTrainingJob of the same name (deleted and created again, as GitOps tools do on an
    immutable change): garbage the garbage collector deletes in its own time, never this job's."""
    return (
        child.owner_kind == schema.KIND
        and child.owner_name == job.name
        and bool(child.owner_uid)
        and child.owner_uid != job.uid
    )


def _name_taken(job: Job, status: JobStatus, obs: Observed) -> Decision | None:
    """Fail with `ClusterNameTaken` when the cluster (or the auth Secret, or the NetworkPolicy) under the job's
    names is not ours, nor left by a deleted job of the same name (`_replace_leftovers` replaces those)."""
    cluster = obs.cluster
    foreign_child = next((c for c in obs.children if not _left_by_namesake(job, c)), None)
    if cluster is not None and _foreign(cluster, job.uid) and not _left_by_namesake(job, cluster):
        owner = f"owned by uid {cluster.owner_uid}" if cluster.owner_uid else "with no owner reference"
        message = (
            f"RayCluster {cluster.name} exists and was not created for this job ({owner}); it is left alone: "
            "delete it or rename the job"
        )
    elif obs.foreign_secret:
        message = (
            f"Secret {obs.foreign_secret} (Ray's auth token for this job) exists and was not created for this job; "
            "it is left alone: delete it or rename the job"
        )
    elif foreign_child is not None:
        owner = f"owned by uid {foreign_child.owner_uid}" if foreign_child.owner_uid else "with no owner reference"
        message = (
            f"{foreign_child.kind} {foreign_child.name} exists and was not created for this job ({owner}); it is left "
            "alone: delete it or rename the job"
        )
    else:
        return None
    return _finish(job, status, obs, Phase.FAILED, Reason.CLUSTER_NAME_TAKEN, message, stop_job=False)


def _cleanup_actions(job: Job, status: JobStatus, cluster: ClusterView | None) -> tuple[Action, ...]:
    if job.spec.run_policy.cleanup != "Delete":
        return ()
    if (cluster is not None and cluster.deleting) or _foreign(cluster, job.uid):
        return ()
    return (DeleteRayCluster(job.namespace, status.ray_cluster_name),)


def _finish(
    job: Job,
    status: JobStatus,
    obs: Observed,
    phase: Phase,
    reason: Reason,
    message: str,
    *,
    stop_job: bool,
) -> Decision:
    """Enter a terminal phase: stop what still runs, clean up per `runPolicy.cleanup`."""
    new = replace(status, phase=phase, reason=reason, message=message, end_time=obs.now, provisioning_since=None)
    if phase == Phase.FAILED:
        new = replace(
            new,
            conditions=_job_submitted_false(new, reason, message, obs.now, job.generation)
            if _condition_status(new, ConditionType.JOB_SUBMITTED) == "True"
            else new.conditions,
        )
    actions: tuple[Action, ...] = ()
    if stop_job and status.submission_id:
        actions += (StopJob(status.submission_id),)
    actions += _cleanup_actions(job, new, obs.cluster)
    return Decision(new, actions)


def _condition_status(status: JobStatus, type_: str) -> str:
    return next((str(c.get("status")) for c in status.conditions if c.get("type") == type_), "")


def _job_submitted_false(status: JobStatus, reason: str, message: str, now: datetime, gen: int) -> list[dict[str, Any]]:
    return set_condition(
        status.conditions, ConditionType.JOB_SUBMITTED, "False", reason, message, now=now, generation=gen
    )


def _finished(job: Job, status: JobStatus, obs: Observed) -> Decision:
    """A terminal job: make sure nothing still runs and the cluster is gone (cleanup: Delete), then the TTL."""
    actions: tuple[Action, ...] = ()
    if obs.ray_job is not None and obs.ray_job.status not in RAY_TERMINAL:
        # Level-triggered stop: the one decided on entering this phase may have been lost to a restart,
        # and with cleanup: Keep no cluster deletion would end the Ray job either.
        actions += (StopJob(status.submission_id),)
    if obs.cluster is not None:
        actions += _cleanup_actions(job, status, obs.cluster)
    ttl = job.spec.run_policy.ttl_seconds_after_finished
    if ttl is None:
        return Decision(status, actions, done=not actions)
    end = status.end_time or obs.now
    left = ttl - (obs.now - end).total_seconds()
    if left <= 0:
        return Decision(status, (*actions, DeleteJob()))
    return Decision(status, actions, requeue_after=left)


def _next_attempt(job: Job, status: JobStatus) -> JobStatus:
    """A new attempt (retry or resume): a new submission id, nothing left of what the last one's ranks said."""
    attempts = status.attempts + 1
    return replace(
        cleared_run_data(status), attempts=attempts, submission_id=render.submission_id(job.name, job.uid, attempts)
    )


def _submitted(status: JobStatus) -> bool:
    """A Ray job may exist for the current submission id."""
    return status.phase in (Phase.SUBMITTING, Phase.RUNNING)


def _check_suspend(job: Job, status: JobStatus, obs: Observed, package: str) -> Decision | None:
    suspend = job.spec.run_policy.suspend
    if status.phase == Phase.SUSPENDED:
        if suspend:
            # Level-triggered: the cluster is deleted again if it came back.
            lingering = obs.cluster is not None and not obs.cluster.deleting and not _foreign(obs.cluster, job.uid)
            again = (DeleteRayCluster(job.namespace, status.ray_cluster_name),) if lingering else ()
            return Decision(status, again)
        fresh = _next_attempt(job, status)
        resumed = replace(
            fresh,
            phase=Phase.PENDING,
            reason=Reason.RESUMED,
            message=f"resumed as attempt {fresh.attempts}",
            # activeDeadlineSeconds counts from the resume, as for a Kubernetes Job.
            start_time=obs.now,
            workers="",
            # A new RayCluster: `availabilityZone: auto` looks for the best zone again.
            placement={},
        )
        return Decision(resumed)
    if not suspend:
        return None
    actions: tuple[Action, ...] = ()
    if not _foreign(obs.cluster, job.uid):
        if _submitted(status):
            actions += (StopJob(status.submission_id),)
        if obs.cluster is not None or status.phase != Phase.PENDING:
            actions += (DeleteRayCluster(job.namespace, status.ray_cluster_name),)
    conditions = set_condition(
        status.conditions,
        ConditionType.WORKERS_READY,
        "False",
        "Suspended",
        "RayCluster deleted",
        now=obs.now,
        generation=job.generation,
    )
    if _condition_status(status, ConditionType.JOB_SUBMITTED) == "True":
        conditions = set_condition(
            conditions,
            ConditionType.JOB_SUBMITTED,
            "False",
            "Suspended",
            "Ray job stopped",
            now=obs.now,
            generation=job.generation,
        )
    new = replace(
        status,
        phase=Phase.SUSPENDED,
        reason=Reason.SUSPENDED,
        message="suspended: Ray job stopped and RayCluster deleted; set runPolicy.suspend: false to resume",
        provisioning_since=None,
        conditions=conditions,
    )
    return Decision(new, actions)


def _check_deadline(job: Job, status: JobStatus, obs: Observed, package: str) -> Decision | None:
    deadline = job.spec.run_policy.active_deadline_seconds
    if deadline is None or status.start_time is None:
        return None
    elapsed = (obs.now - status.start_time).total_seconds()
    if elapsed < deadline:
        return None
    message = f"activeDeadlineSeconds ({deadline}s) exceeded after {elapsed:.0f}s in phase {status.phase}"
    return _finish(job, status, obs, Phase.FAILED, Reason.DEADLINE_EXCEEDED, message, stop_job=_submitted(status))


def finalize_actions(
    namespace: str, name: str, uid: str, status: JobStatus, cluster: ClusterView | None
) -> tuple[Action, ...]:
    """What deleting a job must do: stop its Ray job, then delete its RayCluster (whatever `cleanup` says).

    The cluster name is derived again when status never recorded it, so a job deleted during its very
    first pass leaves nothing behind either; a cluster controlled by another object is left alone.
    """
    if _foreign(cluster, uid):
        return ()
    actions: tuple[Action, ...] = ()
    if status.submission_id and status.phase in (Phase.SUBMITTING, Phase.RUNNING) and cluster is not None:
        actions += (StopJob(status.submission_id),)
    if cluster is None or cluster.deleting:
        return actions
    return (*actions, DeleteRayCluster(namespace, status.ray_cluster_name or render.raycluster_name(name)))


def _ray_unreachable(job: Job, status: JobStatus, obs: Observed, timeout: float) -> Decision:
    """Ray's job API does not answer a submitted job: wait, but never longer than `timeout` (then Failed)."""
    since = status.ray_unreachable_since or obs.now
    silent = (obs.now - since).total_seconds()
    # Why it does not answer, when KubeRay knows: the head pod is not ready (its Ray exited, it restarts).
    head = (
        f"; the Ray head pod is not ready ({obs.cluster.head_not_ready})"
        if obs.cluster and obs.cluster.head_not_ready
        else ""
    )
    if silent >= timeout:
        message = f"Ray's job API did not answer for {silent:.0f}s (limit {timeout:g}s): {obs.ray_error}{head}"
        return _finish(job, status, obs, Phase.FAILED, Reason.RAY_UNREACHABLE, message, stop_job=True)
    new = replace(
        status,
        reason=Reason.RAY_UNREACHABLE,
        message=f"Ray job API: {obs.ray_error}{head}",
        ray_unreachable_since=since,
    )
    return Decision(new)
