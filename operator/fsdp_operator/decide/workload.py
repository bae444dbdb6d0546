"""What the state machine reads of Kueue's Workload for a job's RayCluster (`WorkloadView`). Pure data.

Kueue (kueue.x-k8s.io/v1beta1) makes one Workload per queued RayCluster, labelled `kueue.x-k8s.io/job-uid` with the
cluster's uid and owned by it, and reports admission in `status.conditions` (metav1.Condition):
`QuotaReserved` (False, reason `Pending`, with the flavor assigner's message such as "couldn't assign flavors to pod
set workers: insufficient unused quota for nvidia.com/gpu in flavor default-flavor, 8 more needed"), `Admitted`,
`Evicted` (reason `Preempted`, `PodsReadyTimeout`, `InactiveWorkload`, ...), `Preempted` and `Finished`; the
admitting ClusterQueue is `status.admission.clusterQueue` (https://kueue.sigs.k8s.io/docs/concepts/workload/).
Everything here comes from another controller: read as untrusted, bounded, never raising.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fsdp_train.contract.events import clean_text

from fsdp_operator.decide.untrusted import mapping

JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
"""The label Kueue puts on a Workload: the uid of the object it queues (here the RayCluster)."""
TEXT_LIMIT = 512


def _text(value: Any) -> str:
    return clean_text(value, TEXT_LIMIT) if isinstance(value, str) else ""


@dataclass(frozen=True, slots=True)
class WorkloadView:
    """A Workload's admission state, as the job's status shows it."""

    name: str
    quota_reserved: bool = False
    admitted: bool = False
    cluster_queue: str = ""
    """The ClusterQueue that reserved quota for it (`status.admission.clusterQueue`); empty before."""
    pending: str = ""
    """Why it waits: the reason and message of `QuotaReserved` (or `Admitted`) when False; empty when unknown."""
    evicted: str = ""
    """Why it was evicted: the reason and message of `Evicted` when True; empty otherwise."""

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> WorkloadView:
        meta, status = mapping(obj.get("metadata")), mapping(obj.get("status"))
        raw = status.get("conditions")
        conditions = {str(c.get("type")): c for c in (mapping(c) for c in (raw if isinstance(raw, list) else [])) if c}

        def true(type_: str) -> bool:
            return conditions.get(type_, {}).get("status") == "True"

        def said(type_: str) -> str:
            c = conditions.get(type_, {})
            reason, message = _text(c.get("reason")), _text(c.get("message"))
            return f"{reason}: {message}" if reason and message else reason or message

        pending = ""
        if not true("QuotaReserved") and "QuotaReserved" in conditions:
            pending = said("QuotaReserved")
        elif true("QuotaReserved") and not true("Admitted") and "Admitted" in conditions:
            pending = said("Admitted")  # quota reserved, admission checks still pending
        return cls(
            name=_text(meta.get("name")),
            quota_reserved=true("QuotaReserved"),
            admitted=true("Admitted"),
            cluster_queue=_text(mapping(status.get("admission")).get("clusterQueue")),
            pending=pending,
            evicted=said("Evicted") if true("Evicted") else "",
        )


def workload_of(items: Sequence[Any], cluster_uid: str) -> WorkloadView | None:
    """The Workload of the RayCluster `cluster_uid` among `items` (a list answer): the one it owns, newest first."""
    owned = []
    for item in items:
        meta = mapping(mapping(item).get("metadata"))
        references = meta.get("ownerReferences")
        owners = [mapping(o) for o in references] if isinstance(references, list) else []
        if any(o.get("uid") == cluster_uid for o in owners):
            owned.append((str(meta.get("creationTimestamp") or ""), mapping(item)))
    if not owned:
        return None
    return WorkloadView.from_object(max(owned, key=lambda pair: pair[0])[1])
