"""The I/O around the state machine: observe, `reconcile()`, write status once, act. One loop per live job.

`handlers.py` starts `JobLoop.run` as a kopf daemon per FSDPTrainingJob and wakes it from child
watches; this loop is the only writer of the job's status. It re-reads the job at the top of every
pass (level-triggered: a missed event costs at most one interval), keeps the status it computed in
memory (progress-only writes are rate-limited), and writes before it acts, so a restart between the
two repeats an idempotent action instead of losing the intent.

Containment: a pass that raises (a bug, or input no check foresaw) is recorded on the job as the
`ReconcileError` condition and a Warning event, and the log offset still moves past what was read, so one
poisoned line cannot freeze a job; a status the API server refuses (too large, invalid) is written again without
the per-rank detail before the pass acts, and when no form of it can be written the actions that stop work (stop
the Ray job, delete the cluster) still run. A write that fails on the way (no answer, 5xx, 409, 429) acts on
nothing: the next pass decides again. Each pass reads at most `LOG_CHUNK` characters of log, so
one job's flood of output costs others at most one bounded slice of the event loop per pass.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import functools
import logging
import multiprocessing
import secrets
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import BrokenExecutor, ProcessPoolExecutor
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from fsdp_train.events import KEY_ENV, PREFIX, Verifier, attempt_key, parse_log

from fsdp_operator import render
from fsdp_operator.capacity import NoCredentials, ZoneAdvisor, ZoneChoice
from fsdp_operator.kube import Kube, KubeError
from fsdp_operator.metrics import Metrics
from fsdp_operator.rayjobs import (
    LOG_CHUNK,
    CachingFactory,
    RayJobs,
    RayJobsFactory,
    RayUnavailable,
    SubmissionRejected,
)
from fsdp_operator.reconcile import (
    MUST_STOP_ACTIONS,
    RAY_TERMINAL,
    ApplyNetworkPolicy,
    ChildView,
    ClusterView,
    CreateAuthSecret,
    CreateRayCluster,
    Decision,
    DeleteJob,
    DeleteLeftover,
    DeleteRayCluster,
    Observed,
    PostEvent,
    StopJob,
    SubmitJob,
    dashboard_url,
    finalize_actions,
    pass_failed,
    reconcile,
)
from fsdp_operator.render import INSTANCE_TYPE_LABEL, Submission, raycluster_name
from fsdp_operator.settings import OperatorConfig
from fsdp_operator.spec import ZONE_LABEL, Job, NotAJobError, SpecError, parse_job
from fsdp_operator.status import JobStatus, Phase, merge_patch, progress_only, within_budget, without_rank_detail

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
        self._first_passes = 0
        """Loops whose first pass has not ended yet."""
        self._no_first_passes = asyncio.Event()
        self._no_first_passes.set()
        self._log_worker: ProcessPoolExecutor | None = None

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


def _describe(error: BaseException) -> str:
    """One line for the `ReconcileError` condition: the exception's type and its (cut) message."""
    return f"{type(error).__name__}: {str(error)[:900]}"


_CREATES = (CreateAuthSecret, ApplyNetworkPolicy, CreateRayCluster)


def _transient(error: KubeError) -> bool:
    """A failed request worth repeating as it was: no answer (the request may have taken effect), a server error,
    throttling, a conflict, or the object gone (the next pass finds out). Other 4xx refuse the request itself."""
    return not 400 <= error.status < 500 or error.status in (404, 409, 429)


def _owned_by(obj: Mapping[str, Any], uid: str) -> bool:
    references = (obj.get("metadata") or {}).get("ownerReferences")
    return isinstance(references, list) and any(isinstance(r, Mapping) and r.get("uid") == uid for r in references)


def _token(secret: Mapping[str, Any]) -> str:
    data = secret.get("data")
    raw = data.get(render.AUTH_TOKEN_KEY) if isinstance(data, Mapping) else None
    try:
        return base64.b64decode(str(raw or ""), validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        return ""


def _events_key(secret: Mapping[str, Any]) -> bytes:
    data = secret.get("data")
    raw = data.get(render.EVENTS_KEY_KEY) if isinstance(data, Mapping) else None
    try:
        return base64.b64decode(str(raw or ""), validate=True)
    except binascii.Error:
        return b""


OFF_PROCESS_EVENTS = 64
"""A log chunk with more event lines than this is parsed and folded in the log worker process, not in the
operator's: parsing 256 KiB of event lines takes ~140 ms of CPU, which in a thread would still hold the GIL the
event loop needs (docs/reliability.md, "Log flood")."""


@dataclass(frozen=True, slots=True)
class LogChunk:
    """Whole lines of one log chunk waiting to be parsed, and the verifier state they are checked against."""

    text: str
    key: bytes
    last_seq: dict[int, int]


def parse_and_reconcile(
    chunk: LogChunk, obj: Obj, status: JobStatus, observed: Observed, settings: dict[str, Any]
) -> tuple[Decision, Observed, dict[int, int]]:
    """Parse `chunk` into `observed` and decide: (the decision, what was observed without the events, the
    verifier's state after the chunk). Pure; run in the log worker process for large chunks."""
    verifier = Verifier(chunk.key)
    verifier.last_seq = dict(chunk.last_seq)
    parsed = parse_log(chunk.text.splitlines(), verifier)
    observed = replace(
        observed,
        events=parsed.events,
        skipped_lines=observed.skipped_lines + parsed.malformed,
        forged_lines=observed.forged_lines + parsed.forged,
    )
    decision = reconcile(obj, status, observed, **settings)
    return decision, replace(observed, events=()), verifier.last_seq


def with_event_key(submission: Submission, job_key: bytes) -> Submission:
    """The submission with its attempt's signing key in the job's environment (as is, without a job key)."""
    if not job_key:
        return submission
    key = attempt_key(job_key, submission.submission_id).hex()
    env_vars = {**submission.runtime_env.get("env_vars", {}), KEY_ENV: key}
    return replace(submission, runtime_env={**submission.runtime_env, "env_vars": env_vars})


async def job_events_key(runtime: Runtime, namespace: str, job_name: str, uid: str) -> bytes:
    """The job's event-signing key from its own Secret; b'' before the Secret exists or when it is not the job's."""
    secret = await runtime.kube.get_secret(namespace, render.auth_secret_name(job_name))
    if secret is None or (uid and not _owned_by(secret, uid)):
        return b""
    return _events_key(secret)


async def cluster_token(runtime: Runtime, namespace: str, job_name: str, uid: str) -> tuple[str, str]:
    """(Ray auth token of the job's cluster, name of its Secret when that Secret is not the job's own).

    ('', '') with token auth off or before the Secret exists.
    """
    if not runtime.config.security.token_auth:
        return "", ""
    name = render.auth_secret_name(job_name)
    secret = await runtime.kube.get_secret(namespace, name)
    if secret is None:
        return "", ""
    if uid and not _owned_by(secret, uid):
        return "", name  # a token someone else chose is never sent to, or trusted for, this job's cluster
    return _token(secret), ""


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


class ObjectNotOurs(Exception):
    """A create answered 409 and the object under that name is not the job's own (never taken as success)."""


class JobLoop:
    """Reconciles one FSDPTrainingJob until it is finished (or deleted)."""

    def __init__(self, runtime: Runtime, namespace: str, name: str, logger: Logger):
        self.rt = runtime
        self.namespace = namespace
        self.name = name
        self.log = logger
        self.status: JobStatus | None = None
        """The status this loop last wrote or deferred (ahead of the stored one while progress writes wait)."""
        self.written: Obj = {}
        """`self.status` as it was written or deferred: what the stored status is compared with."""
        self.pending_write = False
        self.last_write = float("-inf")
        self.submit_error = ""
        self.address = ""
        self.uid = ""
        self.token = ""
        """Ray's auth token for the job's cluster, read from the job's Secret ('' until it exists)."""
        self.events_key = b""
        """The job's event-signing key, read from the job's Secret (b'' until it exists)."""
        self.verifier: tuple[str, Verifier] | None = None
        """(submission id, the verifier of its event lines): the sequence numbers of the lines up to the log offset
        of `self.status`, for this attempt only."""
        self.pending_chunk: LogChunk | None = None
        """This pass's log lines when there are too many event lines to parse here (`OFF_PROCESS_EVENTS`)."""
        self.pending_verifier: tuple[str, Verifier] | None = None
        """The verifier after this pass's lines: it replaces `verifier` only once the status that records their
        offset is written (a failed write re-reads the same lines, which must verify again)."""
        self.refused = ""
        """The API server's refusal of this job's last create that a retry alone does not change (a 4xx other than
        404, 409 and 429): shown in status by the next pass, cleared once the creates of a pass go through."""
        self.conflicts: set[str] = set()
        """Kinds (Secret, NetworkPolicy) whose create answered 409 with an object not the job's own: observed next."""
        self.discarding_line = False
        """The log chunk last read ended inside a line longer than a whole chunk: skip to its end."""
        self.first_pass_due = False
        """`run` has not finished its first pass yet (counted in `Runtime.after_first_passes`)."""

    # --- the loop ---
    async def run(self, stopped: Any) -> None:
        wake = self.rt.wakeup(self.namespace, self.name)
        self.rt.first_pass_started()
        self.first_pass_due = True
        try:
            while not stopped:
                if not self.first_pass_due:
                    await self.rt.after_first_passes()
                    if stopped:
                        return
                wake.clear()
                try:
                    with self.rt.metrics.reconcile_seconds.time(), self._first_pass_ends():
                        decision = await self.pass_once(stopped)
                    self.rt.metrics.reconcile_passes.labels("ok").inc()
                except (KubeError, RayUnavailable) as e:
                    self.rt.metrics.reconcile_passes.labels("error").inc()
                    self.log.warning(f"pass failed, retrying in {self.rt.config.error_backoff:g}s: {e}")
                    await self._sleep(wake, stopped, self.rt.config.error_backoff)
                    continue
                except Exception:  # one job's failure must never end its loop or reach others
                    self.log.exception(f"pass failed, retrying in {self.rt.config.error_backoff:g}s")
                    await self._sleep(wake, stopped, self.rt.config.error_backoff)
                    continue
                if decision is None or decision.done:
                    return
                await self._sleep(wake, stopped, self._delay(decision))
        finally:
            self.rt.forget(self.namespace, self.name)
            self._end_first_pass()

    @contextlib.contextmanager
    def _first_pass_ends(self) -> Iterator[None]:
        """The first pass ends with this block, however it ends (later passes give way to first ones)."""
        try:
            yield
        finally:
            self._end_first_pass()

    def _end_first_pass(self) -> None:
        if self.first_pass_due:
            self.first_pass_due = False
            self.rt.first_pass_ended()

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
            self.uid, self.status, self.pending_write, self.token = uid, None, False, ""
            self.events_key, self.verifier = b"", None
            self.conflicts, self.refused = set(), ""
        raw_status = obj.get("status")
        stored = dict(raw_status) if isinstance(raw_status, Mapping) else {}
        status = self._current(stored)
        self.pending_verifier, self.pending_chunk = None, None
        failure = ""
        try:
            observed = await self.observe(obj, status)
        except (KubeError, RayUnavailable):
            raise
        except Exception as e:  # contained: becomes the ReconcileError condition
            self.log.exception("observing the job failed")
            observed, failure = Observed(now=self.rt.clock()), _describe(e)
        if self.refused and not observed.create_refused:
            observed = replace(observed, create_refused=self.refused)
        if not failure:
            settings: dict[str, Any] = {
                "training_package": self.rt.config.training_package,
                "security": self.rt.config.security,
                "ray_unreachable_timeout": self.rt.config.ray_unreachable_timeout,
            }
            try:
                if self.pending_chunk is not None:
                    decision, observed, last_seq = await self._parse_and_reconcile(
                        self.pending_chunk, obj, status, observed, settings
                    )
                    if self.pending_verifier is not None:
                        self.pending_verifier[1].last_seq = last_seq
                else:
                    decision = reconcile(obj, status, observed, **settings)
            except Exception as e:  # contained: becomes the ReconcileError condition
                self.log.exception("reconcile failed")
                failure = _describe(e)
        if failure:
            decision = pass_failed(status, observed, failure)
        self.rt.metrics.record_pass((self.namespace, self.name), obj, status, decision.status, observed.now)
        try:
            await self.write(stored, decision.status)
        except KubeError as e:
            if _transient(e):
                # Not recorded, or recorded unseen (a lost answer): act on nothing. The next pass decides again from
                # what is stored and acts once its decision is. Acting now lets that pass observe this one's action
                # as someone else's: the RayCluster deleted for a `Succeeded` that was never written reads as
                # `ClusterLost`, a Ray job stopped for a `Failed` that was never written as stopped from outside.
                raise
            # The API server refused this status (too large, invalid): write it without the per-rank detail, with
            # the ReconcileError condition saying why, so the phase transition and the log offset still land.
            self.log.error(f"status write refused: {e}")
            refused = pass_failed(without_rank_detail(decision.status), observed, f"status write refused: {e}")
            try:
                await self.write(stored, refused.status)
            except KubeError as again:
                if not _transient(again):
                    # Nothing about this job can be recorded: work that must end ends anyway (a status the API
                    # server refuses in every form must not hold GPUs).
                    stopping = tuple(a for a in decision.actions if isinstance(a, MUST_STOP_ACTIONS))
                    await self.act(obj, Decision(decision.status, stopping))
                raise
            decision = replace(decision, status=refused.status, actions=(*decision.actions, *refused.actions))
            await self.act(obj, decision)
            return decision
        if stopped:
            return None  # kopf is stopping this loop (deletion or shutdown): leave the acting to the next owner
        await self.act(obj, decision)
        return decision

    def _current(self, stored: Obj) -> JobStatus:
        """The status to decide from: this loop's own, ahead of the stored one by deferred progress, unless the stored
        one moved on in more than progress (a write whose answer was lost had landed; another writer): then that one,
        as a restarted loop would. Deciding from the older one would redo what the stored one already records, and
        overwrite it: a `Succeeded` followed by a deleted RayCluster became `ClusterLost`."""
        if self.status is not None and progress_only(stored, self.written):
            return self.status
        # From the stored offset on: the verifier starts again (the lines before it are never read again).
        self.status, self.written, self.pending_write, self.verifier = None, {}, False, None
        return JobStatus.from_dict(stored)

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
        children = await self._conflicting_children() if status.phase == Phase.PROVISIONING else ()
        cluster_obj = await self.rt.kube.get_raycluster(self.namespace, status.ray_cluster_name)
        if cluster_obj is None:
            return Observed(now=now, submit_error=submit_error, children=children)
        cluster = ClusterView.from_object(cluster_obj)
        if self.uid and cluster.owner_uid != self.uid:
            # Not ours: no word with its Ray (`reconcile` replaces it when a deleted namesake left it, else fails).
            return Observed(now=now, cluster=cluster, children=children)
        if children:
            return Observed(now=now, cluster=cluster, children=children)
        self.address = self.rt.ray_address(cluster_obj)
        if self.address and not self.token:
            self.token, foreign_secret = await cluster_token(self.rt, self.namespace, self.name, self.uid)
            if foreign_secret:
                return Observed(now=now, cluster=cluster, foreign_secret=foreign_secret)
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
                return Observed(
                    now=now,
                    cluster=cluster,
                    unschedulable=await self._unschedulable(cluster.name),
                    create_refused=await self._pods_refused(cluster.name),
                )
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
            final = info.status in RAY_TERMINAL
            chunk = await client.logs(status.submission_id, status.log_offset, LOG_CHUNK, final=final)
        except RayUnavailable as e:
            self.rt.metrics.ray_api_errors.labels("job").inc()
            return Observed(now=now, cluster=cluster, ray_error=str(e))
        text, consumed, over_long = self._complete_lines(chunk, full=len(chunk) >= LOG_CHUNK, final=final)
        verifier = await self._verifier(status.submission_id)
        if text.count(PREFIX) > OFF_PROCESS_EVENTS:
            # Parsed with the decision, in the log worker: a flood of event lines must not hold this event loop.
            self.pending_chunk = LogChunk(text, verifier.key, verifier.last_seq)
            text = ""
        parsed = parse_log(text.splitlines(), verifier)
        return Observed(
            now=now,
            cluster=cluster,
            ray_job=info,
            events=parsed.events,
            log_offset=status.log_offset + consumed,
            skipped_lines=parsed.malformed + over_long,
            forged_lines=parsed.forged,
            log_pending=len(chunk) >= LOG_CHUNK,
        )

    async def _parse_and_reconcile(
        self, chunk: LogChunk, obj: Obj, status: JobStatus, observed: Observed, settings: dict[str, Any]
    ) -> tuple[Decision, Observed, dict[int, int]]:
        """Many event lines: parsed and folded in the log worker, off this process's event loop and its GIL."""
        loop = asyncio.get_running_loop()
        try:
            work = functools.partial(parse_and_reconcile, chunk, obj, status, observed, settings)
            return await loop.run_in_executor(self.rt.log_worker(), work)
        except (BrokenExecutor, RuntimeError, OSError):
            # No worker (it died, or could not start): a new one next time; this chunk here, slower but not lost. A
            # RuntimeError of the decision itself raises again here and becomes the ReconcileError condition.
            self.rt.drop_log_worker()
            self.log.warning("the log worker process died; this chunk is parsed in the operator's process")
            return parse_and_reconcile(chunk, obj, status, observed, settings)

    async def _events_key(self) -> bytes:
        if not self.events_key:
            self.events_key = await job_events_key(self.rt, self.namespace, self.name, self.uid)
        return self.events_key

    async def _verifier(self, submission_id: str) -> Verifier:
        """A copy of the verifier of this attempt's lines, for this pass (`write` keeps it once the pass lands).

        Without the job's key (a Secret made before keys, or not the job's) nothing verifies: every event line
        is refused, and the `EventsAuthentic` condition says so."""
        if self.verifier is None or self.verifier[0] != submission_id:
            key = await self._events_key()
            self.verifier = (submission_id, Verifier(attempt_key(key, submission_id) if key else b""))
        pending = self.verifier[1].copy()
        self.pending_verifier = (submission_id, pending)
        return pending

    def _status_moved_on(self) -> None:
        if self.pending_verifier is not None:
            self.verifier, self.pending_verifier = self.pending_verifier, None

    async def _conflicting_children(self) -> tuple[ChildView, ...]:
        """The objects whose create answered 409 with one not the job's own, as they are now (gone or the job's own
        by now: forgotten)."""
        found = []
        for kind in sorted(self.conflicts):
            if kind == "Secret":
                obj = await self.rt.kube.get_secret(self.namespace, render.auth_secret_name(self.name))
            else:
                obj = await self.rt.kube.get_network_policy(self.namespace, render.network_policy_name(self.name))
            if obj is None or _owned_by(obj, self.uid):
                self.conflicts.discard(kind)
            else:
                found.append(ChildView.from_object(kind, obj))
        return tuple(found)

    def _complete_lines(self, chunk: str, *, full: bool, final: bool) -> tuple[str, int, int]:
        """(whole lines to parse, characters consumed, over-long lines skipped) of one log chunk.

        A half-written last line waits for the next pass, unless the job has ended (then it is all there is).
        A line longer than a whole chunk is never parsed: it is skipped to its end, over as many passes as it
        takes, and counted once.
        """
        start = 0
        if self.discarding_line:
            cut = chunk.find("\n")
            if cut < 0:
                self.discarding_line = full
                return "", len(chunk), 0
            self.discarding_line, start = False, cut + 1
        end = len(chunk) if final and not full else chunk.rfind("\n") + 1
        if end <= start:
            if full and start == 0:
                self.discarding_line = True
                return "", len(chunk), 1
            return "", start, 0
        return chunk[start:end], end, 0

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

    async def _pods_refused(self, cluster_name: str) -> str:
        """KubeRay's latest word that the API server refused a pod of the cluster (its FailedToCreateHeadPod and
        FailedToCreateWorkerPod Warning events on the RayCluster); empty when none."""
        selector = f"involvedObject.kind=RayCluster,involvedObject.name={cluster_name}"
        events = [
            e
            for e in await self.rt.kube.list_events(self.namespace, selector)
            if e.get("reason") in ("FailedToCreateHeadPod", "FailedToCreateWorkerPod")
        ]
        if not events:
            return ""
        latest = max(events, key=lambda e: str(e.get("lastTimestamp") or e.get("eventTime") or ""))
        return f"KubeRay could not create a pod ({latest.get('reason')}): {str(latest.get('message', ''))[:600]}"

    def _ray(self) -> RayJobs:
        return self.rt.ray(self.address, self.token)

    # --- writing ---
    async def write(self, stored: Obj, status: JobStatus) -> None:
        """Patch status when it changed; progress-only changes at most once per `progress_write_interval`.

        `self.status` moves on only once the write is done (or deliberately deferred): when the patch fails,
        the next pass decides again from the old status, so the transition's actions and events are not lost.
        """
        new = within_budget(status.to_dict())
        if new == stored:
            self.status, self.written, self.pending_write = status, new, False
            self._status_moved_on()
            return
        now = time.monotonic()
        if progress_only(stored, new) and now - self.last_write < self.rt.config.progress_write_interval:
            self.status, self.written, self.pending_write = status, new, True  # the loop comes back when it is due
            self._status_moved_on()
            self.rt.metrics.status_writes.labels("deferred").inc()
            return
        try:
            await self.rt.kube.patch_job_status(self.namespace, self.name, merge_patch(stored, new))
        except KubeError:
            self.rt.metrics.status_writes.labels("failed").inc()
            raise
        self.rt.metrics.status_writes.labels("written").inc()
        self.status, self.written, self.pending_write, self.last_write = status, new, False, now
        self._status_moved_on()

    # --- acting ---
    async def act(self, obj: Obj, decision: Decision) -> None:
        """Take each action; one that fails (API refused, Ray unreachable) does not keep the others from running,
        except the RayCluster's own create after what it needs failed (its Secret, its NetworkPolicy)."""
        missing, refused, created_any = "", [], False
        for action in decision.actions:
            if isinstance(action, PostEvent) and self.first_pass_due:
                # A first pass's work is done once its cluster is asked for: its events wait for the other first passes.
                self._end_first_pass()
                await self.rt.after_first_passes()
            if isinstance(action, CreateRayCluster) and missing:
                # Only a missing cluster makes a pass create these again: created now, it would wait for ever for a
                # Secret its head cannot start without, or run with Ray's ports open.
                self.log.warning(f"RayCluster not created before its {missing}; the next pass retries")
                continue
            try:
                await self._act_one(obj, decision, action)
            except (KubeError, RayUnavailable, ObjectNotOurs) as e:
                # Level-triggered: the next pass decides the same action again if it is still needed.
                self.log.warning(f"{type(action).__name__} failed, the next pass retries: {e}")
                if isinstance(action, CreateAuthSecret | ApplyNetworkPolicy):
                    missing = "Secret" if isinstance(action, CreateAuthSecret) else "NetworkPolicy"
                if isinstance(e, KubeError) and isinstance(action, _CREATES) and not _transient(e):
                    # RBAC, admission, validation or quota: repeating the request changes nothing; say so in status.
                    kind = {CreateAuthSecret: "Secret", ApplyNetworkPolicy: "NetworkPolicy"}.get(
                        type(action), "RayCluster"
                    )
                    refused.append(f"the API server refused the job's {kind}: {str(e)[:600]}")
            else:
                created_any = created_any or isinstance(action, _CREATES)
        if refused or created_any:
            self.refused = "; ".join(refused)

    async def _act_one(self, obj: Obj, decision: Decision, action: Any) -> None:
        match action:
            case CreateAuthSecret(manifest=manifest):
                token = base64.b64encode(secrets.token_urlsafe(32).encode()).decode()
                events_key = base64.b64encode(secrets.token_bytes(32)).decode()
                data = {render.AUTH_TOKEN_KEY: token, render.EVENTS_KEY_KEY: events_key}
                created = await self.rt.kube.create_secret({**manifest, "data": data})
                self.log.info(f"Secret {manifest['metadata']['name']} " + ("created" if created else "exists"))
                if not created:
                    existing = await self.rt.kube.get_secret(self.namespace, manifest["metadata"]["name"])
                    self._own_or_conflict("Secret", existing)
            case ApplyNetworkPolicy(manifest=manifest):
                created = await self.rt.kube.create_network_policy(manifest)
                self.log.info(f"NetworkPolicy {manifest['metadata']['name']} " + ("created" if created else "exists"))
                if not created:
                    existing = await self.rt.kube.get_network_policy(self.namespace, manifest["metadata"]["name"])
                    self._own_or_conflict("NetworkPolicy", existing)
            case DeleteLeftover(kind=kind, namespace=namespace, name=name, uid=uid):
                if await self.rt.kube.delete_owned(kind, namespace, name, uid):
                    self.log.info(f"{kind} {name} (uid {uid}, left by a deleted job of the same name) deleted")
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

    def _own_or_conflict(self, kind: str, existing: Obj | None) -> None:
        """A 409 is success only for the job's own object; another one (a deleted namesake's the garbage collector
        has not reached yet, someone else's) is observed by the next pass, and the RayCluster waits."""
        if existing is not None and (not self.uid or _owned_by(existing, self.uid)):
            self.conflicts.discard(kind)
            return
        self.conflicts.add(kind)
        raise ObjectNotOurs(f"{kind} exists and is not this job's own")

    async def _submit(self, submission_id: str, decision: Decision, action: SubmitJob) -> None:
        if not self.address:
            return
        # The attempt's key goes in here, at the last moment: never in a decision, a status or a log line. Without
        # one (a Secret from before event keys) the ranks print unsigned lines, which are refused, and said so.
        key = await self._events_key()
        submission = with_event_key(action.submission, key)
        if not key:
            self.log.warning(f"submission {submission_id}: the job's Secret holds no event key; no event will verify")
        try:
            created = await self._ray().submit(submission)
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
