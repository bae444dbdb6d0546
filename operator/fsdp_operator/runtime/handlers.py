"""kopf handlers, thin: each delegates to `controller.py`. Built into a registry per operator instance.

- a daemon per FSDPTrainingJob runs `JobLoop` (the lifecycle, the only status writer) until the job is
  finished; kopf starts it for new jobs and again for every job when the operator restarts (resume);
- watches on the job, its RayCluster and its pods only wake that loop (level-triggered), a running one once
  the first passes of new jobs are done (`Runtime.wake`), and only for news (`watched.is_news`: not for the loop's
  own status write or kopf's finalizer);
- the delete handler stops the Ray job and deletes the RayCluster before kopf removes the finalizer.

Raw event handlers are used for waking instead of create/update handlers: they need no diff-base
annotation writes on the job, and the loop re-reads the whole spec on each pass anyway. They are async:
kopf runs a sync handler in its thread pool (a hop per watch event), and `asyncio.Event.set` must be
called from the loop's own thread.
"""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import Mapping
from typing import Any

import kopf

from fsdp_operator.api import render, schema
from fsdp_operator.runtime.controller import JobLoop
from fsdp_operator.runtime.finalizer import finalize
from fsdp_operator.runtime.kube import RAYCLUSTER_GROUP, RAYCLUSTER_PLURAL, RAYCLUSTER_VERSION, AioKube
from fsdp_operator.runtime.settings import configure_kopf
from fsdp_operator.runtime.shared import Runtime

Logger = logging.Logger | logging.LoggerAdapter[Any]
MANAGED = {render.LABEL_MANAGED_BY: render.MANAGED_BY}
GC_THRESHOLDS = (20_000, 10, 10)
"""The garbage collector's thresholds while the operator runs: young collections every 20,000 allocations."""


def build_registry(runtime: Runtime, *, login: bool = True) -> kopf.OperatorRegistry:
    """A fresh registry with every handler bound to `runtime`.

    With `login`, the registry logs in the way kopf would by default (in-cluster service account or
    kubeconfig, through the `kubernetes` client) and builds `runtime.kube` from the same credentials.
    Without it, the caller provides both a login handler and `runtime.kube`.
    """
    registry = kopf.OperatorRegistry()
    config = runtime.config
    thresholds_before = gc.get_threshold()

    @kopf.on.startup(registry=registry)
    def fsdp_startup(settings: kopf.OperatorSettings, **_: Any) -> None:
        configure_kopf(settings, config)
        # What exists once the operator starts (modules, registry, settings) lives as long as the process:
        # frozen, it is no longer walked by every full garbage collection (a tenth of the operator's CPU
        # while many jobs are created at once: docs/reliability.md). Thawed again at cleanup.
        gc.freeze()
        # And the collector runs less often: every 700 allocations (Python's default) it ran about 180 times a
        # second while 300 jobs arrived at once, 15 % of the operator's CPU (docs/reliability.md). Cycles are rare
        # here (reference counting frees the rest at once), so memory barely moves.
        gc.set_threshold(*GC_THRESHOLDS)

    if login:

        @kopf.on.login(registry=registry)
        def fsdp_login(*, logger: Logger, **kwargs: Any) -> Any:
            # kopf calls this again whenever the API server answers 401 (a rotated or expired token): each
            # call re-reads the service-account token file or re-runs the kubeconfig's exec plugin.
            info = kopf.login_via_client(logger=logger, **kwargs)
            if info is None:
                raise kopf.PermanentError("no Kubernetes credentials (in-cluster service account or kubeconfig)")
            if not runtime.has_kube():

                async def refresh() -> Any:
                    try:
                        return await asyncio.to_thread(kopf.login_via_client, logger=logger, **kwargs)
                    except kopf.LoginError as e:
                        logger.warning(f"could not refresh the Kubernetes credentials: {e}")
                        return None  # the request fails with its 401, and the pass is retried

                runtime.set_kube(AioKube.from_connection_info(info, timeout=config.kube_timeout, refresh=refresh))
            elif isinstance(runtime.kube, AioKube):
                runtime.kube.use_credentials(info)
            return info

    @kopf.on.cleanup(registry=registry)
    async def fsdp_cleanup(**_: Any) -> None:
        await runtime.close()
        gc.unfreeze()
        gc.set_threshold(*thresholds_before)

    @kopf.daemon(
        schema.GROUP,
        schema.VERSION,
        schema.PLURAL,
        registry=registry,
        id="lifecycle",
        # Stopping (deletion, shutdown) is signalled first; the loop notices at once and exits between passes.
        cancellation_backoff=config.daemon_cancellation_timeout,
        cancellation_timeout=config.daemon_cancellation_timeout,
    )
    async def fsdptrainingjob_lifecycle(
        *, namespace: str | None, name: str, stopped: kopf.DaemonStopped, logger: Logger, **_: Any
    ) -> None:
        await JobLoop(runtime, namespace or "default", name, logger).run(stopped)

    @kopf.on.event(schema.GROUP, schema.VERSION, schema.PLURAL, registry=registry)
    async def fsdptrainingjob_event(
        *, namespace: str | None, name: str, type: str | None, body: kopf.Body, **_: Any
    ) -> None:
        if runtime.watched.job(namespace or "default", name, body, deleted=type == "DELETED"):
            await runtime.wake(namespace, name)

    @kopf.on.delete(schema.GROUP, schema.VERSION, schema.PLURAL, registry=registry)
    async def fsdptrainingjob_delete(*, body: kopf.Body, logger: Logger, **_: Any) -> None:
        await finalize(runtime, body, logger)

    @kopf.on.event(RAYCLUSTER_GROUP, RAYCLUSTER_VERSION, RAYCLUSTER_PLURAL, labels=MANAGED, registry=registry)
    async def raycluster_event(
        *, namespace: str | None, name: str, labels: Mapping[str, str], type: str | None, body: kopf.Body, **_: Any
    ) -> None:
        if runtime.watched.cluster(namespace or "default", name, body, deleted=type == "DELETED"):
            await runtime.wake(namespace, labels.get(render.LABEL_JOB))

    @kopf.on.event("v1", "pods", labels=MANAGED, registry=registry)
    async def pod_event(
        *, namespace: str | None, labels: Mapping[str, str], type: str | None, body: kopf.Body, **_: Any
    ) -> None:
        runtime.watched.pod(namespace or "default", body, deleted=type == "DELETED")
        await runtime.wake(namespace, labels.get(render.LABEL_JOB))

    # The loops read their jobs, RayClusters and pods from these watches, not on every pass (`watched.py`).
    runtime.watched.jobs_watched = runtime.watched.clusters_watched = runtime.watched.pods_watched = True

    return registry
