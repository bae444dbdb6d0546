"""The I/O around the state machine: observe, `reconcile()`, write status once, act. One loop per live job.

`handlers.py` starts `JobLoop.run` as a kopf daemon per FSDPTrainingJob and wakes it from child
watches; this loop is the only writer of the job's status. It re-reads the job at the top of every
pass (level-triggered: a missed event costs at most one interval), keeps the status it computed in
memory (progress-only writes are rate-limited), and writes before it acts, so a restart between the
two repeats an idempotent action instead of losing the intent.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from fsdp_train.events import parse_lines

from fsdp_operator.capacity import NoCredentials, ZoneAdvisor, ZoneChoice
from fsdp_operator.kube import Kube, KubeError
from fsdp_operator.metrics import Metrics
from fsdp_operator.rayjobs import CachingFactory, RayJobs, RayJobsFactory, RayUnavailable, SubmissionRejected
from fsdp_operator.reconcile import (
    ClusterView,
    CreateRayCluster,
    Decision,
    DeleteJob,
    DeleteRayCluster,
    Observed,
    PostEvent,
    StopJob,
    SubmitJob,
    dashboard_url,
    finalize_actions,
    reconcile,
)
from fsdp_operator.render import INSTANCE_TYPE_LABEL, raycluster_name
from fsdp_operator.settings import OperatorConfig
from fsdp_operator.spec import ZONE_LABEL, Job, NotAJobError, SpecError, parse_job
from fsdp_operator.status import JobStatus, Phase, merge_patch, progress_only

Obj = dict[str, Any]
Logger = logging.Logger | logging.LoggerAdapter[Any]


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

    @property
    def kube(self) -> Kube:
        if self._kube is None:
            raise RuntimeError("no Kubernetes client: the login handler has not run")
        return self._kube

    def set_kube(self, kube: Kube) -> None:
        self._kube = kube

    def has_kube(self) -> bool:
        return self._kube is not None

    def wakeup(self, namespace: str, name: str) -> asyncio.Event:
        return self._wakeups.setdefault((namespace, name), asyncio.Event())

    def wake(self, namespace: str | None, name: str | None) -> None:
        if namespace and name and (event := self._wakeups.get((namespace, name))) is not None:
            event.set()

    def forget(self, namespace: str, name: str) -> None:
        self._wakeups.pop((namespace, name), None)

    async def close(self) -> None:
        if self._kube is not None:
            await self._kube.close()


def _auto_zone_job(obj: Obj) -> Job | None:
    """The job when it asks for `availabilityZone: auto` (an invalid one is reconcile's to report)."""
    try:
        job = parse_job(obj)
    except (SpecError, NotAJobError):
        return None
    return job if job.spec.placement.availability_zone == "auto" else None


def _zone_of(node: Obj) -> str:
    labels = (node.get("metadata") or {}).get("labels") or {}
    return str(labels.get(ZONE_LABEL) or "")


def _cut_complete_lines(text: str) -> str:
    """The text up to and including its last newline: a half-written line waits for the next pass."""
    return text[: text.rfind("\n") + 1]


class JobLoop:
    """Reconciles one FSDPTrainingJob until it is finished (or deleted)."""

    def __init__(self, runtime: Runtime, namespace: str, name: str, logger: Logger):
        self.rt = runtime
        self.namespace = namespace
        self.name = name
        self.log = logger
        self.status: JobStatus | None = None
        """The status this loop last wrote or deferred (ahead of the stored one while progress writes wait)."""
        self.pending_write = False
        self.last_write = float("-inf")
        self.submit_error = ""
        self.address = ""
        self.uid = ""

    # --- the loop ---
    async def run(self, stopped: Any) -> None:
        wake = self.rt.wakeup(self.namespace, self.name)
        try:
            while not stopped:
                wake.clear()
                try:
                    with self.rt.metrics.reconcile_seconds.time():
                        decision = await self.pass_once(stopped)
                    self.rt.metrics.reconcile_passes.labels("ok").inc()
                except (KubeError, RayUnavailable) as e:
                    self.rt.metrics.reconcile_passes.labels("error").inc()
                    self.log.warning(f"pass failed, retrying in {self.rt.config.error_backoff:g}s: {e}")
                    await self._sleep(wake, stopped, self.rt.config.error_backoff)
                    continue
                if decision is None or decision.done:
                    return
                await self._sleep(wake, stopped, self._delay(decision))
        finally:
            self.rt.forget(self.namespace, self.name)

    def _delay(self, decision: Decision) -> float:
        delay = self.rt.config.interval
        if decision.requeue_after is not None:
            # A finished job waits for its TTL without polling; a live one never sleeps past the interval.
            terminal = decision.status.terminal
            delay = decision.requeue_after if terminal else min(delay, max(decision.requeue_after, 0.0))
        if self.pending_write:
            # A rate-limited progress write is pending: come back when it is allowed.
            due = self.last_write + self.rt.config.progress_write_interval - time.monotonic()
            delay = min(delay, max(due, 0.0))
        return delay

    @staticmethod
    async def _sleep(wake: asyncio.Event, stopped: Any, seconds: float) -> None:
        """Until woken (a child changed), stopped (kopf), or `seconds` passed."""
        if stopped:
            return

        async def until_stopped() -> None:
            await stopped.wait(seconds)

        waiters = [asyncio.ensure_future(wake.wait()), asyncio.ensure_future(until_stopped())]
        try:
            await asyncio.wait(waiters, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiters:
                waiter.cancel()

    async def pass_once(self, stopped: Any = None) -> Decision | None:
        """One observe-decide-write-act pass; None when the job is gone or being deleted."""
        obj = await self.rt.kube.get_job(self.namespace, self.name)
        if obj is None or (obj.get("metadata") or {}).get("deletionTimestamp"):
            return None
        uid = str(obj["metadata"].get("uid", ""))
        if uid != self.uid:
            # A new object under the same name: forget what the previous one's loop knew.
            self.uid, self.status, self.pending_write = uid, None, False
        stored = dict(obj.get("status") or {})
        status = self.status if self.status is not None else JobStatus.from_dict(stored)
        observed = await self.observe(obj, status)
        config = self.rt.config
        decision = reconcile(
            obj,
            status,
            observed,
            training_package=config.training_package,
            ray_unreachable_timeout=config.ray_unreachable_timeout,
        )
        self.rt.metrics.record_pass((self.namespace, self.name), obj, status, decision.status, observed.now)
        await self.write(stored, decision.status)
        if stopped:
            return None  # kopf is stopping this loop (deletion or shutdown): leave the acting to the next owner
        await self.act(obj, decision)
        return decision

    # --- observing ---
    async def observe(self, obj: Obj, status: JobStatus) -> Observed:
        now = self.rt.clock()
        submit_error, self.submit_error = self.submit_error, ""
        if status.phase == Phase.PENDING and not status.placement:
            job = _auto_zone_job(obj)
            if job is not None:
                return Observed(now=now, zone_choice=await self._choose_zone(job))
        if status.phase in (None, Phase.PENDING) or not status.ray_cluster_name:
            return Observed(now=now)
        cluster_obj = await self.rt.kube.get_raycluster(self.namespace, status.ray_cluster_name)
        if cluster_obj is None:
            return Observed(now=now, submit_error=submit_error)
        cluster = ClusterView.from_object(cluster_obj)
        self.address = self.rt.ray_address(cluster_obj)
        if status.terminal and not cluster.deleting and self.address and status.submission_id:
            # Does the Ray job still run behind a terminal phase? (`reconcile` stops it if so.)
            try:
                return Observed(now=now, cluster=cluster, ray_job=await self._ray().info(status.submission_id))
            except RayUnavailable:
                self.rt.metrics.ray_api_errors.labels("info").inc()
                return Observed(now=now, cluster=cluster)  # unknowable now: do not hold the job's loop open
        if status.terminal or status.phase == Phase.SUSPENDED or cluster.deleting:
            return Observed(now=now, cluster=cluster)

        if status.phase == Phase.PROVISIONING:
            if cluster.state != "ready":
                return Observed(now=now, cluster=cluster, unschedulable=await self._unschedulable(cluster.name))
            if not self.address:
                return Observed(now=now, cluster=cluster, ray_error="no dashboard address in RayCluster status")
            try:
                nodes = await self._ray().nodes()
            except RayUnavailable as e:
                self.rt.metrics.ray_api_errors.labels("nodes").inc()
                return Observed(now=now, cluster=cluster, ray_error=str(e))
            return Observed(now=now, cluster=cluster, ray_nodes=nodes)

        # Submitting or Running: Ray's view of the job, then its log since the last offset.
        if not self.address:
            return Observed(now=now, cluster=cluster, ray_error="no dashboard address in RayCluster status")
        client = self._ray()
        try:
            info = await client.info(status.submission_id)
            if info is None:
                return Observed(now=now, cluster=cluster, submit_error=submit_error)
            text = _cut_complete_lines(await client.logs(status.submission_id, status.log_offset))
        except RayUnavailable as e:
            self.rt.metrics.ray_api_errors.labels("job").inc()
            return Observed(now=now, cluster=cluster, ray_error=str(e))
        return Observed(
            now=now,
            cluster=cluster,
            ray_job=info,
            events=tuple(parse_lines(text.splitlines())),
            log_offset=status.log_offset + len(text),
        )

    async def _choose_zone(self, job: Job) -> ZoneChoice:
        """Ask AWS for the best zone among those where the cluster has nodes of the type (any, when it has none)."""
        instance_type, count = job.spec.workers.instance_type, job.spec.workers.replicas
        if self.rt.zones is None:
            return ZoneChoice("", "the operator has no AWS access configured")
        try:
            nodes = await self.rt.kube.list_nodes(f"{INSTANCE_TYPE_LABEL}={instance_type}")
        except KubeError as e:
            self.log.warning(f"cannot list nodes ({e}); considering every zone")
            nodes = []
        zones = sorted({zone for node in nodes if (zone := _zone_of(node))})
        try:
            return await asyncio.wait_for(
                self.rt.zones.choose(instance_type, count, zones), self.rt.config.zone_advice_timeout
            )
        except NoCredentials:
            return ZoneChoice("", "no AWS credentials (IRSA or an instance role) for the operator")
        except TimeoutError:
            return ZoneChoice("", f"AWS did not answer within {self.rt.config.zone_advice_timeout:g}s")

    async def _unschedulable(self, cluster_name: str) -> str:
        """The scheduler's message for a Pending pod of the cluster (pod condition, else FailedScheduling event)."""
        pods = await self.rt.kube.list_pods(self.namespace, f"ray.io/cluster={cluster_name}")
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
        events = await self.rt.kube.list_events(self.namespace, "involvedObject.kind=Pod,reason=FailedScheduling")
        ours = [e for e in events if (e.get("involvedObject") or {}).get("name") in names]
        if not ours:
            return ""
        latest = max(ours, key=lambda e: str(e.get("lastTimestamp") or e.get("eventTime") or ""))
        return f"pod {latest['involvedObject']['name']}: {latest.get('message', '')}"

    def _ray(self) -> RayJobs:
        return self.rt.ray(self.address)

    # --- writing ---
    async def write(self, stored: Obj, status: JobStatus) -> None:
        """Patch status when it changed; progress-only changes at most once per `progress_write_interval`.

        `self.status` moves on only once the write is done (or deliberately deferred): when the patch fails,
        the next pass decides again from the old status, so the transition's actions and events are not lost.
        """
        new = status.to_dict()
        if new == stored:
            self.status, self.pending_write = status, False
            return
        now = time.monotonic()
        if progress_only(stored, new) and now - self.last_write < self.rt.config.progress_write_interval:
            self.status, self.pending_write = status, True  # the loop comes back when the write is due
            self.rt.metrics.status_writes.labels("deferred").inc()
            return
        try:
            await self.rt.kube.patch_job_status(self.namespace, self.name, merge_patch(stored, new))
        except KubeError:
            self.rt.metrics.status_writes.labels("failed").inc()
            raise
        self.rt.metrics.status_writes.labels("written").inc()
        self.status, self.pending_write, self.last_write = status, False, now

    # --- acting ---
    async def act(self, obj: Obj, decision: Decision) -> None:
        for action in decision.actions:
            match action:
                case CreateRayCluster(manifest=manifest):
                    created = await self.rt.kube.create_raycluster(manifest)
                    self.log.info(f"RayCluster {manifest['metadata']['name']} " + ("created" if created else "exists"))
                case DeleteRayCluster(namespace=namespace, name=name):
                    if await self.rt.kube.delete_raycluster(namespace, name):
                        self.log.info(f"RayCluster {name} deleted")
                case SubmitJob(submission=submission):
                    await self._submit(submission.submission_id, decision, action)
                case StopJob(submission_id=submission_id):
                    if self.address:
                        try:
                            await self._ray().stop(submission_id)
                        except RayUnavailable as e:
                            self.log.warning(f"could not stop Ray job {submission_id}: {e}")
                case PostEvent(type=type_, reason=reason, message=message):
                    try:
                        await self.rt.kube.post_event(obj, type_, reason, message)
                    except KubeError as e:
                        self.log.warning(f"could not post event {reason}: {e}")
                case DeleteJob():
                    self.log.info("ttlSecondsAfterFinished passed: deleting the job")
                    await self.rt.kube.delete_job(self.namespace, self.name)

    async def _submit(self, submission_id: str, decision: Decision, action: SubmitJob) -> None:
        if not self.address:
            return
        try:
            created = await self._ray().submit(action.submission)
        except SubmissionRejected as e:
            self.rt.metrics.submissions.labels("rejected").inc()
            self.submit_error = str(e)
            self.log.warning(f"Ray rejected submission {submission_id}: {e}")
            return
        except RayUnavailable as e:
            self.rt.metrics.submissions.labels("unavailable").inc()
            self.log.warning(f"submission {submission_id} not sent, will retry: {e}")
            return
        self.rt.metrics.submissions.labels("created" if created else "exists").inc()
        self.log.info(f"submission {submission_id} " + ("sent" if created else "already known to Ray"))


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
                try:
                    await asyncio.wait_for(runtime.ray(address).stop(submission_id), runtime.config.finalize_timeout)
                    logger.info(f"Ray job {submission_id} stopped")
                except (RayUnavailable, TimeoutError) as e:
                    logger.warning(f"Ray job {submission_id} not stopped (Ray unreachable), deleting its cluster: {e}")
            case DeleteRayCluster(namespace=ns, name=cluster_to_delete):
                if await runtime.kube.delete_raycluster(ns, cluster_to_delete):
                    logger.info(f"RayCluster {cluster_to_delete} deleted")
            case _:
                raise AssertionError(f"unexpected finalize action {action}")
