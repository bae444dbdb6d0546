"""In-memory object storage of the emulated API server: the Kubernetes semantics, without the HTTP.

One global resourceVersion counter, uids, generations, finalizers and deletionTimestamp, the status
subresource split, ownerReference garbage collection (background, foreground and orphan propagation; the
collector at once, after a delay from its own thread, or none: `Store.gc_delay`, docs/conformance.md) and an
event history that watches replay from. Thread-safe: the HTTP server's loop, the collector and test code in
other threads may all call it.
"""

from __future__ import annotations

import heapq
import itertools
import random
import re
import threading
import time
import uuid
from collections import Counter, deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TypeVar

from fsdp_operator.local.server import structural
from fsdp_operator.local.server.patching import merge_patch
from fsdp_operator.local.server.resources import (
    InvalidDefinition,
    Obj,
    ResourceType,
    builtin_types,
    json_copy,
    type_from_crd,
)

_T = TypeVar("_T")


# Namespaces a fresh cluster has.
INITIAL_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
# How many events watches can replay from; older resourceVersions get 410 Gone, as after etcd compaction.
HISTORY_LENGTH = 20_000

_DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
# The alphabet of generateName suffixes (k8s.io/apimachinery/pkg/util/rand).
_SUFFIX_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
# The finalizer a foreground deletion puts on the owner until its blocking dependents are gone
# (https://kubernetes.io/docs/concepts/architecture/garbage-collection/#foreground-deletion).
FOREGROUND_FINALIZER = "foregroundDeletion"


class ApiError(Exception):
    """An error the server answers with a `Status` body."""

    def __init__(
        self, code: int, reason: str, message: str, *, details: Obj | None = None, causes: list[Obj] | None = None
    ) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details or {}
        if causes:
            self.details["causes"] = causes

    def status(self) -> Obj:
        return {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "details": self.details,
            "code": self.code,
        }


def not_found(rtype: ResourceType, name: str) -> ApiError:
    return ApiError(
        404,
        "NotFound",
        f'{rtype.group_resource} "{name}" not found',
        details={"name": name, "group": rtype.group, "kind": rtype.plural},
    )


def invalid(rtype: ResourceType, name: str, message: str, field_path: str = "") -> ApiError:
    return ApiError(
        422,
        "Invalid",
        f'{rtype.kind}.{rtype.group or "core"} "{name}" is invalid: {message}'.replace(".core ", " "),
        details={"name": name, "group": rtype.group, "kind": rtype.kind},
        causes=[{"reason": "FieldValueInvalid", "message": message, "field": field_path}],
    )


def invalid_fields(rtype: ResourceType, name: str, errors: Sequence[structural.FieldError]) -> ApiError:
    """A 422 naming every field error, printed as the real server prints an aggregate (brackets for several)."""
    listed = [str(e) for e in errors]
    summary = listed[0] if len(listed) == 1 else f"[{', '.join(listed)}]"
    return ApiError(
        422,
        "Invalid",
        f'{rtype.kind}.{rtype.group or "core"} "{name}" is invalid: {summary}'.replace(".core ", " "),
        details={"name": name, "group": rtype.group, "kind": rtype.kind},
        causes=[
            {
                "reason": f"FieldValue{e.kind.replace('Unsupported', 'NotSupported')}",
                "message": str(e)[len(e.path) + 2 :],
                "field": e.path,
            }
            for e in errors
        ],
    )


def conflict(rtype: ResourceType, name: str) -> ApiError:
    return ApiError(
        409,
        "Conflict",
        f'Operation cannot be fulfilled on {rtype.group_resource} "{name}": the object has been modified; '
        "please apply your changes to the latest version and try again",
        details={"name": name, "group": rtype.group, "kind": rtype.plural},
    )


def now_timestamp() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class WatchEvent:
    """One change, as stored in the history and sent to watches."""

    resource_version: int
    type: str
    key: tuple[str, str]
    object: Obj


@dataclass(eq=False)
class Subscription:
    """A live watch: the store calls `deliver` (under its lock, in commit order) for every change."""

    key: tuple[str, str]
    namespace: str | None
    deliver: Callable[[WatchEvent], None]


@dataclass
class Store:
    """All objects of one emulated cluster."""

    types: dict[tuple[str, str], ResourceType] = field(default_factory=dict)
    objects: dict[tuple[str, str], dict[tuple[str, str], Obj]] = field(default_factory=dict)
    resource_version: int = 1
    history_length: int = HISTORY_LENGTH
    history: deque[WatchEvent] = field(init=False)
    compacted: int = 0
    """The resourceVersion of the newest event that fell out of the history."""
    created: Counter[str] = field(default_factory=Counter)
    """Creations per `plural.group` (through HTTP or in-process), for tests that count."""
    lock: threading.RLock = field(default_factory=threading.RLock)
    subscriptions: set[Subscription] = field(default_factory=set)
    _live_uids: set[str] = field(default_factory=set)
    """The uids of all stored objects (garbage collection asks whether an owner still exists)."""
    _dependents: dict[str, dict[tuple[tuple[str, str], tuple[str, str]], None]] = field(default_factory=dict)
    """Owner uid -> (type key, object key) of the objects whose ownerReferences name it, in commit order."""
    gc_delay: float | None = 0.0
    """The garbage collector (https://kubernetes.io/docs/concepts/architecture/garbage-collection/, sections
    "Owners and dependents" and "Cascading deletion"). A positive delay: it deletes the dependents of a deleted
    owner, and those created naming an owner that does not exist, that many seconds later from its own thread,
    as the real controller does in the background (seconds, minutes under load). None: no collector at all,
    dependents stay until someone deletes them, and a foreground deletion never completes (as on a cluster whose
    kube-controller-manager is down). 0: at once, inside the deleting request (or, for a dependent created naming an
    owner that is gone, inside the creating one), which no real cluster does; for tests about something else."""
    _gc_due: list[tuple[float, int, str]] = field(default_factory=list)
    """(when, sequence, owner uid) the collector looks at, soonest first."""
    _gc_wakeup: threading.Condition = field(default_factory=threading.Condition)
    _gc_thread: threading.Thread | None = None
    _gc_stopped: bool = False
    _gc_busy: bool = False
    _foreground: dict[str, tuple[tuple[str, str], tuple[str, str]]] = field(default_factory=dict)
    """Uid -> (type key, object key) of the owners in a foreground deletion, waiting for their dependents."""
    graceful_pods: bool = False
    """Graceful deletion of pods (`local/cluster/kubelet.py`, which plays the kubelet that finishes it). Off: a pod is
    removed at once, as when no kubelet would ever finish its termination."""

    def __post_init__(self) -> None:
        self.history = deque(maxlen=self.history_length)
        for rtype in builtin_types():
            self._register(rtype)
        for namespace in INITIAL_NAMESPACES:
            self.create(self.resource("namespaces"), {"metadata": {"name": namespace}})

    # ------------------------------------------------------------------ types

    def _register(self, rtype: ResourceType) -> None:
        self.types[rtype.key] = rtype
        self.objects.setdefault(rtype.key, {})

    def resource(self, name: str, group: str | None = None) -> ResourceType:
        """Find a served type by plural, singular, kind or short name (optionally within a group)."""
        with self.lock:
            lowered = name.lower()
            for rtype in self.types.values():
                if group is not None and rtype.group != group:
                    continue
                if lowered in (rtype.plural, rtype.singular, rtype.kind.lower(), *rtype.short_names):
                    # `events` exists twice; the core one wins unless the group is named.
                    if (
                        group is None
                        and rtype.group
                        and any(t.group == "" and t.plural == rtype.plural for t in self.types.values())
                    ):
                        continue
                    return rtype
            raise KeyError(f"no resource type {name!r}" + (f" in group {group!r}" if group is not None else ""))

    def lookup(self, group: str, version: str, plural: str) -> ResourceType | None:
        with self.lock:
            rtype = self.types.get((group, plural))
            return rtype if rtype is not None and version in rtype.versions else None

    def group_versions(self) -> dict[str, list[str]]:
        """Group -> served versions, preferred first (the core group is "")."""
        with self.lock:
            result: dict[str, list[str]] = {}
            for rtype in self.types.values():
                versions = result.setdefault(rtype.group, [])
                for version in rtype.versions:
                    if version not in versions:
                        versions.append(version)
            return result

    # ------------------------------------------------------------------ reads

    def get(self, rtype: ResourceType, name: str, namespace: str | None = None) -> Obj:
        with self.lock:
            obj = self.objects[rtype.key].get((self._ns(rtype, namespace), name))
            if obj is None:
                raise not_found(rtype, name)
            return json_copy(obj)

    def peek(self, rtype: ResourceType, name: str, namespace: str | None = None) -> Obj | None:
        """The stored object itself, not a copy (None when absent): for the server's own readers of a few fields on
        every request (RBAC's roles). Use it under `lock`, and never change or keep it."""
        with self.lock:
            return self.objects[rtype.key].get((self._ns(rtype, namespace), name))

    def list_objects(
        self, rtype: ResourceType, namespace: str | None = None, predicate: Callable[[Obj], bool] | None = None
    ) -> tuple[list[Obj], int]:
        """Objects sorted like etcd keys (namespace, name), and the resourceVersion of the snapshot."""
        with self.lock:
            items = [
                json_copy(obj)
                for (ns, _), obj in sorted(self.objects[rtype.key].items())
                if (namespace is None or ns == namespace) and (predicate is None or predicate(obj))
            ]
            return items, self.resource_version

    def project(self, rtype: ResourceType, take: Callable[[Obj], _T]) -> list[_T]:
        """`take` of every object of a type, under the lock and without copying the objects: for a reader that wants
        a few fields of many objects often (a load test's poll). `take` must not change what it is given or keep it.
        """
        with self.lock:
            return [take(obj) for obj in self.objects[rtype.key].values()]

    def find(self, plural: str, group: str | None = None, namespace: str | None = None) -> list[Obj]:
        """Test convenience: all objects of a type by plural/kind/short name."""
        return self.list_objects(self.resource(plural, group), namespace)[0]

    # ------------------------------------------------------------------ writes

    def create(
        self,
        rtype: ResourceType,
        body: Obj,
        namespace: str | None = None,
        *,
        dry_run: bool = False,
        private: bool = False,
    ) -> Obj:
        """Store a new object. `private`: nobody else holds `body` (a request's parsed body), so it is stored without a
        copy."""
        with self.lock:
            obj = body if private else json_copy(body)
            obj["apiVersion"] = rtype.api_version(_version_of(obj, rtype))
            obj["kind"] = rtype.kind
            meta = obj.setdefault("metadata", {})
            if not isinstance(meta, dict):
                raise ApiError(400, "BadRequest", "metadata must be an object")
            ns = self._ns(rtype, namespace if namespace is not None else meta.get("namespace"))
            if rtype.namespaced:
                if meta.get("namespace") not in (None, "", ns):
                    raise ApiError(
                        400,
                        "BadRequest",
                        "the namespace of the provided object does not match the namespace sent on the request",
                    )
                meta["namespace"] = ns
                self._require_namespace(ns)
            else:
                meta.pop("namespace", None)
            if not meta.get("name"):
                prefix = meta.get("generateName")
                if not prefix:
                    raise invalid(
                        rtype, "", "metadata.name: Required value: name or generateName is required", "metadata.name"
                    )
                meta["name"] = self._generate_name(rtype, ns, str(prefix))
            name = str(meta["name"])
            self._validate_name(rtype, name)
            if (ns, name) in self.objects[rtype.key]:
                raise ApiError(
                    409,
                    "AlreadyExists",
                    f'{rtype.group_resource} "{name}" already exists',
                    details={"name": name, "group": rtype.group, "kind": rtype.plural},
                )
            for key in ("resourceVersion", "deletionTimestamp", "deletionGracePeriodSeconds", "selfLink"):
                meta.pop(key, None)
            meta["uid"] = str(uuid.uuid4())
            meta["creationTimestamp"] = now_timestamp()
            meta["generation"] = 1
            self._defaults_on_create(rtype, obj)
            if rtype.key == ("apiextensions.k8s.io", "customresourcedefinitions"):
                new_type = self._crd_type(obj)
                obj["status"] = _crd_status(obj)
            if dry_run:
                return obj
            if rtype.key == ("apiextensions.k8s.io", "customresourcedefinitions"):
                self._register(new_type)
            self.created[rtype.group_resource] += 1
            self._commit(rtype, "ADDED", obj)
            if self.gc_delay is not None and any(
                str(r.get("uid")) not in self._live_uids for r in _owner_references(meta)
            ):
                # An owner that does not exist (deleted before, or never was): the collector deletes the dependent
                # once every owner is verified absent (docs: "Owners and dependents"); the immediate one at once. A
                # client that read the owner before its deletion and creates a dependent after it (a Kueue Workload
                # for a RayCluster deleted meanwhile) otherwise leaves one that no collector ever looks at again.
                self._schedule_collection(*{str(r.get("uid")) for r in _owner_references(meta)})
            return json_copy(obj)

    def update(
        self,
        rtype: ResourceType,
        name: str,
        body: Obj,
        namespace: str | None = None,
        *,
        subresource: str = "",
        require_resource_version: bool = False,
        dry_run: bool = False,
        private: bool = False,
    ) -> Obj:
        """Replace an object (PUT, or the result of a PATCH). A stale resourceVersion in the body is 409.
        `private`: nobody else holds `body` (a patch's result), so it is stored without a copy."""
        with self.lock:
            ns = self._ns(rtype, namespace)
            old = self.objects[rtype.key].get((ns, name))
            if old is None:
                raise not_found(rtype, name)
            new = body if private else json_copy(body)
            meta = new.get("metadata")
            if not isinstance(meta, dict):
                new["metadata"] = meta = {}
            if meta.get("name", name) != name:
                raise ApiError(400, "BadRequest", "the name of the object does not match the name on the URL")
            given_version = meta.get("resourceVersion")
            if given_version not in (None, ""):
                if str(given_version) != old["metadata"]["resourceVersion"]:
                    raise conflict(rtype, name)
            elif require_resource_version:
                raise invalid(
                    rtype,
                    name,
                    "metadata.resourceVersion: Invalid value: 0x0: must be specified for an update",
                    "metadata.resourceVersion",
                )
            if subresource == "status":
                # Stored objects are never changed in place (copy on write): the new version shares all but its
                # metadata, which the commit stamps, and its status with the old one.
                result = {**old, "metadata": dict(old["metadata"])}
                if "status" in new:
                    result["status"] = new["status"]
                else:
                    result.pop("status", None)
            else:
                result = new
                result["apiVersion"], result["kind"] = old["apiVersion"], old["kind"]
                if rtype.status_subresource:
                    # The main endpoint ignores status changes when the kind has a status subresource.
                    if "status" in old:
                        result["status"] = json_copy(old["status"])
                    else:
                        result.pop("status", None)
                result_meta = result["metadata"]
                for key in (
                    "name",
                    "namespace",
                    "uid",
                    "creationTimestamp",
                    "generation",
                    "deletionTimestamp",
                    "deletionGracePeriodSeconds",
                    "resourceVersion",
                ):
                    if key in old["metadata"]:
                        result_meta[key] = old["metadata"][key]
                    else:
                        result_meta.pop(key, None)
                added = set(result_meta.get("finalizers") or []) - set(old["metadata"].get("finalizers") or [])
                if old["metadata"].get("deletionTimestamp") and added:
                    raise invalid(
                        rtype,
                        name,
                        "metadata.finalizers: Forbidden: no new finalizers can be added if the object is being deleted",
                        "metadata.finalizers",
                    )
                if not result_meta.get("finalizers"):
                    result_meta.pop("finalizers", None)
                if "managedFields" not in result_meta and "managedFields" in old["metadata"]:
                    # An update that does not send managedFields keeps them (Server-Side Apply docs).
                    result_meta["managedFields"] = json_copy(old["metadata"]["managedFields"])
                if _spec_of(result) != _spec_of(old):
                    result_meta["generation"] = int(old["metadata"].get("generation", 1)) + 1
            if rtype.key == ("apiextensions.k8s.io", "customresourcedefinitions") and subresource != "status":
                new_type = self._crd_type(result)
                result["status"] = _crd_status(result)
            if result == old or dry_run:
                return json_copy(result)
            if rtype.key == ("apiextensions.k8s.io", "customresourcedefinitions") and subresource != "status":
                self._register(new_type)
            if result["metadata"].get("deletionTimestamp") and not result["metadata"].get("finalizers"):
                return self._remove(rtype, result)
            self._commit(rtype, "MODIFIED", result)
            return json_copy(result)

    def patch(
        self,
        rtype: ResourceType,
        name: str,
        apply: Callable[[Obj], Obj],
        namespace: str | None = None,
        *,
        subresource: str = "",
        dry_run: bool = False,
        private: bool = False,
    ) -> Obj:
        """Apply a patch function to the current object atomically (a resourceVersion in the result is a
        precondition, as with the real server). `private`: `apply` builds its result from the copy it is given and
        copies of the patch (the server's patches), so the result is stored without another copy."""
        with self.lock:
            current = self.get(rtype, name, namespace)
            return self.update(
                rtype, name, apply(current), namespace, subresource=subresource, dry_run=dry_run, private=private
            )

    def merge(
        self,
        resource: ResourceType | str,
        name: str,
        patch: Obj,
        namespace: str | None = None,
        *,
        subresource: str = "",
        group: str | None = None,
    ) -> Obj:
        """In-process JSON merge patch (what test stand-ins for controllers use to write status)."""
        rtype = resource if isinstance(resource, ResourceType) else self.resource(resource, group)
        return self.patch(rtype, name, lambda current: merge_patch(current, patch), namespace, subresource=subresource)

    def delete(
        self,
        rtype: ResourceType,
        name: str,
        namespace: str | None = None,
        *,
        propagation: str = "Background",
        preconditions: Obj | None = None,
        dry_run: bool = False,
        grace_period: int | None = None,
    ) -> Obj:
        """Delete: with finalizers, mark (deletionTimestamp) and wait for them; else remove and collect. A pod on a
        node (with `graceful_pods`) is marked terminating for its grace period instead (`_terminating`)."""
        with self.lock:
            ns = self._ns(rtype, namespace)
            old = self.objects[rtype.key].get((ns, name))
            if old is None:
                raise not_found(rtype, name)
            preconditions = preconditions or {}
            uid = preconditions.get("uid")
            version = preconditions.get("resourceVersion")
            if (uid and uid != old["metadata"]["uid"]) or (version and version != old["metadata"]["resourceVersion"]):
                raise ApiError(
                    409,
                    "Conflict",
                    f'Operation cannot be fulfilled on {rtype.group_resource} "{name}": Precondition failed',
                    details={"name": name, "group": rtype.group, "kind": rtype.plural},
                )
            if dry_run:
                return json_copy(old)
            if rtype.key == ("", "pods") and self.graceful_pods:
                terminating = self._terminating(rtype, old, grace_period)
                if terminating is not None:
                    return terminating
                if old["metadata"].get("deletionTimestamp") and not old["metadata"].get("finalizers"):
                    return self._remove(rtype, old)  # a terminating pod forced (grace 0): gone now
            if old["metadata"].get("deletionTimestamp"):
                return json_copy(old)
            if propagation == "Orphan":
                self._orphan_dependents(old["metadata"]["uid"])
            if rtype.key == ("", "namespaces"):
                return self._delete_namespace(rtype, old)
            if propagation == "Foreground" and (self.gc_delay != 0 or self._dependents.get(old["metadata"]["uid"])):
                # The owner stays, marked and with the foregroundDeletion finalizer, until the collector has deleted
                # its dependents; only those with blockOwnerDeletion: true hold it (docs: "Foreground cascading
                # deletion"). Without a collector it stays so.
                marked = json_copy(old)
                marked["metadata"]["deletionTimestamp"] = now_timestamp()
                marked["metadata"]["deletionGracePeriodSeconds"] = 0
                finalizers = list(marked["metadata"].get("finalizers") or [])
                marked["metadata"]["finalizers"] = [*finalizers, FOREGROUND_FINALIZER]
                self._commit(rtype, "MODIFIED", marked)
                uid = marked["metadata"]["uid"]
                self._foreground[uid] = (rtype.key, (marked["metadata"].get("namespace", ""), name))
                self._schedule_collection(uid)
                return json_copy(self.objects[rtype.key].get((ns, name), marked))
            if old["metadata"].get("finalizers"):
                marked = json_copy(old)
                marked["metadata"]["deletionTimestamp"] = now_timestamp()
                marked["metadata"]["deletionGracePeriodSeconds"] = 0
                self._commit(rtype, "MODIFIED", marked)
                return json_copy(marked)
            return self._remove(rtype, old)

    def _terminating(self, rtype: ResourceType, old: Obj, grace_period: int | None) -> Obj | None:
        """Graceful deletion of a pod, as the API server's pod strategy does it (Kubernetes documentation, Pod
        Lifecycle, "Termination of Pods"): the grace period is the request's `gracePeriodSeconds`, else the pod's
        `terminationGracePeriodSeconds`, else 30; 0 for a pod bound to no node or already Succeeded or Failed. With
        a period above 0 the pod is not removed: `metadata.deletionTimestamp` is set to now plus the period ("the
        time beyond which the Pod is considered dead") and `deletionGracePeriodSeconds` to the period, and the
        kubelet of its node stops its containers and then deletes it with period 0. A second deletion may only
        shorten the period; with 0 the pod is removed at once (a forced deletion). None: remove as any object."""
        meta, spec = old["metadata"], old.get("spec") or {}
        phase = (old.get("status") or {}).get("phase")
        period = grace_period if grace_period is not None else spec.get("terminationGracePeriodSeconds", 30)
        if not isinstance(period, int) or isinstance(period, bool) or period < 0:
            period = 30
        if not spec.get("nodeName") or phase in ("Succeeded", "Failed"):
            period = 0
        current = meta.get("deletionGracePeriodSeconds")
        if meta.get("deletionTimestamp"):
            if period == 0 and not meta.get("finalizers"):
                return None
            if not isinstance(current, int) or period >= current:
                return json_copy(old)
        elif period == 0:
            return None
        marked = json_copy(old)
        due = datetime.now(UTC) + timedelta(seconds=period)
        marked["metadata"]["deletionTimestamp"] = due.strftime("%Y-%m-%dT%H:%M:%SZ")
        marked["metadata"]["deletionGracePeriodSeconds"] = period
        self._commit(rtype, "MODIFIED", marked)
        return json_copy(marked)

    # ------------------------------------------------------------------ watches

    def subscribe(
        self,
        rtype: ResourceType,
        namespace: str | None,
        since: int | None,
        deliver: Callable[[WatchEvent], None],
    ) -> tuple[Subscription, list[WatchEvent]]:
        """Register a watch. With `since`, return the stored events after it (410 when compacted away);
        without, synthetic ADDED events of the current objects. Later changes go to `deliver`."""
        with self.lock:
            if since is not None and since < self.compacted:
                raise ApiError(410, "Expired", f"too old resource version: {since} ({self.compacted})")
            if since is not None:
                backlog = [
                    event
                    for event in self.history
                    if event.resource_version > since
                    and event.key == rtype.key
                    and (namespace is None or event.object["metadata"].get("namespace") == namespace)
                ]
            else:
                items, _ = self.list_objects(rtype, namespace)
                backlog = [
                    WatchEvent(int(obj["metadata"]["resourceVersion"]), "ADDED", rtype.key, obj) for obj in items
                ]
            subscription = Subscription(rtype.key, namespace, deliver)
            self.subscriptions.add(subscription)
            return subscription, backlog

    def unsubscribe(self, subscription: Subscription) -> None:
        with self.lock:
            self.subscriptions.discard(subscription)

    # ------------------------------------------------------------------ internals

    def _ns(self, rtype: ResourceType, namespace: str | None) -> str:
        if not rtype.namespaced:
            return ""
        return namespace or "default"

    def _require_namespace(self, namespace: str) -> None:
        ns_obj = self.objects[("", "namespaces")].get(("", namespace))
        if ns_obj is None:
            raise ApiError(
                404,
                "NotFound",
                f'namespaces "{namespace}" not found',
                details={"name": namespace, "kind": "namespaces"},
            )
        if ns_obj["metadata"].get("deletionTimestamp"):
            raise ApiError(
                403,
                "Forbidden",
                f"unable to create new content in namespace {namespace} because it is being terminated",
                details={"name": namespace, "kind": "namespaces"},
            )

    def _generate_name(self, rtype: ResourceType, namespace: str, prefix: str) -> str:
        for _ in range(100):
            name = prefix[:58] + "".join(random.choices(_SUFFIX_ALPHABET, k=5))
            if (namespace, name) not in self.objects[rtype.key]:
                return name
        raise ApiError(500, "InternalError", "could not generate a unique name")

    def _validate_name(self, rtype: ResourceType, name: str) -> None:
        pattern, limit = (_DNS1123_LABEL, 63) if rtype.kind in ("Namespace", "Service") else (_DNS1123_SUBDOMAIN, 253)
        if len(name) > limit or not pattern.fullmatch(name):
            raise invalid(
                rtype,
                name,
                f'metadata.name: Invalid value: "{name}": a lowercase RFC 1123 name must consist of lower case '
                "alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character",
                "metadata.name",
            )

    def _defaults_on_create(self, rtype: ResourceType, obj: Obj) -> None:
        if rtype.status_subresource:
            # Status is the controllers' to write; a create through the main endpoint drops it.
            obj.pop("status", None)
        if rtype.key == ("", "pods"):
            obj["status"] = {"phase": "Pending", "qosClass": "BestEffort"}
        elif rtype.key == ("", "namespaces"):
            obj["spec"] = {"finalizers": ["kubernetes"]}
            obj["status"] = {"phase": "Active"}
            obj["metadata"].setdefault("labels", {})["kubernetes.io/metadata.name"] = obj["metadata"]["name"]
        elif rtype.key == ("", "services"):
            spec = obj.setdefault("spec", {})
            spec.setdefault("type", "ClusterIP")
            if spec.get("clusterIP") != "None":
                count = len(self.objects[rtype.key]) + 1
                spec["clusterIP"] = f"10.96.{count // 250}.{count % 250 + 1}"
                spec["clusterIPs"] = [spec["clusterIP"]]
            obj["status"] = {"loadBalancer": {}}

    def _crd_type(self, crd: Obj) -> ResourceType:
        crds = self.types[("apiextensions.k8s.io", "customresourcedefinitions")]
        name = str(crd.get("metadata", {}).get("name", ""))
        try:
            new_type = type_from_crd(crd)
        except InvalidDefinition as e:
            raise invalid(crds, name, str(e)) from e
        try:
            schema_errors = structural.validate_crd(crd)
        except (AttributeError, TypeError, ValueError, KeyError) as e:
            raise ApiError(
                400,
                "BadRequest",
                f'CustomResourceDefinition in version "v1" cannot be handled as a CustomResourceDefinition: a '
                f"schema field has the wrong type ({type(e).__name__}: {e})",
            ) from e
        if schema_errors:
            raise invalid_fields(crds, name, schema_errors)
        existing = self.types.get(new_type.key)
        if existing is not None and existing.builtin:
            raise invalid(
                self.types[("apiextensions.k8s.io", "customresourcedefinitions")],
                crd["metadata"]["name"],
                "spec.group: a built-in group cannot be redefined",
            )
        return new_type

    def _commit(self, rtype: ResourceType, event_type: str, obj: Obj) -> None:
        self.resource_version += 1
        obj["metadata"]["resourceVersion"] = str(self.resource_version)
        key = (obj["metadata"].get("namespace", ""), obj["metadata"]["name"])
        previous = self.objects[rtype.key].get(key)
        if previous is not None:
            self._unindex(rtype, key, previous)
        if event_type == "DELETED":
            self.objects[rtype.key].pop(key, None)
        else:
            self.objects[rtype.key][key] = obj
            self._index(rtype, key, obj)
        event = WatchEvent(self.resource_version, event_type, rtype.key, json_copy(obj))
        if len(self.history) == self.history.maxlen:
            self.compacted = self.history[0].resource_version
        self.history.append(event)
        for subscription in list(self.subscriptions):
            if subscription.key == rtype.key and subscription.namespace in (None, key[0]):
                subscription.deliver(event)

    def _remove(self, rtype: ResourceType, obj: Obj) -> Obj:
        removed = json_copy(obj)
        self._commit(rtype, "DELETED", removed)
        if rtype.key == ("apiextensions.k8s.io", "customresourcedefinitions"):
            self._unregister_crd(removed)
        uid = removed["metadata"]["uid"]
        self._foreground.pop(uid, None)
        self._schedule_collection(uid)
        # A foreground owner waiting for this dependent looks again.
        self._schedule_collection(
            *(u for r in _owner_references(removed["metadata"]) if (u := str(r.get("uid"))) in self._foreground)
        )
        namespace = removed["metadata"].get("namespace")
        if namespace:
            self._finish_namespace_if_empty(namespace)
        return json_copy(removed)

    def _unregister_crd(self, crd: Obj) -> None:
        spec = crd.get("spec") or {}
        key = (spec.get("group", ""), (spec.get("names") or {}).get("plural", ""))
        rtype = self.types.get(key)
        if rtype is None or rtype.builtin:
            return
        for obj in list(self.objects[key].values()):
            self._commit(rtype, "DELETED", json_copy(obj))
        del self.types[key]
        del self.objects[key]

    def _all_objects(self) -> Iterable[tuple[ResourceType, Obj]]:
        for key, objects in list(self.objects.items()):
            rtype = self.types.get(key)
            if rtype is not None:
                for obj in list(objects.values()):
                    yield rtype, obj

    def _index(self, rtype: ResourceType, key: tuple[str, str], obj: Obj) -> None:
        meta = obj["metadata"]
        self._live_uids.add(meta["uid"])
        for ref in _owner_references(meta):
            self._dependents.setdefault(str(ref.get("uid")), {})[(rtype.key, key)] = None

    def _unindex(self, rtype: ResourceType, key: tuple[str, str], obj: Obj) -> None:
        meta = obj["metadata"]
        self._live_uids.discard(meta["uid"])
        for ref in _owner_references(meta):
            uid = str(ref.get("uid"))
            dependents = self._dependents.get(uid)
            if dependents is not None:
                dependents.pop((rtype.key, key), None)
                if not dependents:
                    del self._dependents[uid]

    def _schedule_collection(self, *owner_uids: str) -> None:
        """Have the collector look at the dependents of these owners: now (delay 0), later, or never (None)."""
        if self.gc_delay is None or not owner_uids:
            return
        if not self.gc_delay:
            for uid in owner_uids:
                self._collect_dependents(uid)
            return
        with self._gc_wakeup:
            for uid in owner_uids:
                heapq.heappush(self._gc_due, (time.monotonic() + self.gc_delay, next(_sequence), uid))
            if self._gc_thread is None:
                self._gc_thread = threading.Thread(target=self._collector, name="garbage-collector", daemon=True)
                self._gc_thread.start()
            self._gc_wakeup.notify()

    def _collector(self) -> None:
        """The asynchronous collector: each owner's dependents once its delay has passed."""
        while True:
            with self._gc_wakeup:
                while not self._gc_stopped and (not self._gc_due or self._gc_due[0][0] > time.monotonic()):
                    self._gc_wakeup.wait(self._gc_due[0][0] - time.monotonic() if self._gc_due else None)
                if self._gc_stopped:
                    return
                _, _, uid = heapq.heappop(self._gc_due)
                self._gc_busy = True
            try:
                with self.lock:
                    self._collect_dependents(uid)
            finally:
                with self._gc_wakeup:
                    self._gc_busy = False

    def stop_collector(self) -> None:
        with self._gc_wakeup:
            self._gc_stopped = True
            self._gc_wakeup.notify()

    @property
    def collection_pending(self) -> bool:
        """Whether the collector still has owners to look at (tests wait for it to be idle)."""
        with self._gc_wakeup:
            return bool(self._gc_due) or self._gc_busy

    def _collect_dependents(self, owner_uid: str) -> None:
        """Garbage collection of one owner's dependents.

        A dependent whose owners are all gone is deleted (docs: "Owners and dependents"; in the foreground when one
        of its owners is being deleted so, as the real collector does). A dependent of an owner in a foreground
        deletion is deleted too unless another owner is still there (then only the reference goes); once no
        dependent with blockOwnerDeletion: true is left, the owner's foregroundDeletion finalizer is removed.

        Through the owner index (not a scan of every object per deletion, which made deleting many objects
        quadratic), in the order of the types, then of the objects' commits."""
        order = {type_key: i for i, type_key in enumerate(self.objects)}
        found = sorted(self._dependents.get(owner_uid, {}), key=lambda k: order.get(k[0], len(order)))
        foreground = owner_uid in self._foreground
        for type_key, key in found:
            rtype, obj = self.types.get(type_key), self.objects.get(type_key, {}).get(key)
            if rtype is None or obj is None:
                continue  # gone meanwhile (collected as another dependent's dependent)
            owners = _owner_references(obj["metadata"])
            if not any(ref.get("uid") == owner_uid for ref in owners):
                continue
            live = [
                ref for ref in owners if ref.get("uid") in self._live_uids and ref.get("uid") not in self._foreground
            ]
            if not live and not obj["metadata"].get("deletionTimestamp"):
                waiting = any(ref.get("uid") in self._foreground for ref in owners)
                self.delete(rtype, key[1], key[0] or None, propagation="Foreground" if waiting else "Background")
            elif live and foreground:
                kept = json_copy(obj)
                kept["metadata"]["ownerReferences"] = [ref for ref in owners if ref.get("uid") != owner_uid]
                self._commit(rtype, "MODIFIED", kept)
        if foreground:
            self._finish_foreground(owner_uid)

    def _finish_foreground(self, owner_uid: str) -> None:
        """Remove the foregroundDeletion finalizer once no dependent with blockOwnerDeletion: true is left."""
        for type_key, key in self._dependents.get(owner_uid, {}):
            obj = self.objects.get(type_key, {}).get(key)
            refs = _owner_references(obj["metadata"]) if obj is not None else []
            if any(ref.get("uid") == owner_uid and ref.get("blockOwnerDeletion") is True for ref in refs):
                return
        waiting = self._foreground.pop(owner_uid, None)
        if waiting is None:
            return  # finished meanwhile (a dependent's removal looked again, within this collection)
        type_key, key = waiting
        rtype, owner = self.types.get(type_key), self.objects.get(type_key, {}).get(key)
        if rtype is None or owner is None:
            return
        done = json_copy(owner)
        done["metadata"]["finalizers"] = [
            f for f in done["metadata"].get("finalizers") or [] if f != FOREGROUND_FINALIZER
        ]
        self.update(rtype, key[1], done, key[0] or None)

    def _orphan_dependents(self, owner_uid: str) -> None:
        for rtype, obj in list(self._all_objects()):
            owners = obj["metadata"].get("ownerReferences") or []
            if any(ref.get("uid") == owner_uid for ref in owners):
                orphaned = json_copy(obj)
                remaining = [ref for ref in owners if ref.get("uid") != owner_uid]
                if remaining:
                    orphaned["metadata"]["ownerReferences"] = remaining
                else:
                    orphaned["metadata"].pop("ownerReferences", None)
                self._commit(rtype, "MODIFIED", orphaned)

    def _delete_namespace(self, rtype: ResourceType, ns_obj: Obj) -> Obj:
        marked = json_copy(ns_obj)
        marked["metadata"]["deletionTimestamp"] = now_timestamp()
        marked["status"] = {"phase": "Terminating"}
        self._commit(rtype, "MODIFIED", marked)
        namespace = marked["metadata"]["name"]
        for content_type, obj in list(self._all_objects()):
            if content_type.namespaced and obj["metadata"].get("namespace") == namespace:
                self.delete(content_type, obj["metadata"]["name"], namespace)
        self._finish_namespace_if_empty(namespace)
        return json_copy(self.objects[rtype.key].get(("", namespace), marked))

    def _finish_namespace_if_empty(self, namespace: str) -> None:
        ns_type = self.types[("", "namespaces")]
        ns_obj = self.objects[ns_type.key].get(("", namespace))
        if ns_obj is None or not ns_obj["metadata"].get("deletionTimestamp"):
            return
        if any(obj["metadata"].get("namespace") == namespace for rtype, obj in self._all_objects() if rtype.namespaced):
            return
        if not ns_obj["metadata"].get("finalizers"):
            self._remove(ns_type, json_copy(ns_obj))


_sequence = itertools.count()


def _owner_references(meta: Obj) -> list[Obj]:
    references = meta.get("ownerReferences")
    return [ref for ref in references if isinstance(ref, dict)] if isinstance(references, list) else []


def _version_of(obj: Obj, rtype: ResourceType) -> str | None:
    api_version = str(obj.get("apiVersion") or "")
    version = api_version.rsplit("/", 1)[-1]
    return version if version in rtype.versions else None


def _spec_of(obj: Obj) -> Obj:
    """Everything that bumps `metadata.generation` when it changes: all but metadata and status."""
    return {k: v for k, v in obj.items() if k not in ("metadata", "status", "apiVersion", "kind")}


def _crd_status(crd: Obj) -> Obj:
    spec = crd.get("spec") or {}
    timestamp = now_timestamp()
    return {
        "acceptedNames": json_copy(spec.get("names") or {}),
        "storedVersions": [v["name"] for v in spec.get("versions") or [] if v.get("storage")],
        "conditions": [
            {
                "type": "NamesAccepted",
                "status": "True",
                "reason": "NoConflicts",
                "message": "no conflicts found",
                "lastTransitionTime": timestamp,
            },
            {
                "type": "Established",
                "status": "True",
                "reason": "InitialNamesAccepted",
                "message": "the initial names have been accepted",
                "lastTransitionTime": timestamp,
            },
        ],
    }
