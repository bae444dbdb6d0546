"""What a job loop's passes cost the API server: a pass that has nothing new to read makes no request.

Before the loops read their job, RayCluster and pods from kopf's watches, every pass read all three (and lists of
events), so a job's requests grew with how long it took: 63 per job at a load average of 2, 101 at 4, in the
300-job load test (docs/reliability.md, "Load"). These tests hold one job in a state for many passes and count
what its loop asks the API server meanwhile.
"""

from __future__ import annotations

import pytest
from fsdp_operator.local.server import ThreadedApiServer
from fsdp_operator.runtime.shared import Runtime
from support.chart_rbac import ACCOUNT
from support.kopf_runner import eventually
from test_operator import World, manifest, scenario

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

READS = {"get", "list"}
OBSERVED = {"fsdptrainingjobs", "rayclusters", "pods", "events", "secrets"}
PASSES = 25
"""Passes to watch: 2.5 s at the tests' 0.1 s interval."""


def reads(w: World) -> list[tuple[str, str, str]]:
    """The operator's reads of what a pass observes, in order: (verb, resource, name)."""
    with w.access.lock:
        calls = list(w.access.calls)
    return [
        (c.verb, c.resource, c.name)
        for c in calls
        if c.user == ACCOUNT.name and c.verb in READS and c.resource in OBSERVED and not c.subresource
    ]


def passes(runtime: Runtime) -> float:
    value = runtime.metrics.registry.get_sample_value("fsdp_reconcile_passes_total", {"outcome": "ok"})
    return value or 0.0


async def reads_over_passes(w: World, runtime: Runtime) -> list[tuple[str, str, str]]:
    """The reads made during the next `PASSES` passes of the job's loop."""
    before, start = len(reads(w)), passes(runtime)
    await eventually(lambda: passes(runtime) >= start + PASSES, timeout=120, message=f"{PASSES} passes not made")
    return reads(w)[before:]


def test_a_job_waiting_for_unschedulable_workers_reads_nothing_pass_after_pass(apiserver: ThreadedApiServer) -> None:
    message = "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."

    async def body(w: World) -> None:
        w.kuberay.unschedulable = message
        async with w.operator() as runtime:
            w.apply(manifest(runPolicy={"waitForWorkersTimeoutSeconds": 600}))
            status = await w.phase("Provisioning", "Unschedulable")
            assert message in status["message"]  # read from the pods the watch delivered
            made = await reads_over_passes(w, runtime)
            # Before: GET job, GET RayCluster and LIST pods on every pass (75 here).
            assert made == [], made
            assert message in w.status()["message"]

    scenario(apiserver, body)


def test_a_running_job_reads_nothing_from_the_api_server_pass_after_pass(apiserver: ThreadedApiServer) -> None:
    async def body(w: World) -> None:
        async with w.operator() as runtime:
            await w.held_running()
            made = await reads_over_passes(w, runtime)
            assert made == [], made  # before: GET job and GET RayCluster on every pass (50 here)
            w.script.hold = False
            await w.phase("Succeeded")
        w.assert_no_duplicates()

    scenario(apiserver, body)
