"""The local KubeRay stand-in's pure parts, and the marker that lets it stop every process it started."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
from fsdp_operator.api import render
from fsdp_operator.api.spec import parse_job, parse_quantity
from fsdp_operator.local.cluster.kuberay import (
    RAYCLUSTER_CRD,
    LocalCluster,
    LocalKubeRay,
    RayNode,
    _container_env,
    _cpus,
    _memory_limit,
    limited_command,
    secret_refs,
)
from fsdp_operator.local.cluster.processes import kill_marked, marked_processes
from fsdp_operator.local.server import ThreadedApiServer
from support.ray_cluster import RAY_TESTS


def rendered_worker() -> dict[str, object]:
    job = parse_job(
        {"apiVersion": "fsdp.dev/v1alpha1", "kind": "FSDPTrainingJob", "metadata": {"name": "j"}, "spec": {}}
    )
    container: dict[str, object] = render.raycluster(job)["spec"]["workerGroupSpecs"][0]["template"]["spec"][
        "containers"
    ][0]
    return container


def test_container_env_fills_in_the_downward_api_like_a_kubelet() -> None:
    env = _container_env(rendered_worker(), "pod-0", "node-a", {})
    assert env["POD_NAME"] == "pod-0" and env["NODE_NAME"] == "node-a"
    assert env["FI_PROVIDER"] == "efa" and env["NCCL_DEBUG"] == "INFO"


def test_container_env_reads_secret_references_like_a_kubelet() -> None:
    worker = rendered_worker()
    assert secret_refs(worker) == {("j-ray-auth", "token")}
    env = _container_env(worker, "pod-0", "node-a", {("j-ray-auth", "token"): "s3cret"})
    assert env["RAY_AUTH_MODE"] == "token" and env["RAY_AUTH_TOKEN"] == "s3cret"


def test_cpus_come_from_the_limit_and_stand_in_for_gpus() -> None:
    assert _cpus({"resources": {"limits": {"cpu": "2"}}}, 1) == 2
    assert _cpus({"resources": {"limits": {"cpu": "1500m"}}}, 1) == 2
    assert _cpus({"resources": {"limits": {"cpu": "1", "nvidia.com/gpu": "4"}}}, 1) == 4
    assert _cpus({}, 3) == 3


def test_marked_processes_are_found_and_killed() -> None:
    marker = f"FSDP_TEST_MARKER=m{os.getpid()}"
    name, value = marker.split("=")
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env={**os.environ, name: value})
    try:
        deadline = time.monotonic() + 5
        while child.pid not in marked_processes(marker) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert marked_processes(marker) == [child.pid]
        kill_marked(marker)
        assert child.wait(timeout=5) < 0
        assert marked_processes(marker) == []
    finally:
        child.kill()


async def created_cluster(kuberay: LocalKubeRay, tmp_path: Path) -> LocalCluster:
    """RayCluster `rc` in the API server (its kind served first), as the stand-in's record of it: the owner of the
    pods a test writes (the API server's garbage collector removes a pod whose owner does not exist)."""
    await kuberay._request("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", RAYCLUSTER_CRD)
    rc = await kuberay._request(
        "POST",
        "/apis/ray.io/v1/namespaces/default/rayclusters",
        {"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": "rc"}, "spec": {}},
    )
    return LocalCluster("default", "rc", rc["metadata"]["uid"], tmp_path / "c")


def test_a_head_whose_ray_process_exits_is_reported_not_ready_as_a_kubelet_would(
    apiserver: ThreadedApiServer, tmp_path: Path
) -> None:
    """Not a silent Ready head: the pod Failed and not Ready, the RayCluster's HeadPodReady False, with the exit."""

    async def scenario() -> tuple[dict[str, Any], dict[str, Any]]:
        kuberay = LocalKubeRay(apiserver.url, tmp_path)
        try:
            cluster = await created_cluster(kuberay, tmp_path)
            template = {"spec": {"containers": [{"name": "ray-head", "image": "rayproject/ray:2.58.0"}]}}
            await kuberay._put_pod(
                cluster, "rc-head", {"ray.io/node-type": "head"}, "127.0.0.2", ready=True, template=template
            )
            ready = {"type": "HeadPodReady", "status": "True", "reason": "HeadPodRunningAndReady"}
            provisioned = {"type": "RayClusterProvisioned", "status": "True", "reason": "AllPodRunningAndReady"}
            await kuberay._patch_status(cluster, {"state": "ready", "conditions": [ready, provisioned]})
            process = await asyncio.create_subprocess_exec(sys.executable, "-c", "raise SystemExit(3)")
            head = RayNode("rc-head", "127.0.0.2", process, tmp_path / "head.log", tmp_path / "n0")
            await asyncio.wait_for(kuberay.watch_head(cluster, head), 60)
            assert cluster.failure.startswith("the Ray head of RayCluster rc exited with code 3")
            pod = await kuberay._request("GET", "/api/v1/namespaces/default/pods/rc-head")
            found = await kuberay._request("GET", "/apis/ray.io/v1/namespaces/default/rayclusters/rc")
            return pod, found
        finally:
            await kuberay.close()

    pod, rc = asyncio.run(scenario())
    assert pod["status"]["phase"] == "Failed"
    (ready,) = pod["status"]["conditions"]
    assert (ready["type"], ready["status"], ready["reason"]) == ("Ready", "False", "ContainersNotReady")
    assert pod["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 3
    conditions = {c["type"]: c for c in rc["status"]["conditions"]}
    assert conditions["HeadPodReady"]["status"] == "False"
    assert "Ray exited with code 3" in conditions["HeadPodReady"]["message"]
    assert conditions["RayClusterProvisioned"]["status"] == "True"  # the other conditions stay as they were


def test_a_worker_that_used_up_its_restarts_shows_crash_loop_back_off_as_the_operator_reads_it(
    apiserver: ThreadedApiServer, tmp_path: Path
) -> None:
    """What the kubelet shows of a container it keeps restarting, written through the API server's validation of a
    pod's status and read back by the operator's own reader (`provisioning.containers_held`, through the pod
    watch's view)."""
    from fsdp_operator.runtime.provisioning import containers_held
    from fsdp_operator.runtime.watched import _pod_view

    async def scenario() -> dict[str, Any]:
        kuberay = LocalKubeRay(apiserver.url, tmp_path)
        try:
            cluster = await created_cluster(kuberay, tmp_path)
            template = {"spec": {"containers": [{"name": "ray-worker", "image": "rayproject/ray:2.58.0"}]}}
            labels = {"ray.io/node-type": "worker", "ray.io/cluster": "rc"}
            await kuberay._put_pod(cluster, "rc-w-0", labels, "127.0.0.3", ready=False, template=template)
            process = await asyncio.create_subprocess_exec(sys.executable, "-c", "raise SystemExit(3)")
            await process.wait()
            worker = RayNode("rc-w-0", "127.0.0.3", process, tmp_path / "w.log", tmp_path / "n0")
            await kuberay._report_crash_loop(cluster, worker, "ray-worker", 3)
            pod: dict[str, Any] = await kuberay._request("GET", "/api/v1/namespaces/default/pods/rc-w-0")
            return pod
        finally:
            await kuberay.close()

    pod = asyncio.run(scenario())
    assert pod["status"]["phase"] == "Running"
    assert [(c["type"], c["status"]) for c in pod["status"]["conditions"]] == [("Ready", "False")]
    assert containers_held([_pod_view(pod)]) == (
        "pod rc-w-0: container ray-worker CrashLoopBackOff (restarted 3 times, last exit code 3 (Error)): back-off "
        f"5m0s restarting failed container=ray-worker pod=rc-w-0_default (its log: {tmp_path / 'w.log'})"
    )


@pytest.mark.parametrize(
    ("exits", "joined"),
    [
        ({"rc-w-1": 1}, {"rc-w-0", "rc-w-1"}),
        ({"rc-w-1": 99}, {"rc-w-0"}),
        # Each node's restarts are its own: both use all of theirs and join on their last start.
        ({"rc-w-0": 4, "rc-w-1": 4}, {"rc-w-0", "rc-w-1"}),
        # One gives up, the other still joins after that, on its later start.
        ({"rc-w-0": 4, "rc-w-1": 99}, {"rc-w-0"}),
    ],
    ids=["exits-once", "exits-every-time", "both-exit-until-their-last-start", "one-gives-up-the-other-joins-later"],
)
def test_a_worker_whose_ray_start_exits_before_it_joined_is_started_again_in_its_pod(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, exits: dict[str, int], joined: set[str]
) -> None:
    """As the kubelet restarts a container that exited: same pod, same IP, after a back-off; the others are not
    touched. `exits`: how many of a pod's starts exit before it joins. Each node is started again at most
    NODE_RESTARTS times, counted per node (one node's restarts never use up another's); one that exits every time
    is left out (the cluster stays short) while the others go on joining."""
    from fsdp_operator.local.cluster import kuberay as kuberay_module

    monkeypatch.setattr(kuberay_module, "WORKER_RESTART_BACKOFF_SECONDS", 0.05)
    monkeypatch.setattr(kuberay_module, "WORKER_JOIN_SECONDS", 5.0)
    assert kuberay_module.NODE_RESTARTS == 4  # the cases above count on it
    starts: list[tuple[str, str]] = []
    joins: set[int] = set()
    ips = {"rc-w-0": "127.0.0.3", "rc-w-1": "127.0.0.4"}

    async def scenario() -> set[str]:
        kuberay = LocalKubeRay("http://127.0.0.1:1", tmp_path)
        cluster = LocalCluster("default", "rc", "uid", tmp_path / "c")
        (tmp_path / "head.log").write_text("")

        async def node(pod: str, ip: str, code: int | None) -> RayNode:
            # rc-w-1's starts exit later than rc-w-0's: the two exit at different times, as on a loaded machine.
            exit_after = 0.5 if pod == "rc-w-1" else 0.0
            ends = "time.sleep(60)" if code is None else f"time.sleep({exit_after}); raise SystemExit({code})"
            script = f"import time; {ends}"
            process = await asyncio.create_subprocess_exec(sys.executable, "-c", script, start_new_session=True)
            made = RayNode(pod, ip, process, tmp_path / "head.log", tmp_path / f"n{len(cluster.nodes)}")
            cluster.nodes.append(made)
            if code is None:
                joins.add(made.pgid)  # only a node that does not exit joins Ray
            return made

        def exit_code(pod: str) -> int | None:
            started = 1 + sum(1 for p, _ in starts if p == pod)
            return 1 if started <= exits.get(pod, 0) else None

        async def start_worker(pod: str, ip: str) -> RayNode:
            starts.append((pod, ip))
            return await node(pod, ip, exit_code(pod))

        async def alive_nodes(_: LocalCluster) -> list[dict[str, str]]:
            latest = {n.ip: n for n in cluster.nodes}
            return [{"node_ip": ip, "state": "ALIVE"} for ip, n in latest.items() if n.pgid in joins]

        monkeypatch.setattr(kuberay, "_alive_nodes", alive_nodes)
        head = await node("rc-head", "127.0.0.2", None)
        workers = [await node(pod, ip, exit_code(pod)) for pod, ip in ips.items()]
        try:
            return await kuberay._joined(cluster, workers, start_worker, kuberay_module.WORKER_JOIN_SECONDS, head=head)
        finally:
            await kuberay_module.stop_nodes(cluster.nodes)
            await kuberay.close()

    alive = asyncio.run(scenario())
    assert alive == {ips[pod] for pod in joined}
    for pod, ip in ips.items():  # restarted in its pod, at its IP, once per start that exited, at most 4 times
        assert starts.count((pod, ip)) == min(exits.get(pod, 0), kuberay_module.NODE_RESTARTS), starts
    assert {ip for _, ip in starts} <= set(ips.values())


def test_a_head_that_logs_its_fatal_line_is_reported_before_its_process_exits(
    apiserver: ThreadedApiServer, tmp_path: Path
) -> None:
    """`ray start --block` whose GCS died says so in its log, then takes its time stopping the rest: the stand-in
    reports the head gone at that line (within one look, HEAD_WATCH_SECONDS), not when the process ends."""

    async def scenario() -> tuple[str, float, dict[str, Any]]:
        kuberay = LocalKubeRay(apiserver.url, tmp_path)
        log_path = tmp_path / "head.log"
        # A head that lives on (sleeps) after printing Ray's own words for a dead subprocess.
        script = (
            "import sys, time; print('2026-12-03 08:24:00,462\\tERR scripts.py:1304 -- "
            "\\x1b[31mSome Ray subprocesses exited unexpectedly:\\x1b[39m', flush=True); "
            "print('  gcs_server [exit code=-9]', flush=True); time.sleep(600)"
        )
        with log_path.open("wb") as out:
            process = await asyncio.create_subprocess_exec(sys.executable, "-c", script, stdout=out)
        try:
            cluster = await created_cluster(kuberay, tmp_path)
            template = {"spec": {"containers": [{"name": "ray-head", "image": "rayproject/ray:2.58.0"}]}}
            await kuberay._put_pod(
                cluster, "rc-head", {"ray.io/node-type": "head"}, "127.0.0.2", ready=True, template=template
            )
            head = RayNode("rc-head", "127.0.0.2", process, log_path, tmp_path / "n0")
            started = time.monotonic()
            await asyncio.wait_for(kuberay.watch_head(cluster, head), 120)
            took = time.monotonic() - started
            assert process.returncode is None  # reported while the process still runs
            pod = await kuberay._request("GET", "/api/v1/namespaces/default/pods/rc-head")
            return cluster.failure, took, pod
        finally:
            process.kill()
            await process.wait()
            await kuberay.close()

    failure, took, pod = asyncio.run(scenario())
    # Ray's own words, without its colours and log prefix.
    assert failure.startswith(
        "the Ray head of RayCluster rc is dying: Some Ray subprocesses exited unexpectedly: gcs_server [exit code=-9];"
    )
    assert took < 30  # a look or a few (HEAD_WATCH_SECONDS each), generous for a loaded machine
    assert pod["status"]["phase"] == "Failed"


def test_a_containers_memory_limit_bounds_each_process_of_its_ray_node() -> None:
    """`memory: 4Gi` holds locally too: past the limit an allocation fails instead of taking the machine's memory."""
    limit = parse_quantity("256Mi")
    assert _memory_limit({"resources": {"limits": {"memory": "256Mi"}}}) == limit
    assert _memory_limit({}) is None
    assert _memory_limit(rendered_worker()) == parse_quantity(render.raycluster(
        parse_job({"apiVersion": "fsdp.dev/v1alpha1", "kind": "FSDPTrainingJob", "metadata": {"name": "j"}, "spec": {}})
    )["spec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]["resources"]["limits"]["memory"])  # fmt: skip
    # A child process inherits the limit, as a rank started by the node's raylet does.
    allocate = "import subprocess, sys; sys.exit(subprocess.run([sys.executable, '-c', 'bytearray({})']).returncode)"
    small = subprocess.run(
        limited_command([sys.executable, "-c", allocate.format(64 * 2**20)], int(limit)), check=False
    )
    assert small.returncode == 0
    big = subprocess.run(
        limited_command([sys.executable, "-c", allocate.format(512 * 2**20)], int(limit)),
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert big.returncode != 0 and "MemoryError" in big.stderr
    assert limited_command(["ray", "start"], None) == ["ray", "start"]


def _suspended_cluster(kuberay: LocalKubeRay, name: str, *, suspend: bool) -> dict[str, Any]:
    job = parse_job({"apiVersion": "fsdp.dev/v1alpha1", "kind": "FSDPTrainingJob", "metadata": {"name": name},
                     "spec": {"queueName": "team-a", "workers": {"replicas": 1, "gpusPerWorker": 0, "cpu": "1",
                                                                  "ranksPerWorker": 1}}})  # fmt: skip
    rc = render.raycluster(job, render.Security(token_auth=False))
    rc["spec"]["suspend"] = suspend
    # No job is stored in these cases: a RayCluster naming an owner that does not exist is the collector's at once.
    rc["metadata"].pop("ownerReferences", None)
    return rc


async def cluster_to_materialize(
    kuberay: LocalKubeRay, tmp_path: Path, job: str
) -> tuple[LocalCluster, dict[str, Any]]:
    """RayCluster `rc` stored (`created_cluster`), and the manifest the operator renders for a one-worker job `job`,
    as that RayCluster: what `_materialize` is given."""
    rc = _suspended_cluster(kuberay, job, suspend=False)
    cluster = await created_cluster(kuberay, tmp_path)
    rc["metadata"] = {**rc["metadata"], "name": "rc", "uid": cluster.uid, "generation": 1}
    return cluster, rc


def stub_ray_nodes(monkeypatch: pytest.MonkeyPatch, kuberay: LocalKubeRay, start_node: Any, alive_nodes: Any) -> None:
    """Ray nodes as a test makes them (`start_node`) and as it says they joined (`alive_nodes`); no head watch."""
    monkeypatch.setattr(kuberay, "_start_node", start_node)
    monkeypatch.setattr(kuberay, "_alive_nodes", alive_nodes)
    monkeypatch.setattr(kuberay, "watch_head", lambda *_: asyncio.sleep(0))


async def _until(condition: Any, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.05)


def test_a_head_started_again_gets_new_ports_and_the_cluster_its_endpoints(
    apiserver: ThreadedApiServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every pod here shares the machine's ports: a head whose first start exited is started again on a dashboard and
    GCS port of its own (the first start's were found taken), and the workers and the RayCluster's endpoints follow."""
    from fsdp_operator.local.cluster import kuberay as kuberay_module

    monkeypatch.setattr(kuberay_module, "WORKER_RESTART_BACKOFF_SECONDS", 0.05)
    started: list[tuple[str, list[str]]] = []
    joined: set[str] = set()

    async def scenario() -> dict[str, Any]:
        kuberay = LocalKubeRay(apiserver.url, tmp_path)

        async def start_node(cluster: LocalCluster, pod: str, args: list[str], *_: Any, **__: Any) -> RayNode:
            ip = f"127.0.0.{len(started) + 2}"
            first_head = "--head" in args and not any("--head" in a for _, a in started)
            log_path = tmp_path / f"n{len(started)}.log"
            # Ray's words for a port another process took between its choice and the bind: a new start mends it.
            taken = "ValueError: Failed to bind to 127.0.0.1:PORT because it's already occupied. You can use ...\n"
            log_path.write_text(taken if first_head else "")
            script = "raise SystemExit(1)" if first_head else "import time; time.sleep(60)"
            process = await asyncio.create_subprocess_exec(sys.executable, "-c", script, start_new_session=True)
            started.append((pod, args))
            node = RayNode(pod, ip, process, log_path, tmp_path / f"n{len(started)}")
            cluster.nodes.append(node)
            if not first_head:
                joined.add(ip)
            return node

        async def alive_nodes(cluster: LocalCluster) -> list[dict[str, str]]:
            latest = {n.ip: n for n in cluster.nodes}
            return [{"node_ip": ip, "state": "ALIVE"} for ip, n in latest.items() if ip in joined]

        stub_ray_nodes(monkeypatch, kuberay, start_node, alive_nodes)
        try:
            cluster, rc = await cluster_to_materialize(kuberay, tmp_path, "again")
            await kuberay._materialize(cluster, rc)
            await kuberay_module.stop_nodes(cluster.nodes)
            found: dict[str, Any] = await kuberay._request("GET", "/apis/ray.io/v1/namespaces/default/rayclusters/rc")
            return found
        finally:
            await kuberay.close()

    rc = asyncio.run(scenario())
    (first, first_args), (again, head_args), (_, worker_args) = started
    assert first == again and "head" in first  # the same pod, started again

    def port(args: list[str], flag: str) -> str:
        (value,) = [a.split("=", 1)[1] for a in args if a.startswith(f"--{flag}=")]
        return value

    assert port(head_args, "dashboard-port") != port(first_args, "dashboard-port")
    assert port(head_args, "port") != port(first_args, "port")
    assert port(worker_args, "address").endswith(f":{port(head_args, 'port')}")  # the workers join the new GCS
    assert rc["status"]["state"] == "ready"
    assert rc["status"]["endpoints"] == {
        "dashboard": port(head_args, "dashboard-port"),
        "gcs-server": port(head_args, "port"),
    }


# Two real ways a head's start fails, as its logs say them: its GCS dies at once and logs a check that failed while
# `ray start` waits up to a minute for it (still running), or `ray start` itself prints an exception and exits.
GCS_CHECK = (
    "[2026-12-06 11:42:41,134 C 14525 14525] (gcs_server) gcs_server.cc:88:  An unexpected system state has "
    "occurred. You have likely discovered a bug in Ray. Check failed: _s.ok() IOError: No space left on device"
)
RAY_START_ERROR = (
    "Traceback (most recent call last):\n  File \"ray\", line 10\nPermissionError: [Errno 13] Permission denied: '/x'"
)


@pytest.mark.parametrize(
    ("session_log", "output", "exits", "said"),
    [
        (GCS_CHECK, "", False, "gcs_server: Check failed: _s.ok() IOError: No space left on device"),
        ("", RAY_START_ERROR, True, "PermissionError: [Errno 13] Permission denied: '/x'"),
    ],
    ids=["its-gcs-dies-while-ray-start-waits", "ray-start-exits-with-an-exception"],
)
def test_a_head_that_cannot_start_is_reported_at_once_with_its_own_words_and_not_started_again(
    apiserver: ThreadedApiServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    session_log: str,
    output: str,
    exits: bool,
    said: str,
) -> None:
    """A failure a new start would repeat ends the cluster's start at the look that finds it: the RayCluster failed
    with the head's own line, the head started once, long before the kubelet's first back-off or HEAD_START_SECONDS."""
    from fsdp_operator.local.cluster import kuberay as kuberay_module

    monkeypatch.setattr(kuberay_module, "WORKER_RESTART_BACKOFF_SECONDS", 600.0)  # a restart would show as a hang
    started: list[str] = []

    async def scenario() -> tuple[LocalCluster, dict[str, Any], float]:
        kuberay = LocalKubeRay(apiserver.url, tmp_path)

        async def start_node(cluster: LocalCluster, pod: str, args: list[str], *_: Any, **__: Any) -> RayNode:
            temp_dir, log_path = tmp_path / f"n{len(started)}", tmp_path / f"n{len(started)}.log"
            (temp_dir / "session_latest" / "logs").mkdir(parents=True)
            (temp_dir / "session_latest" / "logs" / "gcs_server.out").write_text(session_log + "\n")
            log_path.write_text(output + "\n")
            script = "raise SystemExit(1)" if exits else "import time; time.sleep(60)"
            process = await asyncio.create_subprocess_exec(sys.executable, "-c", script, start_new_session=True)
            started.append(pod)
            node = RayNode(pod, f"127.0.0.{len(started) + 1}", process, log_path, temp_dir)
            cluster.nodes.append(node)
            return node

        async def alive_nodes(cluster: LocalCluster) -> list[dict[str, str]]:
            return []

        stub_ray_nodes(monkeypatch, kuberay, start_node, alive_nodes)
        try:
            cluster, rc = await cluster_to_materialize(kuberay, tmp_path, "broken")
            began = time.monotonic()
            await asyncio.wait_for(kuberay._materialize(cluster, rc), 120)
            took = time.monotonic() - began
            await kuberay_module.stop_nodes(cluster.nodes)
            found: dict[str, Any] = await kuberay._request("GET", "/apis/ray.io/v1/namespaces/default/rayclusters/rc")
            return cluster, found, took
        finally:
            await kuberay.close()

    cluster, rc, took = asyncio.run(scenario())
    assert len(started) == 1 and "head" in started[0]  # not started again
    assert cluster.failure.startswith(f"the Ray head of RayCluster rc did not start: {said}; see "), cluster.failure
    assert rc["status"]["state"] == "failed" and rc["status"]["reason"] == f"head did not start: {said}"
    assert took < 30  # a look or a few (0.5 s each), generous for a loaded machine; the wait is HEAD_START_SECONDS


def test_a_worker_that_joins_after_its_wait_ran_out_is_marked_ready_and_the_cluster_then(
    apiserver: ThreadedApiServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker still starting when its wait ran out (its process running, not in Ray yet) is not given up: when it
    joins later its pod turns Ready and the RayCluster `ready`, as a readiness probe that passes late and KubeRay's
    count of ready pods would have it. Until then the cluster says what it has."""
    from fsdp_operator.local.cluster import kuberay as kuberay_module

    monkeypatch.setattr(kuberay_module, "WORKER_JOIN_SECONDS", 0.5)
    joined: set[str] = set()
    seen: list[dict[str, Any]] = []

    async def scenario() -> tuple[dict[str, Any], dict[str, Any]]:
        kuberay = LocalKubeRay(apiserver.url, tmp_path)

        async def start_node(cluster: LocalCluster, pod: str, args: list[str], *_: Any, **__: Any) -> RayNode:
            ip = f"127.0.0.{len(cluster.nodes) + 2}"
            process = await asyncio.create_subprocess_exec(
                sys.executable, "-c", "import time; time.sleep(60)", start_new_session=True
            )
            node = RayNode(pod, ip, process, tmp_path / "n.log", tmp_path / f"n{len(cluster.nodes)}")
            cluster.nodes.append(node)
            if "--head" in args:
                joined.add(ip)
            return node

        async def alive_nodes(cluster: LocalCluster) -> list[dict[str, str]]:
            return [{"node_ip": ip, "state": "ALIVE"} for ip in sorted(joined)]

        async def worker_joins_once_the_cluster_says_it_is_short() -> None:
            # After the worker's wait ran out: the stand-in has reported the cluster provisioned short.
            path = "/apis/ray.io/v1/namespaces/default/rayclusters/rc"
            while True:
                found = await kuberay._request("GET", path)
                conditions = {c["type"]: c["status"] for c in found.get("status", {}).get("conditions", [])}
                if conditions.get("RayClusterProvisioned") == "False":
                    break
                await asyncio.sleep(0.05)
            seen.append(found)
            joined.add("127.0.0.3")  # the worker, the second node started

        stub_ray_nodes(monkeypatch, kuberay, start_node, alive_nodes)
        try:
            cluster, rc = await cluster_to_materialize(kuberay, tmp_path, "late")
            joining = asyncio.create_task(worker_joins_once_the_cluster_says_it_is_short())
            await asyncio.wait_for(kuberay._materialize(cluster, rc), 60)
            await joining
            await kuberay_module.stop_nodes(cluster.nodes)
            (worker,) = [n for n in cluster.nodes if n.ip == "127.0.0.3"]
            found = await kuberay._request("GET", "/apis/ray.io/v1/namespaces/default/rayclusters/rc")
            pod = await kuberay._request("GET", f"/api/v1/namespaces/default/pods/{worker.pod_name}")
            return found, pod
        finally:
            await kuberay.close()

    rc, pod = asyncio.run(scenario())
    (short,) = seen
    assert short["status"].get("state") != "ready" and short["status"]["readyWorkerReplicas"] == 0
    assert rc["status"]["state"] == "ready"
    assert (rc["status"]["readyWorkerReplicas"], rc["status"]["availableWorkerReplicas"]) == (1, 1)
    assert {c["type"]: c["status"] for c in rc["status"]["conditions"]}["RayClusterProvisioned"] == "True"
    assert pod["status"]["phase"] == "Running"
    assert [(c["type"], c["status"]) for c in pod["status"]["conditions"]] == [("Ready", "True")]


def test_a_worker_whose_ray_exits_after_it_joined_is_started_again_in_its_pod_and_ready_once_it_joined_again(
    apiserver: ThreadedApiServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As the kubelet restarts a container that exited (restartPolicy Always): a worker whose Ray node died after it
    joined (here, as seen in a slow run, its runtime env agent found its port taken seconds after the join) is started
    again in its pod, at its IP; the pod is not Ready, with the restart and the last exit, until the new node joined,
    and Ray's record of the dead node (the GCS notices a death late) does not count as the new one joining."""
    from fsdp_operator.local.cluster import kuberay as kuberay_module

    monkeypatch.setattr(kuberay_module, "WORKER_RESTART_BACKOFF_SECONDS", 0.05)
    workers: list[RayNode] = []
    released: list[bool] = []
    polls_after_restart: list[int] = []
    joined = tmp_path / "joined"

    async def scenario() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any], int]:
        kuberay = LocalKubeRay(apiserver.url, tmp_path)

        async def start_node(
            cluster: LocalCluster, pod: str, args: list[str], env: Any, limit: Any, ip: str | None = None
        ) -> RayNode:
            first_worker = "--head" not in args and not workers
            # The first worker exits once the test saw it joined: an exit after a fixed time could come before the
            # join on a loaded machine, which is the other case (a worker that exited before it joined).
            leave = f"import os, time\nwhile not os.path.exists({str(joined)!r}): time.sleep(0.02)\nraise SystemExit(7)"
            script = leave if first_worker else "import time; time.sleep(60)"
            process = await asyncio.create_subprocess_exec(sys.executable, "-c", script, start_new_session=True)
            address = ip or ("127.0.0.2" if "--head" in args else "127.0.0.3")
            node = RayNode(pod, address, process, tmp_path / "n.log", tmp_path / f"n{len(cluster.nodes)}")
            cluster.nodes.append(node)
            if "--head" not in args:
                workers.append(node)
            return node

        async def alive_nodes(cluster: LocalCluster) -> list[dict[str, Any]]:
            records: list[dict[str, Any]] = [{"node_ip": "127.0.0.2", "state": "ALIVE"}]
            if not workers:
                return records
            # The first worker's record stays ALIVE (the GCS has not noticed its death); the new one's comes once
            # the test says so.
            records.append({"node_ip": "127.0.0.3", "state": "ALIVE", "start_time_ms": workers[0].started_at * 1000})
            if len(workers) > 1:
                polls_after_restart.append(1)
                if released:
                    records.append({"node_ip": "127.0.0.3", "state": "ALIVE",
                                    "start_time_ms": workers[1].started_at * 1000})  # fmt: skip
            return records

        async def until(predicate: Any, what: str) -> dict[str, Any]:
            deadline = time.monotonic() + 120
            while not predicate(found := await kuberay._request("GET", "/api/v1/namespaces/default/pods/" + pod)):
                assert time.monotonic() < deadline, what
                await asyncio.sleep(0.05)
            return found

        def container(found: dict[str, Any]) -> dict[str, Any]:
            return dict((found.get("status", {}).get("containerStatuses") or [{}])[0])

        stub_ray_nodes(monkeypatch, kuberay, start_node, alive_nodes)
        cluster, rc = await cluster_to_materialize(kuberay, tmp_path, "crash")
        try:
            await asyncio.wait_for(kuberay._materialize(cluster, rc), 60)
            joined.touch()
            pod = workers[0].pod_name
            restarting = await until(lambda p: container(p).get("restartCount") == 1, "the restarted pod")
            await _until(lambda: len(polls_after_restart) >= 3, 60, "three looks at Ray after the restart")
            short = await kuberay._request("GET", "/apis/ray.io/v1/namespaces/default/rayclusters/rc")
            released.append(True)
            ready = await until(lambda p: container(p).get("ready") is True, "the pod Ready again")
            return restarting, short, ready, len(workers)
        finally:
            if cluster.worker_watch is not None:
                cluster.worker_watch.cancel()
            await kuberay_module.stop_nodes(cluster.nodes)
            await kuberay.close()

    restarting, short, ready, starts = asyncio.run(scenario())
    assert starts == 2 and workers[1].ip == workers[0].ip  # once more, in its pod, at its IP
    assert restarting["status"]["phase"] == "Running"
    assert [(c["type"], c["status"]) for c in restarting["status"]["conditions"]] == [("Ready", "False")]
    (last,) = restarting["status"]["containerStatuses"]
    assert last["lastState"]["terminated"]["exitCode"] == 7 and "running" in last["state"]
    assert short["status"]["readyWorkerReplicas"] == 0  # the dead node's record is not the new one joining
    assert [(c["type"], c["status"]) for c in ready["status"]["conditions"]] == [("Ready", "True")]
    assert ready["status"]["containerStatuses"][0]["restartCount"] == 1


def test_a_suspended_raycluster_gets_no_pods_and_no_process(apiserver: ThreadedApiServer, tmp_path: Path) -> None:
    """KubeRay's RayClusterSpec.suspend: "A suspended RayCluster will have head pods and worker pods deleted"."""

    async def scenario() -> LocalKubeRay:
        kuberay = LocalKubeRay(apiserver.url, tmp_path)
        task = asyncio.create_task(kuberay.run())
        try:
            await kuberay._request("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", RAYCLUSTER_CRD)
            rc = _suspended_cluster(kuberay, "queued", suspend=True)
            await kuberay._request("POST", "/apis/ray.io/v1/namespaces/default/rayclusters", rc)

            def state() -> str:
                found = apiserver.store.find("rayclusters", "ray.io")
                return str((found[0].get("status") or {}).get("state", "")) if found else ""

            await _until(lambda: state() == "suspended", 30, "the suspended RayCluster's state was never written")
            # A watch event that changes nothing else (a label) must not start it either.
            path = "/apis/ray.io/v1/namespaces/default/rayclusters/queued-ray"
            await kuberay._request("PATCH", path, {"metadata": {"labels": {"x": "y"}}}, "application/merge-patch+json")
            await asyncio.sleep(0.5)
            return kuberay
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await kuberay.close()

    kuberay = asyncio.run(scenario())
    assert kuberay.started == [] and apiserver.store.find("pods") == []


@pytest.mark.e2e
@pytest.mark.slow
@RAY_TESTS
@pytest.mark.timeout(900)
def test_suspending_a_running_raycluster_stops_its_ray_and_deletes_its_pods(apiserver: ThreadedApiServer) -> None:
    """Real Ray processes: unsuspended, the cluster starts; suspended again, its processes stop and its pods go;
    unsuspended once more, it starts anew."""
    workdir = Path(tempfile.mkdtemp(prefix="fsdp-suspend-"))  # short: Ray's socket paths are at most 107 bytes

    def pods() -> list[str]:
        return sorted(p["metadata"]["name"] for p in apiserver.store.find("pods"))

    def state() -> str:
        return str(apiserver.store.find("rayclusters", "ray.io")[0].get("status", {}).get("state", ""))

    async def scenario() -> None:
        kuberay = LocalKubeRay(apiserver.url, workdir)
        task = asyncio.create_task(kuberay.run())
        path = "/apis/ray.io/v1/namespaces/default/rayclusters/cycle-ray"
        merge = "application/merge-patch+json"
        try:
            await kuberay._request("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", RAYCLUSTER_CRD)
            rc = _suspended_cluster(kuberay, "cycle", suspend=True)
            await kuberay._request("POST", "/apis/ray.io/v1/namespaces/default/rayclusters", rc)
            for cycle in (1, 2):
                await kuberay._request("PATCH", path, {"spec": {"suspend": False}}, merge)
                await _until(lambda c=cycle: state() == "ready" and len(kuberay.started) == 2 * c, 300,
                             "the unsuspended cluster never got ready with a new head and worker")  # fmt: skip
                assert len(pods()) == 2
                started = kuberay.started[-2:]
                await kuberay._request("PATCH", path, {"spec": {"suspend": True}}, merge)
                await _until(lambda: pods() == [] and state() == "suspended", 60, "suspending left pods behind")
                await _until(lambda nodes=started: not any(marked_processes(n.marker) for n in nodes), 60,
                             "Ray processes run on after the suspension")  # fmt: skip
            assert len(kuberay.started) == 4  # head and worker, twice: each unsuspension starts anew
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await kuberay.close()

    try:
        asyncio.run(scenario())
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def test_a_pod_is_owned_by_its_raycluster_as_its_controller_as_kuberay_sets_it() -> None:
    """`ctrl.SetControllerReference`: `controller: true` and `blockOwnerDeletion: true`. Without `controller`,
    `kubectl drain` refused the local workers ("cannot delete Pods that declare no controller") without --force."""
    from fsdp_operator.local.cluster.kuberay import LocalCluster, LocalKubeRay

    cluster = LocalCluster("ml", "qwen-ray", "uid-1", Path("/nonexistent"))
    pod = LocalKubeRay._pod(cluster, "qwen-ray-worker-0", {"ray.io/node-type": "worker"}, {"spec": {}})
    assert pod["metadata"]["ownerReferences"] == [
        {"apiVersion": "ray.io/v1", "kind": "RayCluster", "name": "qwen-ray", "uid": "uid-1", "controller": True,
         "blockOwnerDeletion": True}
    ]  # fmt: skip
