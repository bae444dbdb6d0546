"""On delete: stop the Ray job, delete the RayCluster (kopf's finalizer for the job)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from fsdp_operator.api.render import raycluster_name
from fsdp_operator.decide.guards import finalize_actions
from fsdp_operator.decide.observed import (
    ClusterView,
    DeleteRayCluster,
    StopJob,
)
from fsdp_operator.decide.status import JobStatus
from fsdp_operator.runtime.controller import Logger
from fsdp_operator.runtime.job_secret import cluster_token
from fsdp_operator.runtime.rayjobs import (
    RayUnavailable,
)
from fsdp_operator.runtime.shared import Runtime


async def finalize(runtime: Runtime, body: Mapping[str, Any], logger: Logger) -> None:
    """On delete: stop the Ray job (bounded when Ray does not answer), delete the RayCluster explicitly."""
    meta = body.get("metadata") or {}
    namespace, name = str(meta.get("namespace") or "default"), str(meta.get("name"))
    runtime.metrics.forget((namespace, name))
    status = JobStatus.from_dict(body.get("status"))
    cluster_name = status.ray_cluster_name or raycluster_name(name)
    cluster_obj = await runtime.kube.get_raycluster(namespace, cluster_name)
    cluster = ClusterView.from_object(cluster_obj) if cluster_obj else None
    for action in finalize_actions(namespace, name, str(meta.get("uid") or ""), status, cluster):
        match action:
            case StopJob(submission_id=submission_id):
                address = runtime.ray_address(cluster_obj) if cluster_obj else ""
                if not address:
                    continue
                token, _ = await cluster_token(runtime, namespace, name, str(meta.get("uid") or ""))
                try:
                    stop = runtime.ray(address, token).stop(submission_id)
                    await asyncio.wait_for(stop, runtime.config.finalize_timeout)
                    logger.info(f"Ray job {submission_id} stopped")
                except (RayUnavailable, TimeoutError) as e:
                    logger.warning(f"Ray job {submission_id} not stopped (Ray unreachable), deleting its cluster: {e}")
            case DeleteRayCluster(namespace=ns, name=cluster_to_delete):
                if await runtime.kube.delete_raycluster(ns, cluster_to_delete):
                    logger.info(f"RayCluster {cluster_to_delete} deleted")
            case _:
                raise AssertionError(f"unexpected finalize action {action}")
