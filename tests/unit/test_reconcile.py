"""The state machine, table by table: (status, observed) -> (status, actions) for every phase, guard and reason."""

from __future__ import annotations

import copy
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
from fsdp_operator.api import schema
from fsdp_operator.decide.guards import finalize_actions
from fsdp_operator.decide.lifecycle import with_gitops_conditions
from fsdp_operator.decide.observed import (
    RAY_PENDING,
    RAY_RUNNING,
    RAY_STOPPED,
    ClusterView,
    CreateRayCluster,
    Decision,
    DeleteJob,
    DeleteRayCluster,
    Observed,
    PostEvent,
    RayJobInfo,
    RayNodes,
    StopJob,
    SubmitJob,
    dashboard_url,
)
from fsdp_operator.decide.reconcile import reconcile
from fsdp_operator.decide.status import ConditionType, JobStatus, Phase, Reason, get_condition
from fsdp_operator.runtime.rayjobs import summarize_nodes
from fsdp_train.contract.events import Failure, Placement, Step, Summary, Transport
from support.running_job import NOW, UID

NAME, NAMESPACE = "qwen", "ml"
PACKAGE = "/opt/fsdp_train"
CLUSTER = "qwen-ray"  # written down: a change in how names are made must show here


def sid(attempt: int) -> str:
    return f"qwen-f92e6afb-{attempt}"  # sha256("qwen/<UID>")[:8]


def manifest(generation: int = 1, **run_policy: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"workers": {"replicas": 2}, "training": {"steps": 100}}
    if run_policy:
        spec["runPolicy"] = run_policy
    return {
        "apiVersion": schema.API_VERSION,
        "kind": schema.KIND,
        "metadata": {"name": NAME, "namespace": NAMESPACE, "uid": UID, "generation": generation},
        "spec": spec,
    }


def cpu_manifest() -> dict[str, Any]:
    m = manifest()
    m["spec"] = {
        "workers": {"replicas": 2, "instanceType": "", "gpusPerWorker": 0, "efaPerWorker": 0, "ranksPerWorker": 2},
        "network": {"transport": "socket"},
    }
    return m


def with_network(m: dict[str, Any], **network: Any) -> dict[str, Any]:
    m = copy.deepcopy(m)
    m["spec"]["network"] = network
    return m


def at(phase: Phase, *, attempt: int = 1, started: float = 60, **fields: Any) -> JobStatus:
    """A status in `phase` with identities recorded `started` seconds before NOW."""
    base = JobStatus(
        phase=phase,
        reason=fields.pop("reason", None),
        ray_cluster_name=CLUSTER,
        submission_id=sid(attempt),
        attempts=attempt,
        observed_generation=1,
        start_time=NOW - timedelta(seconds=started),
        conditions=[
            {"type": "Validated", "status": "True", "reason": "Valid", "message": "", "lastTransitionTime": ""}
        ],
    )
    if phase == Phase.PROVISIONING:
        base = replace(base, provisioning_since=NOW - timedelta(seconds=started))
    # As the operator wrote it: with the GitOps conditions of its phase.
    return with_gitops_conditions(replace(base, **fields), now=NOW - timedelta(seconds=started), generation=1)


def cluster(ready: int = 2, state: str = "ready", **fields: Any) -> ClusterView:
    return ClusterView(
        name=CLUSTER,
        state=state,
        ready_workers=ready,
        desired_workers=2,
        owner_uid=UID,
        dashboard_url="http://10.0.0.1:8265",
        **fields,
    )


CREATE = ["CreateAuthSecret", "ApplyNetworkPolicy", "CreateRayCluster"]
"""What (re)creating a job's cluster takes: its auth Secret, its NetworkPolicy, then the RayCluster."""
ALL_NODES = RayNodes(alive_workers=2, gpus=8, cpus=80)


def run(m: dict[str, Any], status: JobStatus, **observed: Any) -> Decision:
    return reconcile(m, status, Observed(now=NOW, **observed), training_package=PACKAGE)


def kinds(decision: Decision) -> list[str]:
    """Action names without the events (asserted separately)."""
    return [type(a).__name__ for a in decision.actions if not isinstance(a, PostEvent)]


def events(decision: Decision) -> list[tuple[str, str]]:
    return [(a.type, a.reason) for a in decision.actions if isinstance(a, PostEvent)]


def condition(status: JobStatus, type_: str) -> str:
    found = get_condition(status.conditions, type_)
    return str(found["status"]) if found else ""


# --- validation and identity -----------------------------------------------------------------------------


def test_first_pass_records_identity_with_the_cluster_it_creates() -> None:
    d = run(manifest(), JobStatus())
    s = d.status
    assert (s.phase, s.reason) == (Phase.PROVISIONING, Reason.CLUSTER_CREATING)
    assert s.ray_cluster_name == CLUSTER and s.submission_id == sid(1) and s.attempts == 1
    assert s.start_time == NOW and s.observed_generation == 1 and s.provisioning_since == NOW
    assert condition(s, ConditionType.VALIDATED) == "True"
    # Identity first: the names are in the status the controller writes before it takes these actions.
    assert kinds(d) == CREATE
    (create,) = [a for a in d.actions if isinstance(a, CreateRayCluster)]
    assert create.manifest["metadata"]["name"] == s.ray_cluster_name
    assert events(d) == [("Normal", "ClusterCreating")]


def test_first_pass_for_an_automatic_zone_records_identity_only() -> None:
    m = manifest()
    m["spec"]["placement"] = {"availabilityZone": "auto"}
    d = run(m, JobStatus())
    s = d.status
    assert (s.phase, s.reason) == (Phase.PENDING, Reason.CREATED)
    assert s.ray_cluster_name == CLUSTER and s.submission_id == sid(1)
    assert kinds(d) == [] and d.requeue_after == 0.0  # the next pass asks AWS, at once
    assert events(d) == [("Normal", "Created")]


def test_first_pass_of_a_suspended_job_creates_nothing() -> None:
    d = run(manifest(suspend=True), JobStatus())
    assert (d.status.phase, d.status.reason) == (Phase.SUSPENDED, Reason.SUSPENDED)
    assert d.status.submission_id == sid(1) and kinds(d) == []


def test_invalid_spec_fails_with_every_problem_and_waits_for_a_fix() -> None:
    m = manifest()
    m["spec"]["workers"]["gpusPerWorker"] = 5
    d = run(m, JobStatus())
    assert (d.status.phase, d.status.reason) == (Phase.FAILED, Reason.VALIDATION_FAILED)
    assert "spec.workers.gpusPerWorker: 5 GPUs requested" in d.status.message
    assert condition(d.status, ConditionType.VALIDATED) == "False"
    assert kinds(d) == [] and events(d) == [("Warning", "ValidationFailed")]
    again = run(m, d.status)
    assert again.actions == () and again.status == d.status
    # Not done: the job's loop must still be there when the spec is fixed (see the next test).
    assert not d.done and not again.done


def test_fixed_spec_starts_over_after_validation_failure() -> None:
    m = manifest()
    m["spec"]["workers"]["gpusPerWorker"] = 5
    failed = run(m, JobStatus()).status
    d = run(manifest(generation=2), failed)
    assert (d.status.phase, d.status.reason) == (Phase.PROVISIONING, Reason.CLUSTER_CREATING)
    assert d.status.observed_generation == 2 and d.status.end_time is None and kinds(d) == CREATE


def test_finished_job_keeps_its_outcome_when_the_spec_turns_invalid() -> None:
    m = manifest(generation=2)
    m["spec"]["workers"]["gpusPerWorker"] = 5
    done = at(Phase.SUCCEEDED, reason=Reason.COMPLETED, end_time=NOW)
    d = run(m, done)
    kept = ("phase", "reason", "message", "end_time", "result")
    assert [getattr(d.status, k) for k in kept] == [getattr(done, k) for k in kept] and d.done and d.actions == ()
    assert d.status.observed_generation == 2  # the edit was seen, and changes nothing of a finished run


def test_not_a_job_is_a_validation_failure() -> None:
    m = manifest()
    m["kind"] = "RayJob"
    d = run(m, JobStatus())
    assert d.status.reason == Reason.VALIDATION_FAILED and "kind: RayJob" in d.status.message


# --- provisioning ----------------------------------------------------------------------------------------


def test_pending_creates_the_recorded_cluster() -> None:
    d = run(manifest(), at(Phase.PENDING))
    assert (d.status.phase, d.status.reason) == (Phase.PROVISIONING, Reason.CLUSTER_CREATING)
    (create,) = [a for a in d.actions if isinstance(a, CreateRayCluster)]
    assert create.manifest["metadata"]["name"] == CLUSTER == d.status.ray_cluster_name
    assert create.manifest["metadata"]["ownerReferences"][0]["uid"] == UID
    assert d.status.provisioning_since == NOW and d.status.workers == "0/2"


@pytest.mark.parametrize(
    ("observed", "reason", "message", "workers"),
    [
        ({"cluster": None}, Reason.CLUSTER_CREATING, "creating RayCluster", ""),
        ({"cluster": cluster(ready=0, state="")}, Reason.WORKERS_NOT_READY, "0/2 worker pods ready", "0/2"),
        ({"cluster": cluster(ready=1, state="")}, Reason.WORKERS_NOT_READY, "1/2 worker pods ready", "1/2"),
        (
            {
                "cluster": cluster(ready=1, state=""),
                "unschedulable": "0/3 nodes are available: 3 Insufficient vpc.amazonaws.com/efa.",
            },
            Reason.UNSCHEDULABLE,
            "3 Insufficient vpc.amazonaws.com/efa",
            "1/2",
        ),
        (
            {"cluster": cluster(), "ray_error": "connection refused"},
            Reason.WORKERS_NOT_READY,
            "waiting for Ray's API on the head (connection refused)",
            "2/2",
        ),
        (
            {"cluster": cluster(), "ray_nodes": RayNodes(1, 4, 40)},
            Reason.WORKERS_NOT_READY,
            "Ray reports 1/2 worker nodes alive, 4/8 GPUs",
            "2/2",
        ),
        (
            {"cluster": cluster(), "ray_nodes": RayNodes(2, 6, 80)},
            Reason.WORKERS_NOT_READY,
            "Ray reports 6/8 GPUs",
            "2/2",
        ),
    ],
)
def test_waiting_for_workers_says_why(observed: dict[str, Any], reason: Reason, message: str, workers: str) -> None:
    d = run(manifest(), at(Phase.PROVISIONING, reason=Reason.CLUSTER_CREATING), **observed)
    assert d.status.phase == Phase.PROVISIONING
    assert d.status.reason == reason and message in d.status.message
    if workers:
        assert d.status.workers == workers
    assert "SubmitJob" not in kinds(d)
    if observed.get("cluster") is None:
        assert kinds(d) == CREATE  # idempotent: 409 means it is there
    else:
        assert condition(d.status, ConditionType.WORKERS_READY) == "False"


def test_unschedulable_is_a_warning_event() -> None:
    d = run(manifest(), at(Phase.PROVISIONING), cluster=cluster(ready=0, state=""), unschedulable="Insufficient gpu")
    assert ("Warning", "Unschedulable") in events(d)


def test_cpu_job_waits_for_cpus_not_gpus() -> None:
    m = cpu_manifest()
    d = run(m, at(Phase.PROVISIONING), cluster=cluster(), ray_nodes=RayNodes(2, 0, 3))
    assert d.status.reason == Reason.WORKERS_NOT_READY and "3/4 CPUs" in d.status.message
    d = run(m, at(Phase.PROVISIONING), cluster=cluster(), ray_nodes=RayNodes(2, 0, 4))
    assert d.status.phase == Phase.SUBMITTING


def test_all_workers_joined_submits_the_recorded_id() -> None:
    d = run(manifest(), at(Phase.PROVISIONING), cluster=cluster(), ray_nodes=ALL_NODES)
    assert (d.status.phase, d.status.reason) == (Phase.SUBMITTING, Reason.WORKERS_READY)
    assert condition(d.status, ConditionType.WORKERS_READY) == "True" and d.status.workers == "2/2"
    (submit,) = [a for a in d.actions if isinstance(a, SubmitJob)]
    assert submit.submission.submission_id == sid(1)
    assert submit.submission.runtime_env["py_modules"] == [PACKAGE]
    assert d.status.provisioning_since is None


@pytest.mark.parametrize(
    ("observed", "reason", "message"),
    [
        ({"cluster": cluster(ready=1, state="")}, Reason.WAIT_FOR_WORKERS_TIMEOUT, "1/2 worker pods ready"),
        (
            {"cluster": cluster(ready=0, state=""), "unschedulable": "0/3 nodes are available: Insufficient gpu"},
            Reason.UNSCHEDULABLE,
            "Insufficient gpu",
        ),
        ({"cluster": cluster(), "ray_nodes": RayNodes(1, 4, 40)}, Reason.WAIT_FOR_WORKERS_TIMEOUT, "1/2 worker nodes"),
    ],
)
def test_workers_timeout_fails_with_the_gap(observed: dict[str, Any], reason: Reason, message: str) -> None:
    m = manifest(waitForWorkersTimeoutSeconds=30)
    d = run(m, at(Phase.PROVISIONING, started=31), **observed)
    assert (d.status.phase, d.status.reason) == (Phase.FAILED, reason)
    assert message in d.status.message and d.status.end_time == NOW
    assert kinds(d) == ["DeleteRayCluster"]  # cleanup: Delete (the default)
    assert events(d) == [("Warning", reason.value)]
    # Just before the timeout it still waits.
    assert run(m, at(Phase.PROVISIONING, started=29), **observed).status.phase == Phase.PROVISIONING


def test_cleanup_keep_leaves_the_cluster() -> None:
    m = manifest(waitForWorkersTimeoutSeconds=30, cleanup="Keep")
    d = run(m, at(Phase.PROVISIONING, started=31), cluster=cluster(ready=1, state=""))
    assert d.status.phase == Phase.FAILED and kinds(d) == []


@pytest.mark.parametrize(("ray_status", "stops"), [(RAY_RUNNING, True), (RAY_PENDING, True), (RAY_STOPPED, False)])
def test_a_terminal_job_stops_a_ray_job_that_still_runs(ray_status: str, stops: bool) -> None:
    """The stop decided on entering Failed can be lost to an operator restart; with cleanup: Keep nothing else
    would end the Ray job, so every pass over a terminal job stops it again while Ray says it runs."""
    status = at(Phase.FAILED, reason=Reason.TRANSPORT_FALLBACK, end_time=NOW)
    d = run(manifest(cleanup="Keep"), status, cluster=cluster(), ray_job=RayJobInfo(sid(1), ray_status))
    assert kinds(d) == (["StopJob"] if stops else [])
    assert d.done is not stops and d.status == status


@pytest.mark.parametrize("owner", ["someone-else", ""])
def test_foreign_cluster_under_our_name_is_taken_and_never_deleted(owner: str) -> None:
    foreign = replace(cluster(), owner_uid=owner)
    d = run(manifest(), at(Phase.PROVISIONING), cluster=foreign, ray_nodes=ALL_NODES)
    assert (d.status.phase, d.status.reason) == (Phase.FAILED, Reason.CLUSTER_NAME_TAKEN)
    assert kinds(d) == []
    assert ("no owner reference" if not owner else "owned by uid someone-else") in d.status.message
    later = run(manifest(), d.status, cluster=foreign)
    assert kinds(later) == [] and later.done


# --- submitting and running ------------------------------------------------------------------------------


def test_submitting_resubmits_until_ray_knows_the_job() -> None:
    d = run(manifest(), at(Phase.SUBMITTING), cluster=cluster())
    assert d.status.phase == Phase.SUBMITTING
    assert [a.submission.submission_id for a in d.actions if isinstance(a, SubmitJob)] == [sid(1)]


def test_known_job_is_running_and_never_resubmitted() -> None:
    d = run(manifest(), at(Phase.SUBMITTING), cluster=cluster(), ray_job=RayJobInfo(sid(1), "PENDING"), log_offset=0)
    assert (d.status.phase, d.status.reason) == (Phase.RUNNING, Reason.JOB_RUNNING)
    assert d.status.ray_job_status == "PENDING" and "runtime environment" in d.status.message
    assert condition(d.status, ConditionType.JOB_SUBMITTED) == "True"
    assert kinds(d) == [] and events(d) == [("Normal", "JobRunning")]


def test_rejected_submission_fails() -> None:
    d = run(manifest(), at(Phase.SUBMITTING), cluster=cluster(), submit_error="400: bad runtime_env")
    assert (d.status.phase, d.status.reason) == (Phase.FAILED, Reason.SUBMISSION_FAILED)
    assert "bad runtime_env" in d.status.message


def running(**observed: Any) -> dict[str, Any]:
    return {"cluster": cluster(), "ray_job": RayJobInfo(sid(1), "RUNNING"), "log_offset": 0, **observed}


def on_efa(m: dict[str, Any] | None = None) -> tuple[Transport, ...]:
    """Every rank's verified EFA transport: what a job under requireEFA (the default for efa) needs to succeed."""
    from fsdp_operator.api.spec import parse_job

    world = parse_job(m or manifest()).spec.workers.world_size
    return tuple(Transport(rank=r, transport="efa", evidence="NET/OFI Selected provider is efa") for r in range(world))


def test_running_folds_events_into_status() -> None:
    placement = Placement(
        rank=1, world_size=8, local_rank=1, local_world_size=4, node_rank=0, node_ip="10.0.1.5",
        hostname="w-0", pod="qwen-ray-gpu-workers-worker-abcde", device="NVIDIA L4",
    )  # fmt: skip
    step = Step(
        rank=0, step=12, total_steps=100, loss=2.5, tokens_per_second=12345.6, tokens_per_second_per_device=1543
    )
    d = run(
        manifest(), at(Phase.RUNNING, reason=Reason.JOB_RUNNING), **running(events=(placement, step), log_offset=900)
    )
    s = d.status
    assert s.ranks == [
        {
            "rank": 1,
            "localRank": 1,
            "nodeRank": 0,
            "nodeIP": "10.0.1.5",
            "pod": "qwen-ray-gpu-workers-worker-abcde",
            "hostname": "w-0",
            "device": "NVIDIA L4",
        }
    ]
    assert s.progress["stepOfTotal"] == "12/100" and s.progress["tokensPerSecond"] == 12346
    assert s.log_offset == 900 and kinds(d) == [] and events(d) == []


def test_running_without_news_changes_nothing() -> None:
    status = at(
        Phase.RUNNING,
        reason=Reason.JOB_RUNNING,
        ray_job_status="RUNNING",
        message="training is running",
        dashboard_url="http://10.0.0.1:8265",
    )
    status = replace(
        status,
        conditions=[
            *status.conditions,
            {"type": "JobSubmitted", "status": "True", "reason": "Accepted", "message": "", "lastTransitionTime": ""},
        ],
    )
    d = run(manifest(), status, **running())
    assert d.status == status and d.actions == ()


def test_success_records_result_and_cleans_up() -> None:
    summary = Summary(rank=0, steps=100, final_loss=1.25, first_loss=6.5, tokens_per_second=20000.4, seconds=300)
    succeeded = RayJobInfo(sid(1), "SUCCEEDED")
    d = run(manifest(), at(Phase.RUNNING), **running(ray_job=succeeded, events=(*on_efa(), summary)))
    assert (d.status.phase, d.status.reason) == (Phase.SUCCEEDED, Reason.COMPLETED)
    assert d.status.result["finalLoss"] == 1.25 and d.status.result["tokensPerSecond"] == 20000
    assert d.status.end_time == NOW and "100 steps" in d.status.message
    assert kinds(d) == ["DeleteRayCluster"] and events(d) == [("Normal", "Completed")]


def test_ray_failure_says_the_ranks_cause_in_one_line_and_keeps_rays_logs_apart() -> None:
    failure = Failure(rank=3, message="CUDA out of memory")
    logs = "Traceback (most recent call last):\n" * 40 + "torch.OutOfMemoryError: CUDA out of memory\n"
    info = RayJobInfo(
        sid(1),
        "FAILED",
        "Job entrypoint command failed with exit code 1, last available logs (truncated to 20,000 chars):\n" + logs,
    )
    d = run(manifest(), at(Phase.RUNNING), **running(ray_job=info, events=(failure,)))
    assert (d.status.phase, d.status.reason) == (Phase.FAILED, Reason.RAY_JOB_FAILED)
    assert d.status.message == "rank 3: CUDA out of memory"
    assert d.status.failure_log.endswith("torch.OutOfMemoryError: CUDA out of memory")
    assert "last available logs" not in d.status.failure_log


def test_ray_failure_without_a_rank_report_names_the_last_exception() -> None:
    logs = "chatter\n" * 300 + "fsdp_train: training failed: ModuleNotFoundError: No module named 'tinygpt'\n"
    info = RayJobInfo(
        sid(1),
        "FAILED",
        "Job entrypoint command failed with exit code 1, last available logs (truncated to 20,000 chars):\n" + logs,
    )
    d = run(manifest(), at(Phase.RUNNING), **running(ray_job=info))
    assert d.status.message == "Ray: ModuleNotFoundError: No module named 'tinygpt'"
    assert "\n" in d.status.to_dict()["failureLog"]
    assert condition(d.status, ConditionType.JOB_SUBMITTED) == "False"
    assert kinds(d) == ["DeleteRayCluster"] and events(d) == [("Warning", "RayJobFailed")]


@pytest.mark.parametrize("reported", [True, False])
def test_a_long_failure_is_one_line_of_at_most_300_characters_with_the_users_frame(reported: bool) -> None:
    """The prefix (`rank N: `, `Ray: `) counts toward the limit: a message of 306 characters was seen."""
    from fsdp_operator.decide.failure import HEADLINE_LIMIT

    trace = ("Traceback (most recent call last):\n"
             '  File "<frozen importlib._bootstrap>", line 1387, in _gcd_import\n'
             '  File "/opt/code/mypkg/train.py", line 12, in train_func\n    boom()\n'
             f"ValueError: {'x' * 400}\n")  # fmt: skip
    info = RayJobInfo(sid(1), "FAILED", "Job entrypoint command failed with exit code 1, last available logs "
                      "(truncated to 20,000 chars):\n" + trace)  # fmt: skip
    events = (Failure(rank=3, message=trace),) if reported else ()
    d = run(manifest(), at(Phase.RUNNING), **running(ray_job=info, events=events))
    message = d.status.message
    assert len(message) <= HEADLINE_LIMIT and "\n" not in message, (len(message), message)
    assert message.startswith("rank 3: ValueError: xxx" if reported else "Ray: ValueError: xxx")
    assert message.endswith("(at train.py:12 in train_func)"), message


def test_backoff_retries_under_a_new_id_on_the_same_cluster_then_fails() -> None:
    m = manifest(backoffLimit=1)
    failed = RayJobInfo(sid(1), "FAILED", "boom")
    step = Step(rank=0, step=5, total_steps=100, loss=3.0, tokens_per_second=1, tokens_per_second_per_device=1)
    d = run(m, at(Phase.RUNNING), **running(ray_job=failed, events=(step,)))
    s = d.status
    assert (s.phase, s.reason) == (Phase.PROVISIONING, Reason.RETRYING)
    assert (s.attempts, s.failed_attempts, s.submission_id) == (2, 1, sid(2))
    # The new attempt starts clean, but for the loss curve, which spans the run.
    assert set(s.progress) == {"lossHistory"} and s.log_offset == 0
    assert kinds(d) == CREATE  # 409 when it is still there: reused
    assert events(d) == [("Warning", "Retrying")]

    # The retry goes through the workers check again, then submits attempt 2.
    d2 = run(m, s, cluster=cluster(), ray_nodes=ALL_NODES)
    assert [a.submission.submission_id for a in d2.actions if isinstance(a, SubmitJob)] == [sid(2)]
    again = replace(d2.status, phase=Phase.RUNNING)
    d3 = run(m, again, **running(ray_job=RayJobInfo(sid(2), "FAILED", "boom again")))
    assert (d3.status.phase, d3.status.reason) == (Phase.FAILED, Reason.RAY_JOB_FAILED)
    assert "backoffLimit 1 reached" in d3.status.message and d3.status.failed_attempts == 2


def test_job_stopped_outside_the_operator_fails_without_retry() -> None:
    d = run(manifest(backoffLimit=3), at(Phase.RUNNING), **running(ray_job=RayJobInfo(sid(1), "STOPPED", "by hand")))
    assert (d.status.phase, d.status.reason) == (Phase.FAILED, Reason.RAY_JOB_STOPPED)


def test_job_unknown_to_ray_while_running_is_lost() -> None:
    d = run(manifest(), at(Phase.RUNNING), cluster=cluster())
    assert (d.status.phase, d.status.reason) == (Phase.FAILED, Reason.RAY_JOB_LOST)


def test_job_ray_forgot_while_pending_is_resubmitted_under_its_id() -> None:
    # Ray said PENDING (the entrypoint never ran), then forgot the id (a head restart): submitting again is safe.
    pending = at(Phase.RUNNING, reason=Reason.JOB_RUNNING, ray_job_status="PENDING")
    d = run(manifest(), pending, cluster=cluster())
    assert (d.status.phase, d.status.reason, d.status.attempts) == (Phase.SUBMITTING, Reason.WORKERS_READY, 1)
    assert [a.submission.submission_id for a in d.actions if isinstance(a, SubmitJob)] == [sid(1)]


def test_ray_unreachable_fails_the_job_after_the_timeout() -> None:
    live = at(Phase.RUNNING, reason=Reason.JOB_RUNNING, ray_job_status="RUNNING")
    first = reconcile(manifest(), live, Observed(now=NOW, cluster=cluster(), ray_error="connection refused"),
                      training_package=PACKAGE, ray_unreachable_timeout=60)  # fmt: skip
    assert (first.status.phase, first.status.ray_unreachable_since) == (Phase.RUNNING, NOW)
    later = Observed(now=NOW + timedelta(seconds=59), cluster=cluster(), ray_error="connection refused")
    d = reconcile(manifest(), first.status, later, training_package=PACKAGE, ray_unreachable_timeout=60)
    assert d.status.phase == Phase.RUNNING and d.status.ray_unreachable_since == NOW
    last = replace(later, now=NOW + timedelta(seconds=60))
    d = reconcile(manifest(), first.status, last, training_package=PACKAGE, ray_unreachable_timeout=60)
    assert (d.status.phase, d.status.reason) == (Phase.FAILED, Reason.RAY_UNREACHABLE)
    assert d.status.message == "Ray's job API did not answer for 60s (limit 60s): connection refused"
    assert kinds(d) == ["StopJob", "DeleteRayCluster"]  # best effort; the cluster goes per cleanup: Delete
    # Ray answering again clears the clock.
    back = run(manifest(), first.status, **running())
    assert back.status.ray_unreachable_since is None and back.status.reason == Reason.JOB_RUNNING


def test_ray_unreachable_keeps_the_phase_and_says_so() -> None:
    d = run(manifest(), at(Phase.RUNNING, reason=Reason.JOB_RUNNING), cluster=cluster(), ray_error="timed out")
    assert (d.status.phase, d.status.reason) == (Phase.RUNNING, Reason.RAY_UNREACHABLE)
    assert "timed out" in d.status.message and kinds(d) == [] and events(d) == [("Warning", "RayUnreachable")]


def test_ray_unreachable_says_when_kuberay_reports_the_head_pod_not_ready() -> None:
    rc = {
        "metadata": {"name": CLUSTER},
        "status": {"state": "ready", "conditions": [
            {"type": "HeadPodReady", "status": "False", "reason": "ContainersNotReady",
             "message": "containers with unready status: [ray-head]"},
            {"type": "RayClusterProvisioned", "status": "True", "reason": "AllPodRunningAndReadyFirstTime"}]},
    }  # fmt: skip
    view = ClusterView.from_object(rc)
    assert view.head_not_ready == "ContainersNotReady: containers with unready status: [ray-head]"
    down = replace(cluster(), head_not_ready=view.head_not_ready)
    d = run(manifest(), at(Phase.RUNNING, reason=Reason.JOB_RUNNING), cluster=down, ray_error="connection refused")
    assert d.status.message == (
        "Ray job API: connection refused; the Ray head pod is not ready "
        "(ContainersNotReady: containers with unready status: [ray-head])"
    )
    assert (
        ClusterView.from_object({"status": {"conditions": [{"type": "HeadPodReady", "status": "True"}]}}).head_not_ready
        == ""
    )


@pytest.mark.parametrize("phase", [Phase.SUBMITTING, Phase.RUNNING])
@pytest.mark.parametrize("gone", [None, replace(cluster(), deleting=True)])
def test_cluster_deleted_behind_our_back_is_lost(phase: Phase, gone: ClusterView | None) -> None:
    d = run(manifest(), at(phase), cluster=gone)
    assert (d.status.phase, d.status.reason) == (Phase.FAILED, Reason.CLUSTER_LOST)
    assert CLUSTER in d.status.message
    assert kinds(d)[0] == "StopJob"


def test_cluster_lost_with_backoff_recreates_it() -> None:
    d = run(manifest(backoffLimit=1), at(Phase.RUNNING), cluster=None)
    assert (d.status.phase, d.status.reason, d.status.attempts) == (Phase.PROVISIONING, Reason.RETRYING, 2)
    assert kinds(d) == CREATE


# --- transport policy ------------------------------------------------------------------------------------

SOCKET = Transport(rank=4, transport="socket", evidence="NCCL INFO Using network Socket")
EFA = Transport(rank=0, transport="efa", plugin="Libfabric", provider="efa", evidence="Selected provider is efa")


def test_socket_fallback_with_require_efa_stops_and_fails_with_the_evidence() -> None:
    d = run(manifest(), at(Phase.RUNNING), **running(events=(EFA, SOCKET)))
    assert (d.status.phase, d.status.reason) == (Phase.FAILED, Reason.TRANSPORT_FALLBACK)
    assert "NCCL INFO Using network Socket" in d.status.message and "rank 4" in d.status.message
    assert kinds(d) == ["StopJob", "DeleteRayCluster"]
    assert d.status.transport["summary"] == "mixed"
    assert condition(d.status, ConditionType.TRANSPORT_VERIFIED) == "False"
    assert ("Warning", "TransportFallback") in events(d)


def test_socket_fallback_without_require_efa_keeps_running_with_a_warning() -> None:
    m = with_network(manifest(), transport="efa", requireEFA=False)
    d = run(m, at(Phase.RUNNING, reason=Reason.JOB_RUNNING), **running(events=(EFA, SOCKET)))
    assert d.status.phase == Phase.RUNNING and kinds(d) == []
    assert condition(d.status, ConditionType.TRANSPORT_VERIFIED) == "False"
    assert events(d) == [("Warning", "SocketFallback")]
    # The warning is posted once, when the condition turns False.
    assert events(run(m, d.status, **running())) == []


def test_transport_is_remembered_across_passes() -> None:
    m = manifest()
    first = run(m, at(Phase.RUNNING, reason=Reason.JOB_RUNNING), **running(events=(EFA,)))
    assert first.status.phase == Phase.RUNNING and first.status.transport["summary"] == "pending"
    d = run(m, first.status, **running(events=(SOCKET,)))
    assert d.status.reason == Reason.TRANSPORT_FALLBACK


# --- guards: deadline, suspend ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("phase", "stop"),
    [(Phase.PENDING, False), (Phase.PROVISIONING, False), (Phase.SUBMITTING, True), (Phase.RUNNING, True)],
)
def test_active_deadline_fails_in_every_live_phase(phase: Phase, stop: bool) -> None:
    m = manifest(activeDeadlineSeconds=3600)
    d = run(m, at(phase, started=3601), **running())
    assert (d.status.phase, d.status.reason) == (Phase.FAILED, Reason.DEADLINE_EXCEEDED)
    assert ("StopJob" in kinds(d)) is stop and "DeleteRayCluster" in kinds(d)
    assert run(m, at(phase, started=3599), **running()).status.reason != Reason.DEADLINE_EXCEEDED


@pytest.mark.parametrize(
    ("phase", "actions"),
    [
        (Phase.PENDING, ["DeleteRayCluster"]),
        (Phase.PROVISIONING, ["DeleteRayCluster"]),
        (Phase.SUBMITTING, ["StopJob", "DeleteRayCluster"]),
        (Phase.RUNNING, ["StopJob", "DeleteRayCluster"]),
    ],
)
def test_suspend_stops_and_deletes_in_every_live_phase(phase: Phase, actions: list[str]) -> None:
    d = run(manifest(suspend=True), at(phase), **running())
    assert (d.status.phase, d.status.reason) == (Phase.SUSPENDED, Reason.SUSPENDED)
    assert kinds(d) == actions and events(d) == [("Normal", "Suspended")]
    assert condition(d.status, ConditionType.WORKERS_READY) == "False"


def test_suspended_stays_suspended_and_deletes_a_lingering_cluster() -> None:
    suspended = at(Phase.SUSPENDED, reason=Reason.SUSPENDED)
    assert kinds(run(manifest(suspend=True), suspended, cluster=cluster())) == ["DeleteRayCluster"]
    quiet = run(manifest(suspend=True), suspended, cluster=None)
    assert quiet.actions == () and quiet.status == suspended


def test_resume_is_a_new_attempt_with_a_fresh_deadline() -> None:
    suspended = at(Phase.SUSPENDED, reason=Reason.SUSPENDED, started=5000, progress={"step": 3})
    d = run(manifest(activeDeadlineSeconds=3600), suspended)
    s = d.status
    assert (s.phase, s.reason) == (Phase.PENDING, Reason.RESUMED)
    assert (s.attempts, s.failed_attempts, s.submission_id) == (2, 0, sid(2))
    assert s.start_time == NOW and s.progress == {}
    assert kinds(run(manifest(), s)) == CREATE


def test_suspend_is_ignored_once_finished() -> None:
    done = at(Phase.SUCCEEDED, reason=Reason.COMPLETED, end_time=NOW)
    d = run(manifest(suspend=True), done)
    assert d.status == done and d.done


# --- finished: cleanup and TTL ----------------------------------------------------------------------------


def test_finished_job_deletes_its_cluster_until_gone_then_is_done() -> None:
    done = at(Phase.FAILED, reason=Reason.RAY_JOB_FAILED, end_time=NOW)
    assert kinds(run(manifest(), done, cluster=cluster())) == ["DeleteRayCluster"]
    assert run(manifest(), done, cluster=replace(cluster(), deleting=True)).done
    final = run(manifest(), done, cluster=None)
    assert final.done and final.actions == ()
    assert run(manifest(cleanup="Keep"), done, cluster=cluster()).done


def test_ttl_after_finished_deletes_the_job() -> None:
    done = at(Phase.SUCCEEDED, reason=Reason.COMPLETED, end_time=NOW - timedelta(seconds=10))
    waiting = run(manifest(ttlSecondsAfterFinished=60), done)
    assert waiting.requeue_after == pytest.approx(50) and not waiting.done and waiting.actions == ()
    expired = run(manifest(ttlSecondsAfterFinished=5), done)
    assert [type(a) for a in expired.actions] == [DeleteJob]


# --- delete ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "observed", "expected"),
    [
        (JobStatus(), cluster(), [DeleteRayCluster(NAMESPACE, CLUSTER)]),
        (at(Phase.PENDING), None, []),
        (at(Phase.PROVISIONING), cluster(), [DeleteRayCluster(NAMESPACE, CLUSTER)]),
        (at(Phase.RUNNING), cluster(), [StopJob(sid(1)), DeleteRayCluster(NAMESPACE, CLUSTER)]),
        (at(Phase.SUSPENDED), None, []),
        (at(Phase.SUCCEEDED), cluster(), [DeleteRayCluster(NAMESPACE, CLUSTER)]),
        (at(Phase.RUNNING), replace(cluster(), owner_uid="other"), []),
        (at(Phase.RUNNING), replace(cluster(), owner_uid=""), []),
    ],
)
def test_finalize_stops_and_deletes_whatever_cleanup_says(
    status: JobStatus, observed: ClusterView | None, expected: list[Any]
) -> None:
    assert list(finalize_actions(NAMESPACE, NAME, UID, status, observed)) == expected


# --- events and observations -------------------------------------------------------------------------------


def test_every_transition_of_a_happy_run_posts_one_event() -> None:
    m = manifest()
    posted: list[tuple[str, str]] = []
    status = JobStatus()
    for observed in (
        {},
        {"cluster": cluster(ready=1, state="")},
        {"cluster": cluster(), "ray_nodes": ALL_NODES},
        running(events=on_efa()),
        running(ray_job=RayJobInfo(sid(1), "SUCCEEDED")),
    ):
        d = run(m, status, **observed)
        posted += events(d)
        status = d.status
    assert posted == [
        ("Normal", "ClusterCreating"),
        ("Normal", "WorkersNotReady"),
        ("Normal", "WorkersReady"),
        ("Normal", "JobRunning"),
        ("Normal", "Completed"),
    ]
    assert status.phase == Phase.SUCCEEDED


def test_cluster_view_and_dashboard_address_from_kuberay_status() -> None:
    obj = {
        "metadata": {
            "name": CLUSTER,
            "namespace": NAMESPACE,
            "ownerReferences": [{"uid": UID, "controller": True}],
        },
        "status": {
            "state": "ready",
            "readyWorkerReplicas": 2,
            "desiredWorkerReplicas": 2,
            "head": {"serviceIP": "10.100.0.7", "serviceName": f"{CLUSTER}-head-svc"},
            "endpoints": {"dashboard": "8265", "client": "10001"},
        },
    }
    view = ClusterView.from_object(obj)
    assert view == ClusterView(CLUSTER, "ready", 2, 2, False, UID, "http://10.100.0.7:8265")
    del obj["status"]["head"]["serviceIP"]
    assert dashboard_url(obj) == f"http://{CLUSTER}-head-svc.{NAMESPACE}.svc:8265"
    assert dashboard_url({"metadata": {}, "status": {}}) == ""


def test_ray_nodes_count_alive_workers_only() -> None:
    records = [
        {"state": "ALIVE", "is_head_node": True, "resources_total": {"CPU": 0}},
        {"state": "ALIVE", "is_head_node": False, "resources_total": {"CPU": 48.0, "GPU": 4.0}},
        {"state": "ALIVE", "is_head_node": False, "resources_total": {"CPU": 48.0, "GPU": 4.0}},
        {"state": "DEAD", "is_head_node": False, "resources_total": {"CPU": 48.0, "GPU": 4.0}},
    ]
    assert summarize_nodes(records) == RayNodes(alive_workers=2, gpus=8.0, cpus=96.0)


# --- found in review: each failed before its fix --------------------------------------------------------------


def test_a_retry_forgets_the_previous_attempts_transport_conditions() -> None:
    m = manifest(backoffLimit=1)
    verified = run(m, at(Phase.RUNNING, reason=Reason.JOB_RUNNING), **running(events=(EFA,)))
    assert condition(verified.status, ConditionType.TRANSPORT_VERIFIED) == "Unknown"
    d = run(m, verified.status, **running(ray_job=RayJobInfo(sid(1), "FAILED", "boom")))
    assert d.status.reason == Reason.RETRYING and d.status.transport == {}
    # Attempt 2 has not reported its transport: no condition may speak for it.
    assert condition(d.status, ConditionType.TRANSPORT_VERIFIED) == ""
    assert condition(d.status, ConditionType.JOB_SUBMITTED) == "False"


def test_a_cluster_that_never_appears_still_times_out() -> None:
    """A create the API server keeps refusing (quota, admission, RBAC) must not wait forever."""
    m = manifest(waitForWorkersTimeoutSeconds=30)
    d = run(m, at(Phase.PROVISIONING, reason=Reason.CLUSTER_CREATING, started=31), cluster=None)
    assert (d.status.phase, d.status.reason) == (Phase.FAILED, Reason.WAIT_FOR_WORKERS_TIMEOUT)
    assert f"RayCluster {CLUSTER} does not exist" in d.status.message
    assert run(m, at(Phase.PROVISIONING, started=29), cluster=None).status.phase == Phase.PROVISIONING


def test_a_failed_raycluster_says_why_while_waiting() -> None:
    obj = {
        "metadata": {"name": CLUSTER, "ownerReferences": [{"uid": UID, "controller": True}]},
        "status": {"state": "failed", "reason": "head did not start, see head.log"},
    }
    d = run(manifest(), at(Phase.PROVISIONING), cluster=ClusterView.from_object(obj))
    assert (d.status.phase, d.status.reason) == (Phase.PROVISIONING, Reason.WORKERS_NOT_READY)
    assert "RayCluster state: failed: head did not start, see head.log" in d.status.message


@pytest.mark.parametrize(
    ("phase", "normal"),
    [(Phase.RUNNING, Reason.JOB_RUNNING), (Phase.SUBMITTING, Reason.WORKERS_READY)],
)
def test_flaky_ray_warns_once_per_outage_and_recovers_quietly(phase: Phase, normal: Reason) -> None:
    ray_job = RayJobInfo(sid(1), "RUNNING") if phase == Phase.RUNNING else None
    status = at(phase, reason=normal)
    posted: list[tuple[str, str]] = []
    for _ in range(3):
        down = run(manifest(), status, cluster=cluster(), ray_error="connection refused")
        up = run(manifest(), down.status, **running(ray_job=ray_job))
        assert (up.status.phase, up.status.reason) == (phase, normal)
        posted += events(down) + events(up)
        status = up.status
    assert posted == [("Warning", "RayUnreachable")] * 3
