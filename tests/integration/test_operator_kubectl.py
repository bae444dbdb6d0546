"""What a user does, with the real kubectl, while the real operator runs: apply, get, delete."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from fsdp_operator.local import ThreadedApiServer
from support import k8s_tools
from support.kopf_runner import eventually
from test_operator import Script, World, scenario

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "qwen2.5-1.5b-efa.yaml"
NAME = "qwen25-1p5b-efa"


def test_apply_get_delete_with_kubectl(apiserver: ThreadedApiServer, kubeconfig: Path) -> None:
    try:
        k8s_tools.kubectl()
    except k8s_tools.ToolsUnavailable as e:
        pytest.skip(str(e))

    async def kubectl(*args: str) -> str:
        result = await asyncio.to_thread(k8s_tools.run_kubectl, kubeconfig, *args)
        return result.stdout

    async def body(w: World) -> None:
        async with w.operator():
            assert "created" in await kubectl("apply", "-f", str(EXAMPLE))
            await w.phase("Succeeded", name=NAME)
            header, row = (await kubectl("get", "trainingjobs")).splitlines()
            assert header.split() == ["NAME", "PHASE", "WORKERS", "TRANSPORT", "STEP", "TOKENS/S", "AGE"]
            assert row.split()[:6] == [NAME, "Succeeded", "2/2", "efa", "3/3", "8192"]
            assert "unchanged" in await kubectl("apply", "-f", str(EXAMPLE))
            # Re-applying the same YAML is a no-op: no second cluster, no second submission.
            w.assert_no_duplicates()
            # `kubectl delete` returns once the operator has cleaned up and removed its finalizer.
            assert "deleted" in await kubectl("delete", "-f", str(EXAMPLE), "--timeout=30s")
            await eventually(lambda: not w.clusters(), message="the RayCluster outlived its job")
            assert w.job(NAME) is None

    scenario(apiserver, body, Script())
