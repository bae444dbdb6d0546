"""Kueue queueing, the pure parts: the spec's queue and its labels, the rendered RayCluster, the Workload as read,
and the decisions of a queued job (Queued, admitted, evicted, Preempted, Queued again)."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from fsdp_operator.api import render, schema
from fsdp_operator.api.spec import SpecError, parse_job
from fsdp_operator.cli.main import main
from fsdp_operator.decide.observed import ChildView, ClusterView, CreateRayCluster, DeleteLeftover, Observed, StopJob
from fsdp_operator.decide.reconcile import reconcile
from fsdp_operator.decide.status import JobStatus, Phase, Reason, get_condition
from fsdp_operator.decide.workload import WorkloadView, workload_of
from fsdp_operator.runtime.kube import KubeError
from fsdp_operator.runtime.kueue import read_workload
from support.running_job import NOW, UID

SID1, SID2 = "qwen-f92e6afb-1", "qwen-f92e6afb-2"
PENDING = (
    "couldn't assign flavors to pod set gpu-workers: insufficient unused quota for nvidia.com/gpu in flavor "
    "default-flavor, 8 more needed"
)


def manifest(labels: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "qwen", "namespace": "ml", "uid": UID, "generation": 1}
    if labels is not None:
        meta["labels"] = labels
    body = {"workers": {"replicas": 2}, "training": {"steps": 100}, **spec}
    return {"apiVersion": schema.API_VERSION, "kind": schema.KIND, "metadata": meta, "spec": body}


QUEUED = manifest(queueName="team-a", runPolicy={"activeDeadlineSeconds": 600, "waitForWorkersTimeoutSeconds": 300})


def cluster(*, suspended: bool) -> ClusterView:
    return ClusterView(name="qwen-ray", owner_uid=UID, uid="rc-uid", suspended=suspended, state="suspended")


def status(phase: Phase, **fields: Any) -> JobStatus:
    base = JobStatus(
        phase=phase, reason=Reason.QUEUED if phase == Phase.QUEUED else Reason.JOB_RUNNING, ray_cluster_name="qwen-ray",
        submission_id=SID1, attempts=1, observed_generation=1, start_time=NOW - timedelta(hours=2),
    )  # fmt: skip
    return replace(base, **fields)


def pending_workload() -> WorkloadView:
    return WorkloadView.from_object(
        {"metadata": {"name": "raycluster-qwen-ray-1a2b3"},
         "status": {"conditions": [{"type": "QuotaReserved", "status": "False", "reason": "Pending",
                                    "message": PENDING}]}}
    )  # fmt: skip


# --- the spec and the rendered RayCluster --------------------------------------------------------------------


def test_a_queued_job_renders_a_suspended_raycluster_with_kueues_labels() -> None:
    job = parse_job(manifest({"kueue.x-k8s.io/priority-class": "high"}, queueName="team-a"))
    rc = render.raycluster(job)
    assert rc["spec"]["suspend"] is True
    assert rc["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    assert rc["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] == "high"
    # The pods are Kueue's to admit through the cluster, not to be queued one by one.
    for template in (rc["spec"]["headGroupSpec"]["template"], rc["spec"]["workerGroupSpecs"][0]["template"]):
        assert "kueue.x-k8s.io/queue-name" not in template["metadata"]["labels"]


def test_the_queue_label_on_the_job_queues_it_too_and_no_queue_renders_as_before() -> None:
    labelled = render.raycluster(parse_job(manifest({"kueue.x-k8s.io/queue-name": "team-b"})))
    assert labelled["spec"]["suspend"] is True and labelled["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == (
        "team-b"
    )
    plain = render.raycluster(parse_job(manifest()))
    assert "suspend" not in plain["spec"] and not any(k.startswith("kueue") for k in plain["metadata"]["labels"])


@pytest.mark.parametrize(
    ("labels", "spec", "problem"),
    [
        ({"kueue.x-k8s.io/queue-name": "team-b"}, {"queueName": "team-a"},
         "spec.queueName: 'team-a' contradicts metadata.labels.kueue.x-k8s.io/queue-name ('team-b')"),
        ({"kueue.x-k8s.io/queue-name": "Team_A"}, {},
         "metadata.labels.kueue.x-k8s.io/queue-name: 'Team_A' is not a LocalQueue name"),
        ({"kueue.x-k8s.io/priority-class": "high"}, {},
         "metadata.labels.kueue.x-k8s.io/priority-class: a Kueue priority class needs a queue"),
        (None, {"queueName": "Team-A"}, "spec.queueName: 'Team-A' must be a DNS-1123 subdomain"),
        (None, {"queueName": "a" * 64}, "spec.queueName:"),
    ],
)  # fmt: skip
def test_a_queue_that_cannot_be_is_refused_naming_the_field(
    labels: dict[str, str] | None, spec: dict[str, Any], problem: str
) -> None:
    with pytest.raises(SpecError) as refused:
        parse_job(manifest(labels, **spec))
    assert any(p.startswith(problem) for p in refused.value.problems), refused.value.problems


def test_the_same_queue_in_the_spec_and_the_label_is_accepted() -> None:
    job = parse_job(manifest({"kueue.x-k8s.io/queue-name": "team-a"}, queueName="team-a"))
    assert render.raycluster(job)["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"


def test_fsdpctl_render_shows_the_label_and_the_suspended_cluster(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "queued.yaml"
    path.write_text(yaml.safe_dump(manifest(queueName="team-a")))
    assert main(["render", "-f", str(path)]) == 0
    rc = yaml.safe_load(capsys.readouterr().out)
    assert rc["spec"]["suspend"] is True and rc["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"


# --- the Workload as read --------------------------------------------------------------------------------------


def test_a_workload_is_read_for_why_it_waits_where_it_was_admitted_and_why_it_was_evicted() -> None:
    assert pending_workload().pending == f"Pending: {PENDING}" and not pending_workload().admitted
    admitted = WorkloadView.from_object(
        {"metadata": {"name": "w"}, "status": {"admission": {"clusterQueue": "team-cq"}, "conditions": [
            {"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved", "message": "reserved"},
            {"type": "Admitted", "status": "True", "reason": "Admitted", "message": "The workload is admitted"},
            {"type": "Evicted", "status": "True", "reason": "Preempted", "message": "Preempted to accommodate x"},
        ]}}
    )  # fmt: skip
    assert admitted.admitted and admitted.cluster_queue == "team-cq" and admitted.pending == ""
    assert admitted.evicted == "Preempted: Preempted to accommodate x"


@pytest.mark.parametrize(
    "hostile",
    [None, [], "text", {"metadata": 3, "status": {"conditions": "no"}},
     {"status": {"conditions": [None, 7, {"type": "QuotaReserved", "status": "False",
                                          "message": "\x1b[31m" + "x" * 9000}]}}],
)  # fmt: skip
def test_a_workload_of_any_shape_is_read_without_raising(hostile: Any) -> None:
    view = WorkloadView.from_object(hostile if isinstance(hostile, dict) else {})
    assert len(view.pending) <= 512 and "\x1b" not in view.pending
    assert workload_of([hostile, {"metadata": {"ownerReferences": "x"}}], "rc-uid") is None


def test_the_workload_of_a_cluster_is_the_one_it_owns() -> None:
    mine = {"metadata": {"name": "mine", "ownerReferences": [{"uid": "rc-uid"}], "creationTimestamp": "2026-01-02"}}
    old = {"metadata": {"name": "old", "ownerReferences": [{"uid": "rc-uid"}], "creationTimestamp": "2026-01-01"}}
    other = {"metadata": {"name": "other", "ownerReferences": [{"uid": "x"}], "creationTimestamp": "2026-01-03"}}
    found = workload_of([old, other, mine], "rc-uid")
    assert found is not None and found.name == "mine"


# --- the decisions ---------------------------------------------------------------------------------------------


def test_a_new_queued_job_creates_its_cluster_suspended_and_is_queued() -> None:
    decision = reconcile(QUEUED, status(Phase.PENDING, reason=Reason.CREATED, start_time=NOW), Observed(now=NOW),
                         training_package="pkg")  # fmt: skip
    new = decision.status
    assert (new.phase, new.reason, new.queued_since, new.provisioning_since) == (Phase.QUEUED, Reason.QUEUED, NOW, None)
    (create,) = [a for a in decision.actions if isinstance(a, CreateRayCluster)]
    assert create.manifest["spec"]["suspend"] is True and new.queue == {"localQueue": "team-a"}


def test_a_queued_job_shows_kueues_reason_and_its_deadline_does_not_run_while_queued() -> None:
    since = NOW - timedelta(hours=1)  # longer than activeDeadlineSeconds (600) and the workers' timeout
    obs = Observed(now=NOW, cluster=cluster(suspended=True), workload=pending_workload())
    new = reconcile(QUEUED, status(Phase.QUEUED, queued_since=since), obs, training_package="pkg").status
    assert (new.phase, new.reason) == (Phase.QUEUED, Reason.QUEUED)
    assert new.message == (
        "RayCluster qwen-ray waits in LocalQueue team-a since 2026-11-29T11:00:00Z: Workload "
        f"raycluster-qwen-ray-1a2b3: Pending: {PENDING}"
    )
    assert new.queue["workload"] == "raycluster-qwen-ray-1a2b3"


def test_admission_starts_the_deadline_and_the_workers_timeout_and_counts_the_time_queued() -> None:
    since = NOW - timedelta(hours=1)
    admitted = ClusterView(name="qwen-ray", owner_uid=UID, uid="rc-uid")
    decision = reconcile(QUEUED, status(Phase.QUEUED, queued_since=since, queue={"queuedSeconds": 5}),
                         Observed(now=NOW, cluster=admitted), training_package="pkg")  # fmt: skip
    new = decision.status
    assert (new.phase, new.reason) == (Phase.PROVISIONING, Reason.ADMITTED)
    assert new.start_time == NOW and new.provisioning_since == NOW and new.queued_since is None
    assert new.queue["queuedSeconds"] == 3605 and new.queue["admissions"] == 1
    # 599 s later the deadline (600 s from admission) has not passed, though the job is hours old.
    later = Observed(now=NOW + timedelta(seconds=299), cluster=admitted)
    assert reconcile(QUEUED, new, later, training_package="pkg").status.phase == Phase.PROVISIONING
    late = Observed(now=NOW + timedelta(seconds=600), cluster=admitted)
    assert reconcile(QUEUED, new, late, training_package="pkg").status.reason == Reason.DEADLINE_EXCEEDED


def test_a_running_job_whose_cluster_kueue_suspends_is_preempted_without_using_up_backoff_limit() -> None:
    evicted = WorkloadView(name="w", evicted="Preempted: Preempted to accommodate a workload (UID: u)")
    obs = Observed(now=NOW, cluster=cluster(suspended=True), workload=evicted)
    running = status(Phase.RUNNING, checkpoint={"step": 40, "path": "s3://b/ckpt"}, progress={"step": 41})
    decision = reconcile(QUEUED, running, obs, training_package="pkg")
    new = decision.status
    assert (new.phase, new.reason, new.attempts, new.submission_id) == (Phase.PREEMPTED, Reason.PREEMPTED, 2, SID2)
    assert new.failed_attempts == 0 and new.checkpoint == {"step": 40, "path": "s3://b/ckpt"} and new.progress == {}
    assert "Preempted to accommodate a workload (UID: u)" in new.message and new.queue["preemptions"] == 1
    assert StopJob(SID1) in decision.actions
    ready = get_condition(new.conditions, "WorkersReady")
    assert ready is not None and (ready["status"], ready["reason"]) == ("False", "Preempted")
    again = reconcile(QUEUED, new, Observed(now=NOW, cluster=cluster(suspended=True)), training_package="pkg")
    assert (again.status.phase, again.status.queued_since) == (Phase.QUEUED, NOW)


def test_an_eviction_before_submission_queues_the_same_attempt_again() -> None:
    provisioning = status(Phase.PROVISIONING, reason=Reason.WORKERS_NOT_READY, provisioning_since=NOW)
    obs = Observed(now=NOW, cluster=cluster(suspended=True))
    decision = reconcile(QUEUED, provisioning, obs, training_package="pkg")
    assert (decision.status.phase, decision.status.attempts) == (Phase.QUEUED, 1)
    assert not any(isinstance(a, StopJob) for a in decision.actions)


def test_without_kueue_a_queued_job_says_so_and_a_lost_cluster_is_created_again() -> None:
    obs = Observed(now=NOW, cluster=cluster(suspended=True), workload_error="Kueue's Workload API is not served")
    new = reconcile(QUEUED, status(Phase.QUEUED, queued_since=NOW), obs, training_package="pkg").status
    assert new.reason == Reason.QUEUE_UNAVAILABLE and new.message.endswith("but Kueue's Workload API is not served")
    lost = reconcile(QUEUED, status(Phase.QUEUED, queued_since=NOW), Observed(now=NOW), training_package="pkg")
    assert any(isinstance(a, CreateRayCluster) and a.manifest["spec"]["suspend"] for a in lost.actions)


def test_a_user_suspend_wins_over_the_queue() -> None:
    suspended = manifest(queueName="team-a", runPolicy={"suspend": True})
    decision = reconcile(suspended, status(Phase.QUEUED, queued_since=NOW), Observed(now=NOW, cluster=cluster(
        suspended=True)), training_package="pkg")  # fmt: skip
    assert decision.status.phase == Phase.SUSPENDED


def test_a_job_that_is_not_queued_ignores_a_suspended_cluster_of_its_own() -> None:
    """Only Kueue's suspension of a queued job's cluster is a preemption; the decisions of others are unchanged."""
    obs = Observed(now=NOW, cluster=cluster(suspended=True))
    new = reconcile(manifest(), status(Phase.PROVISIONING, provisioning_since=NOW), obs, training_package="pkg")
    assert new.status.phase == Phase.PROVISIONING


def test_counters_edited_into_status_are_started_over_not_raised_on() -> None:
    admitted = ClusterView(name="qwen-ray", owner_uid=UID, uid="rc-uid")
    edited = status(Phase.QUEUED, queued_since=NOW, queue={"queuedSeconds": "many", "admissions": -3})
    new = reconcile(QUEUED, edited, Observed(now=NOW, cluster=admitted), training_package="pkg").status
    assert (new.phase, new.queue["queuedSeconds"], new.queue["admissions"]) == (Phase.PROVISIONING, 0, 1)


# --- reading Workloads -----------------------------------------------------------------------------------------


class Workloads:
    """The one call `read_workload` makes of the Kube protocol, answering as an API server would."""

    def __init__(self, answer: list[dict[str, Any]] | KubeError | None) -> None:
        self.answer = answer
        self.selectors: list[str] = []

    async def list_workloads(self, namespace: str, label_selector: str) -> list[dict[str, Any]] | None:
        self.selectors.append(label_selector)
        if isinstance(self.answer, KubeError):
            raise self.answer
        return self.answer


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        (None, "is Kueue installed?"),
        (KubeError(403, "workloads.kueue.x-k8s.io is forbidden"), "the operator may not list Kueue's Workloads"),
        ([], ""),
    ],
)
def test_workloads_that_cannot_be_read_are_said_so(answer: Any, expected: str) -> None:
    kube = Workloads(answer)
    workload, error = asyncio.run(read_workload(kube, "ml", cluster(suspended=True)))  # type: ignore[arg-type]
    assert workload is None and (expected in error if expected else error == "")
    assert kube.selectors == ["kueue.x-k8s.io/job-uid=rc-uid"]


def test_an_api_server_that_does_not_answer_fails_the_pass_to_be_retried() -> None:
    with pytest.raises(KubeError):
        asyncio.run(read_workload(Workloads(KubeError(503, "unavailable")), "ml", cluster(suspended=True)))  # type: ignore[arg-type]


def test_a_queued_cluster_the_api_server_refuses_says_why() -> None:
    refused = "the API server refused the job's RayCluster: 403: rayclusters.ray.io is forbidden"
    obs = Observed(now=NOW, create_refused=refused)
    decision = reconcile(QUEUED, status(Phase.QUEUED, queued_since=NOW), obs, training_package="pkg")
    assert (decision.status.phase, decision.status.reason) == (Phase.QUEUED, Reason.CREATE_REFUSED)
    assert decision.status.message == f"creating RayCluster qwen-ray: {refused}"
    assert any(isinstance(a, CreateRayCluster) for a in decision.actions)  # tried again, level-triggered


def test_what_a_deleted_namesake_left_is_replaced_while_queued_and_anyone_elses_fails_the_job() -> None:
    old = "9f9f9f9f-0000-0000-0000-000000000000"
    left = ClusterView(name="qwen-ray", owner_uid=old, owner_kind=schema.KIND, owner_name="qwen", uid="old-rc")
    secret = ChildView("Secret", "qwen-ray-auth", "old-secret", owner_uid=old, owner_kind=schema.KIND,
                       owner_name="qwen")  # fmt: skip
    queued = status(Phase.QUEUED, queued_since=NOW)
    decision = reconcile(QUEUED, queued, Observed(now=NOW, cluster=left, children=(secret,)), training_package="pkg")
    assert decision.status.phase == Phase.QUEUED
    assert set(decision.actions) >= {
        DeleteLeftover("RayCluster", "ml", "qwen-ray", "old-rc"),
        DeleteLeftover("Secret", "ml", "qwen-ray-auth", "old-secret"),
    }
    stranger = ChildView("Secret", "qwen-ray-auth", "s", owner_uid="someone", owner_kind="Other", owner_name="x")
    taken = reconcile(QUEUED, queued, Observed(now=NOW, children=(stranger,)), training_package="pkg").status
    assert (taken.phase, taken.reason) == (Phase.FAILED, Reason.CLUSTER_NAME_TAKEN)
