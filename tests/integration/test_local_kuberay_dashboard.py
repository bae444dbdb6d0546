"""The local KubeRay stand-in reads which Ray nodes are alive from the head's dashboard (`/api/v0/nodes`), here a
real HTTP server on loopback. What the dashboard answers while it starts must never end the stand-in: a clean-clone
run once got a 200 with an empty body, and the JSONDecodeError failed the RayCluster for good (the job then waited
out its 900 s for workers)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from aiohttp import web
from fsdp_operator.local.cluster.kuberay import LocalCluster, LocalKubeRay

pytestmark = [pytest.mark.integration]

NODES = {
    "data": {
        "result": {
            "result": [
                {"node_ip": "127.0.0.2", "state": "ALIVE"},
                {"node_ip": "127.0.0.3", "state": "DEAD"},
                "not a node",
            ]
        }
    }
}


async def _dashboard(answers: list[Callable[[], web.Response]]) -> AsyncIterator[int]:
    async def nodes(_: web.Request) -> web.Response:
        return answers.pop(0)()

    app = web.Application()
    app.router.add_get("/api/v0/nodes", nodes)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    finally:
        await runner.cleanup()


@pytest.mark.parametrize(
    "answer",
    [
        lambda: web.Response(status=200, body=b""),
        lambda: web.Response(status=200, text="<html>starting</html>", content_type="text/html"),
        lambda: web.json_response(["a", "list"]),
        lambda: web.json_response({"data": {"result": None}}),
        lambda: web.Response(status=503, text="not ready"),
    ],
    ids=["empty", "html", "list", "no-result", "503"],
)
def test_an_answer_that_is_not_the_dashboards_json_counts_no_node_and_the_next_is_read(
    tmp_path: Path, answer: Callable[[], web.Response]
) -> None:
    async def scenario() -> None:
        kuberay = LocalKubeRay("http://127.0.0.1:1", tmp_path)
        try:
            async for port in _dashboard([answer, lambda: web.json_response(NODES)]):
                cluster = LocalCluster("default", "c", "uid", tmp_path, dashboard_port=port)
                assert await kuberay._alive_nodes(cluster) == []
                assert [n["node_ip"] for n in await kuberay._alive_nodes(cluster)] == ["127.0.0.2"]
        finally:
            await kuberay.session.close()

    asyncio.run(scenario())
