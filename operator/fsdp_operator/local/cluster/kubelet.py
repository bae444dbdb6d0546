"""The kubelet's side of deleting a pod, for the pods of the local KubeRay stand-in, and KubeRay making it again.

With `Store.graceful_pods` the emulated API server deletes a pod on a node gracefully (`store.Store._terminating`):
it sets `deletionTimestamp` and `deletionGracePeriodSeconds` and keeps the pod. This stand-in watches pods and
does what the Kubernetes documentation says the kubelet then does (Pod Lifecycle, "Termination of Pods",
https://kubernetes.io/docs/concepts/workloads/pods/pod-lifecycle/#pod-termination; Container Lifecycle Hooks,
https://kubernetes.io/docs/concepts/containers/container-lifecycle-hooks/):

1. "If one of the Pod's containers has defined a preStop hook ... the kubelet runs that hook inside of the
   container": the `exec` command runs with the container's environment (`RayNode.env`), in a session of its own.
   "The Pod's termination grace period countdown begins before the PreStop hook is executed": the hook may run for
   the grace period; "If the preStop hook is still running after the grace period expires, the kubelet requests a
   small, one-off grace period extension of 2 seconds", after which it is killed.
2. "The kubelet triggers the container runtime to send a TERM signal to process 1 inside each container": SIGTERM
   to the Ray node's process group; "If any of the containers or processes are still running after the grace
   period expires, the kubelet triggers forcible shutdown ... SIGKILL".
3. "The kubelet transitions the Pod into a terminal phase (Failed or Succeeded ...)" and "triggers forcible removal
   of Pod object from the API server, by setting grace period to 0 (immediate deletion)".

Then KubeRay (whose worker group keeps `replicas` pods) makes the worker pod again: a new Ray node on a new
127.0.0.N address, under the same pod name (KubeRay draws a new suffix; the stand-in's names are fixed).

What differs from a container: no PID or mount namespace. `ray stop` in a hook would stop every Ray on this
machine, so the hook's PATH starts with a `ray` whose `stop` stops this node's process group only; a path under the
pod's own Ray volume (/tmp/ray) is the node's temp dir (`kuberay.pod_local`). A pod this stand-in runs no process
for (its cluster gone) is removed at once. While a pod terminates, KubeRay counts it out of the ready workers
(`readyWorkerReplicas`), as its Ray node is about to go.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from pathlib import Path
from typing import Any

import aiohttp

from fsdp_operator.local.cluster.kuberay import (
    LocalCluster,
    LocalKubeRay,
    RayNode,
    _container_env,
    _cpus,
    _memory_limit,
    now_rfc3339,
)
from fsdp_operator.local.cluster.processes import kill_marked
from fsdp_operator.local.cluster.watching import list_then_watch

log = logging.getLogger(__name__)

Obj = dict[str, Any]

PODS = "/api/v1/pods"
HOOK_EXTENSION_SECONDS = 2.0
"""The one-off extension of the grace period a hook still running gets (Pod Lifecycle, "Termination of Pods")."""
DEFAULT_GRACE_SECONDS = 30
MAKE_AGAIN_TRIES = 3

# `ray stop` for one node: a container's `ray stop` sees only its own processes.
_RAY_SHIM = """#!/bin/sh
if [ "$1" = stop ]; then kill -TERM -- -{pgid} 2>/dev/null; exit 0; fi
exec {ray} "$@"
"""


class LocalKubelet:
    """Finishes the graceful deletion of the stand-in's pods: preStop hook, TERM, KILL, removal; then a new pod."""

    def __init__(self, kuberay: LocalKubeRay) -> None:
        self.kuberay = kuberay
        self.terminating: dict[str, asyncio.Task[None]] = {}
        """Pod uid -> its termination, started once per pod."""
        self.hooks: list[tuple[str, int, float]] = []
        """(pod, hook exit status, seconds) of every preStop hook run: what the tests read."""

    async def run(self) -> None:
        """Watch pods until cancelled; reconnect when a watch ends."""
        await list_then_watch(
            self.kuberay.session,
            self.kuberay.api_url,
            PODS,
            self.kuberay._request,
            lambda _type, pod: self._on_pod(pod),
            ("ADDED", "MODIFIED"),
        )

    def _on_pod(self, pod: Obj) -> None:
        meta = pod.get("metadata") or {}
        uid = str(meta.get("uid", ""))
        if not meta.get("deletionTimestamp") or uid in self.terminating:
            return
        task = asyncio.get_running_loop().create_task(self.terminate(pod))
        self.terminating[uid] = task

    def _node_of(self, pod: Obj) -> tuple[LocalCluster, RayNode] | None:
        meta = pod["metadata"]
        for cluster in self.kuberay.clusters.values():
            if cluster.namespace != meta.get("namespace"):
                continue
            for node in cluster.nodes:
                if node.pod_name == meta.get("name") and node.process.returncode is None:
                    return cluster, node
        return None

    async def terminate(self, pod: Obj) -> None:
        meta = pod["metadata"]
        namespace, name = meta.get("namespace", ""), meta.get("name", "")
        path = f"/api/v1/namespaces/{namespace}/pods/{name}"
        found = self._node_of(pod)
        if found is None:  # no container runs for it here: nothing to stop
            with contextlib.suppress(RuntimeError, aiohttp.ClientError):
                await self.kuberay._request("DELETE", f"{path}?gracePeriodSeconds=0", allow_missing=True)
            return
        cluster, node = found
        grace = meta.get("deletionGracePeriodSeconds")
        grace = grace if isinstance(grace, int) and grace >= 0 else DEFAULT_GRACE_SECONDS
        deadline = time.monotonic() + grace
        worker = (meta.get("labels") or {}).get("ray.io/node-type") == "worker"
        if worker:
            await self._count_ready(cluster, leaving=name)
        container = ((pod.get("spec") or {}).get("containers") or [{}])[0]
        command = (((container.get("lifecycle") or {}).get("preStop") or {}).get("exec") or {}).get("command")
        if isinstance(command, list) and command:
            await self._run_hook(node, [str(part) for part in command], deadline + HOOK_EXTENSION_SECONDS)
        await self._stop(node, deadline)
        code = node.process.returncode
        status = {"phase": "Failed" if code else "Succeeded",
                  "conditions": [{"type": "Ready", "status": "False", "reason": "PodCompleted",
                                  "lastTransitionTime": now_rfc3339()}]}  # fmt: skip
        with contextlib.suppress(RuntimeError, aiohttp.ClientError):
            await self.kuberay._request("PATCH", f"{path}/status", {"status": status}, "application/merge-patch+json")
            await self.kuberay._request("DELETE", f"{path}?gracePeriodSeconds=0", allow_missing=True)
        if worker and cluster is self.kuberay.clusters.get((namespace, cluster.name)):
            await self._make_again(cluster, node)

    async def _run_hook(self, node: RayNode, command: list[str], deadline: float) -> None:
        shim_dir = node.temp_dir / "hook-bin"
        started = time.monotonic()
        try:
            shim_dir.mkdir(parents=True, exist_ok=True)
            shim = shim_dir / "ray"
            shim.write_text(_RAY_SHIM.format(pgid=node.pgid, ray=self.kuberay._bin / "ray"))
            shim.chmod(0o755)
            env = {**os.environ, **node.env, "PATH": f"{shim_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
            out = (node.temp_dir / "prestop.log").open("ab")
        except OSError as e:  # the hook cannot run: as a kubelet, the container is still stopped
            log.warning("pod %s: preStop hook could not start: %s", node.pod_name, e)
            self.hooks.append((node.pod_name, -1, 0.0))
            return
        try:
            process = await asyncio.create_subprocess_exec(
                *command, stdout=out, stderr=asyncio.subprocess.STDOUT, env=env, start_new_session=True
            )
        except OSError as e:
            out.close()
            log.warning("pod %s: preStop hook could not start: %s", node.pod_name, e)
            self.hooks.append((node.pod_name, -1, 0.0))
            return
        try:
            await asyncio.wait_for(process.wait(), max(deadline - time.monotonic(), 0.1))
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            await process.wait()
        finally:
            out.close()
        self.hooks.append((node.pod_name, process.returncode or 0, round(time.monotonic() - started, 2)))

    async def _stop(self, node: RayNode, deadline: float) -> None:
        node.stopping = True  # the pod is deleted: no crash for KubeRay's stand-in to start again
        with contextlib.suppress(ProcessLookupError):
            os.killpg(node.pgid, signal.SIGTERM)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(node.process.wait(), max(deadline - time.monotonic(), 0.1))
        with contextlib.suppress(ProcessLookupError):
            os.killpg(node.pgid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError, ChildProcessError):
            await node.process.wait()
        kill_marked(node.marker)  # Ray's workers start sessions of their own; they carry the node's marker

    async def _count_ready(self, cluster: LocalCluster, leaving: str = "") -> None:
        """`readyWorkerReplicas`: the worker nodes whose process runs, but for the one leaving."""
        workers = [n for n in cluster.nodes if "-head-" not in n.pod_name]
        ready = sum(1 for n in workers if n.process.returncode is None and n.pod_name != leaving)
        status = {"readyWorkerReplicas": ready, "availableWorkerReplicas": ready, "lastUpdateTime": now_rfc3339()}
        await self.kuberay._patch_status(cluster, status)

    async def _make_again(self, cluster: LocalCluster, gone: RayNode) -> None:
        """KubeRay's worker group keeps its replicas: the pod is made again, on a new Ray node; one whose Ray does
        not come up (`ray start` timing out on a loaded machine) is replaced in turn, as KubeRay replaces a failed
        worker pod, a few times."""
        for _ in range(MAKE_AGAIN_TRIES):
            node = await self._make_once(cluster, gone)
            if node is None or node.process.returncode is None:
                return
            await self._stop(node, time.monotonic())  # what its failed start left behind
            await self.kuberay._request(
                "DELETE", f"/api/v1/namespaces/{cluster.namespace}/pods/{gone.pod_name}?gracePeriodSeconds=0",
                allow_missing=True,
            )  # fmt: skip

    async def _make_once(self, cluster: LocalCluster, gone: RayNode) -> RayNode | None:
        spec = cluster.manifest.get("spec") or {}
        head = next((n for n in cluster.nodes if "-head-" in n.pod_name and n.process.returncode is None), None)
        groups = spec.get("workerGroupSpecs") or []
        if head is None or not groups:
            return None
        group = groups[0]
        template = group["template"]
        container = template["spec"]["containers"][0]
        base = {"ray.io/cluster": cluster.name, **(cluster.manifest.get("metadata") or {}).get("labels", {})}
        labels = {**base, "ray.io/node-type": "worker", "ray.io/group": group["groupName"]}
        secrets = await self.kuberay._secrets(cluster.namespace, [container])
        env = _container_env(container, gone.pod_name, self.kuberay.next_node_name(), secrets)
        node = await self.kuberay._start_node(
            cluster,
            gone.pod_name,
            [f"--address={head.ip}:{cluster.gcs_port}", f"--num-cpus={_cpus(container, 1)}", "--num-gpus=0"],
            env,
            _memory_limit(container),
        )
        await self.kuberay._put_pod(cluster, node.pod_name, labels, node.ip, ready=False, template=template)
        alive = await self.kuberay._wait_for(cluster, {node.ip}, time.monotonic() + 120, head=head)
        if node.ip in alive:
            await self.kuberay._put_pod(cluster, node.pod_name, labels, node.ip, ready=True, template=template)
        await self._count_ready(cluster)
        return node

    async def close(self) -> None:
        for task in self.terminating.values():
            task.cancel()
        for task in self.terminating.values():
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


def hook_log(node: RayNode) -> str:
    """What a node's preStop hooks printed."""
    path = Path(node.temp_dir) / "prestop.log"
    return path.read_text(errors="replace") if path.exists() else ""
