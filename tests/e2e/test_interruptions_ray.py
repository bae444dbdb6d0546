"""A worker whose node goes away, with real Ray, through `run-local`'s pieces: the worker pod deleted with a grace
period in the middle of training, between periodic checkpoints. The emulated API server marks it terminating, the
kubelet stand-in runs its preStop hook (the notice), every rank stops after the same step and saves, the hook
returns, the pod goes and KubeRay's stand-in makes it again; the operator starts the next attempt, uncounted, and
it resumes from the checkpoint taken after the notice.

    flock /tmp/ray.lock .venv/bin/python -m pytest -s tests/e2e/test_interruptions_ray.py

Assertions read the status the operator wrote, the Kubernetes Events, and the job logs' structured events.
"""

from __future__ import annotations

import asyncio
import copy
import statistics
from pathlib import Path
from typing import Any

import pytest
import yaml
from fsdp_operator.local.run import TERMINAL_PHASES, LocalRun
from fsdp_train.contract.events import Checkpoint, Interruption, Step, Summary, parse_lines
from fsdp_train.run.fault_hooks import TEST_HOOK_ENV
from support.ray_cluster import RAY_TESTS
from test_faults_ray import Status, ray_address, ray_log, ray_token, run_with, until

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = yaml.safe_load((ROOT / "examples" / "tiny-cpu.yaml").read_text())

pytestmark = [pytest.mark.e2e, RAY_TESTS, pytest.mark.timeout(2400)]

WAIT = 900.0
"""Seconds for each wait: the Ray cluster starting twice on a loaded 2-core machine (a load average of 30 was seen)."""

INTERVAL = 20
STEPS = 120
SLOW_STEP = 0.4


def draining_job(name: str, tmp_path: Path, grace: int = 60) -> dict[str, Any]:
    manifest = copy.deepcopy(EXAMPLE)
    manifest["metadata"]["name"] = name
    spec = manifest["spec"]
    checkpoint = {"storage": str(tmp_path / "checkpoints"), "intervalSteps": INTERVAL, "gracePeriodSeconds": grace}
    spec["sharedVolume"] = {"claimName": "shared", "mountPath": str(tmp_path)}  # the Ray nodes share this machine
    spec["training"].update(steps=STEPS, seqLen=256, batchSizePerRank=8, checkpoint=checkpoint)
    spec["runPolicy"] = {"backoffLimit": 0, "cleanup": "Keep"}  # no retry allowed: an interruption is no failure
    # Every step lasts at least SLOW_STEP seconds (rank 3 slower, the others wait for it): the 120 steps last
    # minutes however fast the machine is, so the status (progress written every 5 s) shows a step between two
    # checkpoints before the run ends. On a quiet machine 0.23 s steps once finished the whole run between polls.
    spec["runtimeEnv"] = {"envVars": {TEST_HOOK_ENV: f"slow=3:{SLOW_STEP}"}}
    return manifest


async def events_of(run: LocalRun, name: str) -> list[Any]:
    """Every Kubernetes Event about the job, as (type, reason, message)."""
    code, listing = await run._get(f"/api/v1/namespaces/{run.namespace}/events")
    assert code == 200
    return [(e.get("type"), e.get("reason"), e.get("message", "")) for e in listing.get("items", [])
            if (e.get("involvedObject") or {}).get("name") == name]  # fmt: skip


async def delete_pod(run: LocalRun, pod: str, grace: int | None = None) -> None:
    assert run.http is not None
    query = f"?gracePeriodSeconds={grace}" if grace is not None else ""
    async with run.http.delete(f"{run.api.url}/api/v1/namespaces/{run.namespace}/pods/{pod}{query}") as response:
        assert response.status == 200, await response.text()
        deleted = await response.json()
    assert deleted["metadata"]["deletionTimestamp"] and deleted["metadata"]["deletionGracePeriodSeconds"] > 0


def between_checkpoints(s: Status) -> bool:
    checkpointed = int((s.get("checkpoint") or {}).get("step", 0))
    step = int((s.get("progress") or {}).get("step", 0))
    return checkpointed >= INTERVAL and checkpointed + 3 <= step and step % INTERVAL not in (0, INTERVAL - 1)


async def rank_3_between_checkpoints(run: LocalRun) -> tuple[dict[str, Any], str]:
    """The job's status once a checkpoint is saved and a few steps passed it, and the pod of rank 3 then."""
    during = await until(run, between_checkpoints, "a checkpoint and a few steps past it", WAIT)
    (pod,) = {r["pod"] for r in during["ranks"] if r["rank"] == 3}
    return during, pod


async def finished(run: LocalRun) -> dict[str, Any]:
    return await until(run, lambda s: s.get("phase") in TERMINAL_PHASES, "the job to finish", WAIT)


def the_one_interruption(final: dict[str, Any]) -> dict[str, Any]:
    """The job succeeded in two attempts, the first interrupted and not counted as failed: that interruption."""
    assert (final["phase"], final["reason"]) == ("Succeeded", "Completed"), final
    assert final["attempts"] == 2 and final.get("failedAttempts", 0) == 0
    (entry,) = final["interruptions"]
    return dict(entry)


# behind `slow` for now: minutes of Ray start-ups, over `make test`'s budget (docs/testing.md)
@pytest.mark.slow
def test_a_worker_pod_deleted_mid_training_checkpoints_and_the_next_attempt_resumes_there(tmp_path: Path) -> None:
    name = "tiny-drain"

    async def scenario(run: LocalRun) -> None:
        during, pod = await rank_3_between_checkpoints(run)
        await delete_pod(run, pod)  # the pod's own grace period (checkpoint.gracePeriodSeconds)
        final = await finished(run)
        address = await ray_address(run, name)
        token = await ray_token(run, name)
        first = list(
            parse_lines((await asyncio.to_thread(ray_log, address, token, during["submissionId"])).splitlines())
        )
        second = list(
            parse_lines((await asyncio.to_thread(ray_log, address, token, final["submissionId"])).splitlines())
        )
        seen = await events_of(run, name)
        saves = [(e.step, round(e.seconds, 3)) for e in first if isinstance(e, Checkpoint) and e.rank == 0]
        step_times = [e.step_seconds for e in first if isinstance(e, Step) and e.step_seconds]
        print(f"\nDRAIN: deleted {pod} at step {during['progress']['step']} (checkpoint "
              f"{during['checkpoint']['step']});"
              f"\n  interruptions: {final.get('interruptions')}\n  final: {final['phase']}/{final['reason']} "
              f"attempts {final['attempts']} failedAttempts {final.get('failedAttempts', 0)}: {final.get('message')}"
              f"\n  events: {[e for e in seen if e[1] in ('Interrupted', 'Retrying', 'Completed')]}"
              f"\n  hooks: {run.kubelet.hooks}"
              f"\n  saves (step, seconds the loop was held): {saves}"
              f"\n  median step seconds, first attempt: {statistics.median(step_times):.3f}")  # fmt: skip

        entry = the_one_interruption(final)
        reports = [e for e in first if isinstance(e, Interruption)]
        assert len(reports) == 1 and reports[0].pod == pod  # one report, from the node that had the notice
        stopped = reports[0].step
        assert entry["attempt"] == 1 and entry["pod"] == pod and entry["saved"] is True
        assert entry["step"] == entry["checkpointStep"] == stopped and entry["stepsLost"] == 0
        assert 0 < entry["secondsToSaved"] < 60
        # Every rank stopped after that step: no step past it in the first attempt.
        assert max(e.step for e in first if isinstance(e, Step)) == stopped
        # ... and that step came at once after the notice, not at the next periodic checkpoint: at most the step in
        # flight and the next one finished after the hook wrote it. (The step number cannot say it: the test sees
        # the step in a status written at most every 5 s, and the notice took 8-30 steps to land under load, once
        # on a periodic step.)
        late = [e.step for e in first if isinstance(e, Step) and e.rank == 0 and e.time > reports[0].notice_time]
        assert len(late) <= 2, (late, reports[0].notice_time)
        # The next attempt resumed from that checkpoint and trained the rest.
        (summary,) = [e for e in second if isinstance(e, Summary) and e.rank == 0]
        assert summary.resumed_from_step == stopped and final["progress"]["stepOfTotal"] == f"{STEPS}/{STEPS}"
        assert min(e.step for e in second if isinstance(e, Step)) == stopped + 1
        assert ("Normal", "Interrupted") in [(t, r) for t, r, _ in seen]
        assert [code for p, code, _ in run.kubelet.hooks if p == pod] == [0]

    asyncio.run(run_with(draining_job(name, tmp_path), tmp_path, scenario))


@pytest.mark.slow
def test_a_termination_taint_on_a_workers_node_drains_it_with_a_save_first(tmp_path: Path) -> None:
    """The Node Termination Handler's Spot-ITN taint on the node of a worker: the operator (nodeNotices, on in
    run-local) deletes that worker's pod, and the save follows as for a drain; the entry names the taint."""
    name, taint = "tiny-taint", "aws-node-termination-handler/spot-itn"

    async def scenario(run: LocalRun) -> None:
        during, pod = await rank_3_between_checkpoints(run)
        code, pod_object = await run._get(f"/api/v1/namespaces/{run.namespace}/pods/{pod}")
        assert code == 200
        node = pod_object["spec"]["nodeName"]
        assert run.http is not None
        patch = {"spec": {"taints": [{"key": taint, "value": "1796295610", "effect": "NoSchedule"}]}}
        headers = {"Content-Type": "application/merge-patch+json"}
        async with run.http.patch(f"{run.api.url}/api/v1/nodes/{node}", json=patch, headers=headers) as response:
            assert response.status == 200, await response.text()
        final = await finished(run)
        seen = await events_of(run, name)
        print(f"\nTAINT: {taint} on {node} ({pod}) at step {during['progress']['step']};"
              f"\n  interruptions: {final.get('interruptions')}\n  final: {final['phase']}/{final['reason']} "
              f"attempts {final['attempts']}: {final.get('message')}"
              f"\n  events: {[e for e in seen if e[1] in ('NodeNotice', 'Interrupted')]}")  # fmt: skip

        entry = the_one_interruption(final)
        assert (entry["pod"], entry["node"], entry["reason"], entry["by"]) == (pod, node, taint, "operator")
        assert entry["saved"] is True and entry["stepsLost"] == 0  # at once after the notice: the drain case's check
        assert {"NodeNotice", "Interrupted"} <= {r for _, r, _ in seen}
        assert final["result"]["resumedFromStep"] == entry["checkpointStep"]

    asyncio.run(run_with(draining_job(name, tmp_path), tmp_path, scenario))


@pytest.mark.slow
def test_a_notice_too_short_for_the_save_abandons_it_and_resumes_from_the_periodic_checkpoint(tmp_path: Path) -> None:
    """A save declared to take 300 s (`FSDP_NOTICE_SAVE_SECONDS`) against a grace period of 30 s: the ranks stop
    after the same step without saving, the status says so, and the next attempt resumes from the last periodic
    checkpoint."""
    name = "tiny-short"
    manifest = draining_job(name, tmp_path, grace=30)
    manifest["spec"]["runtimeEnv"]["envVars"]["FSDP_NOTICE_SAVE_SECONDS"] = "300"

    async def scenario(run: LocalRun) -> None:
        during, pod = await rank_3_between_checkpoints(run)
        await delete_pod(run, pod)
        final = await finished(run)
        print(f"\nSHORT: deleted {pod} at step {during['progress']['step']}; interruptions "
              f"{final.get('interruptions')}; final {final['phase']}/{final['reason']}")  # fmt: skip

        entry = the_one_interruption(final)
        assert entry["saved"] is False and "a save needs about 300.0 s" in entry["message"]
        assert entry["checkpointStep"] % INTERVAL == 0 and entry["checkpointStep"] >= INTERVAL
        assert entry["stepsLost"] == entry["step"] - entry["checkpointStep"] > 0
        assert final["result"]["resumedFromStep"] == entry["checkpointStep"]

    asyncio.run(run_with(manifest, tmp_path, scenario))
