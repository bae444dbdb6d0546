"""What a job loop reads about a job before its workers are up: why its pods wait (the scheduler's word, a pod
KubeRay could not create), and the zone AWS advises for `availabilityZone: auto`."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from fsdp_operator.api.render import INSTANCE_TYPE_LABEL
from fsdp_operator.api.spec import ZONE_LABEL, Job, NotAJobError, SpecError, parse_job
from fsdp_operator.capacity.ec2 import NoCredentials
from fsdp_operator.capacity.plan import ZoneChoice
from fsdp_operator.runtime.kube import Kube, KubeError
from fsdp_operator.runtime.shared import Runtime

Obj = dict[str, Any]


def auto_zone_job(obj: Obj) -> Job | None:
    """The job when it asks for `availabilityZone: auto` (an invalid one is reconcile's to report)."""
    try:
        job = parse_job(obj)
    except (SpecError, NotAJobError):
        return None
    return job if job.spec.placement.availability_zone == "auto" else None


def _zone_of(node: Obj) -> str:
    labels = (node.get("metadata") or {}).get("labels") or {}
    return str(labels.get(ZONE_LABEL) or "")


async def choose_zone(rt: Runtime, job: Job, log: logging.LoggerAdapter[logging.Logger] | logging.Logger) -> ZoneChoice:
    """Ask AWS for the best zone among those where the cluster has nodes of the type (any, when it has none)."""
    instance_type, count = job.spec.workers.instance_type, job.spec.workers.replicas
    if rt.zones is None:
        return ZoneChoice("", "the operator has no AWS access configured")
    try:
        nodes = await rt.kube.list_nodes(f"{INSTANCE_TYPE_LABEL}={instance_type}")
    except KubeError as e:
        log.warning(f"cannot list nodes ({e}); considering every zone")
        nodes = []
    zones = sorted({zone for node in nodes if (zone := _zone_of(node))})
    try:
        return await asyncio.wait_for(rt.zones.choose(instance_type, count, zones), rt.config.zone_advice_timeout)
    except NoCredentials:
        return ZoneChoice("", "no AWS credentials (IRSA or an instance role) for the operator")
    except TimeoutError:
        return ZoneChoice("", f"AWS did not answer within {rt.config.zone_advice_timeout:g}s")


async def unschedulable(kube: Kube, namespace: str, cluster_name: str) -> str:
    """The scheduler's message for a Pending pod of the cluster (pod condition, else FailedScheduling event)."""
    pods = await kube.list_pods(namespace, f"ray.io/cluster={cluster_name}")
    pending = [p for p in pods if (p.get("status") or {}).get("phase", "Pending") == "Pending"]
    for pod in pending:
        for condition in (pod.get("status") or {}).get("conditions") or []:
            if (
                condition.get("type") == "PodScheduled"
                and condition.get("status") == "False"
                and condition.get("reason") == "Unschedulable"
                and condition.get("message")
            ):
                return f"pod {pod['metadata']['name']}: {condition['message']}"
    if not pending:
        return ""
    names = {p["metadata"]["name"] for p in pending}
    events = await kube.list_events(namespace, "involvedObject.kind=Pod,reason=FailedScheduling")
    ours = [e for e in events if (e.get("involvedObject") or {}).get("name") in names]
    if not ours:
        return ""
    latest = max(ours, key=lambda e: str(e.get("lastTimestamp") or e.get("eventTime") or ""))
    return f"pod {latest['involvedObject']['name']}: {latest.get('message', '')}"


async def pods_refused(kube: Kube, namespace: str, cluster_name: str) -> str:
    """KubeRay's latest word that the API server refused a pod of the cluster (its FailedToCreateHeadPod and
    FailedToCreateWorkerPod Warning events on the RayCluster); empty when none."""
    selector = f"involvedObject.kind=RayCluster,involvedObject.name={cluster_name}"
    events = [
        e
        for e in await kube.list_events(namespace, selector)
        if e.get("reason") in ("FailedToCreateHeadPod", "FailedToCreateWorkerPod")
    ]
    if not events:
        return ""
    latest = max(events, key=lambda e: str(e.get("lastTimestamp") or e.get("eventTime") or ""))
    return f"KubeRay could not create a pod ({latest.get('reason')}): {str(latest.get('message', ''))[:600]}"
