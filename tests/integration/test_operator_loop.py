"""The operator's loop and its Ray client where the other side misbehaves: a refused or failed write, a silent Ray head.

No kopf here: the tests step one job's loop (`JobLoop`) themselves against the emulated API server, a fake
KubeRay and a fake Ray, so they can make the API server refuse exactly one write.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import socket
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

import pytest
from fsdp_operator.local.server import ThreadedApiServer
from fsdp_operator.runtime.controller import JobLoop
from fsdp_operator.runtime.kube import AioKube, KubeError
from fsdp_operator.runtime.rayjobs import RayJobsClient, RayUnavailable
from fsdp_operator.runtime.shared import Runtime
from support.chart_rbac import OPERATOR_AUTH
from support.kopf_runner import Stopped
from test_operator import CLUSTERS, FAST, NAMESPACE, World, held_fallback_loop, manifest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

PASSES_DEADLINE = 60.0
"""How long a test steps a loop pass by pass before it gives up (a failure; a passing test stops at its event)."""


async def passes_until(
    loop: JobLoop,
    done: Callable[[], bool],
    each: Callable[[], None] = lambda: None,
    *,
    may_fail: Callable[[], bool] = lambda: True,
) -> None:
    """Step `loop` a pass at a time (a failed pass is the point of these tests) until `done()`, for at most
    `PASSES_DEADLINE` seconds (the fake KubeRay moves in the background: a count of passes is a length of time). A
    pass may fail (`KubeError`) only while `may_fail()` holds."""
    deadline = time.monotonic() + PASSES_DEADLINE
    while time.monotonic() < deadline:
        if done():
            return
        each()
        try:
            await loop.pass_once()
        except KubeError:
            assert may_fail(), "a pass failed before the API server refused anything"
        await asyncio.sleep(0.02)


def passes_of_a_kept_job(
    w: World,
    kube: AioKube,
    loop: JobLoop,
    done: Callable[[], bool],
    each: Callable[[], None] = lambda: None,
    *,
    may_fail: Callable[[], bool] = lambda: True,
) -> None:
    """The job applied with `cleanup: Keep` (only an explicit stop ends its Ray job; deleting the cluster would too),
    the fake KubeRay running, `loop` stepped until `done()` (`passes_until`), then the client closed."""

    async def main() -> None:
        async with w.kuberay.running():
            w.apply(manifest(runPolicy={"cleanup": "Keep"}))
            await passes_until(loop, done, each, may_fail=may_fail)
            await kube.close()

    asyncio.run(main())


class RefusesFirstFailedWrite(AioKube):
    """The real client; the API server answers 500 to the first status write that sets phase Failed."""

    refused = False

    async def patch_job_status(self, namespace: str, name: str, status_patch: dict[str, Any]) -> dict[str, Any]:
        if status_patch.get("phase") == "Failed" and not self.refused:
            self.refused = True
            raise KubeError(500, "etcdserver: request timed out")
        return await super().patch_job_status(namespace, name, status_patch)


def test_a_refused_status_write_is_decided_again_with_its_actions(apiserver: ThreadedApiServer) -> None:
    """The pass whose write failed did not act: the next pass must still stop the Ray job and post the event."""
    w, kube, loop = held_fallback_loop(apiserver, RefusesFirstFailedWrite)

    passes_of_a_kept_job(w, kube, loop, lambda: w.status().get("phase") == "Failed", may_fail=lambda: kube.refused)
    status = w.status()
    assert kube.refused and (status["phase"], status["reason"]) == ("Failed", "TransportFallback")
    assert w.ray.stopped == [w.sid(1)], "the Ray job kept running after the job was marked Failed"
    assert "TransportFallback" in w.event_reasons()


class RefusesEveryStatus(AioKube):
    """The real client; once `refusing` is set, the API server answers 403 to every status write (RBAC lost)."""

    refusing = False

    async def patch_job_status(self, namespace: str, name: str, status_patch: dict[str, Any]) -> dict[str, Any]:
        if self.refusing:
            raise KubeError(403, 'fsdptrainingjobs.fsdp.dev "qwen" is forbidden: cannot patch resource status')
        return await super().patch_job_status(namespace, name, status_patch)


def test_a_status_refused_in_every_form_still_stops_the_ray_job(apiserver: ThreadedApiServer) -> None:
    """Nothing can be recorded (not even the status without per-rank detail): the Ray job must stop all the same."""
    w, kube, loop = held_fallback_loop(apiserver, RefusesEveryStatus)

    def refuse_once_running() -> None:
        if w.status().get("phase") == "Running":
            kube.refusing = True  # from here on, the TransportFallback the ranks report cannot be written

    passes_of_a_kept_job(w, kube, loop, lambda: bool(w.ray.stopped), refuse_once_running)
    assert kube.refusing and w.status()["phase"] == "Running"
    assert w.ray.stopped == [w.sid(1)], "the Ray job kept running while no status could be written"


class FailsSucceededWrite(AioKube):
    """The real client; the first status write that sets phase Succeeded fails: with a 500 before it takes effect, or
    (`lost`) with the connection dropped after it did, so the loop cannot tell. `then` runs right after the failure."""

    def __init__(self, url: str, *, lost: bool, then: Callable[[], None] = lambda: None) -> None:
        super().__init__(url, headers=dict(OPERATOR_AUTH), timeout=FAST.kube_timeout)
        self.lost, self.then, self.failed = lost, then, False

    async def patch_job_status(self, namespace: str, name: str, status_patch: dict[str, Any]) -> dict[str, Any]:
        if status_patch.get("phase") != "Succeeded" or self.failed:
            return await super().patch_job_status(namespace, name, status_patch)
        self.failed = True
        try:
            if not self.lost:
                raise KubeError(500, "etcdserver: request timed out")
            await super().patch_job_status(namespace, name, status_patch)
            raise KubeError(0, f"PATCH {name}/status: Server disconnected")
        finally:
            self.then()


def step_until_final(w: World, loop: JobLoop, kube: FailsSucceededWrite) -> list[tuple[str, str]]:
    """Step the loop until it is done with the job (terminal, nothing left to do); every (phase, reason) stored."""
    seen: list[tuple[str, str]] = []

    async def main() -> None:
        async with w.kuberay.running():
            deadline = time.monotonic() + PASSES_DEADLINE
            while time.monotonic() < deadline:
                try:
                    decision = await loop.pass_once()
                except KubeError:
                    assert kube.failed
                    decision = None
                status = w.status()
                if (status.get("phase"), status.get("reason")) not in seen[-1:]:
                    seen.append((status.get("phase"), status.get("reason")))
                if decision is not None and decision.done:
                    break
                await asyncio.sleep(0.02)
            await kube.close()

    asyncio.run(main())
    return seen


@pytest.mark.parametrize("lost", [False, True], ids=["500", "lost-answer"])
def test_a_failed_terminal_write_deletes_no_cluster_before_it_is_recorded(
    apiserver: ThreadedApiServer, lost: bool
) -> None:
    """The pass whose `Succeeded` write failed must not delete the RayCluster (cleanup: Delete): the next pass would
    decide from the stored `Running` and read the missing cluster as lost (`Failed`/`ClusterLost`)."""
    w = World(apiserver)
    kube = FailsSucceededWrite(apiserver.url, lost=lost)
    loop = w.loop(kube)
    w.apply(manifest())
    seen = step_until_final(w, loop, kube)
    status = w.status()
    assert kube.failed and (status["phase"], status["reason"]) == ("Succeeded", "Completed"), (seen, status)
    assert ("Failed", "ClusterLost") not in seen and status.get("failedAttempts", 0) == 0
    assert not w.clusters()
    w.assert_no_duplicates()


def test_a_terminal_status_that_landed_unseen_is_not_decided_again(apiserver: ThreadedApiServer) -> None:
    """The `Succeeded` write landed but its answer was lost, and the kept RayCluster is deleted before the next pass:
    that pass must decide from the stored `Succeeded`, not from the `Running` the loop last saw written."""
    w = World(apiserver)

    def delete_cluster() -> None:
        w.delete(f"{CLUSTERS}/qwen-ray")

    kube = FailsSucceededWrite(apiserver.url, lost=True, then=delete_cluster)
    loop = w.loop(kube)
    w.apply(manifest(runPolicy={"cleanup": "Keep"}))
    seen = step_until_final(w, loop, kube)
    status = w.status()
    assert kube.failed and (status["phase"], status["reason"]) == ("Succeeded", "Completed"), (seen, status)
    assert ("Failed", "ClusterLost") not in seen


class FailsFirstCreate(AioKube):
    """The real client; the first create of the Secret or of the NetworkPolicy (`kind`) is answered 500."""

    def __init__(self, url: str, kind: str) -> None:
        super().__init__(url, headers=dict(OPERATOR_AUTH), timeout=FAST.kube_timeout)
        self.kind, self.failed = kind, False

    def _fail(self, kind: str) -> None:
        if kind == self.kind and not self.failed:
            self.failed = True
            raise KubeError(500, "etcdserver: request timed out")

    async def create_secret(self, manifest: dict[str, Any]) -> bool:
        self._fail("secret")
        return await super().create_secret(manifest)

    async def create_network_policy(self, manifest: dict[str, Any]) -> bool:
        self._fail("networkpolicy")
        return await super().create_network_policy(manifest)


@pytest.mark.parametrize("kind", ["secret", "networkpolicy"])
def test_a_raycluster_is_created_only_after_what_it_needs(apiserver: ThreadedApiServer, kind: str) -> None:
    """Only a missing RayCluster makes a pass create its Secret and NetworkPolicy again: a cluster created in the pass
    where one of them failed would wait for ever for its token (the fake head refuses every call then), or run with
    Ray's ports open."""
    w = World(apiserver)
    kube = FailsFirstCreate(apiserver.url, kind)
    loop = w.loop(kube)

    passes_of_a_kept_job(w, kube, loop, lambda: w.status().get("phase") == "Succeeded")
    assert kube.failed and w.status().get("phase") == "Succeeded", w.status()
    assert w.api.store.find("secrets") and w.api.store.find("networkpolicies")
    w.assert_no_duplicates()


class MeetsAtCreates(AioKube):
    """The real client; the Secret's and the NetworkPolicy's creates each wait until the other one has started."""

    def __init__(self, url: str) -> None:
        super().__init__(url, headers=dict(OPERATOR_AUTH), timeout=FAST.kube_timeout)
        self.started = {"secret": asyncio.Event(), "networkpolicy": asyncio.Event()}
        self.met = False

    async def _meet(self, kind: str, other: str) -> None:
        self.started[kind].set()
        await asyncio.wait_for(self.started[other].wait(), 20)  # made one after the other: never, and this fails
        self.met = True

    async def create_secret(self, manifest: dict[str, Any]) -> bool:
        await self._meet("secret", "networkpolicy")
        return await super().create_secret(manifest)

    async def create_network_policy(self, manifest: dict[str, Any]) -> bool:
        await self._meet("networkpolicy", "secret")
        return await super().create_network_policy(manifest)


def test_a_clusters_secret_and_network_policy_are_created_at_once(apiserver: ThreadedApiServer) -> None:
    """Neither needs the other: a first pass asks for both together, a round trip fewer before the RayCluster (with
    many jobs created at once each request waits its turn at the API server: docs/reliability.md, "Load")."""
    w = World(apiserver)
    kube = MeetsAtCreates(apiserver.url)
    loop = w.loop(kube)

    async def main() -> None:
        w.apply(manifest())
        await loop.pass_once()
        await kube.close()

    asyncio.run(main())
    assert kube.met, w.status()
    assert w.api.store.find("secrets") and w.api.store.find("networkpolicies") and w.clusters()


def test_only_a_404_that_names_the_object_reads_as_absent(apiserver: ThreadedApiServer) -> None:
    """A 404 for a resource type the server does not serve (here: no RayCluster CRD yet) says nothing of the cluster."""

    async def main() -> None:
        kube = AioKube(apiserver.url, timeout=FAST.kube_timeout)
        try:
            for call in (kube.get_raycluster, kube.delete_raycluster):
                with pytest.raises(KubeError, match="a 404 that does not name 'qwen-ray'") as raised:
                    await call(NAMESPACE, "qwen-ray")
                assert raised.value.status == 404
            await kube.close()
            kube = World(apiserver).kube()  # installs the CRDs and the chart's RBAC
            assert await kube.get_raycluster(NAMESPACE, "qwen-ray") is None
            assert await kube.delete_raycluster(NAMESPACE, "qwen-ray") is False
            assert await kube.get_job(NAMESPACE, "qwen") is None and await kube.delete_job(NAMESPACE, "qwen") is False
            assert await kube.get_secret(NAMESPACE, "qwen-ray-auth") is None
        finally:
            await kube.close()

    asyncio.run(main())


def test_a_ray_head_that_never_answers_does_not_keep_a_thread() -> None:
    """Ray's SDK sets no HTTP timeout; `RayJobsClient` must, or each pass would strand one more thread."""
    importlib.import_module("ray.job_submission")  # the import's own time must not count below
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)  # connections queue in the kernel; nothing ever reads or answers them
    address = f"http://127.0.0.1:{server.getsockname()[1]}"

    async def main() -> None:
        loop = asyncio.get_running_loop()
        loop.set_default_executor(ThreadPoolExecutor(max_workers=1))
        try:
            with pytest.raises(RayUnavailable):
                await RayJobsClient(address, timeout=0.3).info("raysubmit_1")
            # The one worker thread comes free once the request itself times out.
            assert await asyncio.wait_for(loop.run_in_executor(None, lambda: "free"), timeout=5) == "free"
        finally:
            server.close()  # resets the queued connections, so a stuck thread ends and the loop can close

    asyncio.run(main())


def test_later_passes_give_way_to_first_passes_for_a_bounded_time() -> None:
    async def main() -> None:
        runtime = Runtime(replace(FAST, first_pass_priority=5.0))
        await asyncio.wait_for(runtime.after_first_passes(), 0.1)  # no first pass due: no wait
        runtime.first_pass_started()
        runtime.first_pass_started()
        waiting = asyncio.create_task(runtime.after_first_passes())
        await asyncio.sleep(0.05)
        runtime.first_pass_ended()
        await asyncio.sleep(0.05)
        assert not waiting.done(), "a later pass went ahead while a first pass was still due"
        runtime.first_pass_ended()
        await asyncio.wait_for(waiting, 1)
        bounded = Runtime(replace(FAST, first_pass_priority=0.05))
        bounded.first_pass_started()  # a first pass that never ends holds the others up only so long
        await asyncio.wait_for(bounded.after_first_passes(), 1)

    asyncio.run(main())


def test_a_first_pass_that_fails_or_never_runs_still_ends() -> None:
    """However a loop's first pass ends (an API error here, a stop before it ran), it no longer holds others."""

    async def main() -> None:
        unreachable = AioKube("http://127.0.0.1:9", timeout=FAST.kube_timeout)
        runtime = Runtime(replace(FAST, first_pass_priority=30.0), kube=unreachable)
        stopped = Stopped()
        task = asyncio.create_task(JobLoop(runtime, NAMESPACE, "qwen", logging.getLogger(__name__)).run(stopped))
        await asyncio.wait_for(runtime.after_first_passes(), 5)  # the failed first pass ended
        stopped.flag.set()
        await asyncio.wait_for(task, 5)
        never_ran = Stopped()
        never_ran.flag.set()
        await JobLoop(runtime, NAMESPACE, "other", logging.getLogger(__name__)).run(never_ran)
        await asyncio.wait_for(runtime.after_first_passes(), 0.1)
        await unreachable.close()

    asyncio.run(main())


def test_a_running_loop_is_woken_once_the_first_passes_are_done() -> None:
    async def main() -> None:
        runtime = Runtime(replace(FAST, first_pass_priority=5.0))
        await asyncio.wait_for(runtime.wake(NAMESPACE, "not-running"), 0.1)  # no loop: nothing to wait for
        woken = runtime.wakeup(NAMESPACE, "qwen")
        runtime.first_pass_started()
        waking = asyncio.create_task(runtime.wake(NAMESPACE, "qwen"))
        await asyncio.sleep(0.05)
        assert not woken.is_set() and not waking.done(), "woken while a first pass was still due"
        runtime.first_pass_ended()
        await asyncio.wait_for(waking, 1)
        assert woken.is_set()

    asyncio.run(main())
