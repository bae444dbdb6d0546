"""Whole decisions of the state machine, written out: every action with its arguments, every condition field,
and each time limit on both sides of its boundary.

Names, ids and messages are literals here (not derived with `render`), so a change in how they are made
shows up as a failing line, not as a test that follows the code.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from fsdp_operator.api import schema
from fsdp_operator.decide.lifecycle import with_gitops_conditions
from fsdp_operator.decide.observed import (
    ApplyNetworkPolicy,
    ChildView,
    ClusterView,
    CreateAuthSecret,
    CreateRayCluster,
    DeleteJob,
    DeleteLeftover,
    DeleteRayCluster,
    Observed,
    PostEvent,
    RayJobInfo,
    StopJob,
    dashboard_url,
)
from fsdp_operator.decide.reconcile import reconcile
from fsdp_operator.decide.status import JobStatus, Phase, Reason, get_condition
from support.broken_fold import fold_raises_on_step
from support.running_job import NOW, UID

CLUSTER = "qwen-ray"
SID1 = "qwen-f92e6afb-1"  # sha256("qwen/<UID>")[:8], written down once
SID2 = "qwen-f92e6afb-2"


def manifest(generation: int = 1, namespace: str | None = "ml", **spec: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "qwen", "uid": UID, "generation": generation}
    if namespace is not None:
        meta["namespace"] = namespace
    body: dict[str, Any] = {"workers": {"replicas": 2}, "training": {"steps": 100}, **spec}
    return {"apiVersion": schema.API_VERSION, "kind": schema.KIND, "metadata": meta, "spec": body}


def at(phase: Phase, **fields: Any) -> JobStatus:
    base = JobStatus(
        phase=phase,
        reason=fields.pop("reason", Reason.JOB_RUNNING if phase == Phase.RUNNING else None),
        ray_cluster_name=CLUSTER,
        submission_id=SID1,
        attempts=1,
        observed_generation=1,
        start_time=NOW - timedelta(seconds=60),
    )
    for key, value in fields.items():
        setattr(base, key, value)
    return with_gitops_conditions(base, now=NOW - timedelta(seconds=60), generation=1)  # as the operator wrote it


def cluster(**fields: Any) -> ClusterView:
    values: dict[str, Any] = {"name": CLUSTER, "state": "ready", "ready_workers": 2, "desired_workers": 2,
                              "owner_uid": UID, "dashboard_url": "http://10.0.0.1:8265", **fields}  # fmt: skip
    return ClusterView(**values)


def run(m: dict[str, Any], status: JobStatus, **observed: Any) -> Any:
    return reconcile(m, status, Observed(now=NOW, **observed), training_package="/opt/fsdp_train")


def without_events(actions: tuple[Any, ...]) -> list[Any]:
    return [a for a in actions if not isinstance(a, PostEvent)]


def test_the_submission_id_is_the_one_written_down() -> None:
    d = run(manifest(), JobStatus())
    assert (d.status.ray_cluster_name, d.status.submission_id) == (CLUSTER, SID1)


def test_first_pass_in_full() -> None:
    d = run(manifest(generation=4), JobStatus())
    assert d.status.to_dict() == {
        "phase": "Provisioning",
        "reason": "ClusterCreating",
        "message": "creating RayCluster",
        "rayClusterName": CLUSTER,
        "submissionId": SID1,
        "attempts": 1,
        "observedGeneration": 4,
        "startTime": "2026-11-29T12:00:00Z",
        "provisioningSince": "2026-11-29T12:00:00Z",
        "workers": "0/2",
        "conditions": [
            {"type": "Validated", "status": "True", "reason": "Valid", "message": "spec is valid",
             "lastTransitionTime": "2026-11-29T12:00:00Z", "observedGeneration": 4},
            # What kstatus and Flux read: on its way (InProgress), not failed, not ready.
            {"type": "Reconciling", "status": "True", "reason": "ClusterCreating", "message": "creating RayCluster",
             "lastTransitionTime": "2026-11-29T12:00:00Z", "observedGeneration": 4},
            {"type": "Stalled", "status": "False", "reason": "ClusterCreating", "message": "phase Provisioning",
             "lastTransitionTime": "2026-11-29T12:00:00Z", "observedGeneration": 4},
            {"type": "Ready", "status": "False", "reason": "ClusterCreating",
             "message": "phase Provisioning: the job has not finished",
             "lastTransitionTime": "2026-11-29T12:00:00Z", "observedGeneration": 4},
        ],
    }  # fmt: skip
    secret, policy, create = without_events(d.actions)
    assert isinstance(secret, CreateAuthSecret) and secret.manifest["metadata"]["name"] == "qwen-ray-auth"
    assert isinstance(policy, ApplyNetworkPolicy) and isinstance(create, CreateRayCluster)
    assert create.manifest["metadata"]["name"] == CLUSTER
    assert [(a.type, a.reason, a.message) for a in d.actions if isinstance(a, PostEvent)] == [
        ("Normal", "ClusterCreating", "Provisioning: creating RayCluster")
    ]


@pytest.mark.parametrize(
    ("phase", "stops"), [(Phase.RUNNING, True), (Phase.SUBMITTING, True), (Phase.PROVISIONING, False)]
)
def test_a_spec_turned_invalid_fails_and_cleans_up_in_full(phase: Phase, stops: bool) -> None:
    bad = manifest(generation=2, workers={"replicas": 2, "gpusPerWorker": 5})
    d = run(bad, at(phase))
    message = "invalid spec: spec.workers.gpusPerWorker: 5 GPUs requested, g6.12xlarge has 4"
    s = d.status
    assert (s.phase, s.reason, s.message, s.observed_generation) == (Phase.FAILED, Reason.VALIDATION_FAILED, message, 2)
    assert (s.start_time, s.end_time) == (NOW - timedelta(seconds=60), NOW)
    conditions = {c["type"]: c for c in s.conditions}
    assert conditions["Validated"] == {
        "type": "Validated",
        "status": "False",
        "reason": "Invalid",
        "message": message,
        "lastTransitionTime": "2026-11-29T12:00:00Z",
        "observedGeneration": 2,
    }
    assert (conditions["Failed"]["status"], conditions["Failed"]["reason"]) == ("True", "ValidationFailed")
    stop = [StopJob(SID1)] if stops else []
    assert without_events(d.actions) == [*stop, DeleteRayCluster("ml", CLUSTER)]


def test_an_invalid_spec_in_the_default_namespace_deletes_there() -> None:
    bad = manifest(namespace=None, workers={"replicas": 2, "gpusPerWorker": 5})
    assert without_events(run(bad, at(Phase.RUNNING)).actions) == [StopJob(SID1), DeleteRayCluster("default", CLUSTER)]


def test_every_problem_is_listed_on_one_line() -> None:
    bad = manifest(workers={"replicas": 1, "gpusPerWorker": 5}, training={"sharding": "hybrid"})
    message = run(bad, JobStatus()).status.message
    assert message.startswith("invalid spec: ") and "\n" not in message and message.count("; ") >= 1


def test_an_invalid_spec_seen_again_changes_nothing_until_edited() -> None:
    bad = manifest(generation=2, workers={"replicas": 2, "gpusPerWorker": 5})
    failed = run(bad, at(Phase.RUNNING)).status
    again = run(bad, failed)
    assert again.status == failed and again.actions == () and not again.done
    edited_still_bad = manifest(generation=3, workers={"replicas": 2, "gpusPerWorker": 6})
    third = run(edited_still_bad, failed)
    assert third.status.observed_generation == 3 and "6 GPUs requested" in third.status.message
    assert without_events(third.actions) == [DeleteRayCluster("ml", CLUSTER)]  # no Ray job runs any more


def test_an_invalid_manifest_without_a_generation_counts_as_zero() -> None:
    bad = manifest(workers={"replicas": 2, "gpusPerWorker": 5})
    del bad["metadata"]["generation"]
    assert run(bad, JobStatus()).status.observed_generation == 0


# --- time limits on both sides ----------------------------------------------------------------------------


@pytest.mark.parametrize(("waited", "fails"), [(299, False), (300, True)])
def test_wait_for_workers_timeout_on_both_sides(waited: int, fails: bool) -> None:
    m = manifest(runPolicy={"waitForWorkersTimeoutSeconds": 300})
    status = at(Phase.PROVISIONING, provisioning_since=NOW - timedelta(seconds=waited), workers="0/2")
    d = run(m, status, cluster=cluster(state="", ready_workers=1))
    if fails:
        assert (d.status.phase, d.status.reason) == (Phase.FAILED, Reason.WAIT_FOR_WORKERS_TIMEOUT)
        assert d.status.message == (
            "waitForWorkersTimeoutSeconds (300s) exceeded: 1/2 worker pods ready (RayCluster state: no state yet)"
        )
        assert (d.status.workers, d.status.end_time, d.status.provisioning_since) == ("1/2", NOW, None)
        assert without_events(d.actions) == [DeleteRayCluster("ml", CLUSTER)]
    else:
        assert (d.status.phase, d.status.reason) == (Phase.PROVISIONING, Reason.WORKERS_NOT_READY)
        assert d.status.message == "1/2 worker pods ready (RayCluster state: no state yet)"
        assert d.status.workers == "1/2" and d.status.provisioning_since == NOW - timedelta(seconds=waited)
        assert without_events(d.actions) == []


@pytest.mark.parametrize(("waited", "fails"), [(299, False), (300, True)])
def test_a_cluster_that_never_appears_on_both_sides(waited: int, fails: bool) -> None:
    m = manifest(runPolicy={"waitForWorkersTimeoutSeconds": 300})
    d = run(m, at(Phase.PROVISIONING, provisioning_since=NOW - timedelta(seconds=waited)))
    if fails:
        assert (d.status.phase, d.status.reason) == (Phase.FAILED, Reason.WAIT_FOR_WORKERS_TIMEOUT)
        assert d.status.message == "waitForWorkersTimeoutSeconds (300s) exceeded: RayCluster qwen-ray does not exist"
        # A create still in flight may land after this pass: the delete makes sure nothing stays behind.
        assert without_events(d.actions) == [DeleteRayCluster("ml", CLUSTER)]
    else:
        assert (d.status.phase, d.status.reason, d.status.message) == (
            Phase.PROVISIONING, Reason.CLUSTER_CREATING, "creating RayCluster",
        )  # fmt: skip
        secret, policy, create = without_events(d.actions)
        assert isinstance(secret, CreateAuthSecret) and isinstance(policy, ApplyNetworkPolicy)
        assert isinstance(create, CreateRayCluster) and create.manifest["metadata"]["name"] == CLUSTER


def test_a_cluster_being_deleted_while_provisioning_times_out_with_that_said() -> None:
    m = manifest(runPolicy={"waitForWorkersTimeoutSeconds": 300})
    d = run(m, at(Phase.PROVISIONING, provisioning_since=NOW - timedelta(seconds=300)), cluster=cluster(deleting=True))
    assert d.status.message == "waitForWorkersTimeoutSeconds (300s) exceeded: RayCluster qwen-ray is being deleted"


def test_unschedulable_at_the_timeout_fails_with_the_schedulers_words() -> None:
    m = manifest(runPolicy={"waitForWorkersTimeoutSeconds": 300})
    status = at(Phase.PROVISIONING, provisioning_since=NOW - timedelta(seconds=300))
    d = run(m, status, cluster=cluster(state="", ready_workers=0), unschedulable="0/3 nodes are available")
    assert (d.status.phase, d.status.reason) == (Phase.FAILED, Reason.UNSCHEDULABLE)
    assert d.status.message == "workers not scheduled after 300s: 0/3 nodes are available"
    assert without_events(d.actions) == [DeleteRayCluster("ml", CLUSTER)]


@pytest.mark.parametrize("waited", [10, 300])
def test_a_container_the_kubelet_holds_back_is_said_while_waiting_and_in_the_timeouts_failure(waited: int) -> None:
    m = manifest(runPolicy={"waitForWorkersTimeoutSeconds": 300})
    status = at(Phase.PROVISIONING, provisioning_since=NOW - timedelta(seconds=waited))
    held = "pod qwen-ray-w-1: container ray-worker CrashLoopBackOff (restarted 5 times, last exit code 1 (Error))"
    d = run(m, status, cluster=cluster(state="", ready_workers=1), containers_held=held)
    gap = "1/2 worker pods ready (RayCluster state: no state yet)"
    if waited < 300:
        assert (d.status.phase, d.status.reason, d.status.message) == (
            Phase.PROVISIONING, Reason.WORKERS_NOT_READY, f"{gap}; {held}",
        )  # fmt: skip
    else:
        assert (d.status.phase, d.status.reason) == (Phase.FAILED, Reason.WAIT_FOR_WORKERS_TIMEOUT)
        assert d.status.message == f"waitForWorkersTimeoutSeconds (300s) exceeded: {gap}; {held}"


@pytest.mark.parametrize(("elapsed", "fails"), [(3599, False), (3600, True)])
def test_active_deadline_on_both_sides(elapsed: int, fails: bool) -> None:
    m = manifest(runPolicy={"activeDeadlineSeconds": 3600})
    status = at(Phase.RUNNING, start_time=NOW - timedelta(seconds=elapsed))
    d = run(m, status, cluster=cluster(), ray_job=RayJobInfo(SID1, "RUNNING"))
    assert (d.status.phase == Phase.FAILED) is fails
    if fails:
        assert d.status.message == "activeDeadlineSeconds (3600s) exceeded after 3600s in phase Running"
        assert without_events(d.actions) == [StopJob(SID1), DeleteRayCluster("ml", CLUSTER)]


@pytest.mark.parametrize(("since_end", "deleted"), [(59, False), (60, True)])
def test_ttl_after_finished_on_both_sides(since_end: int, deleted: bool) -> None:
    m = manifest(runPolicy={"ttlSecondsAfterFinished": 60, "cleanup": "Keep"})
    status = at(Phase.SUCCEEDED, reason=Reason.COMPLETED, end_time=NOW - timedelta(seconds=since_end))
    d = run(m, status, cluster=cluster())
    if deleted:
        assert d.actions == (DeleteJob(),) and d.requeue_after is None
    else:
        assert d.actions == () and d.requeue_after == 1.0 and not d.done


def test_a_finished_job_without_ttl_is_done_once_nothing_is_left() -> None:
    status = at(Phase.SUCCEEDED, reason=Reason.COMPLETED, end_time=NOW)
    assert run(manifest(), status).done
    busy = run(manifest(), status, cluster=cluster(), ray_job=RayJobInfo(SID1, "RUNNING"))
    assert busy.actions == (StopJob(SID1), DeleteRayCluster("ml", CLUSTER)) and not busy.done


# --- a failed attempt ---------------------------------------------------------------------------------------


def test_a_failed_attempt_with_retries_left_in_full() -> None:
    m = manifest(generation=2, runPolicy={"backoffLimit": 1})
    status = at(Phase.RUNNING, observed_generation=2)
    d = run(m, status, cluster=cluster(), ray_job=RayJobInfo(SID1, "FAILED", "exit 1"))
    s = d.status
    assert (s.phase, s.reason, s.attempts, s.failed_attempts, s.submission_id) == (
        Phase.PROVISIONING, Reason.RETRYING, 2, 1, SID2,
    )  # fmt: skip
    assert s.message == "attempt 1 failed (RayJobFailed: Ray: exit 1); retry 1/1 as attempt 2"
    assert s.provisioning_since == NOW
    submitted = next(c for c in s.conditions if c["type"] == "JobSubmitted")
    assert submitted == {"type": "JobSubmitted", "status": "False", "reason": "RayJobFailed", "message": "Ray: exit 1",
                         "lastTransitionTime": "2026-11-29T12:00:00Z", "observedGeneration": 2}  # fmt: skip
    secret, policy, create = without_events(d.actions)
    assert isinstance(secret, CreateAuthSecret) and isinstance(policy, ApplyNetworkPolicy)
    assert isinstance(create, CreateRayCluster) and create.manifest["metadata"]["name"] == CLUSTER


def test_the_last_allowed_attempt_failing_fails_the_job_in_full() -> None:
    m = manifest(generation=2, runPolicy={"backoffLimit": 1})
    status = at(Phase.RUNNING, attempts=2, failed_attempts=1, submission_id=SID2, observed_generation=2)
    d = run(m, status, cluster=cluster(), ray_job=RayJobInfo(SID2, "FAILED", "exit 1"))
    s = d.status
    assert (s.phase, s.reason, s.failed_attempts, s.end_time) == (Phase.FAILED, Reason.RAY_JOB_FAILED, 2, NOW)
    assert s.message == "Ray: exit 1 (attempt 2; backoffLimit 1 reached)"
    submitted = next(c for c in s.conditions if c["type"] == "JobSubmitted")
    assert (submitted["status"], submitted["reason"], submitted["message"], submitted["observedGeneration"]) == (
        "False", "RayJobFailed", "Ray: exit 1 (attempt 2; backoffLimit 1 reached)", 2,
    )  # fmt: skip
    assert without_events(d.actions) == [DeleteRayCluster("ml", CLUSTER)]  # Ray's job has ended already


def test_a_foreign_cluster_is_a_conflict_and_left_alone() -> None:
    d = run(manifest(), at(Phase.PROVISIONING, provisioning_since=NOW), cluster=cluster(owner_uid="someone-else"))
    assert (d.status.phase, d.status.reason) == (Phase.FAILED, Reason.CLUSTER_NAME_TAKEN)
    assert d.status.message == (
        "RayCluster qwen-ray exists and was not created for this job (owned by uid someone-else); it is left alone: "
        "delete it or rename the job"
    )
    assert without_events(d.actions) == []


OLD_UID = "9f8e7d6c-0000-0000-0000-000000000001"
NAMESAKE = {"owner_uid": OLD_UID, "owner_kind": "FSDPTrainingJob", "owner_name": "qwen"}


def test_what_a_deleted_namesake_left_is_replaced_and_the_status_says_so() -> None:
    secret = ChildView("Secret", "qwen-ray-auth", "secret-uid", **NAMESAKE)
    policy = ChildView("NetworkPolicy", "qwen-ray", "policy-uid", deleting=True, **NAMESAKE)
    d = run(
        manifest(),
        at(Phase.PROVISIONING, provisioning_since=NOW),
        cluster=cluster(uid="cluster-uid", **NAMESAKE),
        children=(secret, policy),
    )
    assert (d.status.phase, d.status.reason) == (Phase.PROVISIONING, Reason.CLUSTER_CREATING)
    assert d.status.message == (
        "replacing Secret qwen-ray-auth, RayCluster qwen-ray and waiting for NetworkPolicy qwen-ray to be deleted: "
        f"left by a deleted FSDPTrainingJob of the same name (uid {OLD_UID})"
    )
    # Deleted only while each is still that object (uid precondition); nothing is created in this pass.
    assert without_events(d.actions) == [
        DeleteLeftover("Secret", "ml", "qwen-ray-auth", "secret-uid"),
        DeleteLeftover("RayCluster", "ml", "qwen-ray", "cluster-uid"),
    ]


def test_once_the_leftovers_are_gone_the_job_creates_its_own() -> None:
    d = run(manifest(), at(Phase.PROVISIONING, provisioning_since=NOW))
    assert [type(a) for a in without_events(d.actions)] == [CreateAuthSecret, ApplyNetworkPolicy, CreateRayCluster]


@pytest.mark.parametrize(
    "owner",
    [
        {"owner_uid": "x", "owner_kind": "FSDPTrainingJob", "owner_name": "other-job"},
        {"owner_uid": "x", "owner_kind": "Deployment", "owner_name": "qwen"},
        {},
    ],
)
def test_an_object_no_namesake_left_is_a_conflict_and_left_alone(owner: dict[str, str]) -> None:
    policy = ChildView("NetworkPolicy", "qwen-ray", "policy-uid", **owner)
    d = run(manifest(), at(Phase.PROVISIONING, provisioning_since=NOW), children=(policy,))
    assert (d.status.phase, d.status.reason) == (Phase.FAILED, Reason.CLUSTER_NAME_TAKEN)
    assert d.status.message.startswith("NetworkPolicy qwen-ray exists and was not created for this job (")
    # Nothing is created or replaced (the cleanup's delete of the absent RayCluster by name is a 404).
    assert without_events(d.actions) == [DeleteRayCluster("ml", CLUSTER)]


# --- reading KubeRay's RayCluster ---------------------------------------------------------------------------


def test_cluster_view_reads_every_field() -> None:
    obj = {
        "metadata": {"name": CLUSTER, "namespace": "ml", "deletionTimestamp": "2026-11-29T12:00:00Z",
                     "ownerReferences": [{"uid": "not-the-controller"}, {"uid": UID, "controller": True}]},
        "status": {"state": "failed", "reason": "pods failed", "readyWorkerReplicas": 1, "desiredWorkerReplicas": 2,
                   "head": {"serviceIP": "10.96.0.7"}, "endpoints": {"dashboard": "18265"}},
    }  # fmt: skip
    assert ClusterView.from_object(obj) == ClusterView(
        name=CLUSTER, state="failed", ready_workers=1, desired_workers=2, deleting=True, owner_uid=UID,
        dashboard_url="http://10.96.0.7:18265", reason="pods failed",
    )  # fmt: skip
    assert ClusterView.from_object({}) == ClusterView(name="")


@pytest.mark.parametrize(
    ("status", "namespace", "url"),
    [
        ({"head": {"serviceName": "qwen-ray-head-svc"}}, "ml", "http://qwen-ray-head-svc.ml.svc:8265"),
        ({"head": {"serviceName": "qwen-ray-head-svc"}}, None, "http://qwen-ray-head-svc.default.svc:8265"),
        ({"head": {"serviceIP": "10.96.0.7", "serviceName": "x"}, "endpoints": {"client": "1"}}, "ml",
         "http://10.96.0.7:8265"),
        ({"endpoints": {"dashboard": "8265"}}, "ml", ""),
    ],
)  # fmt: skip
def test_dashboard_address(status: dict[str, Any], namespace: str | None, url: str) -> None:
    meta = {"name": CLUSTER} | ({"namespace": namespace} if namespace else {})
    assert dashboard_url({"metadata": meta, "status": status}) == url


# --- a pass that raised -------------------------------------------------------------------------------


def test_a_failed_pass_sets_reconcile_error_posts_one_warning_and_moves_the_log_offset() -> None:
    from fsdp_operator.decide.reconcile import pass_failed

    before = at(Phase.RUNNING, log_offset=100, skipped_events=2)
    d = pass_failed(before, Observed(now=NOW, log_offset=250, skipped_lines=3), "boom\x00 in pass")
    assert (d.status.log_offset, d.status.skipped_events) == (250, 5)
    assert (d.status.phase, d.status.reason, d.status.submission_id) == (Phase.RUNNING, Reason.JOB_RUNNING, SID1)
    assert [c for c in d.status.conditions if c["type"] not in ("Reconciling", "Stalled", "Ready")] == [
        {"type": "ReconcileError", "status": "True", "reason": "PassFailed", "message": "boom in pass",
         "lastTransitionTime": "2026-11-29T12:00:00Z", "observedGeneration": 1},
    ]  # fmt: skip
    assert d.actions == (PostEvent("Warning", "ReconcileError", "boom in pass"),)
    # The same error again: no second event; another error: one more.
    again = pass_failed(d.status, Observed(now=NOW + timedelta(seconds=5)), "boom\x00 in pass")
    assert again.actions == () and again.status.log_offset == 250 and again.status.skipped_events == 5
    other = pass_failed(d.status, Observed(now=NOW + timedelta(seconds=5)), "other")
    assert other.actions == (PostEvent("Warning", "ReconcileError", "other"),)
    error = get_condition(other.status.conditions, "ReconcileError")
    assert error is not None and error["lastTransitionTime"] == "2026-11-29T12:00:00Z"  # still True: no flip


def test_a_failed_pass_that_read_no_log_keeps_the_offset() -> None:
    from fsdp_operator.decide.reconcile import pass_failed

    d = pass_failed(at(Phase.RUNNING, log_offset=100, skipped_events=2), Observed(now=NOW, skipped_lines=9), "x")
    assert (d.status.log_offset, d.status.skipped_events) == (100, 2)


def test_an_event_whose_folding_raises_is_skipped_alone_and_the_lines_read_with_it_are_folded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A bug in folding one event must not lose the others of its batch: here the transport lines read in the same
    pass as step 2, which once failed a finished job as `TransportUnverified`."""
    from fsdp_train.contract.events import Step, Transport

    fold_raises_on_step(monkeypatch, 2)
    efa = [Transport(rank=r, transport="efa", evidence="NET/OFI Selected provider is efa") for r in range(8)]
    steps = [
        Step(rank=0, step=s, total_steps=100, loss=2.0, tokens_per_second=1e4, tokens_per_second_per_device=1250.0)
        for s in (1, 2, 3)
    ]
    events = (*efa[:4], steps[0], steps[1], *efa[4:], steps[2])
    before = at(Phase.RUNNING, log_offset=100, skipped_events=1)
    d = run(manifest(), before, cluster=cluster(), events=events, log_offset=900,
            ray_job=RayJobInfo(SID1, "RUNNING"))  # fmt: skip
    assert d.status.phase == Phase.RUNNING and d.status.progress["step"] == 3
    assert {r["rank"]: r.get("transport") for r in d.status.ranks} == {r: "efa" for r in range(8)}
    assert get_condition(d.status.conditions, "TransportVerified")["status"] == "True"
    assert (d.status.log_offset, d.status.skipped_events) == (900, 2)  # the one event that raised, counted
    message = "ZeroDivisionError: step 2 breaks the fold (folding 1 event(s); skipped, the rest folded)"
    assert get_condition(d.status.conditions, "ReconcileError") == {
        "type": "ReconcileError", "status": "True", "reason": "PassFailed", "message": message,
        "lastTransitionTime": "2026-11-29T12:00:00Z", "observedGeneration": 1,
    }  # fmt: skip
    assert PostEvent("Warning", "ReconcileError", message) in d.actions
    # The next pass folds without error: the condition turns False.
    later = reconcile(manifest(), d.status, Observed(now=NOW + timedelta(seconds=5), cluster=cluster(),
                      ray_job=RayJobInfo(SID1, "RUNNING")), training_package="/opt/fsdp_train")  # fmt: skip
    assert get_condition(later.status.conditions, "ReconcileError")["status"] == "False"


# --- suspend and resume, written out ---------------------------------------------------------------------


def suspended_manifest(suspend: bool = True) -> dict[str, Any]:
    return manifest(generation=3, runPolicy={"suspend": suspend})


SUSPENDED_MESSAGE = "suspended: Ray job stopped and RayCluster deleted; set runPolicy.suspend: false to resume"


def test_suspending_a_running_job_in_full() -> None:
    submitted = {"type": "JobSubmitted", "status": "True", "reason": "Submitted", "message": "m",
                 "lastTransitionTime": "2026-11-29T11:00:00Z", "observedGeneration": 1}  # fmt: skip
    d = run(suspended_manifest(), at(Phase.RUNNING, conditions=[submitted]), cluster=cluster())
    s = d.status
    assert (s.phase, s.reason, s.message, s.provisioning_since) == (
        Phase.SUSPENDED, Reason.SUSPENDED, SUSPENDED_MESSAGE, None,
    )  # fmt: skip
    conditions = {c["type"]: c for c in s.conditions}
    assert conditions["WorkersReady"] == {
        "type": "WorkersReady", "status": "False", "reason": "Suspended", "message": "RayCluster deleted",
        "lastTransitionTime": "2026-11-29T12:00:00Z", "observedGeneration": 3,
    }  # fmt: skip
    assert conditions["JobSubmitted"] == {
        "type": "JobSubmitted", "status": "False", "reason": "Suspended", "message": "Ray job stopped",
        "lastTransitionTime": "2026-11-29T12:00:00Z", "observedGeneration": 3,
    }  # fmt: skip
    assert without_events(d.actions) == [StopJob(SID1), DeleteRayCluster("ml", CLUSTER)]


def test_suspending_before_anything_was_submitted_leaves_job_submitted_alone() -> None:
    d = run(suspended_manifest(), at(Phase.PROVISIONING), cluster=cluster(ready_workers=0))
    assert "JobSubmitted" not in {c["type"] for c in d.status.conditions}
    assert without_events(d.actions) == [DeleteRayCluster("ml", CLUSTER)]
    # Pending with no cluster yet: nothing to stop or delete.
    pending = run(suspended_manifest(), at(Phase.PENDING), cluster=None)
    assert pending.status.phase == Phase.SUSPENDED and without_events(pending.actions) == []
    # Pending, but a cluster of ours exists already: deleted.
    assert without_events(run(suspended_manifest(), at(Phase.PENDING), cluster=cluster()).actions) == [
        DeleteRayCluster("ml", CLUSTER)
    ]


def test_suspending_never_touches_a_cluster_that_is_not_the_jobs() -> None:
    d = run(suspended_manifest(), at(Phase.RUNNING), cluster=cluster(owner_uid="someone-else"))
    assert d.status.phase == Phase.SUSPENDED and without_events(d.actions) == []
    lingering = run(suspended_manifest(), at(Phase.SUSPENDED, reason=Reason.SUSPENDED),
                    cluster=cluster(owner_uid="someone-else"))  # fmt: skip
    assert lingering.actions == ()


def test_a_suspended_job_deletes_its_cluster_again_unless_it_is_already_going() -> None:
    suspended = at(Phase.SUSPENDED, reason=Reason.SUSPENDED)
    assert run(suspended_manifest(), suspended, cluster=cluster()).actions == (DeleteRayCluster("ml", CLUSTER),)
    assert run(suspended_manifest(), suspended, cluster=cluster(deleting=True)).actions == ()


def test_resuming_starts_attempt_two_from_scratch_in_full() -> None:
    suspended = at(
        Phase.SUSPENDED, reason=Reason.SUSPENDED, workers="2/2", placement={"availabilityZone": "us-east-2a"},
        progress={"step": 40},
    )  # fmt: skip
    d = run(suspended_manifest(suspend=False), suspended, cluster=None)
    s = d.status
    assert (s.phase, s.reason, s.message) == (Phase.PENDING, Reason.RESUMED, "resumed as attempt 2")
    assert (s.attempts, s.submission_id, s.start_time) == (2, SID2, NOW)
    assert (s.workers, s.placement, s.progress) == ("", {}, {})
    assert without_events(d.actions) == []


# --- ReconcileError turns False after a pass that went through ----------------------------------------------


def test_a_pass_that_goes_through_clears_reconcile_error() -> None:
    failed = {"type": "ReconcileError", "status": "True", "reason": "PassFailed", "message": "boom",
              "lastTransitionTime": "2026-11-29T11:00:00Z", "observedGeneration": 1}  # fmt: skip
    d = run(manifest(), at(Phase.RUNNING, conditions=[failed]), cluster=cluster())
    assert get_condition(d.status.conditions, "ReconcileError") == {
        "type": "ReconcileError", "status": "False", "reason": "PassSucceeded",
        "message": "the last pass over the job succeeded", "lastTransitionTime": "2026-11-29T12:00:00Z",
        "observedGeneration": 1,
    }  # fmt: skip
    # Already False, or never set: left as it is.
    cleared = d.status.conditions
    again = run(manifest(), at(Phase.RUNNING, conditions=cleared), cluster=cluster())
    assert get_condition(again.status.conditions, "ReconcileError") == get_condition(cleared, "ReconcileError")
    assert get_condition(run(manifest(), at(Phase.RUNNING), cluster=cluster()).status.conditions,
                         "ReconcileError") is None  # fmt: skip


# --- following the Ray job: each outcome's words and the next pass ---------------------------------------


@pytest.mark.parametrize(
    ("ray", "phase", "reason", "message"),
    [
        (RayJobInfo(SID1, "SUCCEEDED"), Phase.SUCCEEDED, Reason.COMPLETED, "training finished after 7 steps"),
        (RayJobInfo(SID1, "FAILED"), Phase.FAILED, Reason.RAY_JOB_FAILED, "Ray: job failed"),
        (RayJobInfo(SID1, "FAILED", "exit 3"), Phase.FAILED, Reason.RAY_JOB_FAILED, "Ray: exit 3"),
        (RayJobInfo(SID1, "STOPPED"), Phase.FAILED, Reason.RAY_JOB_STOPPED,
         "the Ray job was stopped outside the operator: no message"),
        (RayJobInfo(SID1, "STOPPED", "by alice"), Phase.FAILED, Reason.RAY_JOB_STOPPED,
         "the Ray job was stopped outside the operator: by alice"),
        (RayJobInfo(SID1, "PENDING"), Phase.RUNNING, Reason.JOB_RUNNING,
         "Ray is preparing the job (runtime environment)"),
        (RayJobInfo(SID1, "RUNNING"), Phase.RUNNING, Reason.JOB_RUNNING, "training is running"),
    ],
)  # fmt: skip
def test_each_ray_outcome_in_words(ray: RayJobInfo, phase: Phase, reason: Reason, message: str) -> None:
    d = run(manifest(), at(Phase.RUNNING, progress={"step": 7}), cluster=cluster(), ray_job=ray)
    assert (d.status.phase, d.status.reason, d.status.message, d.status.ray_job_status) == (
        phase, reason, message, ray.status,
    )  # fmt: skip
    # A job that ran to its end stops nothing; the Ray job is already over.
    assert StopJob(SID1) not in d.actions


def test_a_success_without_steps_says_so() -> None:
    d = run(manifest(), at(Phase.RUNNING), cluster=cluster(), ray_job=RayJobInfo(SID1, "SUCCEEDED"))
    assert d.status.message == "Ray job succeeded"
    with_result = at(Phase.RUNNING, progress={"step": 7}, result={"steps": 9})
    assert run(manifest(), with_result, cluster=cluster(), ray_job=RayJobInfo(SID1, "SUCCEEDED")).status.message == (
        "training finished after 9 steps"
    )


def test_the_rest_of_the_log_is_read_before_a_finished_job_is_judged() -> None:
    d = run(manifest(), at(Phase.RUNNING), cluster=cluster(), ray_job=RayJobInfo(SID1, "SUCCEEDED"), log_pending=True)
    assert (d.status.phase, d.status.message, d.requeue_after) == (
        Phase.RUNNING, "Ray job ended; reading the rest of its log", 0.0,
    )  # fmt: skip
    assert without_events(d.actions) == []
    # A running job with more log waiting: the next pass comes at once; without, at the usual interval.
    busy = run(manifest(), at(Phase.RUNNING), cluster=cluster(), ray_job=RayJobInfo(SID1, "RUNNING"), log_pending=True)
    assert busy.requeue_after == 0.0
    calm = run(manifest(), at(Phase.RUNNING), cluster=cluster(), ray_job=RayJobInfo(SID1, "RUNNING"))
    assert calm.requeue_after is None


def test_skipped_log_lines_add_up_and_the_offset_moves() -> None:
    d = run(manifest(), at(Phase.RUNNING, log_offset=10, skipped_events=4), cluster=cluster(),
            ray_job=RayJobInfo(SID1, "RUNNING"), log_offset=99, skipped_lines=3)  # fmt: skip
    assert (d.status.log_offset, d.status.skipped_events) == (99, 7)
    unread = run(manifest(), at(Phase.RUNNING, log_offset=10, skipped_events=4), cluster=cluster(),
                 ray_job=RayJobInfo(SID1, "RUNNING"), skipped_lines=3)  # fmt: skip
    assert (unread.status.log_offset, unread.status.skipped_events) == (10, 4)


@pytest.mark.parametrize(("lost", "what"), [(None, "was deleted"), (cluster(deleting=True), "is being deleted")])
def test_a_cluster_lost_under_a_running_job_fails_the_attempt_and_stops_its_ray_job(
    lost: ClusterView | None, what: str
) -> None:
    d = run(manifest(), at(Phase.RUNNING), cluster=lost, ray_job=RayJobInfo(SID1, "RUNNING"))
    assert (d.status.phase, d.status.reason, d.status.message) == (
        Phase.FAILED, Reason.CLUSTER_LOST, f"RayCluster {CLUSTER} {what} while the job was Running",
    )  # fmt: skip
    assert StopJob(SID1) in d.actions


def test_a_submission_resent_under_its_recorded_id() -> None:
    d = run(manifest(), at(Phase.SUBMITTING, ray_job_status="PENDING"), cluster=cluster(), ray_job=None)
    assert (d.status.phase, d.status.reason, d.status.message, d.status.ray_job_status) == (
        Phase.SUBMITTING, Reason.WORKERS_READY, f"submitting {SID1}", "",
    )  # fmt: skip
    (submit,) = without_events(d.actions)
    assert submit.submission.submission_id == SID1
    # The training package the operator was given travels with it.
    assert "/opt/fsdp_train" in json.dumps([submit.submission.entrypoint, submit.submission.runtime_env])


def test_transition_events_name_the_new_phase_only_when_it_changes() -> None:
    moved = run(manifest(), at(Phase.SUBMITTING), cluster=cluster(), ray_job=RayJobInfo(SID1, "RUNNING"))
    events = [a for a in moved.actions if isinstance(a, PostEvent)]
    assert PostEvent("Normal", "JobRunning", "Running: training is running") in events
    same = run(manifest(), at(Phase.RUNNING, reason=Reason.WORKERS_READY, message="m"), cluster=cluster(),
               ray_job=RayJobInfo(SID1, "RUNNING"))  # fmt: skip
    assert PostEvent("Normal", "JobRunning", "training is running") in same.actions
    # Back from a Warning reason in the same phase (Ray answering again): no event.
    recovered = run(manifest(), at(Phase.RUNNING, reason=Reason.RAY_UNREACHABLE, message="m"), cluster=cluster(),
                    ray_job=RayJobInfo(SID1, "RUNNING"))  # fmt: skip
    assert [a for a in recovered.actions if isinstance(a, PostEvent)] == []


REFUSED_POD = 'KubeRay could not create a pod (FailedToCreateWorkerPod): Pod "qwen-ray-w-0" is invalid: env[0].name'


def test_a_pod_the_api_server_refused_is_the_reason_while_waiting_and_at_the_timeout() -> None:
    m = manifest(runPolicy={"waitForWorkersTimeoutSeconds": 300})
    d = run(m, at(Phase.PROVISIONING, provisioning_since=NOW), cluster=cluster(state="", ready_workers=0),
            create_refused=REFUSED_POD)  # fmt: skip
    assert (d.status.phase, d.status.reason) == (Phase.PROVISIONING, Reason.CREATE_REFUSED)
    assert d.status.message.endswith(REFUSED_POD) and d.status.message.startswith("0/2 worker pods ready")
    late = at(Phase.PROVISIONING, provisioning_since=NOW - timedelta(seconds=300))
    d = run(m, late, cluster=cluster(state="", ready_workers=0), create_refused=REFUSED_POD)
    assert (d.status.phase, d.status.reason) == (Phase.FAILED, Reason.WAIT_FOR_WORKERS_TIMEOUT)
    assert d.status.message.endswith(REFUSED_POD)


def test_a_refused_create_of_the_cluster_is_the_reason_while_it_does_not_exist() -> None:
    refused = "the API server refused the job's RayCluster: 403: rayclusters.ray.io is forbidden"
    d = run(manifest(), at(Phase.PROVISIONING, provisioning_since=NOW), create_refused=refused)
    assert (d.status.phase, d.status.reason) == (Phase.PROVISIONING, Reason.CREATE_REFUSED)
    assert d.status.message == f"creating RayCluster {CLUSTER}: {refused}"
