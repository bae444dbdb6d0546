"""Graceful deletion of pods in the emulation, against what the Kubernetes documentation says.

Sections cited: Pod Lifecycle, "Termination of Pods"
(https://kubernetes.io/docs/concepts/workloads/pods/pod-lifecycle/#pod-termination) and Container Lifecycle Hooks
(https://kubernetes.io/docs/concepts/containers/container-lifecycle-hooks/). The API server's side
(`store.Store._terminating`): the grace period, `deletionTimestamp`, a second deletion shortening it, a forced
deletion. The kubelet's side (`local/cluster/kubelet.py`): the preStop hook run with the container's environment,
bounded by the grace period, then TERM, KILL after the grace period, then the pod removed. The worker's own hook
(`render.worker_notice_hook`) is what runs: it writes the notice and waits for `done` while a rank lives.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from fsdp_operator.api.render import worker_notice_hook
from fsdp_operator.local.cluster.kubelet import LocalKubelet
from fsdp_operator.local.cluster.kuberay import LocalCluster, LocalKubeRay, RayNode
from fsdp_operator.local.server import ThreadedApiServer
from fsdp_operator.local.server.apiserver import ApiServer
from fsdp_train.watch.notice import DONE_FILE, NOTICE_FILE, read_notice
from test_apiserver import PODS, Client

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def pod(name: str, node: str = "", grace: int | None = None, phase: str = "", **container: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "c", "image": "busybox", **container}]}
    if node:
        spec["nodeName"] = node
    if grace is not None:
        spec["terminationGracePeriodSeconds"] = grace
    return {"metadata": {"name": name}, "spec": spec, **({"status": {"phase": phase}} if phase else {})}


@pytest.fixture
def k8s() -> Iterator[tuple[Client, ThreadedApiServer]]:
    with ThreadedApiServer() as api:
        api.server.store.graceful_pods = True
        yield Client(api.url), api


def seconds_until(timestamp: str) -> float:
    return (datetime.strptime(timestamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC) - datetime.now(UTC)).total_seconds()


def test_a_pod_on_a_node_is_marked_with_its_grace_period_and_kept(k8s: tuple[Client, ThreadedApiServer]) -> None:
    """ "the Pod in the API server is updated with the time beyond which the Pod is considered "dead" along with the
    grace period" (default 30 s); it stays until its kubelet removes it."""
    client, _ = k8s
    for name, grace in (("own", 45), ("default", None)):
        assert client.post(PODS, pod(name, node="n1", grace=grace))[0] == 201
        code, deleted = client.delete(f"{PODS}/{name}")
        assert code == 200
        period = grace if grace is not None else 30
        assert deleted["metadata"]["deletionGracePeriodSeconds"] == period
        assert period - 2 <= seconds_until(deleted["metadata"]["deletionTimestamp"]) <= period + 1
        assert client.get(f"{PODS}/{name}")[0] == 200  # kept: the kubelet finishes the deletion


def test_the_request_grace_period_wins_and_a_second_deletion_only_shortens_it(
    k8s: tuple[Client, ThreadedApiServer],
) -> None:
    client, _ = k8s
    assert client.post(PODS, pod("p", node="n1", grace=45))[0] == 201
    assert (
        client.delete(f"{PODS}/p", params={"gracePeriodSeconds": "20"})[1]["metadata"]["deletionGracePeriodSeconds"]
        == 20
    )
    assert (
        client.delete(f"{PODS}/p", params={"gracePeriodSeconds": "40"})[1]["metadata"]["deletionGracePeriodSeconds"]
        == 20
    )
    body = {"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 5}
    code, shorter = client.call("DELETE", f"{PODS}/p", body, headers={"Content-Type": "application/json"})
    assert code == 200 and shorter["metadata"]["deletionGracePeriodSeconds"] == 5
    assert seconds_until(shorter["metadata"]["deletionTimestamp"]) <= 6
    # "setting grace period to 0 (immediate deletion)": the kubelet's last word, or a forced deletion.
    assert client.delete(f"{PODS}/p", params={"gracePeriodSeconds": "0"})[0] == 200
    assert client.get(f"{PODS}/p")[0] == 404


@pytest.mark.parametrize(
    "unbound", [pod("unscheduled", grace=60), pod("done", node="n1", grace=60, phase="Succeeded")], ids=str
)
def test_a_pod_on_no_node_or_finished_goes_at_once(k8s: tuple[Client, ThreadedApiServer], unbound: Any) -> None:
    client, _ = k8s
    name = unbound["metadata"]["name"]
    assert client.post(PODS, unbound)[0] == 201
    if "status" in unbound:
        client.patch(f"{PODS}/{name}/status", {"status": unbound["status"]})
    assert client.delete(f"{PODS}/{name}")[0] == 200
    assert client.get(f"{PODS}/{name}")[0] == 404


@pytest.mark.parametrize(("value", "code"), [("abc", 400), ("-1", 422), ("1.5", 400)])
def test_a_grace_period_that_is_not_whole_seconds_is_refused(
    k8s: tuple[Client, ThreadedApiServer], value: str, code: int
) -> None:
    client, _ = k8s
    assert client.post(PODS, pod("p", node="n1"))[0] == 201
    assert client.delete(f"{PODS}/p", params={"gracePeriodSeconds": value})[0] == code
    assert "deletionTimestamp" not in client.get(f"{PODS}/p")[1]["metadata"]


def test_without_a_kubelet_pods_go_at_once_as_before() -> None:
    with ThreadedApiServer() as api:
        client = Client(api.url)
        assert client.post(PODS, pod("p", node="n1", grace=30))[0] == 201
        assert client.delete(f"{PODS}/p")[0] == 200 and client.get(f"{PODS}/p")[0] == 404


# --- the kubelet's side -------------------------------------------------------------------------------------


async def _terminate(tmp_path: Path, grace: int, rank: str, done_after: float | None, ignore_term: bool) -> Any:
    """A 'container' (a process group), its pod with the worker's notice hook, deleted: what the kubelet did."""
    api = ApiServer()
    api.store.graceful_pods = True
    await api.start()
    kuberay = LocalKubeRay(api.url, tmp_path / "r")
    kubelet = LocalKubelet(kuberay)
    watching = asyncio.get_running_loop().create_task(kubelet.run())
    notice_dir = tmp_path / "node" / "fsdp-notice"
    trap = "import signal; signal.signal(signal.SIGTERM, signal.SIG_IGN); " if ignore_term else ""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", f"{trap}import time; time.sleep(600)", start_new_session=True
    )
    rank_process = None
    if rank == "alive":  # a training rank of this pod: the hook waits for it
        rank_process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        notice_dir.mkdir(parents=True)
        (notice_dir / "rank.0").write_text(f"{rank_process.pid}\n")
    node = RayNode("w-0", "127.0.0.9", process, tmp_path / "w.log", tmp_path / "node",
                   {"FSDP_NOTICE_DIR": str(notice_dir)})  # fmt: skip
    cluster = LocalCluster("default", "c", "uid", tmp_path, nodes=[node])
    kuberay.clusters[("default", "c")] = cluster
    manifest = pod("w-0", node="local-127.0.0.9", grace=grace, lifecycle=worker_notice_hook(grace))
    manifest["metadata"]["labels"] = {"ray.io/node-type": "worker"}
    api.store.create(api.store.resource("pods"), manifest, "default")
    started = time.monotonic()
    try:
        async with aiohttp.ClientSession() as http:
            async with http.delete(f"{api.url}{PODS}/w-0") as response:
                assert response.status == 200
            if done_after is not None:
                while not (notice_dir / NOTICE_FILE).exists():
                    await asyncio.sleep(0.05)
                await asyncio.sleep(done_after)
                (notice_dir / DONE_FILE).write_text("done\n")
            while True:
                async with http.get(f"{api.url}{PODS}/w-0") as response:
                    if response.status == 404:
                        break
                assert time.monotonic() - started < grace + 30, "the pod was never removed"
                await asyncio.sleep(0.1)
        return time.monotonic() - started, kubelet.hooks, process.returncode, read_notice(notice_dir)
    finally:
        watching.cancel()
        await kubelet.close()
        if rank_process is not None:
            rank_process.kill()
            rank_process.wait()
        if process.returncode is None:
            os.killpg(process.pid, 9)
            await process.wait()
        await kuberay.close()
        await api.stop()


def test_the_hook_runs_with_the_containers_environment_then_term_then_removal(tmp_path: Path) -> None:
    """With no training rank alive the notice hook writes the notice and returns at once; `ray stop` in it stops
    only this pod's processes (TERM to the group); then the pod is removed."""
    took, hooks, code, notice = asyncio.run(_terminate(tmp_path, grace=30, rank="none", done_after=None,
                                                       ignore_term=False))  # fmt: skip
    assert notice is not None and notice.deadline - notice.time == 30 and notice.reason == "preStop"
    assert [(p, c) for p, c, _ in hooks] == [("w-0", 0)] and took < 15
    assert code == -15  # TERM, from the hook's `ray stop` (this node's only) or the kubelet


def test_the_hook_waits_for_the_ranks_done(tmp_path: Path) -> None:
    took, hooks, _, _ = asyncio.run(_terminate(tmp_path, grace=30, rank="alive", done_after=2.0, ignore_term=False))
    (hook,) = hooks
    assert hook[1] == 0 and 2.0 <= hook[2] < 10 and took < 15


def test_a_hook_that_outlasts_the_grace_period_is_cut_and_the_container_killed(tmp_path: Path) -> None:
    """ "If the preStop hook is still running after the grace period expires" it gets 2 s more; a container still
    running after the grace period gets SIGKILL."""
    took, hooks, code, _ = asyncio.run(_terminate(tmp_path, grace=3, rank="alive", done_after=None, ignore_term=True))
    (hook,) = hooks
    assert 2.5 <= hook[2] <= 3 + 2 + 2  # the hook's own bound is the grace period; the kubelet's, 2 s more
    assert code == -9 and took < 3 + 2 + 10
