"""The real operator (kopf, in-process) against the emulated API server over HTTP, a fake KubeRay and a fake Ray.

Every test counts what must never be duplicated: RayClusters (by uid, as the fake KubeRay saw them)
and submissions Ray accepted as new jobs.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import json
import logging
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

import kopf
import pytest
import requests
from fsdp_operator.api import generate, render, schema
from fsdp_operator.api.spec import parse_job
from fsdp_operator.local.cluster.kuberay import RAYCLUSTER_CRD
from fsdp_operator.local.server import ThreadedApiServer
from fsdp_operator.runtime.controller import JobLoop
from fsdp_operator.runtime.handlers import build_registry
from fsdp_operator.runtime.job_secret import with_event_key
from fsdp_operator.runtime.kube import AioKube
from fsdp_operator.runtime.rayjobs import RAY_FAILED, FakeJob, FakeRay
from fsdp_operator.runtime.settings import OperatorConfig
from fsdp_operator.runtime.shared import Runtime
from fsdp_train.contract.events import Step, Summary, Transport
from support import chart_rbac
from support.chart_rbac import ACCOUNT, ADMIN_AUTH, OPERATOR_AUTH, OPERATOR_TOKEN
from support.fake_kuberay import FakeKubeRay
from support.kopf_runner import eventually, kopf_operator
from support.running_job import placement

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

NAMESPACE = "default"
Kube = TypeVar("Kube", bound=AioKube)
JOBS = f"/apis/{schema.GROUP}/{schema.VERSION}/namespaces/{NAMESPACE}/{schema.PLURAL}"
CLUSTERS = f"/apis/ray.io/v1/namespaces/{NAMESPACE}/rayclusters"
FAST = OperatorConfig(
    interval=0.1,
    progress_write_interval=0.5,
    error_backoff=0.2,
    ray_timeout=2,
    kube_timeout=30,  # the default: a loaded CI machine's API server thread answered one GET in over 5 s
    finalize_timeout=1,
    daemon_cancellation_timeout=2,
)
EFA_LINE = "NCCL INFO NET/OFI Selected provider is efa, fabric is efa-direct (found 1 nics)"
WATCHED = [(schema.PLURAL, schema.GROUP), ("rayclusters", "ray.io"), ("pods", "")]
SOCKET_LINE = "NCCL INFO NET/Socket : Using [0]eth0:10.0.1.17<0>"


def manifest(name: str = "qwen", *, steps: int = 3, **sections: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = {"workers": {"replicas": 2}, "training": {"steps": steps}, **sections}
    return {"apiVersion": schema.API_VERSION, "kind": schema.KIND, "metadata": {"name": name}, "spec": spec}


@dataclass
class Script:
    """What each fake Ray job prints: placement and transport per rank, steps, a summary; then it ends."""

    steps: int = 3
    world_size: int = 8
    transport: Callable[[int], str] = lambda rank: "efa"
    fail_attempts: set[int] = field(default_factory=set)
    """Attempts (1-based, by submission id suffix) that end FAILED instead of SUCCEEDED."""
    hold: bool = False
    """While True, a job stops after its first step and waits."""

    def __call__(self, ray: FakeRay, job: FakeJob) -> Iterator[None]:
        sid = job.submission.submission_id
        attempt = int(sid.rsplit("-", 1)[1])
        yield  # Ray takes a moment to start the entrypoint (PENDING)
        ray.emit(
            sid,
            *(
                f"(RayTrainWorker pid={100 + r}, ip=10.0.0.{r // 4 + 1}) "
                + placement(r, self.world_size, hostname="host-{node}").to_line()
                for r in range(self.world_size)
            ),
        )
        yield
        for r in range(self.world_size):
            kind = self.transport(r)
            line = EFA_LINE if kind == "efa" else SOCKET_LINE
            ray.emit(sid, Transport(rank=r, transport=kind, evidence=line).to_line())  # type: ignore[arg-type]
        yield
        for step in range(1, self.steps + 1):
            ray.emit(sid, Step(rank=0, step=step, total_steps=self.steps, loss=5.0 / step, tokens_per_second=8192.4,
                               tokens_per_second_per_device=1024).to_line())  # fmt: skip
            yield
            while self.hold:
                yield
        if attempt in self.fail_attempts:
            ray.finish(sid, RAY_FAILED, f"attempt {attempt}: entrypoint exited with code 1")
            return
        ray.emit(sid, Summary(rank=0, steps=self.steps, final_loss=5.0 / self.steps, first_loss=5.0,
                              tokens_per_second=8192.4).to_line())  # fmt: skip
        ray.finish(sid)


class World:
    """The emulated cluster, the fake KubeRay and Ray, and the operator that can be started and stopped.

    The API server enforces the chart's RBAC (`helm template`, watching every namespace, or with
    `watch_all=False` only `NAMESPACE`) and OwnerReferencesPermissionEnforcement: the operator runs as the chart's
    ServiceAccount (`kube()`, `kopf()`), the test and the KubeRay double act as a cluster admin. A 403 the
    operator meets fails the test when its `operator()` block ends."""

    def __init__(self, api: ThreadedApiServer, script: Script | None = None, *, watch_all: bool = True) -> None:
        self.api = api
        self.script = script or Script()
        self.ray = FakeRay(script=self.script)
        self.watched = None if watch_all else [NAMESPACE]
        docs = chart_rbac.rendered_rbac(watch_all, watched=() if watch_all else (NAMESPACE,))
        self.access = chart_rbac.secure(api, docs)
        self.kuberay = FakeKubeRay(api.url, self.ray)
        self.kuberay.headers.update(ADMIN_AUTH)
        self.http = requests.Session()
        self.http.headers.update(ADMIN_AUTH)
        for crd in (generate.crd(), RAYCLUSTER_CRD):
            response = self.http.post(f"{api.url}/apis/apiextensions.k8s.io/v1/customresourcedefinitions", json=crd)
            assert response.status_code == 201, response.text

    # --- the operator ---
    def kube(self, timeout: float = FAST.kube_timeout, client: type[Kube] = AioKube) -> Kube:  # type: ignore[assignment]
        """The operator's client (`client`: the real one, or a test's subclass of it), as the chart's
        ServiceAccount."""
        return client(self.api.url, headers=dict(OPERATOR_AUTH), timeout=timeout)

    def loop(self, kube: AioKube | None = None, name: str = "qwen") -> JobLoop:
        """One job's loop of the operator, outside kopf: through `kube` (by default `kube()`) and the fake Ray."""
        runtime = Runtime(FAST, kube=kube or self.kube(), ray=self.ray.client)
        return JobLoop(runtime, NAMESPACE, name, logging.getLogger(__name__))

    def kopf(self, registry: kopf.OperatorRegistry, **kwargs: Any) -> contextlib.AbstractAsyncContextManager[None]:
        """kopf, as the chart's ServiceAccount, watching what the chart lets it watch."""
        kwargs.setdefault("namespaces", self.watched)
        return kopf_operator(registry, self.api.url, token=OPERATOR_TOKEN, **kwargs)

    def forbidden(self) -> list[Any]:
        """The operator's requests the chart's RBAC refused."""
        return [d for d in self.access.denied if d.user == ACCOUNT.name]

    @contextlib.asynccontextmanager
    async def operator(self) -> AsyncIterator[Runtime]:
        runtime = Runtime(FAST, kube=self.kube(), ray=self.ray.client)
        watches = [self.api.count("watch", plural, group) for plural, group in WATCHED]
        async with self.kopf(build_registry(runtime, login=False)):
            # Ready means watching: stopping kopf in the middle of its discovery costs seconds at exit.
            await eventually(
                lambda: all(self.api.count("watch", p, g) > n for (p, g), n in zip(WATCHED, watches, strict=True)),
                message="the operator never started watching",
            )
            yield runtime
            # Let in-flight writes and their watch events settle: kopf may otherwise spawn a job's daemon
            # again while it shuts down, and only cancels that one after 5 s.
            await asyncio.sleep(0.2)
        assert not self.forbidden(), f"the chart's RBAC refused the operator: {self.forbidden()}"

    # --- acting like kubectl ---
    def call(self, method: str, path: str, body: Any = None, content_type: str = "application/json") -> Any:
        response = self.http.request(
            method, self.api.url + path, data=None if body is None else json.dumps(body),
            headers={"Content-Type": content_type}, timeout=10,
        )  # fmt: skip
        assert response.status_code < 400, f"{method} {path}: {response.status_code} {response.text}"
        return response.json() if response.content else None

    def apply(self, m: dict[str, Any]) -> dict[str, Any]:
        created: dict[str, Any] = self.call("POST", JOBS, m)
        return created

    def patch_spec(self, name: str, spec: dict[str, Any]) -> None:
        self.call("PATCH", f"{JOBS}/{name}", {"spec": spec}, "application/merge-patch+json")

    def patch_status(self, name: str, status: dict[str, Any]) -> None:
        self.call("PATCH", f"{JOBS}/{name}/status", {"status": status}, "application/merge-patch+json")

    def delete(self, path: str) -> None:
        self.call("DELETE", path)

    # --- looking ---
    def job(self, name: str = "qwen") -> dict[str, Any] | None:
        found = [j for j in self.api.store.find(schema.PLURAL, schema.GROUP) if j["metadata"]["name"] == name]
        return found[0] if found else None

    def status(self, name: str = "qwen") -> dict[str, Any]:
        job = self.job(name)
        return dict((job or {}).get("status") or {})

    def clusters(self) -> list[dict[str, Any]]:
        return list(self.api.store.find("rayclusters", "ray.io"))

    def event_reasons(self, name: str = "qwen") -> list[str]:
        events = [e for e in self.api.store.find("events") if e["involvedObject"]["name"] == name]
        return [e["reason"] for e in sorted(events, key=lambda e: int(e["metadata"]["resourceVersion"]))]

    async def held_running(self, m: dict[str, Any] | None = None) -> dict[str, Any]:
        """Apply the job (`manifest()` by default), its ranks held after their first step, and wait until it runs:
        its status then."""
        self.script.hold = True
        self.apply(m or manifest())
        return await self.phase("Running")

    async def phase(
        self, phase: str, reason: str | None = None, *, name: str = "qwen", timeout: float = 60
    ) -> dict[str, Any]:
        def reached() -> dict[str, Any] | None:
            status = self.status(name)
            ok = status.get("phase") == phase and (reason is None or status.get("reason") == reason)
            return status if ok else None

        try:
            found: dict[str, Any] = await eventually(reached, timeout=timeout)
        except AssertionError:
            raise AssertionError(f"never reached {phase}/{reason}; status: {self.status(name)}") from None
        return found

    async def phase_passed(
        self,
        phase: str,
        reason: str | None = None,
        *,
        name: str = "qwen",
        where: Callable[[dict[str, Any]], bool] = lambda status: True,
        timeout: float = 60,
    ) -> dict[str, Any]:
        """The first status the present job `name` had with `phase` (and `reason`, and `where`), from the API server's
        change history: a phase a job passes through in one pass (Preempted, then Queued again) can be gone before a
        poll of the present status sees it, on a loaded machine."""

        def passed() -> dict[str, Any] | None:
            job = self.job(name)
            uid = (job or {}).get("metadata", {}).get("uid")
            with self.api.store.lock:
                changes = [e.object for e in self.api.store.history if e.key == (schema.GROUP, schema.PLURAL)]
            for obj in changes:
                status, meta = obj.get("status") or {}, obj["metadata"]
                ours = meta["name"] == name and meta.get("uid") == uid and status.get("phase") == phase
                if ours and (reason is None or status.get("reason") == reason) and where(status):
                    return dict(status)
            return None

        try:
            found: dict[str, Any] = await eventually(passed, timeout=timeout)
        except AssertionError:
            raise AssertionError(f"never passed {phase}/{reason}; status: {self.status(name)}") from None
        return found

    def sid(self, attempt: int, name: str = "qwen") -> str:
        job = self.job(name)
        assert job is not None
        return render.submission_id(name, job["metadata"]["uid"], attempt)

    def assert_no_duplicates(self, clusters: int = 1, submissions: int = 1) -> None:
        assert len(self.kuberay.seen_uids) == clusters, self.kuberay.seen_uids
        assert len(self.ray.created) == submissions == len(set(self.ray.created)), self.ray.created


def falls_back_to_sockets(rank: int) -> str:
    """The transport of each rank of a job that fell back: ranks 0-3 (the first node) on EFA, the others on sockets."""
    return "efa" if rank < 4 else "socket"


def held_fallback_loop(api: ThreadedApiServer, client: type[Kube]) -> tuple[World, Kube, JobLoop]:
    """A world whose job falls back to sockets (its ranks held, so the job stays running), and the operator's loop
    for it through `client`, a test's subclass of the real client."""
    w = World(api, Script(transport=falls_back_to_sockets, hold=True))
    kube = w.kube(client=client)
    return w, kube, w.loop(kube)


def scenario(api: ThreadedApiServer, body: Callable[[World], Any], script: Script | None = None) -> World:
    world = World(api, script)

    async def main() -> None:
        async with world.kuberay.running():
            await body(world)

    asyncio.run(main())
    return world


# --- happy path ------------------------------------------------------------------------------------------


def test_happy_path(apiserver: ThreadedApiServer) -> None:
    async def body(w: World) -> None:
        async with w.operator() as runtime:
            # No progress-only write can come due within the run, however slowly a loaded machine runs it (FAST's
            # 0.5 s made the count of writes depend on the machine's speed).
            runtime.config = dataclasses.replace(FAST, progress_write_interval=3600)
            w.apply(manifest(steps=12))
            status = await w.phase("Succeeded", "Completed")
            await eventually(lambda: not w.clusters(), message="the RayCluster was not deleted (cleanup: Delete)")

        assert status["rayClusterName"] == "qwen-ray" and status["submissionId"] == w.sid(1)
        assert status["workers"] == "2/2" and status["attempts"] == 1
        assert status["progress"]["stepOfTotal"] == "12/12" and status["progress"]["tokensPerSecond"] == 8192
        assert status["result"]["steps"] == 12 and status["transport"]["summary"] == "efa"
        assert [r["rank"] for r in status["ranks"]] == list(range(8))
        assert {r["pod"] for r in status["ranks"]} == {"worker-0", "worker-1"}
        conditions = {c["type"]: c["status"] for c in status["conditions"]}
        assert conditions == {
            "Validated": "True", "WorkersReady": "True", "JobSubmitted": "True", "TransportVerified": "True",
            "Running": "False", "Complete": "True", "Reconciling": "False", "Stalled": "False", "Ready": "True",
        }  # fmt: skip
        assert status["startTime"] <= status["endTime"]
        reasons = w.event_reasons()
        for reason in ("ClusterCreating", "WorkersReady", "JobRunning", "Completed"):
            assert reason in reasons, reasons
        w.assert_no_duplicates()

    w = scenario(apiserver, body, Script(steps=12))
    assert apiserver.count("create", "rayclusters", "ray.io") == 1
    assert apiserver.count("delete", "rayclusters", "ray.io") >= 1  # explicit, not garbage collection
    # Progress-only writes are rate-limited: 12 steps do not make 12 status writes (the lifecycle's writes remain).
    patches = apiserver.count("patch", schema.PLURAL, schema.GROUP, "status")
    assert patches < 12, patches
    assert w.ray.submit_calls == [w.ray.created[0]]


def test_ttl_after_finished_deletes_the_job(apiserver: ThreadedApiServer) -> None:
    async def body(w: World) -> None:
        async with w.operator():
            w.apply(manifest(runPolicy={"ttlSecondsAfterFinished": 1, "cleanup": "Keep"}))
            await w.phase("Succeeded")
            assert w.clusters(), "cleanup: Keep must leave the RayCluster"
            await eventually(lambda: w.job() is None, timeout=60, message="the job was not deleted after its TTL")
            await eventually(lambda: not w.clusters(), message="deleting the job must delete the kept cluster")

    scenario(apiserver, body)


def test_a_fixed_spec_starts_the_job_over(apiserver: ThreadedApiServer) -> None:
    async def body(w: World) -> None:
        async with w.operator():
            w.apply(manifest(workers={"replicas": 2, "gpusPerWorker": 5}))
            status = await w.phase("Failed", "ValidationFailed")
            assert "gpusPerWorker" in status["message"] and not w.clusters()
            w.patch_spec("qwen", {"workers": {"gpusPerWorker": 4}})
            status = await w.phase("Succeeded")
        assert status["observedGeneration"] == 2 and status["submissionId"] == w.sid(1)
        w.assert_no_duplicates()

    scenario(apiserver, body)


# --- restarts --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("phase", ["Pending", "Provisioning", "Submitting", "Submitted", "Running", "Succeeded"])
def test_restart_in_every_phase_never_duplicates(apiserver: ThreadedApiServer, phase: str) -> None:
    """Stop the operator in `phase`, start a new one: one RayCluster and one submission in the end.

    Submitting: stopped after the status said Submitting but before Ray got the job; Submitted: Ray
    got the job but the status still says Submitting (the two sides of the write-then-act order).
    """

    async def body(w: World) -> None:
        if phase == "Pending":
            # What a first pass writes before anything exists: identities only.
            created = w.apply(manifest())
            uid = created["metadata"]["uid"]
            w.patch_status("qwen", {"phase": "Pending", "reason": "Created", "attempts": 1,
                                    "rayClusterName": render.raycluster_name("qwen"),
                                    "submissionId": render.submission_id("qwen", uid, 1)})  # fmt: skip
        else:
            w.kuberay.never_ready = phase in ("Provisioning", "Submitting", "Submitted")
            w.script.hold = phase == "Running"
            async with w.operator():
                w.apply(manifest())
                if phase in ("Provisioning", "Submitting", "Submitted"):
                    await w.phase("Provisioning", "WorkersNotReady")
                else:
                    await w.phase(phase)
                if phase == "Running":
                    await eventually(lambda: w.status().get("progress"))
            if phase in ("Submitting", "Submitted"):
                w.kuberay.never_ready = False
                await eventually(lambda: w.kuberay.clusters and all(c.ready for c in w.kuberay.clusters.values()))
                w.patch_status("qwen", {"phase": "Submitting", "reason": "WorkersReady"})
                if phase == "Submitted":
                    (address,) = [c.address for c in w.kuberay.clusters.values()]
                    job = w.job()
                    assert job is not None
                    submission = render.submission(parse_job(job), w.sid(1), FAST.training_package)
                    (secret,) = w.api.store.find("secrets")  # what the operator adds at submission: the attempt key
                    job_key = base64.b64decode(secret["data"][render.EVENTS_KEY_KEY])
                    await w.ray.client(address, w.ray.tokens[address]).submit(with_event_key(submission, job_key))
        w.script.hold = w.kuberay.never_ready = False
        async with w.operator():
            await w.phase("Succeeded", timeout=60)
        w.assert_no_duplicates()
        assert apiserver.count("create", "rayclusters", "ray.io") == 1

    scenario(apiserver, body)


# --- failures --------------------------------------------------------------------------------------------


def test_workers_never_ready_times_out(apiserver: ThreadedApiServer) -> None:
    async def body(w: World) -> None:
        w.kuberay.never_ready = True
        async with w.operator():
            w.apply(manifest(runPolicy={"waitForWorkersTimeoutSeconds": 1}))
            status = await w.phase("Provisioning", "WorkersNotReady")
            assert "0/2 worker pods ready" in status["message"] and status["workers"] == "0/2"
            status = await w.phase("Failed", "WaitForWorkersTimeout")
            assert "waitForWorkersTimeoutSeconds (1s) exceeded" in status["message"]
            await eventually(lambda: not w.clusters())
        assert "WaitForWorkersTimeout" in w.event_reasons()
        w.assert_no_duplicates(submissions=0)

    scenario(apiserver, body)


def test_unschedulable_workers_show_the_schedulers_message(apiserver: ThreadedApiServer) -> None:
    message = "0/3 nodes are available: 3 Insufficient vpc.amazonaws.com/efa. preemption: 0/3 nodes are available"

    async def body(w: World) -> None:
        w.kuberay.unschedulable = message
        async with w.operator():
            # Long enough for the waiting state to be seen by polling on a loaded machine (at 2 s it was missed).
            w.apply(manifest(runPolicy={"waitForWorkersTimeoutSeconds": 20}))
            status = await w.phase("Provisioning", "Unschedulable")
            assert message in status["message"]
            status = await w.phase("Failed", "Unschedulable")
            assert message in status["message"]
        reasons = w.event_reasons()
        assert reasons.count("Unschedulable") == 2, reasons  # while waiting (Warning), and the failure
        w.assert_no_duplicates(submissions=0)

    scenario(apiserver, body)


def test_a_crash_looping_worker_is_named_while_waiting_and_in_the_timeouts_failure(
    apiserver: ThreadedApiServer,
) -> None:
    """The kubelet's word on a worker container it keeps restarting reaches the status through the pod watch."""
    container = {
        "name": "ray-worker",
        "ready": False,
        "restartCount": 3,
        "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s restarting failed container"}},
        "lastState": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}},
    }
    said = "container ray-worker CrashLoopBackOff (restarted 3 times, last exit code 137 (OOMKilled)): back-off 40s"

    async def body(w: World) -> None:
        w.kuberay.worker_container_status = container
        async with w.operator():
            w.apply(manifest(runPolicy={"waitForWorkersTimeoutSeconds": 20}))
            status = await w.phase_passed(
                "Provisioning", "WorkersNotReady", where=lambda s: said in s.get("message", "")
            )
            assert status["message"].startswith("0/2 worker pods ready"), status["message"]
            status = await w.phase("Failed", "WaitForWorkersTimeout")
            assert said in status["message"], status["message"]
        w.assert_no_duplicates(submissions=0)

    scenario(apiserver, body)


def test_ray_job_failure_without_retries_fails(apiserver: ThreadedApiServer) -> None:
    async def body(w: World) -> None:
        async with w.operator():
            w.apply(manifest())
            status = await w.phase("Failed", "RayJobFailed")
            assert "attempt 1: entrypoint exited with code 1" in status["message"]
        assert "RayJobFailed" in w.event_reasons()
        w.assert_no_duplicates()

    scenario(apiserver, body, Script(fail_attempts={1}))


def test_backoff_retries_with_a_new_submission_on_the_same_cluster(apiserver: ThreadedApiServer) -> None:
    async def body(w: World) -> None:
        async with w.operator():
            w.apply(manifest(runPolicy={"backoffLimit": 2}))
            status = await w.phase("Succeeded")
        assert status["attempts"] == 3 and status["failedAttempts"] == 2
        assert status["submissionId"] == w.sid(3)
        assert w.ray.created == [w.sid(1), w.sid(2), w.sid(3)]
        assert w.event_reasons().count("Retrying") == 2
        w.assert_no_duplicates(clusters=1, submissions=3)

    scenario(apiserver, body, Script(fail_attempts={1, 2}))


def test_cluster_deleted_behind_the_operators_back(apiserver: ThreadedApiServer) -> None:
    async def body(w: World) -> None:
        async with w.operator():
            await w.held_running()
            w.delete(f"{CLUSTERS}/qwen-ray")
            status = await w.phase("Failed", "ClusterLost")
            assert "qwen-ray was deleted" in status["message"] or "is being deleted" in status["message"]
        assert "ClusterLost" in w.event_reasons()
        w.assert_no_duplicates()

    scenario(apiserver, body)


def test_socket_fallback_fails_the_job_promptly(apiserver: ThreadedApiServer) -> None:
    async def body(w: World) -> None:
        w.script.hold = True
        async with w.operator():
            w.apply(manifest())
            # Promptly: the job holds after its first step, so only the fallback can end it.
            status = await w.phase("Failed", "TransportFallback")
            assert SOCKET_LINE in status["message"] and "ranks 4, 5, 6, 7" in status["message"]
            # The status is written before the stop is sent: the stop may land a moment after it is seen.
            await eventually(lambda: w.ray.stopped == [w.sid(1)], message="the Ray job was not stopped")
            conditions = {c["type"]: c for c in status["conditions"]}
            assert conditions["TransportVerified"]["status"] == "False"
        assert {"TransportFallback", "SocketFallback"} <= set(w.event_reasons())

    scenario(apiserver, body, Script(transport=falls_back_to_sockets))


def test_socket_fallback_without_require_efa_keeps_running_with_a_warning(apiserver: ThreadedApiServer) -> None:
    async def body(w: World) -> None:
        w.script.hold = True
        async with w.operator():
            w.apply(manifest(network={"transport": "efa", "requireEFA": False}))
            status = await eventually(
                lambda: (s := w.status()).get("transport", {}).get("summary") == "mixed" and s, timeout=10
            )
            assert status["phase"] == "Running"
            assert {c["type"]: c["status"] for c in status["conditions"]}["TransportVerified"] == "False"
            await eventually(lambda: "SocketFallback" in w.event_reasons())
            w.script.hold = False
            await w.phase("Succeeded")
        assert w.ray.stopped == []

    scenario(apiserver, body, Script(transport=falls_back_to_sockets))


# --- suspend, delete -------------------------------------------------------------------------------------


def test_suspend_and_resume(apiserver: ThreadedApiServer) -> None:
    async def body(w: World) -> None:
        async with w.operator():
            await w.held_running()
            w.patch_spec("qwen", {"runPolicy": {"suspend": True}})
            await w.phase("Suspended", "Suspended")
            await eventually(lambda: w.ray.stopped == [w.sid(1)], message="the Ray job was not stopped")
            await eventually(lambda: not w.clusters(), message="suspend must delete the RayCluster")
            w.script.hold = False
            w.patch_spec("qwen", {"runPolicy": {"suspend": False}})
            status = await w.phase("Succeeded")
        assert status["attempts"] == 2 and status["submissionId"] == w.sid(2)
        assert w.ray.created == [w.sid(1), w.sid(2)]
        assert {"Suspended", "Resumed"} <= set(w.event_reasons())
        w.assert_no_duplicates(clusters=2, submissions=2)

    scenario(apiserver, body)


@pytest.mark.parametrize("phase", ["FirstPass", "Provisioning", "Running", "Succeeded", "Suspended", "RayDown"])
def test_delete_in_every_phase_leaves_nothing(apiserver: ThreadedApiServer, phase: str) -> None:
    async def body(w: World) -> None:
        w.kuberay.never_ready = phase == "Provisioning"
        w.script.hold = phase in ("Running", "Suspended", "RayDown")
        run_policy: dict[str, Any] = {"cleanup": "Keep"} if phase == "Succeeded" else {}
        async with w.operator():
            w.apply(manifest(runPolicy=run_policy))
            first = w.sid(1)
            if phase == "Suspended":
                await w.phase("Running")
                w.patch_spec("qwen", {"runPolicy": {"suspend": True}})
            if phase == "FirstPass":
                await eventually(lambda: w.status().get("submissionId"))
            else:
                await w.phase("Running" if phase == "RayDown" else phase)
            if phase == "RayDown":
                w.ray.down = True  # Ray does not answer: the delete must still finish, bounded
            w.delete(f"{JOBS}/qwen")
            await eventually(lambda: w.job() is None, timeout=60, message="the finalizer was never removed")
            await eventually(lambda: not w.clusters(), message="a RayCluster was left behind")
        if phase == "Running":
            assert w.ray.stopped == [first]
        assert len(w.kuberay.seen_uids) <= 1
        assert len(w.ray.created) <= 1

    scenario(apiserver, body)
