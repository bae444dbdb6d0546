"""The state machine: (job, current status, what was observed) -> (new status, actions). Pure, no I/O.

`controller.py` observes the RayCluster, its pods and Ray's own view, calls `reconcile()` once per
pass, performs the returned actions and writes the returned status. Guards come first and each ends
the pass (KubeRay's `check...AndUpdateStatusIfNeeded`): validation, identity, terminal cleanup,
suspend, deadline; then one step per phase.

Retries (`runPolicy.backoffLimit`) reuse the RayCluster when it is still there: a failed attempt goes
back to Provisioning, which re-checks the workers (and re-creates the cluster only if it is gone),
then submits under a new submission id.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Literal

from fsdp_train.events import Event, clean_text

from fsdp_operator import render, schema
from fsdp_operator.capacity import ZoneChoice
from fsdp_operator.spec import Job, NotAJobError, SpecError, parse_job
from fsdp_operator.status import (
    CONDITIONS,
    WARNING_REASONS,
    ConditionType,
    JobStatus,
    Phase,
    Reason,
    cleared_run_data,
    fold_events,
    get_condition,
    set_condition,
    with_lifecycle_conditions,
)

# Ray's job states (ray.job_submission.JobStatus values).
RAY_PENDING, RAY_RUNNING, RAY_SUCCEEDED = "PENDING", "RUNNING", "SUCCEEDED"
RAY_FAILED, RAY_STOPPED = "FAILED", "STOPPED"
RAY_TERMINAL = frozenset({RAY_SUCCEEDED, RAY_FAILED, RAY_STOPPED})
RAY_UNREACHABLE_TIMEOUT = 300.0
"""Seconds a submitted job's Ray job API may stay silent before the job fails (the operator's default)."""


# --- what was observed ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ClusterView:
    """The parts of a RayCluster object the state machine reads."""

    name: str
    state: str = ""
    """KubeRay's `status.state` (`ready`, `failed`, `suspended`, ...); empty before KubeRay wrote one."""
    ready_workers: int = 0
    desired_workers: int = 0
    deleting: bool = False
    owner_uid: str = ""
    """The uid in the controller ownerReference; empty when the cluster has none."""
    dashboard_url: str = ""
    """Ray's dashboard / job API, from `status.head` and `status.endpoints` as KubeRay writes them."""
    reason: str = ""
    """KubeRay's `status.reason`: why the state is what it is (set with `failed`)."""
    head_not_ready: str = ""
    """KubeRay's HeadPodReady condition when it is False: its reason and message (the head pod's Ready); else empty."""
    owner_kind: str = ""
    owner_name: str = ""
    uid: str = ""

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> ClusterView:
        meta = _mapping(obj.get("metadata"))
        status = _mapping(obj.get("status"))
        references = meta.get("ownerReferences")
        owners = [_mapping(o) for o in references] if isinstance(references, list) else []
        owner: Mapping[str, Any] = next((o for o in owners if o.get("controller") is True), {})
        return cls(
            name=str(meta.get("name", "")),
            state=str(status.get("state") or ""),
            ready_workers=_count(status.get("readyWorkerReplicas")),
            desired_workers=_count(status.get("desiredWorkerReplicas")),
            deleting=bool(meta.get("deletionTimestamp")),
            owner_uid=str(owner.get("uid", "")),
            owner_kind=str(owner.get("kind", "")),
            owner_name=str(owner.get("name", "")),
            uid=str(meta.get("uid", "")),
            dashboard_url=dashboard_url(obj),
            reason=str(status.get("reason") or ""),
            head_not_ready=_head_not_ready(status.get("conditions")),
        )


def _head_not_ready(conditions: Any) -> str:
    for condition in conditions if isinstance(conditions, list) else []:
        c = _mapping(condition)
        if c.get("type") == "HeadPodReady" and c.get("status") == "False":
            return f"{c.get('reason') or 'HeadPodNotReady'}: {c.get('message') or 'no message'}"[:512]
    return ""


@dataclass(frozen=True, slots=True)
class ChildView:
    """An object under one of the job's names (its auth Secret, its NetworkPolicy) that a create found there and
    that is not the job's own."""

    kind: str
    name: str
    uid: str
    owner_uid: str = ""
    owner_kind: str = ""
    owner_name: str = ""
    deleting: bool = False

    @classmethod
    def from_object(cls, kind: str, obj: Mapping[str, Any]) -> ChildView:
        view = ClusterView.from_object(obj)
        return cls(kind, view.name, view.uid, view.owner_uid, view.owner_kind, view.owner_name, view.deleting)


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _count(value: Any) -> int:
    """A replica count from another controller's status (typed there, unchecked here)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def dashboard_url(obj: Mapping[str, Any]) -> str:
    """`http://<head service IP or name>:<dashboard port>` from a RayCluster's status; empty when unknown."""
    status = obj.get("status") or {}
    head = status.get("head") or {}
    meta = obj.get("metadata") or {}
    port = str((status.get("endpoints") or {}).get("dashboard") or render.DASHBOARD_PORT)
    host = head.get("serviceIP") or ""
    if not host and head.get("serviceName"):
        host = f"{head['serviceName']}.{meta.get('namespace', 'default')}.svc"
    return f"http://{host}:{port}" if host else ""


@dataclass(frozen=True, slots=True)
class RayNodes:
    """Ray's own view of the cluster: alive worker (non-head) nodes and their resources."""

    alive_workers: int
    gpus: float
    cpus: float


@dataclass(frozen=True, slots=True)
class RayJobInfo:
    submission_id: str
    status: str
    message: str = ""


@dataclass(frozen=True, slots=True)
class Observed:
    """Everything one pass saw. `None` means "absent" (cluster, Ray job) or "not asked"."""

    now: datetime
    cluster: ClusterView | None = None
    unschedulable: str = ""
    """The scheduler's message for a Pending worker or head pod (FailedScheduling); empty when none."""
    create_refused: str = ""
    """The API server's refusal of a create the job needs, for a reason a retry does not change by itself (RBAC,
    admission, validation, quota): of the job's Secret, NetworkPolicy or RayCluster by the operator, or of a pod by
    KubeRay (its FailedToCreateHeadPod / FailedToCreateWorkerPod event). Empty when none."""
    ray_nodes: RayNodes | None = None
    ray_job: RayJobInfo | None = None
    ray_error: str = ""
    """Why Ray's API could not be asked (connection refused, timeout); empty when it answered."""
    events: tuple[Event, ...] = ()
    """Structured events from the job log since `status.logOffset`."""
    log_offset: int | None = None
    """The log offset after `events`; None when the log was not read."""
    submit_error: str = ""
    """Ray rejected the submission of `status.submissionId` (not a transient error)."""
    skipped_lines: int = 0
    """Event lines in the log read this pass that did not parse (malformed, over-long)."""
    forged_lines: int = 0
    """Event lines in the log read this pass that failed the signature check (never folded)."""
    log_pending: bool = False
    """More of the job log is waiting than one pass reads: the next pass comes at once."""
    foreign_secret: str = ""
    """The job's auth Secret exists and is not owned by this job: its name."""
    children: tuple[ChildView, ...] = ()
    """Objects under the job's names whose create answered 409 and that are not the job's own."""
    zone_choice: ZoneChoice | None = None
    """For `placement.availabilityZone: auto` before the cluster exists: the zone AWS advised (or why none)."""


# --- what to do -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CreateRayCluster:
    manifest: dict[str, Any]


@dataclass(frozen=True, slots=True)
class DeleteRayCluster:
    namespace: str
    name: str


@dataclass(frozen=True, slots=True)
class SubmitJob:
    submission: render.Submission


@dataclass(frozen=True, slots=True)
class StopJob:
    submission_id: str


@dataclass(frozen=True, slots=True)
class CreateAuthSecret:
    """The per-job Secret for Ray's auth token and the event key (the controller draws both); 409: it exists."""

    manifest: dict[str, Any]


@dataclass(frozen=True, slots=True)
class ApplyNetworkPolicy:
    """The per-job NetworkPolicy closing Ray's ports; 409 means it exists."""

    manifest: dict[str, Any]


@dataclass(frozen=True, slots=True)
class DeleteLeftover:
    """Delete what a deleted job of the same name left under this job's names, only while it is the object `uid`
    (a precondition: never a newer one); its create follows once it is gone."""

    kind: str
    namespace: str
    name: str
    uid: str


@dataclass(frozen=True, slots=True)
class PostEvent:
    type: Literal["Normal", "Warning"]
    reason: str
    message: str


@dataclass(frozen=True, slots=True)
class DeleteJob:
    """`ttlSecondsAfterFinished` ran out: delete the FSDPTrainingJob itself."""


Action = (
    CreateRayCluster
    | DeleteRayCluster
    | SubmitJob
    | StopJob
    | PostEvent
    | DeleteJob
    | CreateAuthSecret
    | ApplyNetworkPolicy
    | DeleteLeftover
)

MUST_STOP_ACTIONS = (StopJob, DeleteRayCluster)
"""Actions that end what runs: taken even when the API server refuses every form of the status decided with them."""


@dataclass(frozen=True, slots=True)
class Decision:
    status: JobStatus
    actions: tuple[Action, ...] = ()
    requeue_after: float | None = None
    """Seconds until the next pass is due regardless of events (TTL); None: the usual interval."""
    done: bool = False
    """Terminal and nothing left to do: the per-job loop can stop."""


# --- the state machine ------------------------------------------------------------------------------


def reconcile(
    manifest: Mapping[str, Any],
    status: JobStatus,
    observed: Observed,
    *,
    training_package: str,
    security: render.Security | None = None,
    ray_unreachable_timeout: float = RAY_UNREACHABLE_TIMEOUT,
) -> Decision:
    """One pass: the new status and the actions, with an Event for every phase or reason change."""
    decision = _decide(
        manifest, status, observed, training_package, security or render.Security(), ray_unreachable_timeout
    )
    new = decision.status
    if observed.cluster is not None and observed.cluster.dashboard_url and not status.terminal:
        new = replace(new, dashboard_url=observed.cluster.dashboard_url)
    generation = _count(_mapping(manifest.get("metadata")).get("generation"))
    new = with_lifecycle_conditions(status, new, now=observed.now, generation=generation)
    if new is not decision.status:
        decision = replace(decision, status=new)
    return _with_transition_events(status, _error_cleared(decision, observed.now))


def pass_failed(status: JobStatus, observed: Observed, error: str) -> Decision:
    """A pass that raised: the `ReconcileError` condition and a Warning event, and the log offset moved past
    what was read, so the same line cannot fail every pass for ever. Nothing else changes."""
    message = clean_text(error, 1024)
    previous = get_condition(status.conditions, ConditionType.RECONCILE_ERROR)
    new = status
    if observed.log_offset is not None:
        new = replace(new, log_offset=observed.log_offset, skipped_events=new.skipped_events + observed.skipped_lines)
    new = replace(
        new,
        conditions=set_condition(
            new.conditions, ConditionType.RECONCILE_ERROR, "True", "PassFailed", message,
            now=observed.now, generation=status.observed_generation,
        ),
    )  # fmt: skip
    repeated = previous is not None and previous.get("status") == "True" and previous.get("message") == message
    actions: tuple[Action, ...] = () if repeated else (PostEvent("Warning", "ReconcileError", message),)
    return Decision(new, actions)


def _error_cleared(decision: Decision, now: datetime) -> Decision:
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


def _decide(
    manifest: Mapping[str, Any],
    status: JobStatus,
    obs: Observed,
    package: str,
    security: render.Security,
    ray_unreachable_timeout: float,
) -> Decision:
    try:
        job = parse_job(dict(manifest))
    except (SpecError, NotAJobError) as e:
        return _validation_failed(manifest, status, str(e), obs)

    if status.reason == Reason.VALIDATION_FAILED and job.generation != status.observed_generation:
        # The spec was fixed: start over as a new job (nothing was created for the invalid one).
        status = JobStatus(attempts=status.attempts)
    status = replace(status, observed_generation=job.generation)
    if status.phase is None or not status.submission_id:
        status = _with_identity(job, status, obs.now)
        if job.spec.placement.availability_zone == "auto" and obs.zone_choice is None:
            # AWS is asked for a zone by the next pass (which follows at once), once the names are recorded.
            return Decision(status, requeue_after=0.0)
    if status.terminal:
        return _finished(job, status, obs)
    for guard in (_check_suspend, _check_deadline):
        decision = guard(job, status, obs, package)
        if decision is not None:
            return decision
    match status.phase:
        case Phase.PENDING:
            return _provision(job, status, obs, Reason.CLUSTER_CREATING, "creating RayCluster", security)
        case Phase.PROVISIONING:
            return _wait_for_workers(job, status, obs, package, security)
        case Phase.SUBMITTING | Phase.RUNNING:
            return _track_job(job, status, obs, package, security, ray_unreachable_timeout)
        case _:
            raise AssertionError(f"unhandled phase {status.phase}")


def _validation_failed(manifest: Mapping[str, Any], status: JobStatus, problems: str, obs: Observed) -> Decision:
    now = obs.now
    meta = _mapping(manifest.get("metadata"))
    generation = _count(meta.get("generation"))
    already = status.phase == Phase.FAILED and status.reason == Reason.VALIDATION_FAILED
    # Not `done` (kopf never restarts a daemon that returned): a fixed spec must start the job over.
    if already and status.observed_generation == generation:
        return Decision(status)
    if status.terminal and not already:
        return Decision(status, done=True)  # a finished run stays as it ended, whatever the spec says now
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


def _replace_leftovers(job: Job, status: JobStatus, obs: Observed) -> Decision | None:
    """What a deleted job of the same name left under this job's names is deleted (with a uid precondition) and
    created again by a later pass, or waited for while it is being deleted; the status says which."""
    found: list[ClusterView | ChildView] = list(obs.children)
    if obs.cluster is not None and _left_by_namesake(job, obs.cluster):
        found.append(obs.cluster)
    leftovers = [c for c in found if _left_by_namesake(job, c)]
    if not leftovers:
        return None
    kinds = {id(c): "RayCluster" if isinstance(c, ClusterView) else c.kind for c in leftovers}
    deleting = [f"{kinds[id(c)]} {c.name}" for c in leftovers if c.deleting]
    replacing = [c for c in leftovers if not c.deleting]
    parts = []
    if replacing:
        parts.append("replacing " + ", ".join(f"{kinds[id(c)]} {c.name}" for c in replacing))
    if deleting:
        parts.append("waiting for " + ", ".join(deleting) + " to be deleted")
    owner = leftovers[0].owner_uid
    message = f"{' and '.join(parts)}: left by a deleted FSDPTrainingJob of the same name (uid {owner})"
    new = replace(status, reason=Reason.CLUSTER_CREATING, message=message)
    actions = tuple(DeleteLeftover(kinds[id(c)], job.namespace, c.name, c.uid) for c in replacing)
    return Decision(new, actions, requeue_after=LEFTOVER_RECHECK_SECONDS)


LEFTOVER_RECHECK_SECONDS = 1.0
"""How soon a pass looks again whether what a deleted namesake left is gone."""


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


def _cluster_actions(job: Job, status: JobStatus, security: render.Security) -> tuple[Action, ...]:
    """Create (idempotently) what the RayCluster needs first, then the cluster itself."""
    # Always: besides Ray's token it holds the key the job's events are signed with (docs/reliability.md).
    actions: tuple[Action, ...] = (CreateAuthSecret(render.auth_secret(job)),)
    if security.network_policy:
        actions += (ApplyNetworkPolicy(render.network_policy(job, security)),)
    return (*actions, _raycluster(job, status, security))


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


def _placed(job: Job, status: JobStatus, obs: Observed) -> JobStatus:
    """Record the zone for `availabilityZone: auto` once, before the first RayCluster: the choice and why, or
    why there is none (then the workers run without a zone constraint; a condition says so, not an error)."""
    if job.spec.placement.availability_zone != "auto" or status.placement:
        return status
    choice = obs.zone_choice or ZoneChoice("", "no zone was asked for")
    if choice.zone:
        condition = ("True", "ZoneChosen", f"workers placed in {choice.zone}: {choice.reason}")
    else:
        condition = ("False", "NoZoneChosen", f"workers run without a zone constraint: {choice.reason}")
    return replace(
        status,
        placement={"availabilityZone": choice.zone, "reason": choice.reason[:1024]},
        conditions=set_condition(
            status.conditions, ConditionType.ZONE_PLACED, *condition, now=obs.now, generation=job.generation
        ),
    )


def _raycluster(job: Job, status: JobStatus, security: render.Security) -> CreateRayCluster:
    zone = str(status.placement.get("availabilityZone") or "")
    return CreateRayCluster(render.raycluster(job, security, chosen_zone=zone))


def _provision(
    job: Job, status: JobStatus, obs: Observed, reason: Reason, message: str, security: render.Security
) -> Decision:
    status = _placed(job, status, obs)
    new = replace(
        status,
        phase=Phase.PROVISIONING,
        reason=reason,
        message=message,
        provisioning_since=obs.now,
        workers=f"0/{job.spec.workers.replicas}",
    )
    return Decision(new, _cluster_actions(job, new, security))


def _workers_gap(job: Job, cluster: ClusterView, nodes: RayNodes | None, ray_error: str) -> str:
    """Why the workers are not all there yet; empty when they are."""
    workers = job.spec.workers
    if cluster.state != "ready" or cluster.ready_workers < workers.replicas:
        state = cluster.state or "no state yet"
        if cluster.reason:
            # Shown, not acted on: KubeRay also writes `failed` for errors it retries; the timeout decides.
            state += f": {cluster.reason}"
        return f"{cluster.ready_workers}/{workers.replicas} worker pods ready (RayCluster state: {state})"
    if nodes is None:
        return "worker pods ready; waiting for Ray's API on the head" + (f" ({ray_error})" if ray_error else "")
    gaps: list[str] = []
    if nodes.alive_workers < workers.replicas:
        gaps.append(f"{nodes.alive_workers}/{workers.replicas} worker nodes alive")
    if workers.gpus_per_worker:
        want = workers.replicas * workers.gpus_per_worker
        if nodes.gpus < want:
            gaps.append(f"{nodes.gpus:g}/{want} GPUs")
    elif nodes.cpus < workers.world_size:
        gaps.append(f"{nodes.cpus:g}/{workers.world_size} CPUs for the ranks")
    return ("Ray reports " + ", ".join(gaps)) if gaps else ""


def _wait_for_workers(job: Job, status: JobStatus, obs: Observed, package: str, security: render.Security) -> Decision:
    cluster = obs.cluster
    since = status.provisioning_since or obs.now
    waited = (obs.now - since).total_seconds()
    timeout = job.spec.run_policy.wait_for_workers_timeout_seconds
    if (taken := _name_taken(job, status, obs)) is not None:
        return taken
    if waited < timeout and (replacing := _replace_leftovers(job, status, obs)) is not None:
        return replacing
    if cluster is None or cluster.deleting:
        if waited >= timeout:
            # A create the API server keeps refusing (quota, admission, RBAC) ends here too.
            what = "does not exist" if cluster is None else "is being deleted"
            message = f"waitForWorkersTimeoutSeconds ({timeout}s) exceeded: RayCluster {status.ray_cluster_name} {what}"
            if obs.create_refused:
                message += f"; {obs.create_refused}"
            return _finish(job, status, obs, Phase.FAILED, Reason.WAIT_FOR_WORKERS_TIMEOUT, message, stop_job=False)
        # Not there (yet, or any more) while provisioning: creating it again is idempotent.
        reason, message = Reason.CLUSTER_CREATING, "creating RayCluster"
        if obs.create_refused:
            reason, message = (
                Reason.CREATE_REFUSED,
                f"creating RayCluster {status.ray_cluster_name}: {obs.create_refused}",
            )
        return Decision(replace(status, reason=reason, message=message), _cluster_actions(job, status, security))
    desired = job.spec.workers.replicas
    workers = f"{min(cluster.ready_workers, desired)}/{desired}"
    gap = _workers_gap(job, cluster, obs.ray_nodes, obs.ray_error)

    if gap:
        if waited >= timeout:
            status = replace(status, workers=workers)
            if obs.unschedulable:
                message = f"workers not scheduled after {waited:.0f}s: {obs.unschedulable}"
                return _finish(job, status, obs, Phase.FAILED, Reason.UNSCHEDULABLE, message, stop_job=False)
            message = f"waitForWorkersTimeoutSeconds ({timeout}s) exceeded: {gap}"
            if obs.create_refused:
                message += f"; {obs.create_refused}"
            return _finish(job, status, obs, Phase.FAILED, Reason.WAIT_FOR_WORKERS_TIMEOUT, message, stop_job=False)
        reason, message = Reason.WORKERS_NOT_READY, gap
        if obs.unschedulable:
            reason, message = Reason.UNSCHEDULABLE, obs.unschedulable
        elif obs.create_refused:
            reason, message = Reason.CREATE_REFUSED, f"{gap}; {obs.create_refused}"
        new = replace(
            status,
            reason=reason,
            message=message,
            workers=workers,
            provisioning_since=since,
            conditions=set_condition(
                status.conditions,
                ConditionType.WORKERS_READY,
                "False",
                reason,
                message,
                now=obs.now,
                generation=job.generation,
            ),
        )
        return Decision(new)

    message = f"all {desired} workers joined Ray after {waited:.0f}s; submitting {status.submission_id}"
    new = replace(
        status,
        phase=Phase.SUBMITTING,
        reason=Reason.WORKERS_READY,
        message=message,
        workers=workers,
        provisioning_since=None,
        conditions=set_condition(
            status.conditions,
            ConditionType.WORKERS_READY,
            "True",
            "AllWorkersJoined",
            f"{desired}/{desired} worker pods ready and alive in Ray",
            now=obs.now,
            generation=job.generation,
        ),
    )
    return Decision(new, (SubmitJob(render.submission(job, status.submission_id, package)),))


def _attempt_failed(
    job: Job, status: JobStatus, obs: Observed, reason: Reason, message: str, security: render.Security
) -> Decision:
    """A failed attempt: retry under a new submission id while `backoffLimit` allows, else Failed."""
    limit = job.spec.run_policy.backoff_limit
    failed = status.failed_attempts + 1
    if failed > limit:
        if limit:
            message = f"{message} (attempt {status.attempts}; backoffLimit {limit} reached)"
        return _finish(job, replace(status, failed_attempts=failed), obs, Phase.FAILED, reason, message, stop_job=False)
    fresh = _next_attempt(job, status)
    retry = replace(
        fresh,
        phase=Phase.PROVISIONING,
        reason=Reason.RETRYING,
        message=f"attempt {status.attempts} failed ({reason}: {message}); "
        f"retry {failed}/{limit} as attempt {fresh.attempts}",
        failed_attempts=failed,
        provisioning_since=obs.now,
        conditions=_job_submitted_false(fresh, reason, message, obs.now, job.generation),
    )
    # The RayCluster is reused when it is still there (409 on create); a lost one is created again.
    return Decision(retry, _cluster_actions(job, retry, security))


def _data_unavailable(status: JobStatus) -> str | None:
    """The message of the first rank (or the job's driver) that could not read spec.data, or None."""
    for failure in status.rank_failures:
        if failure.get("reason") == Reason.DATA_UNAVAILABLE:
            message = str(failure.get("message", ""))
            return message.removeprefix(f"{Reason.DATA_UNAVAILABLE}: ") or "the data source cannot be read"
    return None


def _track_job(
    job: Job, status: JobStatus, obs: Observed, package: str, security: render.Security, unreachable_timeout: float
) -> Decision:
    cluster = obs.cluster
    if (taken := _name_taken(job, status, obs)) is not None:
        return taken  # a cluster swapped under our name: its Ray is not ours to stop
    if cluster is None or cluster.deleting:
        what = "was deleted" if cluster is None else "is being deleted"
        message = f"RayCluster {status.ray_cluster_name} {what} while the job was {status.phase}"
        decision = _attempt_failed(job, status, obs, Reason.CLUSTER_LOST, message, security)
        if _submitted(status) and decision.status.phase == Phase.FAILED:
            # Best effort: the Ray job goes with its cluster, but a cluster being deleted may still run it.
            decision = replace(decision, actions=(StopJob(status.submission_id), *decision.actions))
        return decision

    if obs.events or obs.log_offset is not None:
        # The requireEFA deadline at the latest: the Ray job succeeded and its whole log is folded.
        ended = obs.ray_job is not None and obs.ray_job.status == RAY_SUCCEEDED and not obs.log_pending
        folded = fold_events(job, status, obs.events, now=obs.now, forged=obs.forged_lines, job_ended=ended)
        status = folded.status
        if obs.log_offset is not None:
            status = replace(
                status, log_offset=obs.log_offset, skipped_events=status.skipped_events + obs.skipped_lines
            )
        running = obs.ray_job is not None and obs.ray_job.status not in RAY_TERMINAL
        if folded.transport_failure:
            return _finish(
                job, status, obs, Phase.FAILED, Reason.TRANSPORT_FALLBACK, folded.transport_failure, stop_job=running
            )
        if folded.unverified_transport:
            return _finish(
                job, status, obs, Phase.FAILED, Reason.TRANSPORT_UNVERIFIED, folded.unverified_transport,
                stop_job=running,
            )  # fmt: skip
    unreadable = _data_unavailable(status)
    if unreadable:
        # Not retried: another attempt would read the same source. The ranks still waiting stop now.
        running = obs.ray_job is not None and obs.ray_job.status not in RAY_TERMINAL
        return _finish(job, status, obs, Phase.FAILED, Reason.DATA_UNAVAILABLE, unreadable, stop_job=running)

    info = obs.ray_job
    if obs.ray_error:
        return _ray_unreachable(job, status, obs, unreachable_timeout)
    status = replace(status, ray_unreachable_since=None)
    if info is None:
        if status.phase == Phase.RUNNING and status.ray_job_status != RAY_PENDING:
            message = f"Ray no longer knows submission {status.submission_id} (head restarted?)"
            return _attempt_failed(job, status, obs, Reason.RAY_JOB_LOST, message, security)
        if obs.submit_error:
            return _attempt_failed(job, status, obs, Reason.SUBMISSION_FAILED, obs.submit_error, security)
        # Not known to Ray, and no step of it ever ran (never sent, or forgotten while still PENDING, e.g. by a
        # head restart): (re)submit under the recorded id; "already exists" counts as success.
        new = replace(
            status,
            phase=Phase.SUBMITTING,
            reason=Reason.WORKERS_READY,
            message=f"submitting {status.submission_id}",
            ray_job_status="",
        )
        return Decision(new, (SubmitJob(render.submission(job, status.submission_id, package)),))

    status = replace(status, ray_job_status=info.status)
    if info.status in RAY_TERMINAL and obs.log_pending:
        # Finish only once the whole log is folded in: its last lines carry the result (or the failing rank).
        return Decision(replace(status, message="Ray job ended; reading the rest of its log"), requeue_after=0.0)
    if status.phase == Phase.SUBMITTING or _condition_status(status, ConditionType.JOB_SUBMITTED) != "True":
        status = replace(
            status,
            conditions=set_condition(
                status.conditions,
                ConditionType.JOB_SUBMITTED,
                "True",
                "Accepted",
                f"Ray accepted submission {info.submission_id}",
                now=obs.now,
                generation=job.generation,
            ),
        )
    if info.status == RAY_SUCCEEDED:
        steps = status.result.get("steps") or status.progress.get("step")
        message = f"training finished after {steps} steps" if steps else "Ray job succeeded"
        return _finish(job, status, obs, Phase.SUCCEEDED, Reason.COMPLETED, message, stop_job=False)
    if info.status == RAY_FAILED:
        message = f"Ray: {info.message or 'job failed'}"
        if status.rank_failures:
            first = status.rank_failures[0]
            message += f"; rank {first.get('rank')}: {first.get('message')}"
        return _attempt_failed(job, status, obs, Reason.RAY_JOB_FAILED, message, security)
    if info.status == RAY_STOPPED:
        message = f"the Ray job was stopped outside the operator: {info.message or 'no message'}"
        return _finish(job, status, obs, Phase.FAILED, Reason.RAY_JOB_STOPPED, message, stop_job=False)
    running_message = (
        "Ray is preparing the job (runtime environment)" if info.status == RAY_PENDING else "training is running"
    )
    return Decision(
        replace(status, phase=Phase.RUNNING, reason=Reason.JOB_RUNNING, message=running_message),
        requeue_after=0.0 if obs.log_pending else None,
    )


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


# --- events for transitions ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Watched:
    phase: Phase | None
    reason: Reason | None
    conditions: dict[str, str] = field(default_factory=dict)


def _watched(status: JobStatus) -> _Watched:
    return _Watched(status.phase, status.reason, {str(c["type"]): str(c.get("status")) for c in status.conditions})


def _with_transition_events(old: JobStatus, decision: Decision) -> Decision:
    """Add an Event for every phase or reason change and every condition turning False.

    A return from a Warning reason to a Normal one within the same phase (Ray answering again after
    `RayUnreachable`) posts nothing: the Warning said what went wrong, the phase's own event was posted
    when it began, and a flaky API would otherwise post two events per blip.
    """
    new = decision.status
    before, after = _watched(old), _watched(new)
    events: list[Action] = []
    warning = new.phase == Phase.FAILED or new.reason in WARNING_REASONS
    recovered = new.phase == old.phase and old.reason in WARNING_REASONS and not warning
    if (before.phase, before.reason) != (after.phase, after.reason) and new.reason is not None and not recovered:
        text = f"{new.phase}: {new.message}" if new.phase != old.phase else new.message
        events.append(PostEvent("Warning" if warning else "Normal", new.reason.value, text[:1024]))
    for condition in new.conditions:
        type_ = str(condition["type"])
        turned_false = condition.get("status") == "False" and before.conditions.get(type_) != "False"
        rule = CONDITIONS.get(ConditionType(type_)) if type_ in ConditionType._value2member_map_ else None
        if turned_false and rule is not None and rule.warning_when_false:
            reason, message = str(condition.get("reason", type_)), str(condition.get("message", ""))
            events.append(PostEvent("Warning", reason, message))
    if not events:
        return decision
    return replace(decision, actions=(*decision.actions, *events))
