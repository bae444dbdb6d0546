"""Rules across spec fields for what the cluster would refuse later or silently get wrong: a nodeSelector that
contradicts the placement, a local checkpoint path several workers cannot share, a RayCluster larger than etcd
stores. Spec._rules calls them once every field is well-formed; parse_job checks the size of the whole."""

from __future__ import annotations

import json
from typing import Any

from fsdp_operator.api import formats
from fsdp_operator.api.fields import Problems, show

ZONE_LABEL = "topology.kubernetes.io/zone"
"""The zone label of every node (the cloud provider sets it); placement.availabilityZone becomes a selector on it."""
# The least /dev/shm a worker may have. GPU workers: NCCL's shared-memory transport and proxy buffers live there;
# NCCL's troubleshooting guide ("Docker": "--shm-size=1g") names 1 GiB where a container limits it, and the
# 64 MiB a container gets by default is where NCCL fails ("Error while creating shared memory segment").
# CPU workers: Docker's 64 MiB default; below it Ray's object store falls back to /tmp and data loaders fail.
MIN_SHARED_MEMORY_GPU = "1Gi"
MIN_SHARED_MEMORY_CPU = "64Mi"


def shared_memory_floor(size: str, gpus: int, path: str, problems: Problems) -> None:
    floor = MIN_SHARED_MEMORY_GPU if gpus else MIN_SHARED_MEMORY_CPU
    if formats.parse_quantity(size) < formats.parse_quantity(floor):
        why = (
            "NCCL keeps its intra-node buffers there, and fails with less (NCCL's troubleshooting guide asks for "
            "1Gi where a container limits /dev/shm)"
            if gpus
            else "Ray's object store and the data loaders use it; with less Ray moves its store to disk"
        )
        problems.append(f"{path}.sharedMemory: {size} is less than {floor}: {why}")


# What the placement fields become in the workers' nodeSelector (render.raycluster), and the labels that carry
# the same choice under other names: a selector may repeat the placement, never contradict it (the renderer
# would silently overwrite it, and the job would run somewhere else than the selector says).
CAPACITY_RESERVATION_LABEL = "karpenter.k8s.aws/capacity-reservation-id"  # Karpenter's label of reserved nodes
ZONE_LABELS = (ZONE_LABEL, "failure-domain.beta.kubernetes.io/zone")  # the second: deprecated, still set by some
CAPACITY_TYPE_LABEL = "karpenter.sh/capacity-type"  # spot, on-demand, reserved (Karpenter's NodePool docs)
INSTANCE_FAMILY_LABEL = "karpenter.k8s.aws/instance-family"
INSTANCE_SIZE_LABEL = "karpenter.k8s.aws/instance-size"


def placement_rules(placement: dict[str, Any], w: dict[str, Any], path: str, problems: Problems) -> None:
    selector = w["node_selector"]
    zone = placement["availability_zone"]
    for label in ZONE_LABELS:
        chosen = selector.get(label)
        if zone and chosen is not None and chosen != zone:
            problems.append(
                f"{path}.workers.nodeSelector.{label}: {show(chosen)} contradicts "
                f"{path}.placement.availabilityZone ({zone}); choose the zone with placement.availabilityZone"
            )
    if (
        ZONE_LABELS[0] in selector
        and ZONE_LABELS[1] in selector
        and selector[ZONE_LABELS[0]] != selector[ZONE_LABELS[1]]
    ):
        problems.append(
            f"{path}.workers.nodeSelector.{ZONE_LABELS[1]}: {show(selector[ZONE_LABELS[1]])} contradicts "
            f"{path}.workers.nodeSelector.{ZONE_LABELS[0]} ({selector[ZONE_LABELS[0]]}): no node is in two zones"
        )
    reservation = placement["capacity_reservation_id"]
    chosen = selector.get(CAPACITY_RESERVATION_LABEL)
    if reservation and chosen is not None and chosen != reservation:
        problems.append(
            f"{path}.workers.nodeSelector.{CAPACITY_RESERVATION_LABEL}: {show(chosen)} contradicts "
            f"{path}.placement.capacityReservationId ({reservation}); choose the reservation with "
            "placement.capacityReservationId"
        )
    capacity_type = selector.get(CAPACITY_TYPE_LABEL)
    if reservation and capacity_type == "spot":
        problems.append(
            f"{path}.workers.nodeSelector.{CAPACITY_TYPE_LABEL}: spot contradicts "
            f"{path}.placement.capacityReservationId ({reservation}): a Capacity Reservation holds On-Demand "
            "instances, never Spot ones"
        )
    instance_type = w["instance_type"]
    if "." in instance_type:
        family, size = instance_type.split(".", 1)
        for label, part in ((INSTANCE_FAMILY_LABEL, family), (INSTANCE_SIZE_LABEL, size)):
            chosen = selector.get(label)
            if chosen is not None and chosen != part:
                problems.append(
                    f"{path}.workers.nodeSelector.{label}: {show(chosen)} contradicts {path}.workers.instanceType "
                    f"({instance_type}); choose the instance type with instanceType"
                )


def local_storage_rules(s: dict[str, Any], path: str, problems: Problems) -> None:
    """A local checkpoint or output path is on each worker's own disk: with more than one worker every pod writes
    its own shards, no pod holds a whole checkpoint, and nothing can resume (Ray Train's storage_path must be
    shared storage for multi-node runs). It must lie on the declared shared volume, or be an object store."""
    replicas, volume = s["workers"]["replicas"], s["shared_volume"]
    if replicas < 2:
        return
    for where, value in (
        ("training.checkpoint.storage", s["training"]["checkpoint"]["storage"]),
        ("output.storage", s["output"]["storage"]),
    ):
        local = formats.local_path(value)
        if local is None:
            continue
        mount = volume["mount_path"].rstrip("/") if volume else None
        if mount is not None and (local == mount or local.startswith(mount + "/")):
            continue
        instead = (
            f"put it under {path}.sharedVolume.mountPath ({volume['mount_path']})"
            if volume
            else f"use s3:// or gs://, or declare a shared volume ({path}.sharedVolume) and put it under its mountPath"
        )
        problems.append(
            f"{path}.{where}: {show(value)} is a path on each worker's own disk, and with {replicas} workers each "
            f"writes only its own shards there (no whole checkpoint, no resume); {instead}"
        )


# etcd refuses a write larger than its --max-request-bytes (1.5 MiB by default, which managed control planes keep),
# and the API server stores a custom resource such as the RayCluster as JSON: what the operator creates must fit,
# with room kept for what the API server and KubeRay add to it (metadata.managedFields, status).
MAX_STORED_BYTES = 1536 * 1024
STORED_OVERHEAD = 64 * 1024


# The rest of a RayCluster, besides the spec fields counted in check_cluster_size: names, labels, resources, ports,
# probes, the operator's own variables and the image twice. tests/unit/test_refused_up_front.py renders clusters
# and holds that this bounds it (render builds on the spec, so the spec cannot render to measure).
RAYCLUSTER_REST_BYTES = 16 * 1024


def _json_bytes(value: Any) -> int:
    return len(json.dumps(value, separators=(",", ":")).encode())


def cluster_bytes(spec: Any, labels: dict[str, str]) -> tuple[int, dict[str, int]]:
    """At least the size of the RayCluster `spec` renders to, as JSON, and the bytes each spec field takes in it."""
    copies = {
        "spec.env": (spec.env, 2),  # the head's and the workers' containers (render.raycluster)
        "spec.network.env": (spec.network.env, 1),
        "spec.workers.nodeSelector": (spec.workers.node_selector, 1),
        "spec.workers.tolerations": (spec.workers.tolerations, 1),
        "spec.head.nodeSelector": (spec.head.node_selector, 1),
        "spec.head.tolerations": (spec.head.tolerations, 1),
        "metadata.labels": (labels, 1),
    }
    taken = {path: _json_bytes(value) * times for path, (value, times) in copies.items()}
    return RAYCLUSTER_REST_BYTES + sum(taken.values()), taken


def check_cluster_size(spec: Any, labels: dict[str, str], problems: Problems) -> None:
    """The RayCluster the job becomes must fit in etcd; else say which spec field takes the room."""
    size, taken = cluster_bytes(spec, labels)
    limit = MAX_STORED_BYTES - STORED_OVERHEAD
    if size > limit:
        largest = max(taken, key=lambda path: taken[path])
        where = " (set in the head and in the workers)" if largest == "spec.env" else ""
        problems.append(
            f"{largest}: the RayCluster would be about {size} bytes, over the {limit} that fit in etcd's "
            f"{MAX_STORED_BYTES}-byte limit (--max-request-bytes) beside what the API server adds; {largest} takes "
            f"{taken[largest]} bytes of it{where}: put large values in a Secret or ConfigMap (valueFrom) or in the "
            "image"
        )
