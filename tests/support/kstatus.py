"""kstatus's reading of a custom resource, as sigs.k8s.io/cli-utils/pkg/kstatus/status computes it (Flux's health
checks and `kubectl`-adjacent tools use it); the Go library cannot run here, so its published rules are written out.

`status.Compute`: `checkGenericProperties` first (generic.go): a deletion timestamp is Terminating; a
`status.observedGeneration` that differs from `metadata.generation` is InProgress ("LatestGenerationNotObserved");
a `Reconciling` condition with status True is InProgress, a `Stalled` one with status True is Failed (in the order
the conditions come). A kind with no rules of its own (every custom resource) is then Current ("Resource is
current"). Not reproduced: the built-in kinds' own rules (Deployment, Job, ...), which a custom resource never meets.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

IN_PROGRESS, FAILED, CURRENT, TERMINATING = "InProgress", "Failed", "Current", "Terminating"


def compute(obj: Mapping[str, Any]) -> tuple[str, str]:
    """(kstatus's status, its message) for a custom resource."""
    meta = obj.get("metadata") or {}
    status = obj.get("status") or {}
    if meta.get("deletionTimestamp"):
        return TERMINATING, "Resource scheduled for deletion"
    generation, observed = meta.get("generation"), status.get("observedGeneration")
    if generation is not None and observed is not None and observed != generation:
        return (
            IN_PROGRESS,
            f"{obj.get('kind')} generation is {generation}, but latest observed generation is {observed}",
        )
    for condition in status.get("conditions") or []:
        if condition.get("type") == "Reconciling" and condition.get("status") == "True":
            return IN_PROGRESS, str(condition.get("message", ""))
        if condition.get("type") == "Stalled" and condition.get("status") == "True":
            return FAILED, str(condition.get("message", ""))
    return CURRENT, "Resource is current"
