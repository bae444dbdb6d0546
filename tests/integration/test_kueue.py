"""Queued jobs (`queueName`) with the real operator, the emulated API server, a fake KubeRay and Ray, and a test
double of Kueue's documented admission of RayClusters (tests/support/kueue.py): one ClusterQueue with 8 GPUs.

Each job asks for 2 workers x 4 GPUs = 8 GPUs: the quota holds exactly one at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from fsdp_operator.local.server import ThreadedApiServer
from fsdp_operator.runtime.rayjobs import FakeJob, FakeRay
from fsdp_train.contract.events import Checkpoint, Step, Summary
from support.chart_rbac import ADMIN_AUTH
from support.kopf_runner import eventually
from support.kueue import WORKLOAD_CRD, FakeKueue
from test_operator import World, manifest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

QUEUE = "team-a"
PENDING_MESSAGE = (
    "couldn't assign flavors to pod set gpu-workers: insufficient unused quota for nvidia.com/gpu in flavor "
    "default-flavor, 8 more needed"
)


@dataclass
class CheckpointingScript:
    """Each fake Ray job trains `steps` steps, one checkpoint per step into `storage` (the job's checkpoint
    directory, kept across attempts as storage is), and a new attempt resumes after the latest one, reporting it
    as the training function does (`Checkpoint(resumed=True)`)."""

    steps: int = 6
    storage: dict[str, int] = field(default_factory=dict)
    """Job name -> the step of its latest checkpoint."""
    hold_at: dict[str, int] = field(default_factory=dict)
    """Job name -> a step after which its job waits (while the entry is there)."""
    started_at: dict[str, list[int]] = field(default_factory=dict)
    """Submission id -> the first step each attempt trained."""

    def __call__(self, ray: FakeRay, job: FakeJob) -> Iterator[None]:
        sid = job.submission.submission_id
        name = str(job.submission.metadata.get("fsdp.dev/job", "")) or sid.rsplit("-", 2)[0]
        yield
        first = self.storage.get(name, 0) + 1
        if first > 1:
            ray.emit(sid, Checkpoint(rank=0, step=first - 1, path=f"/ckpt/{name}", resumed=True).to_line())
        self.started_at.setdefault(name, []).append(first)
        for step in range(first, self.steps + 1):
            ray.emit(sid, Step(rank=0, step=step, total_steps=self.steps, loss=5.0 / step, tokens_per_second=100.0,
                               tokens_per_second_per_device=12.5).to_line())  # fmt: skip
            self.storage[name] = step
            ray.emit(sid, Checkpoint(rank=0, step=step, path=f"/ckpt/{name}", seconds=0.1).to_line())
            yield
            while self.hold_at.get(name) == step:
                yield
        ray.emit(sid, Summary(rank=0, steps=self.steps, final_loss=5.0 / self.steps, first_loss=5.0,
                              tokens_per_second=100.0).to_line())  # fmt: skip
        ray.finish(sid)


class QueueWorld(World):
    def __init__(self, api: ThreadedApiServer, *, kueue_installed: bool = True, **kueue: Any) -> None:
        self.checkpoints = CheckpointingScript()
        super().__init__(api)
        self.ray.script = self.checkpoints
        if kueue_installed:
            self.call("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", WORKLOAD_CRD)
        self.kueue = FakeKueue(api.url, {"nvidia.com/gpu": "8"}, **kueue)
        self.kueue.headers.update(ADMIN_AUTH)
        self.kueue_installed = kueue_installed

    @contextlib.asynccontextmanager
    async def world(self) -> AsyncIterator[None]:
        async with self.kuberay.running():
            if not self.kueue_installed:
                yield
                return
            async with self.kueue.running():
                yield

    def pods(self, cluster: str) -> list[str]:
        return [p["metadata"]["name"] for p in self.api.store.find("pods") if cluster in p["metadata"]["name"]]

    def workload(self, cluster: str) -> dict[str, Any] | None:
        found = [w for w in self.api.store.find("workloads", "kueue.x-k8s.io") if cluster in w["metadata"]["name"]]
        return found[0] if found else None


def running(ray: FakeRay, submission_id: str) -> bool:
    try:
        return ray.job(submission_id).status in ("PENDING", "RUNNING")
    except KeyError:
        return False  # its head is gone, and the job with it


def queued(name: str, **sections: Any) -> dict[str, Any]:
    m = manifest(name, **sections)
    m["spec"]["queueName"] = QUEUE
    m["spec"]["network"] = {"transport": "socket"}  # the script reports no transport
    m["spec"]["training"] = {"steps": 6, "checkpoint": {"storage": f"s3://ckpt/{name}", "intervalSteps": 1}}
    return m


async def second_queued_behind_first(w: QueueWorld, hold_first_at: int) -> None:
    """`first` runs (its ranks held before step `hold_first_at`) and takes the quota; `second` then waits Queued."""
    w.checkpoints.hold_at["first"] = hold_first_at
    w.apply(queued("first"))
    await w.phase("Running", name="first")
    w.apply(queued("second"))
    await w.phase("Queued", name="second")


def run(world: QueueWorld, body: Any) -> None:
    async def main() -> None:
        async with world.world():
            await body(world)

    asyncio.run(main())


def test_a_quota_of_8_gpus_runs_one_of_two_8_gpu_jobs_and_queues_the_other(apiserver: ThreadedApiServer) -> None:
    async def body(w: QueueWorld) -> None:
        async with w.operator():
            await second_queued_behind_first(w, hold_first_at=2)
            await w.phase("Queued", "Queued", name="second")
            await eventually(lambda: PENDING_MESSAGE in w.status("second").get("message", ""))
            status = w.status("second")
            # Kueue's own words, where it waits, and since when; its RayCluster exists, suspended, without pods.
            assert "LocalQueue team-a" in status["message"] and status["queuedSince"], status
            assert status["queue"]["localQueue"] == QUEUE and status["queue"]["workload"].startswith("raycluster-")
            second = next(c for c in w.clusters() if c["metadata"]["name"] == "second-ray")
            assert second["spec"]["suspend"] is True and w.pods("second-ray") == []
            assert second["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == QUEUE
            assert "startTime" in status and "provisioningSince" not in status
            w.checkpoints.hold_at.clear()
            first = await w.phase("Succeeded", name="first")
            done = await w.phase("Succeeded", name="second", timeout=60)
        assert w.kueue.admitted == ["first-ray", "second-ray"]
        assert first["queue"]["admissions"] == 1 and first["queue"]["clusterQueue"] == "team-cq"
        assert done["queue"]["admissions"] == 1 and done["queue"]["queuedSeconds"] >= 0
        assert done["attempts"] == 1 and "queuedSince" not in done
        assert {"Queued", "Admitted", "Completed"} <= set(w.event_reasons("second"))
        w.assert_no_duplicates(clusters=2, submissions=2)

    run(QueueWorld(apiserver), body)


def test_a_preempted_job_is_queued_again_and_resumes_from_its_checkpoint(apiserver: ThreadedApiServer) -> None:
    """`backoffLimit: 0`: a preemption that counted as a failed attempt would fail the job."""

    async def body(w: QueueWorld) -> None:
        w.checkpoints.hold_at["low"] = 3
        async with w.operator():
            w.apply(queued("low", runPolicy={"backoffLimit": 0}))
            await eventually(lambda: w.checkpoints.storage.get("low") == 3, message="low never checkpointed step 3")
            # The operator knows of that checkpoint only from the job's log, read by a pass while Ray runs: preempted
            # before a pass read it, the job would record the one before (the next attempt finds the newer anyway).
            await eventually(
                lambda: (w.status("low").get("checkpoint") or {}).get("step") == 3,
                message="the operator never recorded the checkpoint of step 3",
            )
            urgent = queued("urgent")
            urgent["metadata"]["labels"] = {"kueue.x-k8s.io/priority-class": "high"}
            w.apply(urgent)
            preempted = await w.phase_passed("Preempted", "Preempted", name="low")
            assert "Preempted to accommodate a workload" in preempted["message"], preempted
            assert preempted["attempts"] == 2 and preempted.get("failedAttempts", 0) == 0
            assert preempted["checkpoint"]["step"] == 3  # the checkpoint the next attempt resumes from
            await eventually(lambda: not running(w.ray, w.sid(1, "low")), message="the preempted Ray job runs on")
            w.checkpoints.hold_at.clear()
            await w.phase_passed("Queued", name="low", where=lambda status: status["queue"].get("preemptions") == 1)
            await w.phase("Succeeded", name="urgent", timeout=60)
            done = await w.phase("Succeeded", name="low", timeout=60)
        assert w.kueue.evicted == ["low-ray"] and w.kueue.admitted == ["low-ray", "urgent-ray", "low-ray"]
        # Attempt 2 resumed after the checkpoint of step 3, without using up backoffLimit.
        assert w.checkpoints.started_at["low"] == [1, 4]
        assert done["attempts"] == 2 and done.get("failedAttempts", 0) == 0 and done["submissionId"] == w.sid(2, "low")
        assert done["checkpoint"]["step"] == 6 and done["queue"]["admissions"] == 2
        reasons = w.event_reasons("low")
        assert reasons.index("Preempted") < len(reasons) - 1 - reasons[::-1].index("Queued"), reasons
        assert w.ray.created == [w.sid(1, "low"), w.sid(1, "urgent"), w.sid(2, "low")]

    run(QueueWorld(apiserver, priorities={"high": 100}), body)


def test_without_kueue_a_queued_job_says_so(apiserver: ThreadedApiServer) -> None:
    async def body(w: QueueWorld) -> None:
        async with w.operator():
            w.apply(queued("lonely"))
            status = await w.phase("Queued", "QueueUnavailable", name="lonely")
        assert "is Kueue installed?" in status["message"], status
        assert w.pods("lonely-ray") == [] and "QueueUnavailable" in w.event_reasons("lonely")

    run(QueueWorld(apiserver, kueue_installed=False), body)


def test_a_missing_local_queue_is_kueues_reason(apiserver: ThreadedApiServer) -> None:
    async def body(w: QueueWorld) -> None:
        async with w.operator():
            w.apply(queued("stray"))
            await eventually(lambda: "LocalQueue team-a doesn't exist" in w.status("stray").get("message", ""))
        assert w.status("stray")["phase"] == "Queued"

    run(QueueWorld(apiserver, local_queues=("other",)), body)


def test_a_user_suspend_of_a_queued_job_deletes_its_cluster_and_resume_queues_it_again(
    apiserver: ThreadedApiServer,
) -> None:
    async def body(w: QueueWorld) -> None:
        async with w.operator():
            await second_queued_behind_first(w, hold_first_at=1)
            w.patch_spec("second", {"runPolicy": {"suspend": True}})
            await w.phase("Suspended", name="second")
            await eventually(lambda: all(c["metadata"]["name"] != "second-ray" for c in w.clusters()))
            await eventually(lambda: w.workload("second-ray") is None, message="the Workload outlived its cluster")
            w.patch_spec("second", {"runPolicy": {"suspend": False}})
            await w.phase("Queued", name="second")
            w.checkpoints.hold_at.clear()
            done = await w.phase("Succeeded", name="second", timeout=60)
        assert done["attempts"] == 2 and w.kueue.admitted == ["first-ray", "second-ray"]

    run(QueueWorld(apiserver), body)
