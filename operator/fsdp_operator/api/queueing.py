"""Kueue queueing of a job: which LocalQueue (and priority class) its RayCluster goes to. Pure, no I/O.

Kueue's RayCluster integration (https://kueue.sigs.k8s.io/docs/tasks/run/rayclusters/, "Queue selection" and
"Suspend control"): the RayCluster names its LocalQueue in the label `kueue.x-k8s.io/queue-name` (and optionally a
WorkloadPriorityClass in `kueue.x-k8s.io/priority-class`) and is created with `spec.suspend: true`; Kueue admits
it as one Workload, head and every worker together, by setting `spec.suspend: false`, and evicts it by setting it
true again (KubeRay then deletes the cluster's pods). docs/kueue.md.

The queue comes from `spec.queueName` or from the same label on the FSDPTrainingJob itself (as a user of Kueue
labels a batch/v1 Job). Both may be set only to the same value: two different queues are refused, naming both
fields, rather than one silently winning.
"""

from __future__ import annotations

from typing import Any

from fsdp_operator.api import formats
from fsdp_operator.api.fields import Problems, show

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"

QUEUE_NAME_DOC = (
    "The Kueue LocalQueue (in the job's namespace) that admits the job's RayCluster, head and all workers as one "
    "gang: the cluster is created suspended with the label kueue.x-k8s.io/queue-name, and the job is Queued until "
    "Kueue admits it (docs/kueue.md). The same label on the FSDPTrainingJob works too (a different value is "
    "refused). Empty: no queue, the RayCluster is created running."
)

# A LocalQueue name is a DNS-1123 subdomain; it also has to fit in a label value (63 characters).
QUEUE_NAME = formats.Grammar(
    "LocalQueue name (DNS-1123 subdomain of at most 63 characters)",
    lambda value: formats.DNS1123_SUBDOMAIN.check(value) if len(value) <= 63 else "longer than 63 characters",
    63,
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$",
)


def check_labels(labels: dict[str, str], queue_name: str, problems: Problems) -> None:
    """The queue label on the job agrees with spec.queueName, names a LocalQueue, and a priority class needs a
    queue (Kueue reads it only on a queued object)."""
    label = labels.get(QUEUE_LABEL)
    path = f"metadata.labels.{QUEUE_LABEL}"
    if label is not None:
        if (reason := QUEUE_NAME.check(label)) is not None:
            problems.append(f"{path}: {show(label)} is not a {QUEUE_NAME.name}: {reason}")
        elif queue_name and label != queue_name:
            problems.append(
                f"spec.queueName: {show(queue_name)} contradicts {path} ({show(label)}); set one of them, or both "
                "to the same LocalQueue"
            )
    if PRIORITY_LABEL in labels and not (queue_name or label):
        problems.append(
            f"metadata.labels.{PRIORITY_LABEL}: a Kueue priority class needs a queue (spec.queueName or "
            f"metadata.labels.{QUEUE_LABEL})"
        )


def queue_name(spec_queue: str, labels: dict[str, str]) -> str:
    """The LocalQueue of a valid job ('' for none): the spec's, else the label's (they agree when both are set)."""
    return spec_queue or labels.get(QUEUE_LABEL, "")


def cluster_labels(spec_queue: str, labels: dict[str, str]) -> dict[str, str]:
    """The Kueue labels the job's RayCluster carries: its queue and priority class; empty without a queue."""
    queue = queue_name(spec_queue, labels)
    if not queue:
        return {}
    out = {QUEUE_LABEL: queue}
    if PRIORITY_LABEL in labels:
        out[PRIORITY_LABEL] = labels[PRIORITY_LABEL]
    return out


def queue_of_manifest(manifest: dict[str, Any]) -> str:
    """The queue a raw manifest asks for, without parsing it in full (the controller decides what to observe)."""
    spec = manifest.get("spec")
    meta = manifest.get("metadata")
    spec_queue = spec.get("queueName") if isinstance(spec, dict) else None
    labels = meta.get("labels") if isinstance(meta, dict) else None
    label = labels.get(QUEUE_LABEL) if isinstance(labels, dict) else None
    return str(spec_queue or label or "")
