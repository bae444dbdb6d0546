"""The controller's I/O paths when Ray or the API server misbehave, pass by pass.

One job's loop (`JobLoop`) is stepped by the test against the emulated API server (real HTTP), the fake
KubeRay and a `FakeRay` that fails on demand: unreachable while provisioning and while running, a
submission it rejects, a spec turned invalid under a running job, probes that measured nothing usable.
Every wait is for a condition of the stored status, never for a length of time.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from fsdp_operator.local.server import ThreadedApiServer
from fsdp_operator.runtime.controller import JobLoop
from fsdp_operator.runtime.kube import AioKube, KubeError
from fsdp_operator.runtime.rayjobs import FakeJob, FakeRay
from fsdp_operator.runtime.shared import Runtime
from fsdp_train.contract.events import Probe, Step, Summary, Transport
from support.chart_rbac import OPERATOR_AUTH
from support.kopf_runner import Stopped
from support.running_job import placement
from test_operator import EFA_LINE, FAST, NAMESPACE, Script, World, manifest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

LOG = logging.getLogger(__name__)
# The submission ids of job "qwen" are derived from its uid, which the API server makes: see `World.sid`.


def make_loop(w: World, kube: AioKube | None = None) -> tuple[JobLoop, AioKube]:
    kube = kube or w.kube()
    return JobLoop(Runtime(FAST, kube=kube, ray=w.ray.client), NAMESPACE, "qwen", LOG), kube


async def step_until(loop: JobLoop, done: Callable[[], Any], *, deadline: float = 60) -> Any:
    """Run passes (the fake KubeRay and Ray move in between) until `done()` is truthy; return its value. Bounded by
    time, not by a count of passes: the background moves at its own pace on a loaded machine."""
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        await loop.pass_once()
        if value := done():
            return value
        await asyncio.sleep(0.01)
    raise AssertionError(f"not reached after {deadline} s; status: {loop.status}")


def at(w: World, phase: str, reason: str | None = None) -> Callable[[], dict[str, Any] | None]:
    def check() -> dict[str, Any] | None:
        status = w.status()
        ok = status.get("phase") == phase and (reason is None or status.get("reason") == reason)
        return status if ok else None

    return check


def scenario(api: ThreadedApiServer, body: Callable[[World, JobLoop], Any], script: Script | None = None) -> World:
    w = World(api, script)

    async def main() -> None:
        loop, kube = make_loop(w)
        try:
            async with w.kuberay.running(tick=0.01):
                await body(w, loop)
        finally:
            await kube.close()

    asyncio.run(main())
    return w


def test_ray_unreachable_while_provisioning_waits_then_submits(apiserver: ThreadedApiServer) -> None:
    async def body(w: World, loop: JobLoop) -> None:
        w.ray.down = True
        w.apply(manifest())
        status = await step_until(loop, lambda: (s := w.status()).get("message", "").startswith("worker pods") and s)
        assert (status["phase"], status["reason"]) == ("Provisioning", "WorkersNotReady")
        assert status["message"] == (
            "worker pods ready; waiting for Ray's API on the head (http://10.96.0.2:8265: connection refused)"
        )
        assert w.ray.submit_calls == []
        w.ray.down = False
        await step_until(loop, at(w, "Succeeded", "Completed"))
        assert w.ray.created == [w.sid(1)]

    scenario(apiserver, body)


def test_ray_unreachable_while_running_warns_once_and_resumes(apiserver: ThreadedApiServer) -> None:
    async def body(w: World, loop: JobLoop) -> None:
        w.script.hold = True
        w.apply(manifest())
        await step_until(loop, lambda: at(w, "Running")() and w.status().get("progress"))
        w.ray.down = True
        status = await step_until(loop, at(w, "Running", "RayUnreachable"))
        assert status["message"] == "Ray job API: http://10.96.0.2:8265: connection refused"
        for _ in range(3):  # more passes in the same outage: no more events
            await loop.pass_once()
        w.ray.down = False
        await step_until(loop, at(w, "Running", "JobRunning"))
        w.script.hold = False
        await step_until(loop, at(w, "Succeeded", "Completed"))
        reasons = w.event_reasons()
        assert reasons.count("RayUnreachable") == 1, reasons
        assert reasons.count("JobRunning") == 1, reasons  # recovering posts nothing
        assert w.ray.created == [w.sid(1)]  # never resubmitted during the outage

    scenario(apiserver, body)


def test_a_submission_ray_rejects_fails_the_job(apiserver: ThreadedApiServer) -> None:
    async def body(w: World, loop: JobLoop) -> None:
        w.apply(manifest())
        w.ray.reject[w.sid(1)] = "runtime_env: pip package 'nope==0' not found"
        status = await step_until(loop, at(w, "Failed"))
        assert status["reason"] == "SubmissionFailed"
        assert status["message"] == "runtime_env: pip package 'nope==0' not found"
        assert w.ray.submit_calls == [w.sid(1)] and w.ray.created == []
        assert "SubmissionFailed" in w.event_reasons()

    scenario(apiserver, body)


def test_format_characters_from_ray_reach_neither_status_nor_events(apiserver: ThreadedApiServer) -> None:
    """A U+202E in Ray's answer made `kubectl get` and `kubectl describe` show a reason that reads backwards."""

    async def body(w: World, loop: JobLoop) -> None:
        w.apply(manifest())
        w.ray.reject[w.sid(1)] = "pip package 'ok\u202e==0' \u2066not\u2069 found\x1b[2J"
        status = await step_until(loop, at(w, "Failed", "SubmissionFailed"))
        assert status["message"] == "pip package 'ok\\u202e==0' \\u2066not\\u2069 found\\u001b[2J"
        messages = [e["message"] for e in apiserver.store.find("events") if e["reason"] == "SubmissionFailed"]
        assert messages and all(m.endswith("\\u001b[2J") and "\u202e" not in m for m in messages), messages

    scenario(apiserver, body)


def test_a_rejected_submission_is_retried_under_a_new_id(apiserver: ThreadedApiServer) -> None:
    async def body(w: World, loop: JobLoop) -> None:
        w.apply(manifest(runPolicy={"backoffLimit": 1}))
        w.ray.reject[w.sid(1)] = "invalid runtime_env"
        status = await step_until(loop, at(w, "Succeeded"))
        assert (status["attempts"], status["failedAttempts"], status["submissionId"]) == (2, 1, w.sid(2))
        assert w.ray.created == [w.sid(2)]
        assert w.event_reasons().count("Retrying") == 1

    scenario(apiserver, body)


class FlakyKube(AioKube):
    """The real client; the API server answers 503 to the first `failures` reads of the RayCluster."""

    def __init__(self, url: str, failures: int) -> None:
        super().__init__(url, headers=dict(OPERATOR_AUTH), timeout=FAST.kube_timeout)
        self.failures = failures

    async def get_raycluster(self, namespace: str, name: str) -> dict[str, Any] | None:
        if self.failures:
            self.failures -= 1
            raise KubeError(503, "the server is currently unable to handle the request")
        return await super().get_raycluster(namespace, name)


def test_the_loop_retries_after_an_api_error_and_finishes(apiserver: ThreadedApiServer) -> None:
    """Errors out of a pass go to the retry loop (`error_backoff`), which carries on from the stored status."""
    w = World(apiserver)

    async def main() -> None:
        kube = FlakyKube(apiserver.url, failures=3)
        loop, _ = make_loop(w, kube)
        stopped = Stopped()
        try:
            async with w.kuberay.running(tick=0.01):
                w.apply(manifest())
                running = asyncio.ensure_future(loop.run(stopped))
                deadline = asyncio.get_running_loop().time() + 20
                while w.status().get("phase") != "Succeeded" or w.clusters():
                    assert not running.done() and asyncio.get_running_loop().time() < deadline, w.status()
                    await asyncio.sleep(0.05)
                # Finished with nothing left to do, the loop waits for news of the job (an edit) until kopf stops it.
                assert not running.done()
                stopped.flag.set()
                await asyncio.wait_for(running, timeout=20)
        finally:
            await kube.close()
        assert kube.failures == 0

    with _captured("WARNING") as warnings:
        asyncio.run(main())
    assert w.status()["phase"] == "Succeeded"
    retries = [m for m in warnings if m.startswith("pass failed, retrying in 0.2s: ")]
    assert len(retries) == 3, warnings
    w.assert_no_duplicates()


def test_a_loop_started_again_decides_from_the_stored_job_not_an_older_watched_body(
    apiserver: ThreadedApiServer,
) -> None:
    """While the operator exits, kopf stops each job's daemon and may spawn it again from an event it queued before
    the last status write (the ended loop's watched body is gone with it). The new loop's first pass reads the job
    from the API server: decided from the queued `Running` body, it took the RayCluster its predecessor deleted for
    `Succeeded` as lost and overwrote `Succeeded` with `ClusterLost`."""

    async def body(w: World, loop: JobLoop) -> None:
        w.apply(manifest())
        running = await step_until(loop, lambda: w.job() if w.status().get("phase") == "Running" else None)
        await step_until(loop, lambda: w.status().get("phase") == "Succeeded" and not w.clusters())
        succeeded = w.status()

        # The first loop ended (kopf's stop): its watched body went with it; the queued event arrives after.
        watched = loop.rt.watched
        watched.jobs_watched = True
        watched.forget_job(NAMESPACE, "qwen")
        watched.job(NAMESPACE, "qwen", running)
        again = JobLoop(loop.rt, NAMESPACE, "qwen", LOG)
        decision = await again.pass_once()

        assert decision is not None and decision.status.phase == "Succeeded", decision
        assert not decision.actions, decision.actions
        assert w.status() == succeeded

    scenario(apiserver, body)


def test_an_edit_of_a_running_jobs_spec_is_refused_by_the_api_server_and_the_run_goes_on(
    apiserver: ThreadedApiServer,
) -> None:
    """The CRD's CEL rules (`generate.immutability_rules`): the refusal names the field and how to run another spec;
    nothing is stored, so the generation and observedGeneration stay the spec that runs."""

    async def body(w: World, loop: JobLoop) -> None:
        w.script.hold = True
        w.apply(manifest())
        await step_until(loop, lambda: at(w, "Running")() and w.status().get("progress"))
        path = f"/apis/fsdp.dev/v1alpha1/namespaces/{NAMESPACE}/fsdptrainingjobs/qwen"
        response = w.http.request(
            "PATCH", w.api.url + path, data='{"spec": {"workers": {"gpusPerWorker": 5}}}',
            headers={"Content-Type": "application/merge-patch+json"}, timeout=10,
        )  # fmt: skip
        assert response.status_code == 422, response.text
        answer = response.json()
        assert answer["message"] == (
            'FSDPTrainingJob.fsdp.dev "qwen" is invalid: spec.workers: Forbidden: spec.workers cannot change once '
            "the operator has taken the job; delete the job and apply it again to run another spec (Argo CD: the "
            "sync options Replace=true,Force=true; Flux: force: true)"
        )
        assert answer["details"]["causes"][0]["field"] == "spec.workers"
        job = w.job()
        assert job is not None and job["metadata"]["generation"] == job["status"]["observedGeneration"] == 1
        w.script.hold = False
        status = await step_until(loop, at(w, "Succeeded"))
        assert status["observedGeneration"] == 1

    scenario(apiserver, body)


def test_a_spec_edited_to_invalid_behind_the_api_servers_back_stops_the_ray_job(apiserver: ThreadedApiServer) -> None:
    """Defence in depth, where the API server does not enforce the CRD's rules (a cluster before CEL validation, a
    CRD installed without them): the edit is written to the store directly, past the rules."""

    async def body(w: World, loop: JobLoop) -> None:
        w.script.hold = True
        w.apply(manifest())
        await step_until(loop, lambda: at(w, "Running")() and w.status().get("progress"))
        job = w.job()
        assert job is not None
        job["spec"]["workers"]["gpusPerWorker"] = 5
        w.api.store.update(w.api.store.resource("fsdptrainingjobs", "fsdp.dev"), "qwen", job, NAMESPACE)
        status = await step_until(loop, at(w, "Failed", "ValidationFailed"))
        assert status["message"] == "invalid spec: spec.workers.gpusPerWorker: 5 GPUs requested, g6.12xlarge has 4"
        await step_until(loop, lambda: w.ray.stopped == [w.sid(1)] and not w.clusters())

    scenario(apiserver, body)


class ProbeScript(Script):
    """A two-node job whose rank 0 reports the given cross-node probe (or none)."""

    def __init__(self, cross_node: float | None) -> None:
        super().__init__(steps=2, world_size=8)
        self.cross_node = cross_node

    def __call__(self, ray: FakeRay, job: FakeJob) -> Iterator[None]:
        sid = job.submission.submission_id
        yield
        for r in range(8):
            ray.emit(
                sid,
                placement(r, 8, hostname="h", pod="w{node}").to_line(),
                Transport(rank=r, transport="efa", evidence=EFA_LINE).to_line(),
            )
        ray.emit(sid, Probe(rank=0, scope="all", ranks=8, size_bytes=1024, allreduce_busbw_gbps=40.0,
                            allgather_busbw_gbps=40.0).to_line())  # fmt: skip
        if self.cross_node is not None:
            ray.emit(sid, Probe(rank=0, scope="cross-node", ranks=2, size_bytes=1024,
                                allreduce_busbw_gbps=self.cross_node, allgather_busbw_gbps=1.0).to_line())  # fmt: skip
        yield
        ray.emit(
            sid,
            Step(
                rank=0, step=2, total_steps=2, loss=1.0, tokens_per_second=1.0, tokens_per_second_per_device=1.0
            ).to_line(),
            Summary(rank=0, steps=2, final_loss=1.0, first_loss=2.0, tokens_per_second=1.0).to_line(),
        )
        ray.finish(sid)


@pytest.mark.parametrize(
    ("cross_node", "want"),
    [
        (math.nan, ("Unknown", "NotMeasured")),
        (math.inf, ("Unknown", "NotMeasured")),
        (None, ("Unknown", "NotMeasured")),
        (4.99, ("False", "BelowFloor")),  # g6.12xlarge's floor is 5 GB/s: both sides of it
        (5.0, ("True", "Healthy")),
    ],
)
def test_a_nan_or_missing_probe_is_never_healthy(
    apiserver: ThreadedApiServer, cross_node: float | None, want: tuple[str, str]
) -> None:
    async def body(w: World, loop: JobLoop) -> None:
        w.apply(manifest())
        status = await step_until(loop, at(w, "Succeeded"))
        conditions = {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}
        assert conditions["InterconnectHealthy"] == want

    scenario(apiserver, body, ProbeScript(cross_node))


class _captured:
    """Collect the messages this module's logger emits at `level` or above."""

    def __init__(self, level: str) -> None:
        self.level = level
        self.messages: list[str] = []
        self.handler = logging.Handler()
        self.handler.emit = lambda record: self.messages.append(record.getMessage())  # type: ignore[method-assign]

    def __enter__(self) -> list[str]:
        self.handler.setLevel(self.level)
        LOG.addHandler(self.handler)
        return self.messages

    def __exit__(self, *exc: object) -> None:
        LOG.removeHandler(self.handler)
