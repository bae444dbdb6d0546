"""A test-side KubeRay: plays the RayCluster controller against the emulated API server, over HTTP.

Level-triggered and task-free (an in-process kopf cancels tasks it did not see at startup): the test's
world loop calls `sync()` every tick. For each RayCluster it writes the status KubeRay writes (desired
and ready worker counts, `state: ready`, head service IP and dashboard endpoint), creates the head and
worker pods from the groups' templates (a pod the API server refuses is a `FailedToCreate*Pod` Warning event
on the RayCluster, as KubeRay reports it), and registers the cluster's nodes with the `FakeRay` that plays
Ray. Knobs make the workers slow, never ready, or unschedulable (Pending pods with the scheduler's
FailedScheduling event).

`spec.suspend: true` (KubeRay's RayClusterSpec: "A suspended RayCluster will have head pods and worker pods
deleted"; the state it writes is `suspended`): a cluster created suspended gets no pods, and suspending a running
one deletes its pods and takes its Ray away (its jobs with it); `suspend: false` creates them again.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from fsdp_operator.api.spec import parse_quantity
from fsdp_operator.runtime.rayjobs import FakeRay, RayNodes

from support.background import every

Obj = dict[str, Any]
RAYCLUSTERS = "/apis/ray.io/v1/rayclusters"
REQUEST_SECONDS = 10.0
"""A request unanswered this long is given up and the pass is tried again on the next tick, as KubeRay's client
(client-go, with a timeout) and its controller's requeue do. Rarely, a request to the emulated API server in the
kill-and-restart tests was never answered (the server held no handler for it; aiohttp 3.14's server, cause not
found): without a timeout this loop waited on it for ever and the test's cluster never got ready."""


@dataclass
class _Cluster:
    namespace: str
    name: str
    uid: str
    address: str
    service_ip: str
    created: float
    pods: list[str] = field(default_factory=list)
    failed: bool = False
    """A pod create was refused: the cluster never gets ready (KubeRay retries; nothing changes)."""
    ready: bool = False
    suspended: bool = False


class RefusedError(RuntimeError):
    """The API server refused an object as invalid (422); the message is the server's."""


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


class FakeKubeRay:
    def __init__(self, api_url: str, ray: FakeRay) -> None:
        self.api_url = api_url.rstrip("/")
        self.ray = ray
        self.ready_delay = 0.0
        """Seconds between seeing a cluster and its workers being ready."""
        self.never_ready = False
        """Worker pods are scheduled but never become ready."""
        self.unschedulable = ""
        """When set, worker pods stay Pending with this scheduler message."""
        self.worker_container_status: Obj | None = None
        """When set, worker pods run and never become ready, with this as their container's status (the kubelet's
        CrashLoopBackOff, ImagePullBackOff)."""
        self.seen_uids: list[str] = []
        """Every RayCluster (by uid) this controller ever saw: the duplicate check counts these."""
        self.clusters: dict[str, _Cluster] = {}
        self.headers: dict[str, str] = {}
        """Sent with every request (an `Authorization` header where the API server enforces RBAC)."""
        self._session: aiohttp.ClientSession | None = None

    async def _request(
        self, method: str, path: str, body: Obj | None = None, content_type: str = "", *, exists_ok: bool = False
    ) -> Obj:
        """One request; `exists_ok`: a create answered 409 (a retried create whose first answer was lost) is done."""
        assert self._session is not None, "use `async with kuberay.running()`"
        headers = {"Content-Type": content_type or "application/json"}
        timeout = aiohttp.ClientTimeout(total=REQUEST_SECONDS)
        async with self._session.request(method, self.api_url + path, json=body, headers=headers, timeout=timeout) as r:
            payload: Obj = await r.json(content_type=None) if r.content_length != 0 else {}
            if r.status == 422:
                raise RefusedError(str(payload.get("message")))
            if r.status == 409 and exists_ok:
                return payload
            if r.status >= 400 and r.status != 404:
                raise RuntimeError(f"{method} {path}: {r.status} {payload.get('message')}")
            return payload

    async def _patch_status(self, c: _Cluster, status: Obj) -> None:
        path = f"/apis/ray.io/v1/namespaces/{c.namespace}/rayclusters/{c.name}/status"
        await self._request("PATCH", path, {"status": status}, "application/merge-patch+json")

    async def _pod(
        self, c: _Cluster, name: str, labels: dict[str, str], status: Obj, template: Obj | None = None
    ) -> bool:
        """Create the pod from its group's template (as KubeRay does) once, then write its status.

        A create the API server refuses is what KubeRay reports as a Warning event on the RayCluster
        (`FailedToCreateHeadPod` / `FailedToCreateWorkerPod`); the pod is then never there. False then."""
        base = f"/api/v1/namespaces/{c.namespace}/pods"
        if name not in c.pods:
            template = template or {"spec": {"containers": [{"name": "ray", "image": "fake"}]}}
            template_meta = template.get("metadata") or {}
            pod = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": name,
                    "namespace": c.namespace,
                    "labels": {**(template_meta.get("labels") or {}), **labels},
                    "annotations": dict(template_meta.get("annotations") or {}),
                    "ownerReferences": [
                        {
                            "apiVersion": "ray.io/v1",
                            "kind": "RayCluster",
                            "name": c.name,
                            "uid": c.uid,
                            "controller": True,
                        }
                    ],
                },
                "spec": copy.deepcopy(template["spec"]),
            }
            try:
                await self._request("POST", base, pod, exists_ok=True)
            except RefusedError as e:
                c.failed = True
                node_type = "head" if labels.get("ray.io/node-type") == "head" else "worker"
                await self._cluster_event(
                    c,
                    f"FailedToCreate{node_type.capitalize()}Pod",
                    f"Failed to create {node_type} Pod {c.namespace}/{name}, {e}",
                )
                return False
            c.pods.append(name)
        await self._request("PATCH", f"{base}/{name}/status", {"status": status}, "application/merge-patch+json")
        return True

    async def _cluster_event(self, c: _Cluster, reason: str, message: str) -> None:
        involved = {
            "kind": "RayCluster",
            "name": c.name,
            "namespace": c.namespace,
            "apiVersion": "ray.io/v1",
            "uid": c.uid,
        }
        await self._warn(c, c.name, involved, reason, message, "raycluster-controller")

    async def _warn(self, c: _Cluster, about: str, involved: Obj, reason: str, message: str, component: str) -> None:
        """A Warning Event about `involved` (named `about`), as `component` of a cluster posts one."""
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{about}.", "namespace": c.namespace},
            "involvedObject": involved,
            "reason": reason,
            "message": message,
            "type": "Warning",
            "source": {"component": component},
            "firstTimestamp": _now(),
            "lastTimestamp": _now(),
            "count": 1,
        }
        await self._request("POST", f"/api/v1/namespaces/{c.namespace}/events", event)

    @contextlib.asynccontextmanager
    async def running(self, tick: float = 0.03) -> AsyncIterator[None]:
        """Play KubeRay (and advance the fake Ray jobs) every `tick` seconds until the block exits.

        Enter this before starting the operator, so kopf leaves this task alone at its shutdown.
        """
        self._session = aiohttp.ClientSession(headers=self.headers)

        async def step() -> None:
            # Unanswered or cut off: the next tick observes and tries again (REQUEST_SECONDS).
            with contextlib.suppress(TimeoutError, aiohttp.ClientError):
                await self.sync()
            self.ray.advance()

        try:
            async with every(tick, step, "fake kuberay"):
                yield
        finally:
            await self._session.close()
            self._session = None

    async def sync(self) -> None:
        listing = await self._request("GET", RAYCLUSTERS)
        live = [rc for rc in listing.get("items", []) if not rc["metadata"].get("deletionTimestamp")]
        # Gone ones first: a cluster deleted and created again under its name gets its pods made anew.
        for uid in set(self.clusters) - {rc["metadata"]["uid"] for rc in live}:
            await self._teardown(self.clusters.pop(uid))
        for rc in live:
            meta = rc["metadata"]
            cluster = self.clusters.get(meta["uid"])
            if (rc.get("spec") or {}).get("suspend") is True:
                if cluster is None or not cluster.suspended:
                    await self._suspend(rc, cluster)
                continue
            if cluster is None or cluster.suspended:
                cluster = await self._adopt(rc)
            waiting = (
                not cluster.ready
                and not cluster.failed
                and not self.never_ready
                and not self.unschedulable
                and self.worker_container_status is None
            )
            if waiting and time.monotonic() - cluster.created >= self.ready_delay:
                await self._make_ready(cluster, rc)

    async def _suspend(self, rc: Obj, cluster: _Cluster | None) -> None:
        """No pods while suspended: a running cluster's are deleted (its Ray goes with its head)."""
        if cluster is not None:
            await self._teardown(cluster)
        else:
            cluster = self._record(rc)
        cluster.pods, cluster.ready, cluster.failed, cluster.suspended = [], False, False, True
        await self._patch_status(
            cluster,
            {"state": "suspended", "readyWorkerReplicas": 0, "availableWorkerReplicas": 0, "lastUpdateTime": _now()},
        )

    def _record(self, rc: Obj) -> _Cluster:
        meta = rc["metadata"]
        if meta["uid"] not in self.seen_uids:
            self.seen_uids.append(meta["uid"])
        n = self.seen_uids.index(meta["uid"]) + 1
        service_ip = f"10.96.{n // 250}.{n % 250 + 1}"
        cluster = _Cluster(
            namespace=meta["namespace"],
            name=meta["name"],
            uid=meta["uid"],
            address=f"http://{service_ip}:8265",
            service_ip=service_ip,
            created=time.monotonic(),
        )
        self.clusters[cluster.uid] = cluster
        return cluster

    async def _adopt(self, rc: Obj) -> _Cluster:
        cluster = self._record(rc)
        try:
            return await self._create_pods(cluster, rc)
        except BaseException:
            self.clusters.pop(cluster.uid, None)  # adopted again, whole, on the next tick
            raise

    async def _create_pods(self, cluster: _Cluster, rc: Obj) -> _Cluster:
        meta = rc["metadata"]
        await self._require_token(cluster, rc)
        group = rc["spec"]["workerGroupSpecs"][0]
        replicas = int(group["replicas"])
        await self._patch_status(
            cluster,
            {
                "desiredWorkerReplicas": replicas,
                "readyWorkerReplicas": 0,
                "availableWorkerReplicas": 0,
                "head": {"serviceIP": cluster.service_ip, "serviceName": f"{cluster.name}-head-svc"},
                "endpoints": {"dashboard": "8265", "client": "10001", "gcs-server": "6379"},
                "lastUpdateTime": _now(),
                "state": None,  # no longer `suspended` until the pods are ready again
            },
        )
        labels = {"ray.io/cluster": cluster.name, **(meta.get("labels") or {})}
        head = rc["spec"]["headGroupSpec"].get("template")
        await self._pod(
            cluster, f"{cluster.name}-head", {**labels, "ray.io/node-type": "head"}, {"phase": "Running"}, head
        )
        for i in range(replicas):
            name = f"{cluster.name}-{group['groupName']}-worker-{i:05d}"
            status: Obj = {"phase": "Pending"}
            if self.worker_container_status is not None:
                status = {"phase": "Running", "containerStatuses": [self.worker_container_status]}
            if self.unschedulable:
                status["conditions"] = [
                    {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                     "message": self.unschedulable, "lastTransitionTime": _now()},
                ]  # fmt: skip
            created = await self._pod(
                cluster, name, {**labels, "ray.io/node-type": "worker"}, status, group.get("template")
            )
            if self.unschedulable and created:
                await self._failed_scheduling(cluster, name)
        return cluster

    async def _require_token(self, c: _Cluster, rc: Obj) -> None:
        """A head started with RAY_AUTH_MODE=token answers only requests that carry its Secret's token."""
        env = {e["name"]: e for e in rc["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0].get("env", [])}
        if (env.get("RAY_AUTH_MODE") or {}).get("value") != "token":
            return
        ref = env["RAY_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"]
        secret = await self._request("GET", f"/api/v1/namespaces/{c.namespace}/secrets/{ref['name']}")
        encoded = (secret.get("data") or {}).get(ref["key"], "")
        # A missing Secret leaves a token no client can know: the head refuses everyone, as a real one would.
        self.ray.tokens[c.address] = base64.b64decode(encoded).decode() if encoded else "\0missing"

    async def _failed_scheduling(self, c: _Cluster, pod: str) -> None:
        involved = {"kind": "Pod", "name": pod, "namespace": c.namespace, "apiVersion": "v1"}
        await self._warn(c, pod, involved, "FailedScheduling", self.unschedulable, "default-scheduler")

    async def _make_ready(self, c: _Cluster, rc: Obj) -> None:
        group = rc["spec"]["workerGroupSpecs"][0]
        replicas = int(group["replicas"])
        gpus = float(group.get("rayStartParams", {}).get("num-gpus") or 0)
        limits = group["template"]["spec"]["containers"][0]["resources"]["limits"]
        cpus = float(parse_quantity(limits["cpu"]))
        for name in c.pods:
            if "-worker-" in name:
                await self._pod(c, name, {}, {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]})
        self.ray.add_cluster(c.address, RayNodes(alive_workers=replicas, gpus=gpus * replicas, cpus=cpus * replicas))
        await self._patch_status(
            c,
            {"state": "ready", "readyWorkerReplicas": replicas, "availableWorkerReplicas": replicas,
             "lastUpdateTime": _now()},
        )  # fmt: skip
        c.ready = True

    async def _teardown(self, c: _Cluster) -> None:
        self.ray.remove_cluster(c.address)
        for name in c.pods:
            await self._request("DELETE", f"/api/v1/namespaces/{c.namespace}/pods/{name}")
