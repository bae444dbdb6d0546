"""What a user does, with the real kubectl, while the real operator runs: apply, get, delete."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from fsdp_operator.local.server import ThreadedApiServer
from fsdp_operator.local.server.rbac import MASTERS, User
from support import k8s_tools
from support.kopf_runner import eventually
from test_operator import Script, World, scenario

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "qwen2.5-1.5b-efa.yaml"
NAME = "qwen25-1p5b-efa"


def test_apply_get_delete_with_kubectl(apiserver: ThreadedApiServer, kubeconfig: Path) -> None:
    k8s_tools.needed("kubectl")

    async def kubectl(*args: str) -> str:
        result = await asyncio.to_thread(k8s_tools.run_kubectl, kubeconfig, *args)
        return result.stdout

    async def body(w: World) -> None:
        # kubectl sends no token over plain HTTP: the person running it is an anonymous cluster admin here; the
        # operator still runs as the chart's ServiceAccount.
        w.access.anonymous = User("system:anonymous", (MASTERS,))
        async with w.operator():
            assert "created" in await kubectl("apply", "-f", str(EXAMPLE))
            await w.phase("Succeeded", name=NAME)
            header, row = (await kubectl("get", "trainingjobs")).splitlines()
            assert header.split() == [
                "NAME",
                "PHASE",
                "WORKERS",
                "TRANSPORT",
                "STEP",
                "TOKENS/S",
                "EVAL",
                "LOSS",
                "AGE",
            ]
            assert row.split()[:6] == [NAME, "Succeeded", "2/2", "efa", "3/3", "8192"]
            assert "unchanged" in await kubectl("apply", "-f", str(EXAMPLE))
            # Re-applying the same YAML is a no-op: no second cluster, no second submission.
            w.assert_no_duplicates()
            # `kubectl delete` returns once the operator has cleaned up and removed its finalizer.
            assert "deleted" in await kubectl("delete", "-f", str(EXAMPLE), "--timeout=30s")
            await eventually(lambda: not w.clusters(), message="the RayCluster outlived its job")
            assert w.job(NAME) is None

    scenario(apiserver, body, Script())


def test_kubectl_wait_for_complete_and_failed(apiserver: ThreadedApiServer, kubeconfig: Path) -> None:
    """What people script against batch/v1 Jobs works here: `kubectl wait --for=condition=Complete|Failed`."""
    k8s_tools.needed("kubectl")
    from test_operator import manifest

    async def kubectl(*args: str, check: bool = True) -> tuple[int, str]:
        result = await asyncio.to_thread(k8s_tools.run_kubectl, kubeconfig, *args, check=check)
        return result.returncode, result.stdout + result.stderr

    async def body(w: World) -> None:
        # kubectl sends no token over plain HTTP: the person running it is an anonymous cluster admin here; the
        # operator still runs as the chart's ServiceAccount.
        w.access.anonymous = User("system:anonymous", (MASTERS,))
        async with w.operator():
            w.apply(manifest("good"))
            # Started before the job finishes: kubectl watches until the condition turns True.
            code, out = await kubectl("wait", "--for=condition=Complete", "trainingjob/good", "--timeout=30s")
            assert code == 0 and "condition met" in out, out
            w.script.fail_attempts = {1}
            w.apply(manifest("bad", runPolicy={"backoffLimit": 0}))
            code, out = await kubectl("wait", "--for=condition=Failed", "trainingjob/bad", "--timeout=30s")
            assert code == 0 and "condition met" in out, out
            failed = next(c for c in w.status("bad")["conditions"] if c["type"] == "Failed")
            assert failed["reason"] == "RayJobFailed" and "exited with code 1" in failed["message"]
            # A failed job never becomes Complete: waiting for it times out.
            code, out = await kubectl(
                "wait", "--for=condition=Complete", "trainingjob/bad", "--timeout=1s", check=False
            )
            assert code != 0 and "timed out" in out, out
            # The dashboard's address is in status, as KubeRay's RayJob has it.
            assert w.status("good")["dashboardURL"].startswith("http://10.96.")

    scenario(apiserver, body, Script())
