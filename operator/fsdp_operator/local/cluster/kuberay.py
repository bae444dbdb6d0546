"""A local stand-in for the KubeRay controller: each RayCluster becomes Ray processes on this machine.

It watches RayClusters over the Kubernetes API (HTTP, like the real controller), starts a head
(`ray start --head --num-cpus=0`, dashboard on loopback) and one Ray node per worker replica, each
with its own 127.0.0.N address and temp dir, creates the matching Pod objects from the groups' templates
(a pod the API server refuses is a `FailedToCreate*Pod` Warning event on the RayCluster, and no process
starts), and writes the RayCluster status the way KubeRay does. Deleting the RayCluster stops its
processes, by process group.

Environment variables come from the container spec as a kubelet would fill them: plain values, the
downward API fields the operator uses, and `secretKeyRef`s read from the API server (Ray's auth token
among them, so a cluster with token authentication really requires it).

A head whose Ray process exits is reported as a kubelet and KubeRay would: the pod not Ready and
Failed, the RayCluster's HeadPodReady condition False.

`spec.suspend: true` is honoured as KubeRay documents it (RayClusterSpec.suspend: "A suspended RayCluster will
have head pods and worker pods deleted"; `status.state: suspended`): a cluster created suspended starts no
process and gets no pod; suspending a running one stops its Ray processes and deletes its pods; `suspend: false`
starts it again from scratch (a new head: Ray's jobs of before are gone, as with a real new head pod). This is
how Kueue queues and preempts a RayCluster (docs/kueue.md).

A container's memory limit becomes RLIMIT_DATA of every process of its Ray node (see limited_command):
per process, where a pod's cgroup limits the sum.

What it does not reproduce: images (the Ray on this machine runs, not the container's), pod
scheduling, CPU limits and the memory cgroup (see above), GPUs (a worker gets CPUs in place of GPUs), restarts
the Pod's own network namespace (all nodes share loopback and the machine's ports),
NetworkPolicies (stored by the API server, enforced by nothing here: all nodes share loopback).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import logging
import math
import os
import signal
import socket
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from fsdp_operator.api.spec import parse_quantity
from fsdp_operator.local.cluster import pod_status
from fsdp_operator.local.cluster.node_logs import (
    FATAL_TAIL_BYTES,
    PYTHON_ERROR,
    SESSION_LOGS,
    clean,
    fatal_line,
    mended_by_a_new_start,
)
from fsdp_operator.local.cluster.processes import kill_marked, marked_processes
from fsdp_operator.local.cluster.watching import list_then_watch

log = logging.getLogger(__name__)

Obj = dict[str, Any]

RAYCLUSTERS = "/apis/ray.io/v1/rayclusters"
OBJECT_STORE_BYTES = 100 * 1024 * 1024
STOP_GRACE_SECONDS = 5.0
HEAD_START_SECONDS = 300
"""How long a Ray head may take to come up (its dashboard's modules included) on a loaded machine, per start."""
WORKER_JOIN_SECONDS = 300
"""How long a cluster's worker has to join Ray, per start."""
WORKER_RESTART_BACKOFF_SECONDS = 10.0
"""The kubelet's first back-off before it restarts a container that exited, doubled each time after."""
MAX_RESTART_BACKOFF_SECONDS = 300.0
"""The kubelet's cap on that back-off (five minutes)."""
NODE_RESTARTS = 4
"""Starts of each node after its first (the kubelet restarts without end; a stand-in node that exits every time ends
its cluster's start instead of a test's time)."""

# A minimal RayCluster definition of our own (KubeRay's real CRD is not shipped with the project):
# enough for the API server to serve the kind, its status subresource and KubeRay-like columns.
RAYCLUSTER_CRD: Obj = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "rayclusters.ray.io"},
    "spec": {
        "group": "ray.io",
        "scope": "Namespaced",
        "names": {
            "kind": "RayCluster",
            "listKind": "RayClusterList",
            "plural": "rayclusters",
            "singular": "raycluster",
        },
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "subresources": {"status": {}},
                "additionalPrinterColumns": [
                    {"name": "desired workers", "type": "integer", "jsonPath": ".status.desiredWorkerReplicas"},
                    {"name": "available workers", "type": "integer", "jsonPath": ".status.availableWorkerReplicas"},
                    {"name": "status", "type": "string", "jsonPath": ".status.state"},
                    {"name": "age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
                ],
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "properties": {
                            "spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                            "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                        },
                    }
                },
            }
        ],
    },
}


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def now_rfc3339() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


NODE_MARKER = "FSDP_LOCAL_RAY_NODE"


HEAD_WATCH_SECONDS = 0.5
"""How often the head's process and the end of its log are looked at."""
WORKER_WATCH_SECONDS = 5.0
"""How often the keeping of joined workers looks at the head between its workers' exits (`_keep_workers`)."""


def _since(record: Obj, node: RayNode | None) -> bool:
    """Whether Ray's record of an alive node (its `start_time_ms`, if any) is of `node`'s start, not an earlier one."""
    started = record.get("start_time_ms")
    return node is None or not isinstance(started, int | float) or started / 1000 >= node.started_at


def ended(node: RayNode, failed: Callable[[RayNode], str] | None) -> bool:
    """The node's process exited, or `failed` says why its start failed (a head whose GCS died before `ray start`
    gave up on it)."""
    return node.process.returncode is not None or (failed is not None and bool(failed(node)))


def start_error(node: RayNode) -> str:
    """Why a Ray node's start failed, in its own words, or '' while nothing says it did: the fatal line of its
    `ray start` output or of its session's GCS and raylet logs (SESSION_LOGS), else, once its process exited, the
    last error its output printed (a Python exception's line) or its exit code."""
    session = node.temp_dir / "session_latest" / "logs"
    for path in (node.log_path, *(session / name for name in SESSION_LOGS)):
        if line := fatal_line(path):
            return line
    if node.process.returncode is None:
        return ""
    try:
        lines = node.log_path.read_bytes()[-FATAL_TAIL_BYTES:].decode(errors="replace").splitlines()
    except OSError:
        lines = []
    errors = [said for said in map(clean, lines) if PYTHON_ERROR.match(said)]
    return errors[-1][:200] if errors else f"exited with code {node.process.returncode}"


def head_death(head: RayNode) -> str:
    """How the head died ('exited with code N', or its fatal log line), or '' while it lives."""
    if head.process.returncode is not None:
        return f"exited with code {head.process.returncode}"
    line = fatal_line(head.log_path)
    return f"is dying: {line}" if line else ""


@dataclass
class RayNode:
    """One `ray start --block` process group: a head or a worker 'pod'."""

    pod_name: str
    ip: str
    process: asyncio.subprocess.Process
    log_path: Path
    temp_dir: Path
    env: dict[str, str] = field(default_factory=dict)
    """The container's environment as the node's processes got it (a hook runs with it too: `cluster/kubelet.py`)."""
    started_at: float = field(default_factory=time.time)
    stopping: bool = False
    """Stopped on purpose (its pod deleted, its cluster gone): its exit is no crash to start it again for."""

    @property
    def marker(self) -> str:
        """The environment entry every process of this node inherits."""
        return f"{NODE_MARKER}={self.temp_dir}"

    @property
    def pgid(self) -> int:
        return self.process.pid  # started with start_new_session: its pid is the group id


@dataclass
class LocalCluster:
    namespace: str
    name: str
    uid: str
    workdir: Path
    nodes: list[RayNode] = field(default_factory=list)
    dashboard_port: int = 0
    gcs_port: int = 0
    task: asyncio.Task[None] | None = None
    token: str = ""
    """Ray's auth token when the head runs with RAY_AUTH_MODE=token."""
    head_watch: asyncio.Task[None] | None = None
    """Reports the head pod not ready when its Ray process exits (see LocalKubeRay.watch_head)."""
    worker_watch: asyncio.Task[None] | None = None
    """Starts a joined worker whose Ray process exited again (see LocalKubeRay._keep_workers)."""
    failure: str = ""
    """Why the cluster's head is gone (did not start, or its Ray process exited); empty while it is fine."""
    suspended: bool = False
    """`spec.suspend: true`: no process, no pod (KubeRay's suspension)."""
    after: asyncio.Task[None] | None = None
    """The teardown of this cluster's previous run (a suspension) that must end before its pods are made again."""
    manifest: Obj = field(default_factory=dict)
    """The RayCluster as materialized: a worker pod that went is made again from its group's template."""


@dataclass
class _Keeping:
    """What keeping a cluster's workers works on (`_keep_workers`); `workers` and the sets change as it goes."""

    rc: Obj
    pods: _WorkerPods
    workers: list[RayNode]
    alive: set[str]
    restarts: dict[str, int]
    start_worker: Callable[[str, str], Awaitable[RayNode]]
    head: RayNode


@dataclass
class _WorkerPods:
    """What a cluster's worker pods are made from, and which of them are shown Ready or in CrashLoopBackOff so far."""

    labels: dict[str, str]
    template: Obj
    container: str
    replicas: int
    ready: set[str] = field(default_factory=set)
    held: set[str] = field(default_factory=set)


POD_RAY_VOLUME = "/tmp/ray"
"""Where the rendered pods mount their own Ray volume (`render.RAY_LOGS`): each local node's temp dir stands in."""


def pod_local(value: str, temp_dir: Path) -> str:
    """`value` with a path in the pod's own Ray volume made one in this node's temp dir (no mount namespaces here)."""
    if value == POD_RAY_VOLUME or value.startswith(POD_RAY_VOLUME + "/"):
        return str(temp_dir) + value[len(POD_RAY_VOLUME) :]
    return value


def _container_env(
    container: Obj, pod_name: str, node_name: str, secrets: dict[tuple[str, str], str]
) -> dict[str, str]:
    """The container's environment, with the downward-API fields and Secret keys a kubelet would fill in.

    `secrets` maps (secret name, key) to the decoded value of every `secretKeyRef` the container uses.
    """
    fields = {"metadata.name": pod_name, "spec.nodeName": node_name}
    env: dict[str, str] = {}
    for item in container.get("env", []):
        source = item.get("valueFrom", {})
        if "value" in item:
            env[item["name"]] = str(item["value"])
        elif path := source.get("fieldRef", {}).get("fieldPath"):
            env[item["name"]] = fields.get(path, "")
        elif ref := source.get("secretKeyRef"):
            env[item["name"]] = secrets.get((ref.get("name", ""), ref.get("key", "")), "")
    return env


def secret_refs(container: Obj) -> set[tuple[str, str]]:
    """(secret name, key) of every `valueFrom.secretKeyRef` in the container's env."""
    refs = (item.get("valueFrom", {}).get("secretKeyRef") for item in container.get("env", []))
    return {(ref["name"], ref["key"]) for ref in refs if ref and ref.get("name") and ref.get("key")}


def _memory_limit(container: Obj) -> int | None:
    """The container's memory limit in bytes; None when it has none."""
    limits = container.get("resources", {}).get("limits", {})
    return math.ceil(float(parse_quantity(limits["memory"]))) if "memory" in limits else None


# Sets RLIMIT_DATA, then becomes the command (same pid, so process-group handling is unchanged). An rlimit needs
# no root, unlike a cgroup; it is inherited by every process the Ray node starts (raylet, the ranks).
_LIMIT_AND_EXEC = (
    "import os, resource, sys; limit = int(sys.argv[1]); "
    "resource.setrlimit(resource.RLIMIT_DATA, (limit, limit)); os.execv(sys.argv[2], sys.argv[2:])"
)


def limited_command(command: list[str], memory_limit: int | None) -> list[str]:
    """`command`, run with each of its processes' data memory (heap, anonymous mappings) at most `memory_limit` bytes.

    RLIMIT_DATA bounds every process on its own, not their sum as a pod's cgroup does: a rank that allocates past
    the container's memory limit gets an allocation error (MemoryError, a failed torch allocation) instead of
    taking the machine's memory, but two ranks of one pod may use up to twice the limit together.
    """
    if memory_limit is None:
        return command
    return [sys.executable, "-c", _LIMIT_AND_EXEC, str(memory_limit), *command]


def _cpus(container: Obj, fallback: int) -> int:
    """CPUs for a local Ray node: the container's limit, and at least one per GPU it would have had."""
    limits = container.get("resources", {}).get("limits", {})
    cpus = math.ceil(float(parse_quantity(limits["cpu"]))) if "cpu" in limits else fallback
    return max(cpus, int(limits.get("nvidia.com/gpu", 0)), 1)


def _path(value: Any, *keys: str) -> Any:
    """`value[k1][k2]...`, or None where a level is missing or no mapping."""
    for key in keys:
        if not isinstance(value, dict):
            return None
        value = value.get(key)
    return value


class LocalKubeRay:
    """Plays the KubeRay controller for every RayCluster on one emulated API server."""

    def __init__(self, api_url: str, workdir: Path) -> None:
        self.api_url = api_url.rstrip("/")
        self.workdir = workdir
        self._materialized = 0  # numbers each cluster's folder: a re-created cluster never reuses one
        self.clusters: dict[tuple[str, str], LocalCluster] = {}
        self.started: list[RayNode] = []
        """Every Ray node ever started, to verify that none outlives its cluster."""
        self._teardowns: set[asyncio.Task[None]] = set()
        self._session: aiohttp.ClientSession | None = None
        self._next_ip = 2  # 127.0.0.1 stays free for the API server and the operator
        # The Ray a job runs with is the one on PATH when `ray start` ran: this interpreter's.
        self._bin = Path(sys.executable).parent

    # ------------------------------------------------------------------ API helpers

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, sock_connect=10))
        return self._session

    async def _request(
        self, method: str, path: str, body: Obj | None = None, content_type: str = "", *, allow_missing: bool = False
    ) -> Obj:
        headers = {"Content-Type": content_type or "application/json"}
        async with self.session.request(method, self.api_url + path, json=body, headers=headers) as response:
            payload: Obj = await response.json(content_type=None)
            if allow_missing and response.status == 404:
                return {}
            if response.status >= 400 and response.status != 409:
                raise RuntimeError(f"{method} {path}: {response.status} {payload.get('message', payload)}")
            return payload

    async def _patch_status(self, cluster: LocalCluster, status: Obj) -> None:
        path = f"/apis/ray.io/v1/namespaces/{cluster.namespace}/rayclusters/{cluster.name}/status"
        with contextlib.suppress(RuntimeError):  # the cluster may be gone already
            await self._request("PATCH", path, {"status": status}, "application/merge-patch+json")

    @staticmethod
    def _pod(cluster: LocalCluster, name: str, labels: dict[str, str], template: Obj) -> Obj:
        """The Pod KubeRay makes of a group's template: its spec, its labels under KubeRay's own."""
        template_meta = template.get("metadata") or {}
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": cluster.namespace,
                "labels": {**(template_meta.get("labels") or {}), **labels},
                "annotations": dict(template_meta.get("annotations") or {}),
                # As KubeRay's `ctrl.SetControllerReference` sets them: `kubectl drain` evicts only pods whose owner is
                # their controller ("cannot delete Pods that declare no controller" without `--force`).
                "ownerReferences": [
                    {
                        "apiVersion": "ray.io/v1",
                        "kind": "RayCluster",
                        "name": cluster.name,
                        "uid": cluster.uid,
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "spec": dict(template.get("spec") or {}),
        }

    async def _refused_pods(self, cluster: LocalCluster, pods: list[tuple[str, Obj]]) -> bool:
        """Ask the API server (dry run) whether it takes each pod, before any process starts. One it refuses is
        what KubeRay reports as a `FailedToCreate{Head,Worker}Pod` Warning event on the RayCluster; the cluster
        then never gets its pods (KubeRay retries, the answer does not change)."""
        base = f"/api/v1/namespaces/{cluster.namespace}/pods"
        headers = {"Content-Type": "application/json"}
        for node_type, pod in pods:
            async with self.session.post(f"{self.api_url}{base}?dryRun=All", json=pod, headers=headers) as response:
                if response.status != 422:
                    continue
                message = (await response.json(content_type=None)).get("message", "")
            event = {
                "apiVersion": "v1",
                "kind": "Event",
                "metadata": {"generateName": f"{cluster.name}.", "namespace": cluster.namespace},
                "involvedObject": {"apiVersion": "ray.io/v1", "kind": "RayCluster", "name": cluster.name,
                                   "namespace": cluster.namespace, "uid": cluster.uid},
                "reason": f"FailedToCreate{node_type.capitalize()}Pod",
                "message": f"Failed to create {node_type} Pod {cluster.namespace}/{pod['metadata']['name']}, {message}",
                "type": "Warning",
                "source": {"component": "raycluster-controller"},
                "firstTimestamp": now_rfc3339(),
                "lastTimestamp": now_rfc3339(),
                "count": 1,
            }  # fmt: skip
            with contextlib.suppress(RuntimeError):
                await self._request("POST", f"/api/v1/namespaces/{cluster.namespace}/events", event)
            log.error("RayCluster %s: the API server refused its %s pod: %s", cluster.name, node_type, message)
            return True
        return False

    async def _put_pod(
        self,
        cluster: LocalCluster,
        name: str,
        labels: dict[str, str],
        ip: str,
        ready: bool,
        template: Obj,
        restarts: int = 0,
    ) -> None:
        base = f"/api/v1/namespaces/{cluster.namespace}/pods"
        pod = self._pod(cluster, name, labels, template)
        pod["spec"]["nodeName"] = f"local-{ip}"
        # Each Ray node is a node of its own, registered as a kubelet registers its Node (409: it is there).
        await self._request("POST", "/api/v1/nodes", {"apiVersion": "v1", "kind": "Node",
                                                       "metadata": {"name": f"local-{ip}"}})  # fmt: skip
        await self._request("POST", base, pod)
        phase = "Running" if ready else "Pending"
        condition = {"type": "Ready", "status": "True" if ready else "False", "lastTransitionTime": now_rfc3339()}
        status: Obj = {"phase": phase, "podIP": ip, "hostIP": ip, "conditions": [condition]}
        if ready:
            # kubectl's READY column counts the containers whose status says ready: without them a joined worker
            # read 0/1 for the whole run while the job's WORKERS said 2/2.
            containers = [c for c in pod["spec"].get("containers") or [] if isinstance(c, dict)]
            status["containerStatuses"] = [
                {"name": str(c.get("name", "")), "image": str(c.get("image", "")), "imageID": "", "ready": True,
                 "started": True, "restartCount": restarts, "state": {"running": {"startedAt": now_rfc3339()}}}
                for c in containers
            ]  # fmt: skip
        with contextlib.suppress(RuntimeError):
            await self._request("PATCH", f"{base}/{name}/status", {"status": status}, "application/merge-patch+json")

    # ------------------------------------------------------------------ the controller loop

    async def run(self) -> None:
        """Watch RayClusters until cancelled; reconnect when a watch ends."""
        await list_then_watch(
            self.session, self.api_url, RAYCLUSTERS, self._request, self._on_event, ("ADDED", "MODIFIED", "DELETED")
        )

    def _on_event(self, kind: str, obj: Obj) -> None:
        meta = obj["metadata"]
        key = (meta["namespace"], meta["name"])
        if kind == "DELETED" or meta.get("deletionTimestamp"):
            cluster = self.clusters.pop(key, None)
            if cluster is not None:
                self._in_background(self._teardown(cluster))
            return
        current = self.clusters.get(key)
        if (obj.get("spec") or {}).get("suspend") is True:
            if current is None or not current.suspended:
                self._suspend(key, meta, current)
        elif current is None or current.suspended:
            self._materialized += 1
            workdir = self.workdir / f"c{self._materialized}"  # short: Ray socket paths max 107 bytes
            cluster = LocalCluster(meta["namespace"], meta["name"], meta.get("uid", ""), workdir)
            cluster.after = current.after if current is not None else None
            self.clusters[key] = cluster
            cluster.task = asyncio.get_running_loop().create_task(self._materialize(cluster, obj))
            cluster.task.add_done_callback(functools.partial(self._report_crash, cluster=cluster))

    def _in_background(self, work: Any) -> asyncio.Task[None]:
        task: asyncio.Task[None] = asyncio.get_running_loop().create_task(work)
        self._teardowns.add(task)
        task.add_done_callback(self._teardowns.discard)
        return task

    def _suspend(self, key: tuple[str, str], meta: Obj, running: LocalCluster | None) -> None:
        """KubeRay's suspension: the cluster's processes stop and its pods go; the state says `suspended`."""
        record = LocalCluster(meta["namespace"], meta["name"], meta.get("uid", ""), self.workdir, suspended=True)
        self.clusters[key] = record
        status = {"state": "suspended", "readyWorkerReplicas": 0, "availableWorkerReplicas": 0,
                  "lastUpdateTime": now_rfc3339()}  # fmt: skip

        async def suspend() -> None:
            if running is not None:
                if running.after is not None:
                    await running.after
                await self._teardown(running)
            await self._patch_status(record, status)

        record.after = self._in_background(suspend())

    def _report_crash(self, task: asyncio.Task[None], cluster: LocalCluster) -> None:
        """A stand-in that fails says so in the RayCluster's status, as KubeRay would, and in its log."""
        if task.cancelled() or task.exception() is None:
            return
        error = task.exception()
        log.error("RayCluster %s/%s could not be started: %r", cluster.namespace, cluster.name, error)
        status = {"state": "failed", "reason": f"local stand-in failed: {error!r}"}
        asyncio.get_running_loop().create_task(self._patch_status(cluster, status))

    # ------------------------------------------------------------------ Ray processes

    def next_node_name(self) -> str:
        """The Node of the Ray node started next (its pod's `spec.nodeName`, `_put_pod`): one per 127.0.0.N."""
        return f"local-127.0.0.{self._next_ip}"

    async def _start_node(
        self,
        cluster: LocalCluster,
        pod_name: str,
        args: list[str],
        env: dict[str, str],
        memory_limit: int | None,
        ip: str | None = None,
    ) -> RayNode:
        """A Ray node of its own process group; at `ip` (a container restarted in its pod), or at the next address."""
        if ip is None:
            ip = f"127.0.0.{self._next_ip}"
            self._next_ip += 1
        temp_dir = cluster.workdir / f"n{len(cluster.nodes)}"  # short: Ray's socket paths are length-limited
        temp_dir.mkdir(parents=True, exist_ok=True)
        log_path = cluster.workdir / f"{pod_name}.log"
        if log_path.exists():  # a restarted container: its last run's log stays readable (`kubectl logs --previous`)
            log_path.replace(log_path.with_suffix(".previous.log"))
        # The pod's Ray volume at /tmp/ray is its own: here each node's temp dir (Ray's --temp-dir below) is it.
        env = {name: pod_local(value, temp_dir) for name, value in env.items()}
        process_env = {**os.environ, **env, "PATH": f"{self._bin}{os.pathsep}{os.environ.get('PATH', '')}"}
        process_env["RAY_USAGE_STATS_ENABLED"] = "0"
        # `ray start` gives the dashboard 60 s and the dashboard its modules 30 s; on a loaded laptop or CI runner
        # they need more, and without the dashboard there is no job API: the head would fail to start.
        for name in ("RAY_DASHBOARD_STARTUP_TIMEOUT_S", "RAY_DASHBOARD_SUBPROCESS_MODULE_WAIT_READY_TIMEOUT"):
            process_env.setdefault(name, str(HEAD_START_SECONDS))
        process_env[NODE_MARKER] = str(temp_dir)
        command = [
            str(self._bin / "ray"),
            "start",
            "--block",
            f"--node-ip-address={ip}",
            f"--temp-dir={temp_dir}",
            f"--object-store-memory={OBJECT_STORE_BYTES}",
            "--disable-usage-stats",
            # Fixed default ports (52365 for the job agent) would collide between nodes on one machine.
            f"--dashboard-agent-listen-port={free_port()}",
            # A port chosen here, not by the agent itself: with a self-chosen one the head's Ray client server
            # waits for the node's record in the GCS to learn it, gives up after 30 s on a loaded machine, and
            # `ray start --block` then takes the whole head down (ray/util/client/server/proxier.py).
            f"--runtime-env-agent-port={free_port()}",
            *args,
        ]
        with log_path.open("wb") as out:
            process = await asyncio.create_subprocess_exec(
                *limited_command(command, memory_limit),
                stdout=out,
                stderr=asyncio.subprocess.STDOUT,
                env=process_env,
                start_new_session=True,
            )
        node = RayNode(pod_name, ip, process, log_path, temp_dir, env)
        cluster.nodes.append(node)
        self.started.append(node)
        return node

    async def _secrets(self, namespace: str, containers: list[Obj]) -> dict[tuple[str, str], str]:
        """The values of the Secret keys the containers reference; a missing Secret or key stays unset (a kubelet
        would not start the container; here the Ray node fails to authenticate, which shows as well)."""
        values: dict[tuple[str, str], str] = {}
        for name, key in set().union(*(secret_refs(c) for c in containers)):
            secret = await self._request("GET", f"/api/v1/namespaces/{namespace}/secrets/{name}", allow_missing=True)
            encoded = (secret.get("data") or {}).get(key)
            if encoded is not None:
                values[(name, key)] = base64.b64decode(encoded).decode()
        return values

    async def _alive_nodes(self, cluster: LocalCluster) -> list[Obj]:
        """The Ray nodes the head's dashboard lists as alive; none while it cannot say (not up yet, or an answer that
        is not its JSON: a dashboard still starting once answered 200 with an empty body)."""
        url = f"http://127.0.0.1:{cluster.dashboard_port}/api/v0/nodes?limit=1000"
        headers = {"Authorization": f"Bearer {cluster.token}"} if cluster.token else {}
        try:
            async with self.session.get(url, headers=headers, timeout=aiohttp.ClientTimeout(total=5)) as response:
                if response.status != 200:
                    return []
                payload = await response.json(content_type=None)
        except (TimeoutError, aiohttp.ClientError, ValueError):  # ValueError: a body that is no JSON
            return []
        nodes = _path(payload, "data", "result", "result")
        if not isinstance(nodes, list):
            return []
        return [n for n in nodes if isinstance(n, dict) and n.get("state") == "ALIVE"]

    async def _wait_for(
        self,
        cluster: LocalCluster,
        ips: set[str],
        deadline: float,
        head: RayNode | None = None,
        failed: Callable[[RayNode], str] | None = None,
    ) -> set[str]:
        """Wait until the Ray nodes with these IPs are alive (or their processes died, or `failed` says why one's start
        failed, or `head` died); return the alive IPs."""
        alive: set[str] = set()
        while time.monotonic() < deadline:
            latest = {n.ip: n for n in cluster.nodes}  # a restarted node's earlier process is not its state
            # Not a record of an earlier start at the IP (a node started again before the GCS saw the last one die).
            alive = {
                r["node_ip"] for r in await self._alive_nodes(cluster) if _since(r, latest.get(r["node_ip"]))
            } & ips
            # A node that joined is past its start: only its process's end counts then.
            dead = [n for ip, n in latest.items() if ip in ips and ended(n, None if ip in alive else failed)]
            if alive == ips or dead or (head is not None and head_death(head)):
                break
            await asyncio.sleep(0.5)
        return alive

    async def _joined(
        self,
        cluster: LocalCluster,
        nodes: list[RayNode],
        start_again: Callable[[str, str], Awaitable[RayNode]],
        seconds: float,
        head: RayNode | None = None,
        restarts: dict[str, int] | None = None,
        failed: Callable[[RayNode], str] | None = None,
    ) -> set[str]:
        """The IPs of `nodes` alive in Ray, once all are (or `head` died, or `seconds` passed); `nodes` ends with
        the processes that run, and `restarts` (pod name -> starts after its first) with each node's count.

        A node whose `ray start` exits before it joined is started again in its pod, at its IP, as the kubelet
        restarts a container that exited (the pod's `restartPolicy` is `Always` by default; "Container restart
        policy", https://kubernetes.io/docs/concepts/workloads/pods/pod-lifecycle/#restart-policy), after the
        kubelet's back-off (10 s, doubled each time). On a loaded machine a node's agents can start too slowly for
        its raylet, which then exits ("Timed out waiting for file .../metrics_agent_port_*"), or the raylet can
        register later than the 30 s `ray start` waits for it ("The current node timed out during startup").
        Each start has `seconds` to join (a start on a loaded machine can take minutes); each node is started again
        at most NODE_RESTARTS times, counted per node as the kubelet counts a container's restarts (one node's
        restarts never use up another's), and the wait goes on for the nodes still starting after one gave up.

        With `failed` (the head's start, `start_error`) a start also ends when its own logs say it failed, and one whose
        failure a new start would not mend (MENDED_BY_A_NEW_START) ends the wait at once: a head that cannot start is
        said in seconds, not after four back-offs or HEAD_START_SECONDS."""
        deadline = time.monotonic() + seconds
        restarts = {} if restarts is None else restarts
        for node in nodes:
            restarts.setdefault(node.pod_name, 0)
        given_up: set[str] = set()
        while True:
            starting = {n.ip for n in nodes if n.pod_name not in given_up}
            alive = await self._wait_for(cluster, starting, deadline, head=head, failed=failed)
            if head is not None and head_death(head):
                return alive
            exited = [n for n in nodes if n.ip in starting - alive and ended(n, failed)]
            if failed is not None and any(not mended_by_a_new_start(failed(n)) for n in exited):
                return alive  # it would fail again: said now (the caller reads why), not after the back-offs
            newly_given_up = {n.pod_name for n in exited if restarts[n.pod_name] == NODE_RESTARTS}
            given_up |= newly_given_up
            again = [n for n in exited if n.pod_name not in given_up]
            if not again:
                if newly_given_up:
                    continue  # the others may still join
                return alive
            for node in again:
                log.warning("Ray node %s exited before it joined (%s); starting it again", node.pod_name,
                            node.log_path)  # fmt: skip
            await _start_again(again, nodes, start_again, restarts)
            deadline = max(deadline, time.monotonic() + seconds)

    async def _materialize(self, cluster: LocalCluster, rc: Obj) -> None:
        if cluster.after is not None:
            await cluster.after  # a suspension's teardown deletes pods of the names made again below
        spec = rc["spec"]
        cluster.manifest = rc
        head_group, (group, *_) = spec["headGroupSpec"], spec["workerGroupSpecs"]
        replicas = int(group.get("replicas", 1))
        base_labels = {"ray.io/cluster": cluster.name, **rc["metadata"].get("labels", {})}
        cluster.dashboard_port, cluster.gcs_port = free_port(), free_port()
        await self._patch_status(
            cluster,
            # state: null: no longer `suspended` (nor anything else) until the pods are ready again.
            {"desiredWorkerReplicas": replicas, "readyWorkerReplicas": 0, "availableWorkerReplicas": 0,
             "minWorkerReplicas": replicas, "maxWorkerReplicas": replicas, "lastUpdateTime": now_rfc3339(),
             "state": None},
        )  # fmt: skip

        head_name = f"{cluster.name}-head-{cluster.uid[:5] or 'local'}"
        head_labels = {**base_labels, "ray.io/node-type": "head"}
        labels = {**base_labels, "ray.io/node-type": "worker", "ray.io/group": group["groupName"]}
        worker_names = [f"{cluster.name}-{group['groupName']}-worker-{i:05d}"[-63:] for i in range(replicas)]
        planned = [("head", self._pod(cluster, head_name, head_labels, head_group["template"]))]
        planned += [("worker", self._pod(cluster, name, labels, group["template"])) for name in worker_names[:1]]
        if await self._refused_pods(cluster, planned):
            return
        head_container = head_group["template"]["spec"]["containers"][0]
        worker_container = group["template"]["spec"]["containers"][0]
        secrets = await self._secrets(cluster.namespace, [head_container, worker_container])
        head_env = _container_env(head_container, head_name, self.next_node_name(), secrets)
        if head_env.get("RAY_AUTH_MODE") == "token":
            cluster.token = head_env.get("RAY_AUTH_TOKEN", "")

        async def start_head(pod_name: str, ip: str | None = None) -> RayNode:
            if ip is not None:
                # A restart: new ports (a pod has its own; here every pod shares the machine's). The earlier start's
                # dashboard port was found taken at restarts in a slow run beside other Ray clusters ("Failed to bind
                # to 127.0.0.1:PORT because it's already occupied", at each of four restarts).
                cluster.dashboard_port, cluster.gcs_port = free_port(), free_port()
            head_args = [
                "--head",
                "--num-cpus=0",
                "--num-gpus=0",
                f"--port={cluster.gcs_port}",
                "--include-dashboard=true",
                "--dashboard-host=127.0.0.1",
                f"--dashboard-port={cluster.dashboard_port}",
                f"--ray-client-server-port={free_port()}",
            ]
            return await self._start_node(cluster, pod_name, head_args, head_env, _memory_limit(head_container), ip)

        heads = [await start_head(head_name)]
        await self._put_pod(cluster, head_name, head_labels, heads[0].ip, ready=False, template=head_group["template"])
        head_up = await self._joined(cluster, heads, start_head, HEAD_START_SECONDS, failed=start_error)
        head = heads[0]
        if not head_up:
            why = start_error(head) or f"not up within {HEAD_START_SECONDS} s"  # the head's own words first
            cluster.failure = f"the Ray head of RayCluster {cluster.name} did not start: {why}; see {head.log_path}"
            log.error("%s", cluster.failure)
            await self._patch_status(cluster, {"state": "failed", "reason": f"head did not start: {why}"})
            return
        await self._put_pod(cluster, head_name, head_labels, head.ip, ready=True, template=head_group["template"])
        head_status = {"podIP": head.ip, "serviceIP": "127.0.0.1", "podName": head_name,
                       "serviceName": f"{cluster.name}-head-svc"}  # fmt: skip
        endpoints = {"dashboard": str(cluster.dashboard_port), "gcs-server": str(cluster.gcs_port)}
        await self._patch_status(cluster, {"head": head_status, "endpoints": endpoints})

        cpus = _cpus(worker_container, 1)
        worker_args = [f"--address={head.ip}:{cluster.gcs_port}", f"--num-cpus={cpus}", "--num-gpus=0"]

        async def start_worker(pod_name: str, ip: str | None = None) -> RayNode:
            env = _container_env(worker_container, pod_name, self.next_node_name() if ip is None else f"local-{ip}",
                                 secrets)  # fmt: skip
            return await self._start_node(cluster, pod_name, worker_args, env, _memory_limit(worker_container), ip)

        workers = [await start_worker(pod_name) for pod_name in worker_names]
        for worker in workers:
            await self._put_pod(cluster, worker.pod_name, labels, worker.ip, ready=False, template=group["template"])
        restarts: dict[str, int] = {}
        alive = await self._joined(cluster, workers, start_worker, WORKER_JOIN_SECONDS, head=head, restarts=restarts)
        if why := head_death(head):
            # The head died while the workers joined: said now, not after the workers' wait runs out.
            await self._report_head_death(cluster, head, why)
            return
        pods = _WorkerPods(labels, group["template"], worker_container.get("name", "ray-worker"), replicas)
        await self._report_workers(cluster, rc, pods, workers, alive, restarts)
        # Watched from here on, after the first write of HeadPodReady=True (a head that died earlier is seen at once).
        cluster.head_watch = asyncio.get_running_loop().create_task(self.watch_head(cluster, head))
        # A worker still starting when its wait ran out (running, not joined) may join later: its pod turns Ready
        # then, as its readiness probe would pass, and KubeRay counts it. Waited for here, then kept (_keep_workers).
        keeping = _Keeping(rc, pods, workers, alive, restarts, start_worker, head)
        while await self._tend_workers(cluster, keeping):
            if head_death(head):
                return  # the head's watch says so
        cluster.worker_watch = asyncio.get_running_loop().create_task(self._keep_workers(cluster, keeping))

    async def _keep_workers(self, cluster: LocalCluster, keeping: _Keeping) -> None:
        """The worker pods after every one joined or gave up, until the head or the cluster goes, as the kubelet keeps
        a pod's container: a worker whose Ray process exits after it joined is started again in its pod
        (restartPolicy Always, the default, which the rendered pods keep; "Container restarts",
        https://kubernetes.io/docs/concepts/workloads/pods/pod-lifecycle/#container-restarts), see _tend_workers."""
        while not head_death(keeping.head):
            if await self._tend_workers(cluster, keeping):
                continue
            running = [asyncio.ensure_future(w.process.wait()) for w in keeping.workers if w.process.returncode is None]
            if not running:
                return  # every worker used up its restarts or was stopped
            _, waiting = await asyncio.wait(running, timeout=WORKER_WATCH_SECONDS, return_when=asyncio.FIRST_COMPLETED)
            for task in waiting:
                task.cancel()

    async def _tend_workers(self, cluster: LocalCluster, keeping: _Keeping) -> bool:
        """One round of keeping the worker pods; False when there is nothing to do (each worker joined and runs, or
        gave up). Workers whose Ray process exited after they joined are containers that exited: started again in
        their pods after the kubelet's back-off, each pod not Ready until its node joined again, restarts counted on
        (CrashLoopBackOff once NODE_RESTARTS are used up). Here a port another node took between its choice and its
        bind ends a node so, seconds after it joined ("Address already in use" from its runtime env agent; on a
        cluster each pod has its own ports). A node this stand-in stopped on purpose (its pod deleted:
        `cluster/kubelet.py`) is not started again. Else the workers still starting are waited for."""
        rc, pods, workers, alive, restarts = keeping.rc, keeping.pods, keeping.workers, keeping.alive, keeping.restarts
        start_worker, head = keeping.start_worker, keeping.head
        exited = [w for w in workers if w.ip in alive and w.process.returncode is not None and not w.stopping]
        late = [w for w in workers if w.ip not in alive and w.process.returncode is None]
        if exited:
            for node in exited:
                log.warning("Ray node %s exited after it joined (%s)", node.pod_name, node.log_path)
                alive.discard(node.ip)
                pods.ready.discard(node.pod_name)
                count, code = restarts[node.pod_name] + 1, node.process.returncode
                status = pod_status.restarted(pods.container, code, count, now_rfc3339())
                await self._patch_pod_status(cluster, node.pod_name, status)
            await _start_again(
                [n for n in exited if restarts[n.pod_name] < NODE_RESTARTS], workers, start_worker, restarts
            )
            await self._report_workers(cluster, rc, pods, workers, alive, restarts)
            return True
        if not late:
            return False
        joined = await self._joined(cluster, late, start_worker, WORKER_JOIN_SECONDS, head=head, restarts=restarts)
        started = {n.pod_name: n for n in late}  # `_joined` replaced the ones it started again
        workers[:] = [started.get(w.pod_name, w) for w in workers]
        if joined or any(w.process.returncode is not None for w in late):
            alive |= joined
            await self._report_workers(cluster, rc, pods, workers, alive, restarts)
        return True

    async def _report_workers(
        self,
        cluster: LocalCluster,
        rc: Obj,
        pods: _WorkerPods,
        workers: list[RayNode],
        alive: set[str],
        restarts: dict[str, int],
    ) -> None:
        """The worker pods as the kubelet shows them (Ready once joined; CrashLoopBackOff once a node used up its
        restarts) and the RayCluster's status as KubeRay counts them: `ready` when every worker is."""
        for worker in workers:
            if worker.ip in alive and worker.pod_name not in pods.ready:
                pod, ip = worker.pod_name, worker.ip
                restarted = restarts.get(pod, 0)
                await self._put_pod(
                    cluster, pod, pods.labels, ip, ready=True, template=pods.template, restarts=restarted
                )
                pods.ready.add(pod)
            elif worker.ip not in alive and worker.process.returncode is not None and worker.pod_name not in pods.held:
                # It used up its restarts.
                await self._report_crash_loop(cluster, worker, pods.container, restarts.get(worker.pod_name, 0))
                pods.held.add(worker.pod_name)
        ready = len(alive)
        state = {"state": "ready"} if ready == pods.replicas else {}
        conditions = [
            {"type": "HeadPodReady", "status": "True", "reason": "HeadPodRunningAndReady",
             "lastTransitionTime": now_rfc3339()},
            {"type": "RayClusterProvisioned", "status": "True" if ready == pods.replicas else "False",
             "reason": "AllPodRunningAndReadyFirstTime" if ready == pods.replicas else "RayClusterPodsProvisioning",
             "lastTransitionTime": now_rfc3339()},
        ]  # fmt: skip
        await self._patch_status(
            cluster,
            {**state, "readyWorkerReplicas": ready, "availableWorkerReplicas": ready, "conditions": conditions,
             "observedGeneration": rc["metadata"].get("generation", 1), "lastUpdateTime": now_rfc3339()},
        )  # fmt: skip

    async def watch_head(self, cluster: LocalCluster, head: RayNode) -> None:
        """When the head's Ray process exits, say so as a kubelet and KubeRay would: the pod's container terminated
        and the pod not Ready (phase Failed: this stand-in restarts nothing, like restartPolicy: Never), and the
        RayCluster's HeadPodReady condition False with the pod's reason (KubeRay copies the head pod's Ready
        condition into it). Without this the head would stay Ready, and Ray's job API would just stop answering."""
        while not (why := head_death(head)):
            # Its process exiting, or its fatal log line: `ray start --block` takes a while to stop the rest of a
            # head whose GCS died, and a loaded machine longer; the fatal line is the moment it is gone.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(head.process.wait()), HEAD_WATCH_SECONDS)
        await self._report_head_death(cluster, head, why)

    async def _report_crash_loop(self, cluster: LocalCluster, node: RayNode, container: str, restarts: int) -> None:
        """A node that exited at each of its starts, as the kubelet shows a container it keeps restarting: the pod
        Running and not Ready, the container waiting in CrashLoopBackOff with its restarts and last exit ("Container
        restarts", https://kubernetes.io/docs/concepts/workloads/pods/pod-lifecycle/#container-restarts). This
        stand-in starts it no more."""
        # The kubelet's words, and where this stand-in keeps the node's log (what `kubectl logs --previous` shows).
        message = f"back-off 5m0s restarting failed container={container} pod={node.pod_name}_{cluster.namespace}"
        message += f" (its log: {node.log_path})"
        status = pod_status.crash_loop(container, node.process.returncode, restarts, message, now_rfc3339())
        await self._patch_pod_status(cluster, node.pod_name, status)

    async def _patch_pod_status(self, cluster: LocalCluster, pod_name: str, status: Obj) -> None:
        path = f"/api/v1/namespaces/{cluster.namespace}/pods/{pod_name}/status"
        with contextlib.suppress(RuntimeError, aiohttp.ClientError):
            await self._request("PATCH", path, {"status": status}, "application/merge-patch+json")

    async def _report_head_death(self, cluster: LocalCluster, head: RayNode, why: str) -> None:
        """The head pod Failed and not Ready, the RayCluster's HeadPodReady False, `cluster.failure` set."""
        code = head.process.returncode
        cluster.failure = f"the Ray head of RayCluster {cluster.name} {why}; see {head.log_path}"
        log.error("%s", cluster.failure)
        message = f"containers with unready status: [ray-head] (Ray {why}; see {head.log_path})"
        now = now_rfc3339()
        await self._patch_pod_status(cluster, head.pod_name, pod_status.failed("ray-head", code, message, now))
        rc = await self._request(
            "GET", f"/apis/ray.io/v1/namespaces/{cluster.namespace}/rayclusters/{cluster.name}", allow_missing=True
        )
        conditions = [c for c in (rc.get("status") or {}).get("conditions") or [] if c.get("type") != "HeadPodReady"]
        conditions.insert(0, {"type": "HeadPodReady", "status": "False", "reason": "ContainersNotReady",
                              "message": message, "lastTransitionTime": now})  # fmt: skip
        await self._patch_status(cluster, {"conditions": conditions, "lastUpdateTime": now})

    async def _teardown(self, cluster: LocalCluster) -> None:
        for task in (cluster.head_watch, cluster.worker_watch, cluster.task):
            if task is not None and not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        await stop_nodes(cluster.nodes)
        for node in cluster.nodes:
            with contextlib.suppress(RuntimeError, aiohttp.ClientError):
                # Forced (grace 0): its processes are stopped already, there is nothing left to terminate gracefully.
                path = f"/api/v1/namespaces/{cluster.namespace}/pods/{node.pod_name}?gracePeriodSeconds=0"
                await self._request("DELETE", path)

    def failures(self) -> list[str]:
        """Why heads of current clusters are gone (see LocalCluster.failure)."""
        return [c.failure for c in self.clusters.values() if c.failure]

    @property
    def busy(self) -> bool:
        """Clusters exist, or some are still being torn down."""
        return bool(self.clusters or self._teardowns)

    async def close(self) -> None:
        """Finish teardowns in flight, stop every remaining cluster's processes, then the HTTP session."""
        clusters, self.clusters = list(self.clusters.values()), {}
        await asyncio.gather(*self._teardowns, *(self._teardown(c) for c in clusters))
        # Belt and braces: nothing this stand-in started may outlive it.
        await stop_nodes([n for n in self.started if marked_processes(n.marker)])
        if self._session is not None:
            await self._session.close()
            self._session = None


async def _start_again(
    again: list[RayNode],
    nodes: list[RayNode],
    start: Callable[[str, str], Awaitable[RayNode]],
    restarts: dict[str, int],
) -> None:
    """Start each of `again` again in its pod, at its IP, after the kubelet's back-off (10 s, doubled at each restart
    of the container, at most five minutes): what it left of its group stopped, its entry in `nodes` replaced, its
    restarts counted."""
    if not again:
        return
    backoff = WORKER_RESTART_BACKOFF_SECONDS * 2 ** max(restarts[n.pod_name] for n in again)
    await asyncio.sleep(min(backoff, MAX_RESTART_BACKOFF_SECONDS))
    for node in again:
        await stop_nodes([node])  # what it left of its group (an agent, a raylet)
        nodes[nodes.index(node)] = await start(node.pod_name, node.ip)
        restarts[node.pod_name] += 1


async def stop_nodes(nodes: list[RayNode]) -> None:
    """SIGTERM each node's process group, then SIGKILL what is left after a grace period."""
    for node in nodes:
        node.stopping = True
        with contextlib.suppress(ProcessLookupError):
            os.killpg(node.pgid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_SECONDS
    for node in nodes:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(node.process.wait(), max(0.1, deadline - time.monotonic()))
    for node in nodes:
        # Ray's daemons (gcs_server, raylet) share the group and can outlive `ray start`.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(node.pgid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError, ChildProcessError):
            await node.process.wait()
        # Ray's worker processes start sessions of their own; they still carry the node's marker.
        kill_marked(node.marker)
