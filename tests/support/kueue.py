"""A test double of Kueue's admission of RayClusters, against the emulated API server over HTTP.

What it plays, from Kueue's documentation:
- "Run A RayCluster" (https://kueue.sigs.k8s.io/docs/tasks/run/rayclusters/): a RayCluster labelled
  `kueue.x-k8s.io/queue-name` is queued as one Workload; Kueue controls its `spec.suspend` ("Suspend control"):
  false once admitted, true again when evicted (KubeRay then deletes its pods).
- Workload (https://kueue.sigs.k8s.io/docs/concepts/workload/): one per RayCluster, owned by it (so the garbage
  collector deletes it with the cluster, which frees its quota), labelled `kueue.x-k8s.io/job-uid` with the
  cluster's uid, with one podSet per group (`head`, then each worker group by its groupName) carrying its count
  and pod template; `status.conditions` `QuotaReserved`, `Admitted`, `Evicted`, `Preempted`; pending with reason
  `Pending` and the flavor assigner's message ("couldn't assign flavors to pod set workers: insufficient unused
  quota for nvidia.com/gpu in flavor default-flavor, 8 more needed"), or `Inadmissible` for a LocalQueue that
  does not exist.
- ClusterQueue (https://kueue.sigs.k8s.io/docs/concepts/cluster_queue/): nominal quota per resource in one
  flavor; BestEffortFIFO ordering by priority, then creation; `preemption.withinClusterQueue: LowerPriority`
  (https://kueue.sigs.k8s.io/docs/concepts/preemption/): a pending Workload that fits once lower-priority admitted
  ones are gone evicts them (reason `Preempted`, "Preempted to accommodate a workload (UID: ...) due to
  prioritization in the ClusterQueue").
- WorkloadPriorityClass (https://kueue.sigs.k8s.io/docs/concepts/workload_priority_class/): the
  `kueue.x-k8s.io/priority-class` label names one; its value orders and preempts.

What it leaves out: several flavors, cohorts and borrowing, admission checks, waitForPodsReady, fair sharing, and
resources the ClusterQueue does not name (real Kueue refuses those; here they are not counted). Eviction frees the
quota at once (Kueue waits for the job to be suspended first). The Workload CRD is a minimal one of our own.
"""

from __future__ import annotations

import contextlib
import hashlib
import time
from collections.abc import AsyncIterator
from fractions import Fraction
from typing import Any

import aiohttp
from fsdp_operator.api.formats import parse_quantity

from support.background import every
from support.crds import namespaced_crd

Obj = dict[str, Any]
GROUP, VERSION = "kueue.x-k8s.io", "v1beta1"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
RAYCLUSTERS = "/apis/ray.io/v1/rayclusters"

WORKLOAD_CRD: Obj = namespaced_crd(
    GROUP,
    VERSION,
    {"kind": "Workload", "listKind": "WorkloadList", "plural": "workloads", "singular": "workload"},
    [
        {"name": "Queue", "type": "string", "jsonPath": ".spec.queueName"},
        {"name": "Reserved in", "type": "string", "jsonPath": ".status.admission.clusterQueue"},
        {"name": "Admitted", "type": "string", "jsonPath": ".status.conditions[?(@.type=='Admitted')].status"},
    ],
    {
        "type": "object",
        "properties": {
            key: {"type": "object", "x-kubernetes-preserve-unknown-fields": True} for key in ("spec", "status")
        },
    },
)


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _condition(type_: str, status: bool, reason: str, message: str) -> Obj:
    return {"type": type_, "status": "True" if status else "False", "reason": reason, "message": message,
            "lastTransitionTime": _now()}  # fmt: skip


def _with(conditions: list[Obj], *new: Obj) -> list[Obj]:
    types = {c["type"] for c in new}
    return [c for c in conditions if c["type"] not in types] + list(new)


def _show(amount: Fraction) -> str:
    return str(int(amount)) if amount.denominator == 1 else f"{float(amount):g}"


class FakeKueue:
    """One ClusterQueue (`quota`, one flavor) behind the LocalQueues named in `local_queues`."""

    def __init__(
        self,
        api_url: str,
        quota: dict[str, str],
        *,
        local_queues: tuple[str, ...] = ("team-a",),
        cluster_queue: str = "team-cq",
        flavor: str = "default-flavor",
        priorities: dict[str, int] | None = None,
    ) -> None:
        self.api_url = api_url.rstrip("/")
        self.quota = {name: Fraction(parse_quantity(value)) for name, value in quota.items()}
        self.local_queues = local_queues
        self.cluster_queue = cluster_queue
        self.flavor = flavor
        self.priorities = priorities or {}
        """WorkloadPriorityClass name -> value."""
        self.admitted: list[str] = []
        """RayCluster names in the order they were admitted (each admission, readmissions included)."""
        self.evicted: list[str] = []
        self.headers: dict[str, str] = {}
        self._session: aiohttp.ClientSession | None = None

    async def _request(self, method: str, path: str, body: Obj | None = None, content_type: str = "") -> Obj:
        assert self._session is not None, "use `async with kueue.running()`"
        headers = {"Content-Type": content_type or "application/json"}
        async with self._session.request(method, self.api_url + path, json=body, headers=headers) as r:
            payload: Obj = await r.json(content_type=None) if r.content_length != 0 else {}
            if r.status >= 400 and r.status not in (404, 409):
                raise RuntimeError(f"{method} {path}: {r.status} {payload.get('message')}")
            return payload

    def _workloads_path(self, namespace: str, name: str = "") -> str:
        return f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/workloads" + (f"/{name}" if name else "")

    @contextlib.asynccontextmanager
    async def running(self, tick: float = 0.03) -> AsyncIterator[None]:
        """Admit and evict every `tick` seconds until the block exits (enter it before starting the operator)."""
        self._session = aiohttp.ClientSession(headers=self.headers)
        try:
            async with every(tick, self.sync, "fake kueue"):
                yield
        finally:
            await self._session.close()
            self._session = None

    # --- what Kueue's RayCluster integration does ---
    async def sync(self) -> None:
        # Workloads first: a cluster deleted after this read is not in the next one (its Workload was collected
        # with it, and must not be made again); one created after it gets its Workload now.
        listing = await self._request("GET", f"/apis/{GROUP}/{VERSION}/workloads")
        clusters = [
            rc for rc in (await self._request("GET", RAYCLUSTERS)).get("items", [])
            if QUEUE_LABEL in (rc["metadata"].get("labels") or {}) and not rc["metadata"].get("deletionTimestamp")
        ]  # fmt: skip
        by_owner = {
            ref["uid"]: w for w in listing.get("items", []) for ref in w["metadata"].get("ownerReferences") or []
        }
        workloads: list[tuple[Obj, Obj]] = []
        for rc in clusters:
            workload = by_owner.get(rc["metadata"]["uid"]) or await self._create_workload(rc)
            workloads.append((rc, workload))
        await self._admit(workloads)

    async def _create_workload(self, rc: Obj) -> Obj:
        meta, spec = rc["metadata"], rc["spec"]
        digest = hashlib.sha256(meta["uid"].encode()).hexdigest()[:5]
        pod_sets = [{"name": "head", "count": 1, "template": spec["headGroupSpec"]["template"]}]
        pod_sets += [
            {"name": g["groupName"], "count": int(g.get("replicas", 1)), "template": g["template"]}
            for g in spec["workerGroupSpecs"]
        ]
        labels = meta.get("labels") or {}
        workload: Obj = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "Workload",
            "metadata": {
                "name": f"raycluster-{meta['name']}-{digest}",
                "namespace": meta["namespace"],
                "labels": {JOB_UID_LABEL: meta["uid"]},
                "ownerReferences": [
                    {
                        "apiVersion": "ray.io/v1",
                        "kind": "RayCluster",
                        "name": meta["name"],
                        "uid": meta["uid"],
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "spec": {"queueName": labels[QUEUE_LABEL], "podSets": pod_sets, "active": True},
        }
        if PRIORITY_LABEL in labels:
            workload["spec"]["priorityClassName"] = labels[PRIORITY_LABEL]
            workload["spec"]["priority"] = self.priorities.get(labels[PRIORITY_LABEL], 0)
        created = await self._request("POST", self._workloads_path(meta["namespace"]), workload)
        return created

    def _requests(self, workload: Obj) -> list[tuple[str, dict[str, Fraction]]]:
        """Per podSet: its count times each container's requests (limits where a request is missing, as the API
        server defaults them), for the resources the ClusterQueue has quota for."""
        out = []
        for pod_set in workload["spec"]["podSets"]:
            total: dict[str, Fraction] = {}
            for container in pod_set["template"]["spec"].get("containers", []):
                resources = container.get("resources") or {}
                amounts = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
                for name, value in amounts.items():
                    if name in self.quota:
                        total[name] = total.get(name, Fraction(0)) + Fraction(parse_quantity(str(value))) * int(
                            pod_set["count"]
                        )
            out.append((pod_set["name"], total))
        return out

    def _usage(self, admitted: list[Obj]) -> dict[str, Fraction]:
        used = dict.fromkeys(self.quota, Fraction(0))
        for workload in admitted:
            for _, amounts in self._requests(workload):
                for name, amount in amounts.items():
                    used[name] += amount
        return used

    def _shortage(self, workload: Obj, used: dict[str, Fraction]) -> str:
        """Kueue's flavor assigner's message for the first podSet that does not fit; empty when all fit."""
        taken = dict(used)
        for pod_set, amounts in self._requests(workload):
            for name, amount in amounts.items():
                if taken[name] + amount > self.quota[name]:
                    missing = taken[name] + amount - self.quota[name]
                    return (
                        f"couldn't assign flavors to pod set {pod_set}: insufficient unused quota for {name} in "
                        f"flavor {self.flavor}, {_show(missing)} more needed"
                    )
                taken[name] += amount
        return ""

    @staticmethod
    def _is_admitted(workload: Obj) -> bool:
        conditions = (workload.get("status") or {}).get("conditions") or []
        return any(c["type"] == "Admitted" and c["status"] == "True" for c in conditions)

    async def _admit(self, pairs: list[tuple[Obj, Obj]]) -> None:
        admitted = [w for _, w in pairs if self._is_admitted(w)]
        for rc, workload in pairs:
            if self._is_admitted(workload) and rc["spec"].get("suspend") is True:
                await self._set_suspend(rc, suspend=False)  # admitted, but the unsuspend was lost: again
        pending = sorted(
            ((rc, w) for rc, w in pairs if not self._is_admitted(w)),
            key=lambda p: (-int(p[1]["spec"].get("priority", 0)), p[1]["metadata"]["creationTimestamp"]),
        )
        for rc, workload in pending:
            queue = workload["spec"]["queueName"]
            if queue not in self.local_queues:
                message = f"LocalQueue {queue} doesn't exist"
                await self._pending(workload, "Inadmissible", message)
                continue
            shortage = self._shortage(workload, self._usage(admitted))
            if shortage:
                victims = self._victims(workload, admitted)
                if victims is None:
                    await self._pending(workload, "Pending", shortage)
                    continue
                for victim_rc, victim in victims:
                    await self._evict(victim_rc, victim, workload)
                    admitted.remove(victim)
            await self._reserve(rc, workload)
            admitted.append(workload)

    def _victims(self, workload: Obj, admitted: list[Obj]) -> list[tuple[Obj, Obj]] | None:
        """Admitted lower-priority Workloads whose eviction makes room (newest first), or None."""
        priority = int(workload["spec"].get("priority", 0))
        lower = sorted(
            (w for w in admitted if int(w["spec"].get("priority", 0)) < priority),
            key=lambda w: (int(w["spec"].get("priority", 0)), w["metadata"]["creationTimestamp"]),
        )
        chosen: list[Obj] = []
        for candidate in lower:
            chosen.append(candidate)
            if not self._shortage(workload, self._usage([w for w in admitted if w not in chosen])):
                return [(self._owner(w), w) for w in chosen]
        return None

    @staticmethod
    def _owner(workload: Obj) -> Obj:
        ref = workload["metadata"]["ownerReferences"][0]
        return {"metadata": {"name": ref["name"], "namespace": workload["metadata"]["namespace"]}, "spec": {}}

    async def _status(self, workload: Obj, status: Obj) -> None:
        meta = workload["metadata"]
        path = self._workloads_path(meta["namespace"], meta["name"]) + "/status"
        await self._request("PATCH", path, {"status": status}, "application/merge-patch+json")
        workload["status"] = {**(workload.get("status") or {}), **status}

    async def _pending(self, workload: Obj, reason: str, message: str) -> None:
        conditions = (workload.get("status") or {}).get("conditions") or []
        current = next((c for c in conditions if c["type"] == "QuotaReserved"), None)
        if current is not None and current["status"] == "False" and current["message"] == message:
            return
        await self._status(workload, {"conditions": _with(conditions, _condition("QuotaReserved", False, reason,
                                                                                   message))})  # fmt: skip

    async def _reserve(self, rc: Obj, workload: Obj) -> None:
        conditions = (workload.get("status") or {}).get("conditions") or []
        assignments = [
            {"name": pod_set, "count": next(p["count"] for p in workload["spec"]["podSets"] if p["name"] == pod_set),
             "flavors": dict.fromkeys(amounts, self.flavor),
             "resourceUsage": {name: _show(amount) for name, amount in amounts.items()}}
            for pod_set, amounts in self._requests(workload)
        ]  # fmt: skip
        conditions = _with(
            conditions,
            _condition("QuotaReserved", True, "QuotaReserved", f"Quota reserved in ClusterQueue {self.cluster_queue}"),
            _condition("Admitted", True, "Admitted", "The workload is admitted"),
        )
        admission = {"clusterQueue": self.cluster_queue, "podSetAssignments": assignments}
        await self._status(workload, {"conditions": conditions, "admission": admission})
        await self._set_suspend(rc, suspend=False)
        self.admitted.append(rc["metadata"]["name"])

    async def _evict(self, rc: Obj, workload: Obj, preemptor: Obj) -> None:
        message = (
            f"Preempted to accommodate a workload (UID: {preemptor['metadata']['uid']}) due to prioritization in "
            "the ClusterQueue"
        )
        conditions = _with(
            (workload.get("status") or {}).get("conditions") or [],
            _condition("Evicted", True, "Preempted", message),
            _condition("Preempted", True, "InClusterQueue", message),
            _condition("QuotaReserved", False, "Pending", message),
            _condition("Admitted", False, "NoReservation", "The workload has no reservation"),
        )
        await self._status(workload, {"conditions": conditions, "admission": None})
        await self._set_suspend(rc, suspend=True)
        self.evicted.append(rc["metadata"]["name"])

    async def _set_suspend(self, rc: Obj, *, suspend: bool) -> None:
        meta = rc["metadata"]
        path = f"/apis/ray.io/v1/namespaces/{meta['namespace']}/rayclusters/{meta['name']}"
        await self._request("PATCH", path, {"spec": {"suspend": suspend}}, "application/merge-patch+json")
