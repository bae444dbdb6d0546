"""A running job as the tests describe it: the fixed time and uid they write down, the status the operator wrote once
its first attempt's Ray job ran, and the Placement event each rank reports (ranks grouped into nodes of equal size)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from fsdp_operator.decide.status import JobStatus, Phase, Reason
from fsdp_train.contract.events import Placement

NOW = datetime(2026, 11, 29, 12, 0, 0, tzinfo=UTC)
"""The tests' fixed now."""
UID = "0b8a2b5e-1111-2222-3333-444455556666"
"""The job uid the tests write down; the names made of it are written down too (`qwen-f92e6afb-1`, from
sha256("qwen/<UID>")), so that a change in how they are made shows as a failing line."""


def first_attempt_running(cluster: str, submission_id: str, started: datetime, **fields: Any) -> JobStatus:
    """Running on the first attempt, since `started`: its RayCluster and submission recorded, generation 1 observed."""
    return JobStatus(
        phase=Phase.RUNNING,
        reason=Reason.JOB_RUNNING,
        ray_cluster_name=cluster,
        submission_id=submission_id,
        attempts=1,
        observed_generation=1,
        start_time=started,
        **fields,
    )


def placement(
    rank: int,
    world_size: int,
    per_node: int = 4,
    *,
    hostname: str = "h{node}",
    pod: str = "worker-{node}",
    device: str = "NVIDIA L4",
    **fields: Any,
) -> Placement:
    """Where `rank` of `world_size` runs: node `rank // per_node` at 10.0.0.(node + 1), on the host and in the pod
    `hostname` and `pod` name (`{node}` filled in)."""
    node = rank // per_node
    return Placement(
        rank=rank,
        world_size=world_size,
        local_rank=rank % per_node,
        local_world_size=per_node,
        node_rank=node,
        node_ip=f"10.0.0.{node + 1}",
        hostname=hostname.format(node=node),
        pod=pod.format(node=node),
        device=device,
        **fields,
    )
