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
from typing import Any

from fsdp_operator.api import render
from fsdp_operator.api.spec import Job, NotAJobError, SpecError, parse_job
from fsdp_operator.capacity.plan import ZoneChoice
from fsdp_operator.decide import failure, health, interruptions, queue
from fsdp_operator.decide.folding import Folded
from fsdp_operator.decide.guards import (
    _check_deadline,
    _check_suspend,
    _condition_status,
    _finish,
    _finished,
    _job_submitted_false,
    _left_by_namesake,
    _name_taken,
    _next_attempt,
    _ray_unreachable,
    _submitted,
    _validation_failed,
    _with_identity,
)
from fsdp_operator.decide.lifecycle import with_lifecycle_conditions
from fsdp_operator.decide.observed import (
    RAY_FAILED,
    RAY_PENDING,
    RAY_STOPPED,
    RAY_SUCCEEDED,
    RAY_TERMINAL,
    RAY_UNREACHABLE_TIMEOUT,
    Action,
    ApplyNetworkPolicy,
    ChildView,
    ClusterView,
    CreateAuthSecret,
    CreateRayCluster,
    Decision,
    DeleteLeftover,
    Observed,
    PostEvent,
    RayNodes,
    StopJob,
    SubmitJob,
    _count,
)
from fsdp_operator.decide.pass_errors import error_cleared, error_recorded, fold_contained
from fsdp_operator.decide.status import (
    CONDITIONS,
    WARNING_REASONS,
    ConditionType,
    JobStatus,
    Phase,
    Reason,
    set_condition,
)
from fsdp_operator.decide.untrusted import mapping

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
    generation = _count(mapping(manifest.get("metadata")).get("generation"))
    new = with_lifecycle_conditions(status, new, now=observed.now, generation=generation)
    if new is not decision.status:
        decision = replace(decision, status=new)
    if decision.contained_error:
        recorded, actions = error_recorded(status, new, decision.contained_error, observed.now)
        return _with_transition_events(
            status, replace(decision, status=recorded, actions=(*decision.actions, *actions))
        )
    return _with_transition_events(status, error_cleared(decision, observed.now))


def pass_failed(
    status: JobStatus, observed: Observed, error: str, manifest: Mapping[str, Any] | None = None
) -> Decision:
    """A pass that raised: the `ReconcileError` condition and a Warning event, and the log offset moved past
    what was read, so the same line cannot fail every pass for ever.

    Defence in depth: with the job's `manifest`, the guards that need nothing from Ray still run on what was
    observed (at least the RayCluster): a terminal job's cleanup and TTL, suspend, `activeDeadlineSeconds`. A job
    whose observation fails every pass still ends on time and gives back its cluster. Nothing else changes."""
    decision = _guards_alone(manifest, status, observed) if manifest is not None else None
    new = decision.status if decision is not None else status
    if observed.log_offset is not None:
        new = replace(new, log_offset=observed.log_offset, skipped_events=new.skipped_events + observed.skipped_lines)
    new, actions = error_recorded(status, new, error, observed.now)
    if decision is None:
        return Decision(new, actions)
    return replace(decision, status=new, actions=(*decision.actions, *actions))


def _guards_alone(manifest: Mapping[str, Any], status: JobStatus, obs: Observed) -> Decision | None:
    """The guards of a pass that need nothing but the job, its status and its RayCluster: the end of a finished job
    (stop, cleanup, TTL), suspend, `activeDeadlineSeconds`. None when none of them acts (or they cannot be run)."""
    try:
        job = parse_job(dict(manifest))
    except (SpecError, NotAJobError):
        return None
    if status.phase is None or not status.submission_id:
        return None
    decision: Decision | None
    try:
        if status.terminal:
            decision = _finished(job, status, obs)
        else:
            decision = _check_suspend(job, status, obs, "") or _check_deadline(job, status, obs, "")
    except Exception:  # the guards failing too: the pass records its error and nothing else
        return None
    if decision is None:
        return None
    new = with_lifecycle_conditions(status, decision.status, now=obs.now, generation=job.generation)
    return _with_transition_events(status, replace(decision, status=new))


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
    if (decision := _check_suspend(job, status, obs, package)) is not None:
        return decision
    # Kueue's admission and eviction (decide/queue.py): before the deadline, which counts from admission.
    if (decision := queue.check_queue(job, status, obs, lambda: _cluster_actions(job, status, security))) is not None:
        return decision
    if (decision := _check_deadline(job, status, obs, package)) is not None:
        return decision
    match status.phase:
        case Phase.PENDING:
            provisioned = _provision(job, status, obs, Reason.CLUSTER_CREATING, "creating RayCluster", security)
            return queue.enqueued(job, provisioned, obs.now) if queue.queue_of(job) else provisioned
        case Phase.PROVISIONING:
            return _wait_for_workers(job, status, obs, package, security)
        case Phase.SUBMITTING | Phase.RUNNING:
            return _track_job(job, status, obs, package, security, ray_unreachable_timeout)
        case _:
            raise AssertionError(f"unhandled phase {status.phase}")


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


def _cluster_actions(job: Job, status: JobStatus, security: render.Security) -> tuple[Action, ...]:
    """Create (idempotently) what the RayCluster needs first, then the cluster itself."""
    # Always: besides Ray's token it holds the key the job's events are signed with (docs/reliability.md).
    actions: tuple[Action, ...] = (CreateAuthSecret(render.auth_secret(job)),)
    if security.network_policy:
        actions += (ApplyNetworkPolicy(render.network_policy(job, security)),)
    return (*actions, _raycluster(job, status, security))


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
            for why in (obs.containers_held, obs.create_refused):
                message += f"; {why}" if why else ""
            return _finish(job, status, obs, Phase.FAILED, Reason.WAIT_FOR_WORKERS_TIMEOUT, message, stop_job=False)
        reason, message = Reason.WORKERS_NOT_READY, gap + (f"; {obs.containers_held}" if obs.containers_held else "")
        if obs.unschedulable:
            reason, message = Reason.UNSCHEDULABLE, obs.unschedulable
        elif obs.create_refused:
            reason, message = Reason.CREATE_REFUSED, f"{message}; {obs.create_refused}"
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
    for reported in status.rank_failures:
        if reported.get("reason") == Reason.DATA_UNAVAILABLE:
            message = failure.headline(str(reported.get("message", "")).removeprefix(f"{Reason.DATA_UNAVAILABLE}: "))
            return message or "the data source cannot be read"
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

    folded, fold_error = fold_contained(job, status, obs) if obs.events or obs.log_offset is not None else (None, "")
    decision = _track_folded(job, status, obs, package, security, unreachable_timeout, folded)
    return replace(decision, contained_error=fold_error) if fold_error else decision


def _track_folded(
    job: Job,
    status: JobStatus,
    obs: Observed,
    package: str,
    security: render.Security,
    unreachable_timeout: float,
    folded: Folded | None = None,
) -> Decision:
    """A job's Ray job tracked, with this pass's events `folded` (None: there were none)."""
    if folded is not None:
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
    running = obs.ray_job is not None and obs.ray_job.status not in RAY_TERMINAL
    status = health.judge(job, status, now=obs.now)
    if running and (stall := health.stall_to_act_on(job, status, now=obs.now)) is not None:
        status = health.with_last_stall(status, stall, obs.now)  # the evidence, kept through the next attempt
        if job.spec.health.on_hang == "Fail":
            return _finish(job, status, obs, Phase.FAILED, Reason.RANK_STALLED, stall, stop_job=True)
        decision = _attempt_failed(job, status, obs, Reason.RANK_STALLED, stall, security)
        return replace(decision, actions=(StopJob(status.submission_id), *decision.actions))  # the hung ranks
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
    if info.status == RAY_FAILED and interruptions.of_attempt(status):  # a node went away: resume, uncounted
        return interruptions.next_attempt(job, status, obs, lambda new: _cluster_actions(job, new, security))
    if info.status == RAY_FAILED:
        # One line naming the cause (a rank's own report when one came, else the end of Ray's message);
        # the log tail Ray appends to its message is kept apart, in failureLog (`fsdpctl status --logs`).
        # The whole message within the headline's limit, its prefix included (a 306-character one was seen).
        if status.rank_failures:
            first = status.rank_failures[0]
            prefix = f"rank {first.get('rank')}: "
            message = prefix + failure.headline(str(first.get("message") or ""), failure.HEADLINE_LIMIT - len(prefix))
        else:
            message = "Ray: " + (failure.headline(info.message, failure.HEADLINE_LIMIT - 5) or "job failed")
        status = replace(status, failure_log=failure.log_tail(info.message))
        return _attempt_failed(job, status, obs, Reason.RAY_JOB_FAILED, message, security)
    if info.status == RAY_STOPPED:
        message = f"the Ray job was stopped outside the operator: {info.message or 'no message'}"
        return _finish(job, status, obs, Phase.FAILED, Reason.RAY_JOB_STOPPED, message, stop_job=False)
    running_message = (
        "Ray is preparing the job (runtime environment)" if info.status == RAY_PENDING else "training is running"
    )
    status, noticed = interruptions.on_node_notices(job, status, obs)  # nodes going away: their pods save first
    return Decision(
        replace(status, phase=Phase.RUNNING, reason=Reason.JOB_RUNNING, message=running_message),
        noticed,
        requeue_after=0.0 if obs.log_pending else None,
    )


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
        rule = CONDITIONS.get(ConditionType(type_)) if type_ in ConditionType._value2member_map_ else None
        bad = "True" if rule is not None and rule.warning_when_true else "False"
        turned_bad = condition.get("status") == bad and before.conditions.get(type_) != bad
        if turned_bad and rule is not None and (rule.warning_when_false or rule.warning_when_true):
            reason, message = str(condition.get("reason", type_)), str(condition.get("message", ""))
            events.append(PostEvent("Warning", reason, message))
    if not events:
        return decision
    return replace(decision, actions=(*decision.actions, *events))
