"""Faults with real Ray, through `run-local`'s pieces: the operator's process SIGKILLed during training, and a
worker node's Ray processes killed during a checkpointing job. Run under the machine-wide Ray lock:

    flock /tmp/ray.lock .venv/bin/python -m pytest -m faults tests/e2e/test_faults_ray.py

Assertions read the status the operator wrote, Ray's own job list, and the job's log of structured events.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import io
import os
import shutil
import signal
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from fsdp_operator.api import render
from fsdp_operator.decide.observed import dashboard_url
from fsdp_operator.local.cluster.processes import kill_marked
from fsdp_operator.local.run import RUN_MARKER, TERMINAL_PHASES, LocalRun
from fsdp_train.contract.events import Placement, Step, Summary, parse_lines
from support.ray_cluster import RAY_TESTS

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = yaml.safe_load((ROOT / "examples" / "tiny-cpu.yaml").read_text())

pytestmark = [pytest.mark.e2e, RAY_TESTS, pytest.mark.timeout(900)]

Status = dict[str, Any]


async def status_of(run: LocalRun) -> Status:
    code, job = await run._get(run.job_path)
    return dict(job.get("status") or {}) if code == 200 else {}


async def until(run: LocalRun, predicate: Callable[[Status], bool], what: str, timeout: float = 400) -> Status:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        status = await status_of(run)
        if predicate(status):
            return status
        if status.get("phase") in TERMINAL_PHASES or loop.time() > deadline:
            raise AssertionError(f"waiting for {what}: {status.get('phase')} {status.get('reason')} {status}")
        await asyncio.sleep(0.5)


async def ray_address(run: LocalRun, job_name: str) -> str:
    code, cluster = await run._get(f"/apis/ray.io/v1/namespaces/{run.namespace}/rayclusters/{job_name}-ray")
    assert code == 200, cluster
    return dashboard_url(cluster)


async def ray_token(run: LocalRun, job_name: str) -> str:
    """The job's Ray auth token, read from its Secret as the operator reads it ('' with token auth off)."""
    path = f"/api/v1/namespaces/{run.namespace}/secrets/{render.auth_secret_name(job_name)}"
    code, secret = await run._get(path)
    if code == 404:
        return ""
    assert code == 200, secret
    return base64.b64decode(secret["data"][render.AUTH_TOKEN_KEY]).decode()


def _client(address: str, token: str) -> Any:
    from ray.job_submission import JobSubmissionClient

    # Explicit headers, as the operator sends them: Ray's own lookup reads one token from the environment.
    return JobSubmissionClient(address, headers={"Authorization": f"Bearer {token}"} if token else None)


def ray_jobs(address: str, token: str) -> list[Any]:
    return list(_client(address, token).list_jobs())


def ray_log(address: str, token: str, submission_id: str) -> str:
    return str(_client(address, token).get_job_logs(submission_id))


async def run_with(manifest: dict[str, Any], tmp_path: Path, scenario: Callable[[LocalRun], Any]) -> Any:
    """Start the run-local pieces for `manifest`, run `scenario`, then delete the job and stop everything."""
    # Short: Ray's unix socket paths under it must stay within 107 bytes (pytest's tmp_path is too deep).
    workdir = Path(tempfile.mkdtemp(prefix="fsdp-faults-"))
    os.environ[RUN_MARKER] = str(workdir)  # every process started from here on carries it (as run-local does)
    run = LocalRun(manifest, workdir, io.StringIO())
    passed = False
    try:
        await run.start()
        await run.apply()
        result = await scenario(run)
        passed = True
    finally:
        await run.delete_job()
        left = await run.stop()
        if passed and not left:
            shutil.rmtree(workdir, ignore_errors=True)
        else:  # the operator's, the stand-in's and Ray's logs are what explains a failure: kept, and said where
            print(f"run-local's files kept in {workdir}")
        assert not left, f"processes left behind: {left}"
    # The operator ran as a ServiceAccount with the call table's roles (the chart's): nothing was refused.
    assert run.access.denied == [], run.access.denied
    return result


@pytest.mark.slow
def test_operator_sigkilled_while_provisioning_the_job_still_succeeds_once(tmp_path: Path) -> None:
    """The shortest case of this suite: a short job, the operator killed before its workers are up (`make test-all`;
    the default run samples the fault suite through tests/integration/test_faults.py and test_restarts.py)."""
    manifest = copy.deepcopy(EXAMPLE)
    manifest["metadata"]["name"] = "tiny-early"
    manifest["spec"]["runPolicy"] = {"cleanup": "Keep"}  # Ray's job list is read after the job finished

    async def scenario(run: LocalRun) -> None:
        before = await until(run, lambda s: s.get("phase") == "Provisioning", "the cluster to be asked for")
        assert run.operator is not None
        os.killpg(run.operator.pid, signal.SIGKILL)
        assert await run.operator.wait() == -signal.SIGKILL
        await run.start_operator()
        final = await until(run, lambda s: s.get("phase") in TERMINAL_PHASES, "the job to finish")
        address = await ray_address(run, "tiny-early")
        jobs = await asyncio.to_thread(ray_jobs, address, await ray_token(run, "tiny-early"))

        assert (final["phase"], final["reason"]) == ("Succeeded", "Completed"), final
        assert final["attempts"] == 1 and final["submissionId"] == before["submissionId"]
        assert [j.submission_id for j in jobs] == [before["submissionId"]]
        assert run.api.count("create", "rayclusters", "ray.io") == 1

    asyncio.run(run_with(manifest, tmp_path, scenario))


@pytest.mark.faults
def test_operator_sigkilled_during_training_the_job_still_succeeds_once(tmp_path: Path) -> None:
    manifest = copy.deepcopy(EXAMPLE)
    manifest["metadata"]["name"] = "tiny-kill"
    # Long enough to be killed in the middle (a tiny model's step takes a few hundredths of a second here).
    manifest["spec"]["training"].update(steps=300, seqLen=256, batchSizePerRank=8)
    manifest["spec"]["runPolicy"] = {"cleanup": "Keep"}  # Ray's job list is read after the job finished

    async def scenario(run: LocalRun) -> None:
        before = await until(run, lambda s: (s.get("progress") or {}).get("step", 0) >= 2, "training to run")
        assert before["progress"]["step"] < 300, "training ended before the kill: make it longer"
        assert run.operator is not None
        os.killpg(run.operator.pid, signal.SIGKILL)  # the operator's whole process, no shutdown of any kind
        assert await run.operator.wait() == -signal.SIGKILL
        await run.start_operator()
        final = await until(run, lambda s: s.get("phase") in TERMINAL_PHASES, "the job to finish")
        print(f"\nSIGKILL: killed at step {before['progress']['step']}; final {final['phase']}/{final['reason']}")
        address = await ray_address(run, "tiny-kill")
        jobs = await asyncio.to_thread(ray_jobs, address, await ray_token(run, "tiny-kill"))

        assert (final["phase"], final["reason"]) == ("Succeeded", "Completed"), final
        assert final["attempts"] == 1 and final["submissionId"] == before["submissionId"]
        assert final["progress"]["stepOfTotal"] == "300/300"
        # One submission: Ray knows exactly one job, the recorded one; one RayCluster was ever created.
        assert [j.submission_id for j in jobs] == [before["submissionId"]]
        assert run.api.count("create", "rayclusters", "ray.io") == 1

    asyncio.run(run_with(manifest, tmp_path, scenario))


CHECKPOINT_INTERVAL = 20
STEPS = 400


@pytest.mark.faults
def test_a_lost_worker_node_restarts_training_from_the_latest_checkpoint(tmp_path: Path) -> None:
    manifest = copy.deepcopy(EXAMPLE)
    manifest["metadata"]["name"] = "tiny-lost"
    spec = manifest["spec"]
    # Two worker nodes of 2 CPUs for 2 ranks (Ray Train packs them on one node): the other node can hold both
    # ranks once the first is gone.
    spec["workers"].update(replicas=2, ranksPerWorker=1, cpu="2")
    checkpoint = {"storage": str(tmp_path / "checkpoints"), "intervalSteps": CHECKPOINT_INTERVAL}
    spec["sharedVolume"] = {"claimName": "shared", "mountPath": str(tmp_path)}  # the Ray nodes share this machine
    spec["training"].update(steps=STEPS, seqLen=256, batchSizePerRank=8, checkpoint=checkpoint)
    spec["runPolicy"] = {"maxWorkerRestarts": 2, "cleanup": "Keep"}  # the job's log is read after it finished

    async def scenario(run: LocalRun) -> None:
        def mid_training(s: Status) -> bool:
            checkpointed = int((s.get("checkpoint") or {}).get("step", 0))
            return checkpointed >= 2 * CHECKPOINT_INTERVAL and int(s["progress"]["step"]) > checkpointed + 1

        during = await until(run, mid_training, "a checkpoint and a few steps past it")
        # Kill every Ray process of the node that runs rank 1 (raylet, object store, the ranks' workers).
        (pod,) = [r["pod"] for r in during["ranks"] if r["rank"] == 1]
        (cluster,) = run.kuberay.clusters.values()
        (node,) = [n for n in cluster.nodes if n.pod_name == pod]
        kill_marked(node.marker)

        final = await until(run, lambda s: s.get("phase") in TERMINAL_PHASES, "the job to finish")
        print(f"\nLOST WORKER: killed {pod} at step {during['progress']['step']}; final {final['phase']}/"
              f"{final['reason']} {final.get('message')}, workerRestarts {final.get('workerRestarts')}")  # fmt: skip
        address = await ray_address(run, "tiny-lost")
        token = await ray_token(run, "tiny-lost")
        log = await asyncio.to_thread(ray_log, address, token, final["submissionId"])
        events = list(parse_lines(log.splitlines()))

        assert (final["phase"], final["reason"]) == ("Succeeded", "Completed"), final
        assert final["attempts"] == 1 and final.get("workerRestarts") == 1, final
        # From the step events: where the first worker group stopped, and where the second one began.
        starts = [i for i, e in enumerate(events) if isinstance(e, Placement) and e.rank == 0]
        assert len(starts) == 2, f"rank 0 started {len(starts)} times"
        before = [e.step for e in events[: starts[1]] if isinstance(e, Step)]
        after = [e.step for e in events[starts[1] :] if isinstance(e, Step)]
        (summary,) = [e for e in events if isinstance(e, Summary) and e.rank == 0]
        resumed = summary.resumed_from_step
        assert resumed % CHECKPOINT_INTERVAL == 0 and resumed >= 2 * CHECKPOINT_INTERVAL
        assert after[0] == resumed + 1 and after[-1] == STEPS
        lost = max(before) - resumed
        print(f"\nLOST WORKER: last step before {max(before)}, resumed from {resumed}, steps lost {lost}")
        assert 0 <= lost <= CHECKPOINT_INTERVAL
        # No rank ran on the killed node after the restart (its pod's container is started again, as the kubelet
        # restarts one that exited: a rank there runs on the new node).
        latest = {n.pod_name: n for n in cluster.nodes}
        assert all(latest[r["pod"]] is not node for r in final["ranks"]), final["ranks"]

    asyncio.run(run_with(manifest, tmp_path, scenario))
