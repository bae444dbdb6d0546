"""What one reconcile pass sees (`Observed`) and what it decides (`Decision`, the `Action`s). Pure data."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from fsdp_train.contract.events import Event

from fsdp_operator.api import render
from fsdp_operator.capacity.plan import ZoneChoice
from fsdp_operator.decide.status import (
    JobStatus,
)
from fsdp_operator.decide.untrusted import mapping
from fsdp_operator.decide.workload import WorkloadView

# Ray's job states (ray.job_submission.JobStatus values).
RAY_PENDING, RAY_RUNNING, RAY_SUCCEEDED = "PENDING", "RUNNING", "SUCCEEDED"


RAY_FAILED, RAY_STOPPED = "FAILED", "STOPPED"


RAY_TERMINAL = frozenset({RAY_SUCCEEDED, RAY_FAILED, RAY_STOPPED})


RAY_UNREACHABLE_TIMEOUT = 300.0
"""Seconds a submitted job's Ray job API may stay silent before the job fails (the operator's default)."""


@dataclass(frozen=True, slots=True)
class ClusterView:
    """The parts of a RayCluster object the state machine reads."""

    name: str
    state: str = ""
    """KubeRay's `status.state` (`ready`, `failed`, `suspended`, ...); empty before KubeRay wrote one."""
    ready_workers: int = 0
    desired_workers: int = 0
    deleting: bool = False
    owner_uid: str = ""
    """The uid in the controller ownerReference; empty when the cluster has none."""
    dashboard_url: str = ""
    """Ray's dashboard / job API, from `status.head` and `status.endpoints` as KubeRay writes them."""
    reason: str = ""
    """KubeRay's `status.reason`: why the state is what it is (set with `failed`)."""
    head_not_ready: str = ""
    """KubeRay's HeadPodReady condition when it is False: its reason and message (the head pod's Ready); else empty."""
    owner_kind: str = ""
    owner_name: str = ""
    uid: str = ""
    suspended: bool = False
    """`spec.suspend` is true: no pods (Kueue has not admitted it, or evicted it; docs/kueue.md)."""

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> ClusterView:
        meta = mapping(obj.get("metadata"))
        status = mapping(obj.get("status"))
        references = meta.get("ownerReferences")
        owners = [mapping(o) for o in references] if isinstance(references, list) else []
        owner: Mapping[str, Any] = next((o for o in owners if o.get("controller") is True), {})
        return cls(
            name=str(meta.get("name", "")),
            state=str(status.get("state") or ""),
            ready_workers=_count(status.get("readyWorkerReplicas")),
            desired_workers=_count(status.get("desiredWorkerReplicas")),
            deleting=bool(meta.get("deletionTimestamp")),
            owner_uid=str(owner.get("uid", "")),
            owner_kind=str(owner.get("kind", "")),
            owner_name=str(owner.get("name", "")),
            uid=str(meta.get("uid", "")),
            dashboard_url=dashboard_url(obj),
            reason=str(status.get("reason") or ""),
            head_not_ready=_head_not_ready(status.get("conditions")),
            suspended=mapping(obj.get("spec")).get("suspend") is True,
        )


def _head_not_ready(conditions: Any) -> str:
    for condition in conditions if isinstance(conditions, list) else []:
        c = mapping(condition)
        if c.get("type") == "HeadPodReady" and c.get("status") == "False":
            return f"{c.get('reason') or 'HeadPodNotReady'}: {c.get('message') or 'no message'}"[:512]
    return ""


@dataclass(frozen=True, slots=True)
class ChildView:
    """An object under one of the job's names (its auth Secret, its NetworkPolicy) that a create found there and
    that is not the job's own."""

    kind: str
    name: str
    uid: str
    owner_uid: str = ""
    owner_kind: str = ""
    owner_name: str = ""
    deleting: bool = False

    @classmethod
    def from_object(cls, kind: str, obj: Mapping[str, Any]) -> ChildView:
        view = ClusterView.from_object(obj)
        return cls(kind, view.name, view.uid, view.owner_uid, view.owner_kind, view.owner_name, view.deleting)


def _count(value: Any) -> int:
    """A replica count from another controller's status (typed there, unchecked here)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def dashboard_url(obj: Mapping[str, Any]) -> str:
    """`http://<head service IP or name>:<dashboard port>` from a RayCluster's status; empty when unknown."""
    status = obj.get("status") or {}
    head = status.get("head") or {}
    meta = obj.get("metadata") or {}
    port = str((status.get("endpoints") or {}).get("dashboard") or render.DASHBOARD_PORT)
    host = head.get("serviceIP") or ""
    if not host and head.get("serviceName"):
        host = f"{head['serviceName']}.{meta.get('namespace', 'default')}.svc"
    return f"http://{host}:{port}" if host else ""


@dataclass(frozen=True, slots=True)
class RayNodes:
    """Ray's own view of the cluster: alive worker (non-head) nodes and their resources."""

    alive_workers: int
    gpus: float
    cpus: float


@dataclass(frozen=True, slots=True)
class RayJobInfo:
    submission_id: str
    status: str
    message: str = ""


@dataclass(frozen=True, slots=True)
class NodeNotice:
    """A worker pod of the job on a node that a termination taint marks as going away (`runtime/nodes.py`)."""

    pod: str
    uid: str
    node: str
    taint: str
    deleting: bool = False
    """The pod is being deleted already (a drain, `kubectl delete pod`): nothing to do but to record it."""


@dataclass(frozen=True, slots=True)
class Observed:
    """Everything one pass saw. `None` means "absent" (cluster, Ray job) or "not asked"."""

    now: datetime
    cluster: ClusterView | None = None
    unschedulable: str = ""
    """The scheduler's message for a Pending worker or head pod (FailedScheduling); empty when none."""
    containers_held: str = ""
    """A container of the cluster's pods that the kubelet keeps from running (CrashLoopBackOff, ImagePullBackOff,
    ...), in its words with the pod's name; empty when none."""
    create_refused: str = ""
    """The API server's refusal of a create the job needs, for a reason a retry does not change by itself (RBAC,
    admission, validation, quota): of the job's Secret, NetworkPolicy or RayCluster by the operator, or of a pod by
    KubeRay (its FailedToCreateHeadPod / FailedToCreateWorkerPod event). Empty when none."""
    ray_nodes: RayNodes | None = None
    ray_job: RayJobInfo | None = None
    ray_error: str = ""
    """Why Ray's API could not be asked (connection refused, timeout); empty when it answered."""
    events: tuple[Event, ...] = ()
    """Structured events from the job log since `status.logOffset`."""
    log_offset: int | None = None
    """The log offset after `events`; None when the log was not read."""
    submit_error: str = ""
    """Ray rejected the submission of `status.submissionId` (not a transient error)."""
    skipped_lines: int = 0
    """Event lines in the log read this pass that did not parse (malformed, over-long)."""
    forged_lines: int = 0
    """Event lines in the log read this pass that failed the signature check (never folded)."""
    log_pending: bool = False
    """More of the job log is waiting than one pass reads: the next pass comes at once."""
    foreign_secret: str = ""
    """The job's auth Secret exists and is not owned by this job: its name."""
    children: tuple[ChildView, ...] = ()
    """Objects under the job's names whose create answered 409 and that are not the job's own."""
    zone_choice: ZoneChoice | None = None
    """For `placement.availabilityZone: auto` before the cluster exists: the zone AWS advised (or why none)."""
    workload: WorkloadView | None = None
    """Kueue's Workload of the RayCluster, read while the cluster is suspended or the job Queued; None: not found."""
    workload_error: str = ""
    """Why Kueue's Workloads could not be read (no Kueue installed, RBAC); empty when they were."""
    node_notices: tuple[NodeNotice, ...] = ()
    """Worker pods being deleted, and (with the operator's `nodeNotices` on) those on nodes with a termination taint."""


@dataclass(frozen=True, slots=True)
class CreateRayCluster:
    manifest: dict[str, Any]


@dataclass(frozen=True, slots=True)
class DeleteRayCluster:
    namespace: str
    name: str


@dataclass(frozen=True, slots=True)
class SubmitJob:
    submission: render.Submission


@dataclass(frozen=True, slots=True)
class StopJob:
    submission_id: str


@dataclass(frozen=True, slots=True)
class CreateAuthSecret:
    """The per-job Secret for Ray's auth token and the event key (the controller draws both); 409: it exists."""

    manifest: dict[str, Any]


@dataclass(frozen=True, slots=True)
class ApplyNetworkPolicy:
    """The per-job NetworkPolicy closing Ray's ports; 409 means it exists."""

    manifest: dict[str, Any]


@dataclass(frozen=True, slots=True)
class DeleteLeftover:
    """Delete what a deleted job of the same name left under this job's names, only while it is the object `uid`
    (a precondition: never a newer one); its create follows once it is gone."""

    kind: str
    namespace: str
    name: str
    uid: str


@dataclass(frozen=True, slots=True)
class DeletePod:
    """Delete a worker pod (while it is the pod `uid`) whose node goes away: its preStop hook saves a checkpoint."""

    namespace: str
    name: str
    uid: str


@dataclass(frozen=True, slots=True)
class PostEvent:
    type: Literal["Normal", "Warning"]
    reason: str
    message: str


@dataclass(frozen=True, slots=True)
class DeleteJob:
    """`ttlSecondsAfterFinished` ran out: delete the FSDPTrainingJob itself."""


Action = (
    CreateRayCluster
    | DeleteRayCluster
    | SubmitJob
    | StopJob
    | PostEvent
    | DeleteJob
    | CreateAuthSecret
    | ApplyNetworkPolicy
    | DeleteLeftover
    | DeletePod
)


MUST_STOP_ACTIONS = (StopJob, DeleteRayCluster)
"""Actions that end what runs: taken even when the API server refuses every form of the status decided with them."""
PREREQUISITES = (CreateAuthSecret, ApplyNetworkPolicy)
"""What a RayCluster needs before it is created; neither needs the other."""
KIND = {CreateAuthSecret: "Secret", ApplyNetworkPolicy: "NetworkPolicy", CreateRayCluster: "RayCluster"}


def together(actions: Iterable[Action]) -> Iterator[list[Action]]:
    """The actions in order, one at a time, except a RayCluster's prerequisites next to each other: together, taken at
    once (with many jobs created together each request waits its turn at the API server: a round trip fewer before
    each new job's cluster, docs/reliability.md, "Load")."""
    batch: list[Action] = []
    for action in actions:
        if batch and not (isinstance(action, PREREQUISITES) and isinstance(batch[0], PREREQUISITES)):
            yield batch
            batch = []
        batch.append(action)
    if batch:
        yield batch


@dataclass(frozen=True, slots=True)
class Decision:
    status: JobStatus
    actions: tuple[Action, ...] = ()
    requeue_after: float | None = None
    """Seconds until the next pass is due regardless of events (TTL); None: the usual interval."""
    done: bool = False
    """Terminal and nothing left to do: the per-job loop stops polling and waits for news of the job (an edit)."""
    contained_error: str = ""
    """An error this pass contained and went on from (an event whose folding raised, skipped alone): the
    `ReconcileError` condition says so, as for a pass that failed."""
