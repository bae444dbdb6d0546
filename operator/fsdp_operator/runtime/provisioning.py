"""What a job loop reads about a job before its workers are up: why its pods wait (the scheduler's word, a pod
KubeRay could not create), and the zone AWS advises for `availabilityZone: auto`."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from fsdp_operator.api.render import INSTANCE_TYPE_LABEL, RAY_CLUSTER_LABEL
from fsdp_operator.api.spec import ZONE_LABEL, Job, NotAJobError, SpecError, parse_job
from fsdp_operator.capacity.ec2 import NoCredentials
from fsdp_operator.capacity.plan import ZoneChoice
from fsdp_operator.decide.untrusted import mapping
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


def _expected_pods(cluster: Obj) -> int:
    """The pods a RayCluster asks for: its head and each worker group's replicas."""
    groups = (cluster.get("spec") or {}).get("workerGroupSpecs") or []
    replicas = [g.get("replicas") for g in groups if isinstance(g, dict)]
    return 1 + sum(r for r in replicas if isinstance(r, int) and not isinstance(r, bool) and r > 0)


EVENTS_EVERY = 6
"""A provisioning job's events are read at most once per this many re-observe intervals (30 s by default)."""


class WhyWaiting:
    """Why a job's cluster is not ready yet, as one job loop reads it pass after pass.

    The pods come from the operator's pod watch (`Watched`), or are listed where nothing watches them. Events are
    read at most once per `EVENTS_EVERY` intervals per job, and only when they can tell something: the scheduler's
    FailedScheduling when a Pending pod carries no scheduler condition, KubeRay's refusals when the cluster has fewer
    pods than it asks for. Listing both on every pass of every provisioning job was most of the operator's requests
    with many jobs at once (docs/reliability.md, "Load")."""

    def __init__(self) -> None:
        self.read_at = float("-inf")
        self.from_events = ("", "")

    async def read(self, rt: Runtime, namespace: str, cluster: Obj) -> tuple[str, str, str]:
        """(the scheduler's message for a Pending pod, KubeRay's latest refusal of a pod, a container the kubelet
        keeps from running): '' for none."""
        name = str(cluster["metadata"]["name"])
        if rt.watched.pods_watched:
            pods = rt.watched.pods(namespace, name)
        else:
            pods = await rt.kube.list_pods(namespace, f"{RAY_CLUSTER_LABEL}={name}")
        message, pending = scheduler_condition(pods)
        short = len(pods) < _expected_pods(cluster)
        if (pending or short) and time.monotonic() - self.read_at >= EVENTS_EVERY * rt.config.interval:
            self.read_at = time.monotonic()
            self.from_events = (
                await failed_scheduling(rt.kube, namespace, pending) if pending else "",
                await pods_refused(rt.kube, namespace, name) if short else "",
            )
        unschedulable = message or (self.from_events[0] if pending else "")
        return unschedulable, self.from_events[1] if short else "", containers_held(pods)


def scheduler_condition(pods: list[Obj]) -> tuple[str, set[str]]:
    """(the scheduler's Unschedulable condition on a Pending pod or '', the Pending pods' names)."""
    pending = [p for p in pods if (p.get("status") or {}).get("phase", "Pending") == "Pending"]
    for pod in pending:
        for condition in (pod.get("status") or {}).get("conditions") or []:
            if (
                condition.get("type") == "PodScheduled"
                and condition.get("status") == "False"
                and condition.get("reason") == "Unschedulable"
                and condition.get("message")
            ):
                return f"pod {pod['metadata']['name']}: {condition['message']}", set()
    return "", {p["metadata"]["name"] for p in pending}


HELD_REASONS = frozenset(
    {
        # pkg/kubelet/container/sync_result.go and pkg/kubelet/kuberuntime/kuberuntime_container.go
        "CrashLoopBackOff",
        "RunContainerError",
        "CreateContainerConfigError",
        "CreateContainerError",
        "PreStartHookError",
        "PostStartHookError",
        # pkg/kubelet/images/types.go
        "ImagePullBackOff",
        "ErrImagePull",
        "ErrImageNeverPull",
        "InvalidImageName",
        "ImageInspectError",
    }
)
"""The reasons of a container's `waiting` state that the kubelet gives when it cannot (or will not yet again) run
it: each needs a person or keeps failing, unlike `ContainerCreating` and `PodInitializing`, which pass."""


def containers_held(pods: list[Obj]) -> str:
    """The first container of the cluster's pods that the kubelet keeps from running, in its words: the pod, the
    container, its waiting reason and message, and for one that ran, its restarts and last exit. '' when none."""
    for pod in pods:
        for listed in (pod.get("status") or {}).get("containerStatuses") or []:
            container = mapping(listed)
            waiting = mapping(mapping(container.get("state")).get("waiting"))
            reason = waiting.get("reason")
            if not isinstance(reason, str) or reason not in HELD_REASONS:
                continue
            said = f"pod {pod['metadata']['name']}: container {container.get('name', '?')} {reason}"
            last = mapping(mapping(container.get("lastState")).get("terminated"))
            restarts = container.get("restartCount")
            if isinstance(restarts, int) and restarts > 0:
                exited = f", last exit code {last['exitCode']}" if "exitCode" in last else ""
                if exited and last.get("reason"):
                    exited += f" ({last['reason']})"
                said += f" (restarted {restarts} times{exited})"
            if waiting.get("message"):
                said += f": {str(waiting['message'])[:300]}"
            return said
    return ""


async def failed_scheduling(kube: Kube, namespace: str, names: set[str]) -> str:
    """The scheduler's latest FailedScheduling event about one of the pods `names`; '' when none."""
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
