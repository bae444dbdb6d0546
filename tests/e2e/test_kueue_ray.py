"""A queued job with real Ray through `run-local`'s pieces (the local KubeRay honours `spec.suspend`), the test
playing Kueue's part on the RayCluster as Kueue documents it ("Suspend control": `spec.suspend: false` admits,
`true` evicts): admitted, preempted mid-training, admitted again, and the second attempt resumes from the
latest checkpoint on disk. Slow (`make test-all`); the default run covers the same decisions against the fake Ray
in tests/integration/test_kueue.py.
"""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path
from typing import Any

import pytest
from fsdp_operator.local.run import TERMINAL_PHASES, LocalRun
from fsdp_train.contract.events import Step, Summary, parse_lines
from support.ray_cluster import RAY_TESTS
from test_faults_ray import EXAMPLE, Status, ray_address, ray_log, ray_token, run_with, until

pytestmark = [pytest.mark.e2e, RAY_TESTS, pytest.mark.slow, pytest.mark.timeout(900)]

CHECKPOINT_INTERVAL = 20
STEPS = 300


async def set_suspend(run: LocalRun, cluster: str, suspend: bool, timeout: float = 120) -> None:
    """What Kueue does to a queued RayCluster: admit (false) or evict (true). The job turns Queued in the pass that
    creates its RayCluster (the status is written before the pass acts), so the cluster may not exist yet: until it
    does, the API server answers 404 and the patch is tried again."""
    assert run.http is not None
    path = f"/apis/ray.io/v1/namespaces/{run.namespace}/rayclusters/{cluster}"
    headers = {"Content-Type": "application/merge-patch+json"}
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        async with run.http.patch(run.api.url + path, json={"spec": {"suspend": suspend}}, headers=headers) as reply:
            if reply.status != 404 or asyncio.get_running_loop().time() > deadline:
                assert reply.status == 200, await reply.text()
                return
        await asyncio.sleep(0.2)


def test_a_preempted_job_resumes_from_its_checkpoint_with_real_ray(tmp_path: Path) -> None:
    manifest = copy.deepcopy(EXAMPLE)
    manifest["metadata"]["name"] = "tiny-queued"
    spec = manifest["spec"]
    spec["queueName"] = "team-a"
    checkpoint = {"storage": str(tmp_path / "checkpoints"), "intervalSteps": CHECKPOINT_INTERVAL}
    spec["sharedVolume"] = {"claimName": "shared", "mountPath": str(tmp_path)}  # the Ray nodes share this machine
    spec["training"].update(steps=STEPS, seqLen=256, batchSizePerRank=8, checkpoint=checkpoint)
    spec["runPolicy"] = {"cleanup": "Keep", "backoffLimit": 0}  # a preemption must not count as a failure

    async def scenario(run: LocalRun) -> dict[str, Any]:
        queued = await until(run, lambda s: s.get("phase") == "Queued", "the job to be queued")
        assert run.kuberay.started == [], "a suspended RayCluster started Ray"
        await set_suspend(run, "tiny-queued-ray", False)

        def mid_training(s: Status) -> bool:
            checkpointed = int((s.get("checkpoint") or {}).get("step", 0))
            return checkpointed >= 2 * CHECKPOINT_INTERVAL and int((s.get("progress") or {}).get("step", 0)) > (
                checkpointed + 1
            )

        during = await until(run, mid_training, "a checkpoint and a few steps past it")
        await set_suspend(run, "tiny-queued-ray", True)
        again = await until(
            run, lambda s: s.get("phase") == "Queued" and (s.get("queue") or {}).get("preemptions") == 1,
            "the preempted job to be queued again",
        )  # fmt: skip
        await set_suspend(run, "tiny-queued-ray", False)
        final = await until(run, lambda s: s.get("phase") in TERMINAL_PHASES, "the job to finish", timeout=600)
        address = await ray_address(run, "tiny-queued")
        log = await asyncio.to_thread(ray_log, address, await ray_token(run, "tiny-queued"), final["submissionId"])
        return {"queued": queued, "during": during, "again": again, "final": final, "log": log}

    seen = asyncio.run(run_with(manifest, tmp_path, scenario))
    final, during = seen["final"], seen["during"]
    assert (final["phase"], final["reason"]) == ("Succeeded", "Completed"), final
    assert final["attempts"] == 2 and final.get("failedAttempts", 0) == 0, final
    assert final["queue"]["admissions"] == 2 and final["queue"]["preemptions"] == 1
    events = list(parse_lines(seen["log"].splitlines()))
    (summary,) = [e for e in events if isinstance(e, Summary) and e.rank == 0]
    steps = [e.step for e in events if isinstance(e, Step) and e.rank == 0]
    resumed = summary.resumed_from_step
    print(f"\nPREEMPTED at step {during['progress']['step']} (checkpoint {during['checkpoint']['step']}); "
          f"attempt 2 resumed from {resumed}")  # fmt: skip
    assert resumed % CHECKPOINT_INTERVAL == 0 and resumed >= during["checkpoint"]["step"]
    assert steps[0] == resumed + 1 and steps[-1] == STEPS
