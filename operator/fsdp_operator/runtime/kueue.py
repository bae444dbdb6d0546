"""Reading Kueue's Workload of a queued job's RayCluster: an observation for `decide/queue.py`.

One list call per pass, only while the cluster is suspended or the job is Queued or Preempted, by the label Kueue
puts on the Workload (`kueue.x-k8s.io/job-uid`: the RayCluster's uid). An API server without Kueue's CRD answers
404 for the collection, and one whose RBAC does not let the operator read Workloads answers 403: both become a
message in the job's status, never a hang without a word (docs/kueue.md).
"""

from __future__ import annotations

from fsdp_operator.decide.observed import ClusterView
from fsdp_operator.decide.workload import JOB_UID_LABEL, WorkloadView, workload_of
from fsdp_operator.runtime.kube import Kube, KubeError

NOT_SERVED = (
    "Kueue's Workload API (workloads.kueue.x-k8s.io/v1beta1) is not served by this cluster: is Kueue installed? "
    "Nothing admits the RayCluster without it (docs/kueue.md)"
)


async def read_workload(kube: Kube, namespace: str, cluster: ClusterView) -> tuple[WorkloadView | None, str]:
    """(the cluster's Workload or None, why Workloads cannot be read or '')."""
    try:
        items = await kube.list_workloads(namespace, f"{JOB_UID_LABEL}={cluster.uid}")
    except KubeError as e:
        if e.status in (401, 403):
            return None, f"the operator may not list Kueue's Workloads (the chart's RBAC grants it): {e}"[:1024]
        raise  # no answer, 5xx, 429: the pass is retried
    if items is None:
        return None, NOT_SERVED
    return workload_of(items, cluster.uid), ""
