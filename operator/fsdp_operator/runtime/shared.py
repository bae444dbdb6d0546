"""What the kopf handlers and the job loops share: clients, settings, wake-up events."""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
from collections.abc import Callable, Mapping
from concurrent.futures import ProcessPoolExecutor
from datetime import UTC, datetime
from typing import Any

from fsdp_operator.capacity.plan import ZoneAdvisor
from fsdp_operator.decide.observed import (
    dashboard_url,
)
from fsdp_operator.runtime.kube import Kube
from fsdp_operator.runtime.metrics import Metrics
from fsdp_operator.runtime.rayjobs import (
    CachingFactory,
    RayJobsFactory,
)
from fsdp_operator.runtime.settings import OperatorConfig
from fsdp_operator.runtime.watched import Watched


class Runtime:
    """What the handlers share: clients, config, and one wake-up event per live job."""

    def __init__(
        self,
        config: OperatorConfig | None = None,
        *,
        kube: Kube | None = None,
        ray: RayJobsFactory | None = None,
        ray_address: Callable[[Mapping[str, Any]], str] | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        metrics: Metrics | None = None,
        zones: ZoneAdvisor | None = None,
    ) -> None:
        self.config = config or OperatorConfig()
        # AWS, for `placement.availabilityZone: auto`; None: no AWS access (such jobs run unconstrained).
        self.zones = zones
        self.metrics = metrics or Metrics()
        self._kube = kube
        self.ray: RayJobsFactory = ray or CachingFactory(timeout=self.config.ray_timeout)
        # Hook for setups where the dashboard is reachable elsewhere than KubeRay's status says.
        self.ray_address = ray_address or dashboard_url
        self.clock = clock
        self._wakeups: dict[tuple[str, str], asyncio.Event] = {}
        self._first_passes = 0
        """Loops whose first pass has not ended yet."""
        self._no_first_passes = asyncio.Event()
        self._no_first_passes.set()
        self._log_worker: ProcessPoolExecutor | None = None
        self.watched = Watched()
        """The job bodies and pods the operator's watches delivered (fed by `handlers.py`)."""

    def log_worker(self) -> ProcessPoolExecutor:
        """The process that parses and folds large log chunks (started on first use; `spawn`: this process has
        threads, which `fork` would copy mid-flight)."""
        if self._log_worker is None:
            self._log_worker = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"))
        return self._log_worker

    @property
    def kube(self) -> Kube:
        if self._kube is None:
            raise RuntimeError("no Kubernetes client: the login handler has not run")
        return self._kube

    def set_kube(self, kube: Kube) -> None:
        self._kube = kube

    def has_kube(self) -> bool:
        return self._kube is not None

    async def read_job(self, namespace: str, name: str, written: str | None) -> dict[str, Any] | None:
        """The job as the watch last delivered it, when that is not older than the loop's own last status write
        (resourceVersion `written`, '' before one); else, or with `written` None, as the API server has it."""
        body = None if written is None else self.watched.fresh_job(namespace, name, written, self.config.watch_recheck)
        if body is None:
            body = await self.kube.get_job(namespace, name)
            if body is not None:
                self.watched.job(namespace, name, body)
        return body

    async def read_cluster(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The RayCluster as its watch delivered it within `watch_recheck` seconds, else as the API server has it."""
        body = self.watched.fresh_cluster(namespace, name, self.config.watch_recheck)
        if body is None:
            body = await self.kube.get_raycluster(namespace, name)
            self.watched.cluster(namespace, name, body)
        return body

    def wakeup(self, namespace: str, name: str) -> asyncio.Event:
        return self._wakeups.setdefault((namespace, name), asyncio.Event())

    async def wake(self, namespace: str | None, name: str | None) -> None:
        """Wake the job's loop (a watch event about the job or one of its children).

        A loop that is already running is woken only once the first passes due are done (`after_first_passes`):
        the watch handler waits, and with it kopf's handling of the rest of this event and of the object's later
        events, which a burst of new jobs needs the CPU for more (their own status writes, their RayClusters'
        first events). A loop that is not running yet is never waited for: kopf starts it from this same event.
        """
        if not namespace or not name or (event := self._wakeups.get((namespace, name))) is None:
            return
        await self.after_first_passes()
        event.set()

    def forget(self, namespace: str, name: str) -> None:
        self._wakeups.pop((namespace, name), None)

    def first_pass_started(self) -> None:
        self._first_passes += 1
        self._no_first_passes.clear()

    def first_pass_ended(self) -> None:
        self._first_passes -= 1
        if self._first_passes <= 0:
            self._no_first_passes.set()

    async def after_first_passes(self) -> None:
        """Give way to the loops that have not made their first pass yet, for at most `first_pass_priority`.

        A first pass writes a new job's identity and creates its RayCluster; a later pass only re-observes.
        With many jobs created at once, the re-observations (each woken by its own status write and its
        children's first events) would otherwise share the operator's CPU with the first passes still due.
        """
        if self._no_first_passes.is_set():
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._no_first_passes.wait(), self.config.first_pass_priority)

    async def close(self) -> None:
        if self._kube is not None:
            await self._kube.close()
        self.drop_log_worker()

    def drop_log_worker(self) -> None:
        if self._log_worker is not None:
            self._log_worker.shutdown(wait=False, cancel_futures=True)
            self._log_worker = None
