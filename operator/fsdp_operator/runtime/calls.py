"""Every request the operator may make of the Kubernetes API, in one table: verb, API group, resource.

The operator's own client (`kube.py`) builds each request from one of the `Call`s below (method and path come
from the call, so no request can leave the table), and kopf's own watches, lists and patches are declared
here as kopf makes them (`../shared/notes/environment.md`: kopf lists CRDs at cluster scope in both modes, and
namespaces when it watches chosen namespaces). `required(watch_all, peering)` is what the chart's
ClusterRole and Roles must grant, no more and no less: `tests/integration/test_rbac.py` holds the rules that
`helm template` renders equal to it in both `watchAllNamespaces` modes, and `fsdpctl run-local` creates its
operator's roles from it.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import quote

from fsdp_operator.api import schema

METHODS = {"get": "GET", "list": "GET", "watch": "GET", "create": "POST", "patch": "PATCH", "delete": "DELETE"}


@dataclass(frozen=True, slots=True)
class Call:
    """One kind of request: `verb` on `resource` (with `/subresource`) of `group`, and why it is made."""

    verb: str
    group: str
    version: str
    resource: str
    why: str
    namespaced: bool = True

    @property
    def rule(self) -> tuple[str, str, str]:
        """(verb, group, resource) as an RBAC rule names it."""
        return self.verb, self.group, self.resource

    @property
    def method(self) -> str:
        return METHODS[self.verb]

    def path(self, namespace: str = "", name: str = "") -> str:
        """The request's path: the collection (list, create), or the object `name` (get, patch, delete)."""
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        plural, _, subresource = self.resource.partition("/")
        if self.namespaced:
            base += f"/namespaces/{quote(namespace, safe='')}"
        path = f"{base}/{plural}"
        if name:
            path += f"/{quote(name, safe='')}" + (f"/{subresource}" if subresource else "")
        return path


def _call(verb: str, group: str, version: str, resource: str, why: str, *, namespaced: bool = True) -> Call:
    return Call(verb, group, version, resource, why, namespaced)


_JOBS = (schema.GROUP, schema.VERSION, schema.PLURAL)
_CLUSTERS = ("ray.io", "v1", "rayclusters")
_SECRETS = ("", "v1", "secrets")
_POLICIES = ("networking.k8s.io", "v1", "networkpolicies")

# --- the operator's own client (kube.py) ---
GET_JOB = _call("get", *_JOBS, "a job loop reads its job (first pass, after a failed one; else the watch's copy)")
PATCH_JOB_STATUS = _call("patch", schema.GROUP, schema.VERSION, f"{schema.PLURAL}/status", "the one status writer")
DELETE_JOB = _call("delete", *_JOBS, "runPolicy.ttlSecondsAfterFinished ran out")
GET_CLUSTER = _call("get", *_CLUSTERS, "the job's RayCluster, when the watch has none of it or said nothing for long")
CREATE_CLUSTER = _call("create", *_CLUSTERS, "the job's RayCluster")
DELETE_CLUSTER = _call("delete", *_CLUSTERS, "cleanup, the finalizer, a deleted namesake's leftover, Kueue's eviction")
CREATE_SECRET = _call("create", *_SECRETS, "each job's Ray token and event-signing key")
GET_SECRET = _call("get", *_SECRETS, "the job's Secret read back by name (never listed or watched)")
DELETE_SECRET = _call(
    "delete",
    *_SECRETS,
    "the Secret a deleted job of the same name left, only with its uid as precondition (the garbage collector "
    "may take minutes, or not run at all)",
)
CREATE_POLICY = _call("create", *_POLICIES, "each job's NetworkPolicy closing Ray's ports")
GET_POLICY = _call("get", *_POLICIES, "whose NetworkPolicy answered 409: the job's own, or a deleted namesake's")
DELETE_POLICY = _call(
    "delete", *_POLICIES, "the NetworkPolicy a deleted job of the same name left, only with its uid as precondition"
)
LIST_PODS = _call("list", "", "v1", "pods", "why workers wait: Pending pods (a loop run without kopf's pod watch)")
LIST_EVENTS = _call("list", "", "v1", "events", "the scheduler's FailedScheduling and KubeRay's refusals")
CREATE_EVENT = _call("create", "", "v1", "events", "the operator's Events about its jobs (kopf's too)")
LIST_WORKLOADS = _call("list", "kueue.x-k8s.io", "v1beta1", "workloads", "spec.queueName: why Kueue waits")
LIST_NODES = _call("list", "", "v1", "nodes", "placement.availabilityZone: auto: zones of the type", namespaced=False)

CLIENT_CALLS = (
    GET_JOB, PATCH_JOB_STATUS, DELETE_JOB, GET_CLUSTER, CREATE_CLUSTER, DELETE_CLUSTER,
    CREATE_SECRET, GET_SECRET, DELETE_SECRET, CREATE_POLICY, GET_POLICY, DELETE_POLICY,
    LIST_PODS, LIST_EVENTS, CREATE_EVENT, LIST_WORKLOADS, LIST_NODES,
)  # fmt: skip
"""What `kube.AioKube` sends; `Kube.delete_owned` picks among the three DELETEs by kind."""

DELETE_POD = _call(
    "delete", "", "v1", "pods", "nodeNotices: a worker pod on a node that goes away, so that its preStop hook saves"
)
NODE_NOTICE_CALLS = (DELETE_POD,)
"""Only with the chart's `nodeNotices.enabled` (the operator's FSDP_NODE_NOTICES): reading nodes is granted anyway."""

# --- kopf's own requests (handlers.py registers the watches; kopf makes the calls) ---
_CRDS = ("apiextensions.k8s.io", "v1", "customresourcedefinitions")
KOPF_CALLS = (
    _call("list", *_CRDS, "kopf finds what to watch, at cluster scope in both modes", namespaced=False),
    _call("watch", *_CRDS, "kopf follows CRDs coming and going", namespaced=False),
    _call("list", *_JOBS, "kopf's watch of the jobs"),
    _call("watch", *_JOBS, "kopf's watch of the jobs"),
    _call("patch", *_JOBS, "kopf's finalizer and its annotations on the job"),
    _call("list", *_CLUSTERS, "kopf's watch of managed RayClusters (wakes a job)"),
    _call("watch", *_CLUSTERS, "kopf's watch of managed RayClusters (wakes a job)"),
    _call("list", "", "v1", "pods", "kopf's watch of managed pods (wakes a job)"),
    _call("watch", "", "v1", "pods", "kopf's watch of managed pods (wakes a job)"),
    _call("create", "", "v1", "events", "kopf's Events about handlers"),
)
KOPF_NAMESPACED_MODE_CALLS = (
    _call("list", "", "v1", "namespaces", "kopf follows the watched namespaces", namespaced=False),
    _call("watch", "", "v1", "namespaces", "kopf follows the watched namespaces", namespaced=False),
)
"""Only when kopf watches chosen namespaces (`watchAllNamespaces: false`)."""


def peering_calls(watch_all: bool) -> tuple[Call, ...]:
    """Replicas elect the active one through kopf's peering object: watched, and its heartbeat patched."""
    resource = "clusterkopfpeerings" if watch_all else "kopfpeerings"
    return tuple(
        _call(verb, "kopf.dev", "v1", resource, "kopf's peering between replicas", namespaced=not watch_all)
        for verb in ("list", "watch", "patch")
    )


ADMISSION_CHECKS = (
    _call(
        "update",
        schema.GROUP,
        schema.VERSION,
        f"{schema.PLURAL}/finalizers",
        "never a request: OwnerReferencesPermissionEnforcement lets a child name its job as owner with "
        "blockOwnerDeletion only for who may update the job's finalizers",
    ),
)


def required(
    watch_all: bool, peering: bool, node_notices: bool = False
) -> tuple[set[tuple[str, str, str]], set[tuple[str, str, str]]]:
    """(rules at cluster scope, rules in each watched namespace) the operator needs, as (verb, group, resource).

    Watching every namespace, everything is granted at cluster scope (one ClusterRole); watching chosen ones,
    only the cluster-scoped resources are, and the rest by a Role in each namespace."""
    calls = [*CLIENT_CALLS, *KOPF_CALLS, *ADMISSION_CHECKS]
    if not watch_all:
        calls += KOPF_NAMESPACED_MODE_CALLS
    if peering:
        calls += peering_calls(watch_all)
    if node_notices:
        calls += NODE_NOTICE_CALLS
    cluster = {c.rule for c in calls if watch_all or not c.namespaced}
    namespaced = set() if watch_all else {c.rule for c in calls if c.namespaced}
    return cluster, namespaced


def rules(needed: set[tuple[str, str, str]]) -> list[dict[str, list[str]]]:
    """RBAC `rules` granting exactly `needed`: one rule per (group, resource), its verbs sorted."""
    verbs: dict[tuple[str, str], set[str]] = {}
    for verb, group, resource in needed:
        verbs.setdefault((group, resource), set()).add(verb)
    return [
        {"apiGroups": [group], "resources": [resource], "verbs": sorted(found)}
        for (group, resource), found in sorted(verbs.items())
    ]
