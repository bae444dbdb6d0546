"""Faults on both sides of the operator: the API server's (409, 429, 500, slow, lost answers, broken watches)
and Ray's (head unreachable, RayCluster deleted by someone else, a job Ray forgot, a head that restarted).

Each test checks what must never happen: a second RayCluster or a second submission for one attempt, a
status that lost what the ranks reported, a job that hangs. `pytest -m faults` runs more seeds at a higher
rate; the default run keeps one seed (see docs/reliability.md for the figures and commands).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import pytest
from aiohttp.test_utils import make_mocked_request
from fsdp_operator.local.server import ThreadedApiServer
from fsdp_operator.local.server.faults import REQUEST_FAULTS, WATCH_FAULTS, FaultInjector, FaultPlan
from fsdp_operator.runtime.rayjobs import RAY_PENDING, FakeJob, FakeRay
from integration.test_operator import CLUSTERS, FAST, Script, World, manifest, scenario
from support.kopf_runner import eventually

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

OPERATOR_CLIENTS = ("kopf/", "fsdp-operator/")
"""The operator's two HTTP clients (kopf's watches and patches, the controller's `AioKube`): faults hit only them."""


def expected_final(steps: int) -> dict[str, Any]:
    """What an undisturbed run of `Script(steps)` ends with, written down (times and the uid left out)."""
    return {
        "phase": "Succeeded",
        "reason": "Completed",
        "message": f"training finished after {steps} steps",
        "workers": "2/2",
        "attempts": 1,
        "rayJobStatus": "SUCCEEDED",
        "progress.stepOfTotal": f"{steps}/{steps}",
        "result.steps": steps,
        "transport.summary": "efa",
        "ranks": list(range(8)),
        "conditions": {"JobSubmitted": "True", "TransportVerified": "True", "Validated": "True",
                       "WorkersReady": "True"},
    }  # fmt: skip


CHECKED_CONDITIONS = ("JobSubmitted", "TransportVerified", "Validated", "WorkersReady")


def summary(status: dict[str, Any]) -> dict[str, Any]:
    """The fields `expected_final` names, read from a status."""
    return {
        "phase": status.get("phase"),
        "reason": status.get("reason"),
        "message": status.get("message"),
        "workers": status.get("workers"),
        "attempts": status.get("attempts"),
        "rayJobStatus": status.get("rayJobStatus"),
        "progress.stepOfTotal": (status.get("progress") or {}).get("stepOfTotal"),
        "result.steps": (status.get("result") or {}).get("steps"),
        "transport.summary": (status.get("transport") or {}).get("summary"),
        "ranks": [r["rank"] for r in status.get("ranks", [])],
        "conditions": {c["type"]: c["status"] for c in status.get("conditions", []) if c["type"] in CHECKED_CONDITIONS},
    }


# --- API faults ------------------------------------------------------------------------------------------


@pytest.fixture
def faulty_api(request: pytest.FixtureRequest) -> Iterator[ThreadedApiServer]:
    plan: FaultPlan = request.param
    with ThreadedApiServer(faults=FaultInjector(plan)) as server:
        yield server


def api_plan(seed: int, rate: float) -> FaultPlan:
    # The run's first write is answered 409 whatever the draw: a sample with few writes (three jobs) does not always
    # draw one, and a conflict at the very start (kopf's finalizer, the first status write) is a case of its own.
    return FaultPlan(rate=rate, seed=seed, clients=OPERATOR_CLIENTS, watch_rate=0.8, drop_within=1.0,
                     slow_seconds=0.3, retry_after=1, conflict_first=True)  # fmt: skip


def _api_faults_converge(api: ThreadedApiServer, jobs: int = 3, steps: int = 5) -> None:
    injector = api.server.faults
    assert injector is not None
    names = [f"job{i}" for i in range(jobs)]

    async def body(w: World) -> None:
        async with w.operator():
            for name in names:
                w.apply(manifest(name, steps=steps))
            for name in names:
                await w.phase("Succeeded", name=name, timeout=60)
            await eventually(lambda: not w.clusters(), timeout=60, message="a RayCluster was left behind")

        for name in names:
            assert summary(w.status(name)) == expected_final(steps), (name, w.status(name))
            assert w.status(name)["submissionId"] == w.sid(1, name)
        # One RayCluster and one accepted submission per job, however often a request failed or was repeated.
        assert len(w.kuberay.seen_uids) == jobs, w.kuberay.seen_uids
        assert sorted(w.ray.created) == sorted(w.sid(1, n) for n in names)

    scenario(api, body, Script(steps=steps))
    # The faults really happened: every kind at least once (the counts are in docs/reliability.md).
    print(f"\nAPI FAULTS seed {injector.plan.seed} rate {injector.plan.rate}: {dict(injector.injected)} in "
          f"{injector.eligible} operator requests, {jobs} jobs converged")  # fmt: skip
    missing = set(REQUEST_FAULTS + WATCH_FAULTS) - set(injector.injected)
    assert not missing, f"never injected: {missing} ({dict(injector.injected)} of {injector.eligible} requests)"


@pytest.mark.parametrize("faulty_api", [api_plan(seed=1, rate=0.2)], indirect=True)
def test_api_faults_converge_without_duplicates(faulty_api: ThreadedApiServer) -> None:
    _api_faults_converge(faulty_api)


@pytest.mark.faults
@pytest.mark.parametrize("faulty_api", [api_plan(seed=s, rate=0.3) for s in range(2, 12)], indirect=True)
def test_api_faults_converge_many_seeds(faulty_api: ThreadedApiServer) -> None:
    _api_faults_converge(faulty_api, jobs=4, steps=8)


def test_conflict_first_answers_the_first_write_409_and_only_it() -> None:
    injector = FaultInjector(FaultPlan(rate=0.0, conflict_first=True))
    methods = ("GET", "POST", "PATCH", "PATCH", "PUT")
    chosen = [injector._choose(make_mocked_request(m, f"{CLUSTERS}/qwen-ray")) for m in methods]
    assert chosen == ["", "", "conflict", "", ""] and injector.injected == {"conflict": 1}


def test_fault_plan_is_seeded_and_validated() -> None:
    with pytest.raises(ValueError, match="unknown fault kinds"):
        FaultPlan(kinds=("teapot",))
    with pytest.raises(ValueError, match="between 0 and 1"):
        FaultPlan(rate=1.5)


# --- Ray faults ------------------------------------------------------------------------------------------


@dataclasses.dataclass
class PendingScript(Script):
    """Like `Script`, but a job stays PENDING (its runtime environment "being prepared") while `pending` is set."""

    pending: bool = False

    def __call__(self, ray: FakeRay, job: FakeJob) -> Iterator[None]:
        while self.pending and job.status == RAY_PENDING:
            yield
        yield from super().__call__(ray, job)


def retry_message(w: World) -> str:
    """The message of the (one) Retrying event: why the attempt failed."""
    (message,) = [e["message"] for e in w.api.store.find("events") if e["reason"] == "Retrying"]
    return str(message)


def address(w: World) -> str:
    (found,) = [c.address for c in w.kuberay.clusters.values()]
    return found


def test_head_unreachable_fails_the_job_after_the_timeout(apiserver: ThreadedApiServer) -> None:
    async def body(w: World) -> None:
        async with w.operator() as runtime:
            runtime.config = dataclasses.replace(FAST, ray_unreachable_timeout=1.0)
            await w.held_running()
            await eventually(lambda: w.status().get("progress"))
            w.ray.down = True  # every call to the head's API is refused from now on
            await w.phase("Running", "RayUnreachable")
            status = await w.phase("Failed", "RayUnreachable", timeout=60)
            assert "did not answer for" in status["message"] and "connection refused" in status["message"]
            await eventually(lambda: not w.clusters(), message="cleanup: Delete must delete the RayCluster")
        w.assert_no_duplicates()

    scenario(apiserver, body)


def test_cluster_deleted_before_submission_is_created_again(apiserver: ThreadedApiServer) -> None:
    async def body(w: World) -> None:
        w.kuberay.never_ready = True
        async with w.operator():
            w.apply(manifest())
            await w.phase("Provisioning", "WorkersNotReady")
            first = w.clusters()[0]["metadata"]["uid"]
            await eventually(lambda: first in w.kuberay.seen_uids)  # KubeRay made its pods
            w.delete(f"{CLUSTERS}/qwen-ray")
            await eventually(lambda: any(c["metadata"]["uid"] != first for c in w.clusters()),
                             message="the deleted RayCluster was not created again")  # fmt: skip
            w.kuberay.never_ready = False
            status = await w.phase("Succeeded")
        assert status["attempts"] == 1 and status.get("failedAttempts", 0) == 0
        w.assert_no_duplicates(clusters=2, submissions=1)

    scenario(apiserver, body)


def test_cluster_deleted_after_submission_fails_the_attempt_and_backoff_decides(apiserver: ThreadedApiServer) -> None:
    async def body(w: World) -> None:
        async with w.operator():
            await w.held_running(manifest(runPolicy={"backoffLimit": 1}))
            w.delete(f"{CLUSTERS}/qwen-ray")
            await eventually(lambda: w.status().get("attempts") == 2, message="no second attempt")
            w.script.hold = False
            status = await w.phase("Succeeded")
        assert "ClusterLost" in retry_message(w)
        assert status["attempts"] == 2 and status["failedAttempts"] == 1 and status["submissionId"] == w.sid(2)
        assert w.ray.created == [w.sid(1), w.sid(2)]
        w.assert_no_duplicates(clusters=2, submissions=2)

    scenario(apiserver, body)


def test_a_job_ray_forgot_before_it_started_is_resubmitted_under_its_id(apiserver: ThreadedApiServer) -> None:
    async def body(w: World) -> None:
        assert isinstance(w.script, PendingScript)
        w.script.pending = True
        async with w.operator():
            w.apply(manifest())
            status = await w.phase("Running")
            assert status["rayJobStatus"] == "PENDING"
            w.ray.lose_job(w.sid(1))  # e.g. `ray job delete`, or a head restart, before the entrypoint ran
            await eventually(lambda: w.ray.created == [w.sid(1), w.sid(1)], message="not resubmitted")
            w.script.pending = False
            status = await w.phase("Succeeded")
        assert status["attempts"] == 1 and status.get("failedAttempts", 0) == 0
        assert len(w.kuberay.seen_uids) == 1

    scenario(apiserver, body, PendingScript())


def test_a_job_ray_forgot_after_it_started_fails_the_attempt(apiserver: ThreadedApiServer) -> None:
    async def body(w: World) -> None:
        async with w.operator():
            await w.held_running()
            await eventually(lambda: w.status().get("rayJobStatus") == "RUNNING")
            w.ray.lose_job(w.sid(1))
            status = await w.phase("Failed", "RayJobLost")
            assert w.sid(1) in status["message"]
        w.assert_no_duplicates()

    scenario(apiserver, body)


def test_head_restart_loses_the_job_and_the_next_attempt_succeeds(apiserver: ThreadedApiServer) -> None:
    async def body(w: World) -> None:
        async with w.operator():
            await w.held_running(manifest(runPolicy={"backoffLimit": 1}))
            await eventually(lambda: w.status().get("progress"))
            w.ray.down = True
            await w.phase("Running", "RayUnreachable")
            w.ray.restart_head(address(w))  # GCS lost: Ray answers again, knowing no jobs
            w.ray.down = False
            await eventually(lambda: w.status().get("attempts") == 2, message="no second attempt")
            w.script.hold = False
            status = await w.phase("Succeeded")
        assert "RayJobLost" in retry_message(w)
        assert status["attempts"] == 2 and status["submissionId"] == w.sid(2)
        assert "progress" in status and status["progress"]["stepOfTotal"] == "3/3"
        w.assert_no_duplicates(clusters=1, submissions=2)

    scenario(apiserver, body)
