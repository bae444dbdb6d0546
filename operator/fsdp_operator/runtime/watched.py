"""What the operator's watches already delivered: the jobs, their RayClusters and pods, kept for the job loops.

kopf watches the FSDPTrainingJobs, the operator's RayClusters and pods anyway (their events wake the loops).
Keeping the latest body of each saves a pass its `GET` of the job and of the RayCluster and its `LIST` of the
cluster's pods: with many jobs those were most of the operator's requests, repeated on every pass, so that a slow
job (a loaded machine, a cluster slow to come up) made more of them the longer it took (docs/reliability.md, "Load").

A job body from the watch is used only when it is not older than the loop's own last status write (`fresh_job`):
the watch delivers that write's event a moment after the write's answer, and a pass that decided from the status
before its own write would redo what that write recorded. Resource versions are compared as numbers when both
are (every API server backed by etcd issues them so); otherwise only an exactly equal one counts, and the loop
reads the job from the API server.

`job` and `cluster` also say whether an event is news to the loop: an event whose object differs from the one
held only in what the API server and kopf maintain (`resourceVersion`, `managedFields`, kopf's `finalizers`) is
not, and the handlers do not wake the loop for it. The loop's own status write is the commonest such event (the
write's answer is held first, and its watch event carries the same object), kopf's finalizer the next: with many
jobs created at once, each woke every loop for a pass that could decide nothing new (docs/reliability.md, "Load").
A skipped wake costs nothing but latency for a change no pass reads; the loop still passes every `interval`.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from fsdp_operator.api import render

Obj = dict[str, Any]


def _version(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion") or "")


def not_older(version: str, than: str) -> bool:
    """`version` is `than` or, both being numbers (etcd's revisions), a later one."""
    return version == than or (version.isdigit() and than.isdigit() and int(version) >= int(than))


NOT_NEWS = frozenset({"resourceVersion", "managedFields", "finalizers"})
"""Metadata the API server (versions, field managers) and kopf (its finalizer) change, which no pass decides from."""


def _essence(obj: Mapping[str, Any]) -> Obj:
    meta = obj.get("metadata") or {}
    return {**obj, "metadata": {k: v for k, v in meta.items() if k not in NOT_NEWS}}


def is_news(held: Mapping[str, Any] | None, body: Mapping[str, Any]) -> bool:
    """`body` differs from `held` (the same object as delivered before) in more than `NOT_NEWS`."""
    return held is None or _essence(held) != _essence(body)


def _older(version: str, than: str) -> bool:
    return version.isdigit() and than.isdigit() and int(version) < int(than)


NODE_TYPE_LABEL = "ray.io/node-type"


def _pod_view(body: Mapping[str, Any]) -> Obj:
    """What the loops read of a pod: its name, phase, conditions and the kubelet's word on each container
    (`provisioning.scheduler_condition`, `provisioning.containers_held`); its uid, node, node type and deletion
    (`nodes.node_notices`)."""
    meta = body.get("metadata") or {}
    status = body.get("status") or {}
    view: Obj = {
        "metadata": {
            "name": meta.get("name", ""),
            "uid": meta.get("uid", ""),
            "labels": {k: v for k, v in (meta.get("labels") or {}).items() if k == NODE_TYPE_LABEL},
        },
        "spec": {"nodeName": (body.get("spec") or {}).get("nodeName") or ""},
        "status": {
            "phase": status.get("phase", "Pending"),
            "conditions": list(status.get("conditions") or []),
            "containerStatuses": [
                {key: c[key] for key in ("name", "restartCount", "state", "lastState") if key in c}
                for c in status.get("containerStatuses") or []
                if isinstance(c, dict)
            ],
        },
    }
    if meta.get("deletionTimestamp"):
        view["metadata"]["deletionTimestamp"] = meta["deletionTimestamp"]
    return view


class Watched:
    """The latest job bodies and pods the watches delivered (or a read returned)."""

    def __init__(self) -> None:
        self.pods_watched = False
        """True once the operator's pod watch feeds `pods` (kopf runs it); without it, the loops list pods."""
        self.jobs_watched = False
        """True once the operator's watch of the jobs feeds the job bodies (kopf runs it); without it, each pass
        reads its job (what a read or a write returned would never learn of a change made elsewhere)."""
        self.clusters_watched = False
        """True once the operator's RayCluster watch feeds the RayClusters (kopf runs it)."""
        self._jobs: dict[tuple[str, str], tuple[float, Obj]] = {}
        """(namespace, name) -> (when delivered or read, in `time.monotonic()`, the job)."""
        self._clusters: dict[tuple[str, str], tuple[float, Obj]] = {}
        """(namespace, name) -> (when delivered or read, in `time.monotonic()`, the RayCluster)."""
        self._pods: dict[tuple[str, str], dict[str, Obj]] = {}
        """(namespace, RayCluster name) -> pod name -> the pod's view."""

    # --- jobs ---
    def job(self, namespace: str, name: str, body: Mapping[str, Any], *, deleted: bool = False) -> bool:
        """A job's body as a watch event or a read brought it (the later one of two is kept); whether it is news
        (`is_news`: a deletion is, an event older than the body held is not)."""
        key = (namespace, name)
        if deleted:
            self._jobs.pop(key, None)
            return True
        held = self._jobs.get(key)
        if held is not None and _uid(held[1]) == _uid(body) and _older(_version(body), _version(held[1])):
            return False  # an event older than what a read already returned (watch events themselves come in order)
        self._jobs[key] = (time.monotonic(), dict(body))
        return held is None or is_news(held[1], body)

    def fresh_job(self, namespace: str, name: str, written: str, max_age: float) -> Obj | None:
        """The job's latest body when it is not older than the status write of version `written` ('' for none) and
        was delivered within `max_age` seconds (a watch that stopped delivering is not trusted for longer)."""
        held = self._jobs.get((namespace, name)) if self.jobs_watched else None
        if held is None or time.monotonic() - held[0] > max_age:
            return None
        if written and not not_older(_version(held[1]), written):
            return None
        return held[1]

    def forget_job(self, namespace: str, name: str) -> None:
        self._jobs.pop((namespace, name), None)

    # --- RayClusters ---
    def cluster(self, namespace: str, name: str, body: Mapping[str, Any] | None, *, deleted: bool = False) -> bool:
        """A RayCluster as its watch delivered it or a read returned it (`body` None: the read found none); whether
        it is news (`is_news`; a deletion is)."""
        key = (namespace, name)
        if deleted or body is None:
            self._clusters.pop(key, None)
            return True
        held = self._clusters.get(key)
        self._clusters[key] = (time.monotonic(), dict(body))
        return held is None or is_news(held[1], body)

    def fresh_cluster(self, namespace: str, name: str, max_age: float) -> Obj | None:
        """The RayCluster as last delivered, when it was delivered or read within `max_age` seconds; else None
        (read it). A deletion the watch missed (a watch restarted after `410 Gone` re-lists what exists, it does
        not report what went) is so seen within `max_age`."""
        if not self.clusters_watched:
            return None
        held = self._clusters.get((namespace, name))
        if held is None or time.monotonic() - held[0] > max_age:
            return None
        return held[1]

    # --- pods ---
    def pod(self, namespace: str, body: Mapping[str, Any], *, deleted: bool = False) -> None:
        meta = body.get("metadata") or {}
        cluster = (meta.get("labels") or {}).get(render.RAY_CLUSTER_LABEL)
        name = meta.get("name")
        if not cluster or not name:
            return
        key = (namespace, str(cluster))
        if deleted:
            pods = self._pods.get(key)
            if pods is not None:
                pods.pop(str(name), None)
                if not pods:
                    del self._pods[key]
            return
        self._pods.setdefault(key, {})[str(name)] = _pod_view(body)

    def pods(self, namespace: str, cluster: str) -> list[Obj]:
        return list(self._pods.get((namespace, cluster), {}).values())


def _uid(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("uid") or "")
