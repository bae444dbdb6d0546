"""The I/O around the state machine: observe, `reconcile()`, write status once, act. One loop per live job.

`handlers.py` starts `JobLoop.run` as a kopf daemon per FSDPTrainingJob and wakes it from child
watches; this loop is the only writer of the job's status. It takes the job anew at the top of every
pass, from the watch when not older than its own last write (`watched.py`), else from the API server
(level-triggered: a missed event costs at most one interval), keeps the status it computed in
memory (progress-only writes are rate-limited), and writes before it acts, so a restart between the
two repeats an idempotent action instead of losing the intent.

Containment: a pass that raises (a bug, or input no check foresaw) is recorded on the job as the
`ReconcileError` condition and a Warning event, and the log offset still moves past what was read, so one
poisoned line cannot freeze a job; a pass whose observation raises reads the job's RayCluster alone and still
enforces a finished job's cleanup and TTL, `suspend` and `activeDeadlineSeconds` (`reconcile.pass_failed`); a
status the API server refuses (too large, invalid) is written again without the per-rank detail before the pass
acts, and when no form of it can be written the actions that stop work (stop
the Ray job, delete the cluster) still run. A write that fails on the way (no answer, 5xx, 409, 429) acts on
nothing: the next pass decides again. Each pass reads at most `LOG_CHUNK` characters of log, so
one job's flood of output costs others at most one bounded slice of the event loop per pass.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import logging
import secrets
import time
from collections.abc import Iterator, Mapping
from concurrent.futures import BrokenExecutor
from dataclasses import replace
from typing import Any

from fsdp_train.contract.events import PREFIX, Verifier, attempt_key, parse_log

from fsdp_operator.api import render
from fsdp_operator.decide.budget import merge_patch, progress_only, within_budget
from fsdp_operator.decide.folding import without_rank_detail
from fsdp_operator.decide.observed import (
    KIND,
    MUST_STOP_ACTIONS,
    PREREQUISITES,
    RAY_TERMINAL,
    ApplyNetworkPolicy,
    ChildView,
    ClusterView,
    CreateAuthSecret,
    CreateRayCluster,
    Decision,
    DeleteJob,
    DeleteLeftover,
    DeletePod,
    DeleteRayCluster,
    Observed,
    PostEvent,
    StopJob,
    SubmitJob,
    together,
)
from fsdp_operator.decide.pass_errors import describe
from fsdp_operator.decide.reconcile import pass_failed, reconcile
from fsdp_operator.decide.status import JobStatus, Phase
from fsdp_operator.runtime.job_secret import _owned_by, cluster_token, job_events_key, with_event_key
from fsdp_operator.runtime.kube import KubeError
from fsdp_operator.runtime.kueue import read_workload
from fsdp_operator.runtime.log_lines import complete_lines
from fsdp_operator.runtime.log_worker import LogChunk, Obj, parse_and_reconcile
from fsdp_operator.runtime.nodes import node_notices
from fsdp_operator.runtime.provisioning import WhyWaiting, auto_zone_job, choose_zone
from fsdp_operator.runtime.rayjobs import (
    LOG_CHUNK,
    RayJobs,
    RayUnavailable,
    SubmissionRejected,
)
from fsdp_operator.runtime.shared import Runtime

Logger = logging.Logger | logging.LoggerAdapter[Any]


_CREATES = (CreateAuthSecret, ApplyNetworkPolicy, CreateRayCluster)


OFF_PROCESS_EVENTS = 64
"""A log chunk with more event lines than this is parsed and folded in the log worker process, not in the
operator's: parsing 256 KiB of event lines takes ~140 ms of CPU, which in a thread would still hold the GIL the
event loop needs (docs/reliability.md, "Log flood")."""


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
        self.long_lines: dict[int, str] = {}
        """Log offset -> the last `MAX_LINE_CHARS` characters of a line longer than a chunk from there: skipped, its end
        read (an event printed after text without a newline); by offset, so a pass repeated from there reads alike."""
        self.first_pass_due = False
        """`run` has not finished its first pass yet (counted in `Runtime.after_first_passes`)."""
        self.written_version = ""
        """The job's resourceVersion that this loop's last status write made ('' before one)."""
        self.trust_watch = False
        """The job may come from the watch (`Runtime.read_job`): not on a first pass (a loop spawned again at exit may
        find an event queued before its predecessor's last write), nor after a failed one."""
        self.why_waiting = WhyWaiting()

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
                if decision is None:
                    return
                # A finished job with nothing left to do is not polled, but waits for news of it: an edit is then
                # observed, and observedGeneration follows (kstatus read one never observed as InProgress for ever).
                await self._sleep(wake, stopped, None if decision.done else self._delay(decision))
        finally:
            self.rt.forget(self.namespace, self.name)
            self.rt.watched.forget_job(self.namespace, self.name)
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
    async def _sleep(wake: asyncio.Event, stopped: Any, seconds: float | None) -> None:
        """Until woken (a child changed), stopped (kopf), or `seconds` passed (None: no time limit)."""
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
        obj = await self.rt.read_job(self.namespace, self.name, self.written_version if self.trust_watch else None)
        self.trust_watch = False  # until this pass ends without an error: a failed one reads the job again
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
            # The job's cluster alone, so that the guards that need nothing from Ray still run (`pass_failed`).
            observed, failure = await self._cluster_alone(status), describe(e)
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
                failure = describe(e)
        if failure:
            decision = pass_failed(status, observed, failure, obj)
        self.rt.metrics.record_pass((self.namespace, self.name), obj, status, decision.status, observed.now)
        try:
            await self.write(stored, decision.status)
        except KubeError as e:
            if e.transient:
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
                if not again.transient:
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
        self.trust_watch = True
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
    async def _cluster_alone(self, status: JobStatus) -> Observed:
        """What a pass whose observation failed still observes: the job's RayCluster (a failed read raises, and the
        pass is repeated), so the deadline, suspend and a finished job's cleanup never touch another's cluster."""
        now = self.rt.clock()
        if not status.ray_cluster_name:
            return Observed(now=now)
        cluster_obj = await self.rt.kube.get_raycluster(self.namespace, status.ray_cluster_name)
        return Observed(now=now, cluster=ClusterView.from_object(cluster_obj) if cluster_obj else None)

    async def observe(self, obj: Obj, status: JobStatus) -> Observed:
        now = self.rt.clock()
        submit_error, self.submit_error = self.submit_error, ""
        if status.phase == Phase.PENDING and not status.placement:
            job = auto_zone_job(obj)
            if job is not None:
                return Observed(now=now, zone_choice=await choose_zone(self.rt, job, self.log))
        if status.phase in (None, Phase.PENDING) or not status.ray_cluster_name:
            return Observed(now=now)
        children = await self._conflicting_children() if status.phase in (Phase.PROVISIONING, Phase.QUEUED) else ()
        cluster_obj = await self.rt.read_cluster(self.namespace, status.ray_cluster_name)
        if cluster_obj is None:
            return Observed(now=now, submit_error=submit_error, children=children)
        cluster = ClusterView.from_object(cluster_obj)
        if self.uid and cluster.owner_uid != self.uid:
            # Not ours: no word with its Ray (`reconcile` replaces it when a deleted namesake left it, else fails).
            return Observed(now=now, cluster=cluster, children=children)
        if children:
            return Observed(now=now, cluster=cluster, children=children)
        waiting = status.phase in (Phase.QUEUED, Phase.PREEMPTED)
        if (cluster.suspended or waiting) and not (status.terminal or status.phase == Phase.SUSPENDED):
            # Kueue's side (docs/kueue.md): why it waits, or why it was evicted. Ray is not asked: it has no pods.
            workload, workload_error = await read_workload(self.rt.kube, self.namespace, cluster)
            return Observed(now=now, cluster=cluster, workload=workload, workload_error=workload_error)
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
                why, refused, held = await self.why_waiting.read(self.rt, self.namespace, cluster_obj)
                return Observed(
                    now=now, cluster=cluster, unschedulable=why, create_refused=refused, containers_held=held
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
        text, consumed, over_long = complete_lines(
            self.long_lines, chunk, full=len(chunk) >= LOG_CHUNK, final=final, offset=status.log_offset
        )
        verifier = await self._verifier(status.submission_id)
        if text.count(PREFIX) > OFF_PROCESS_EVENTS:
            # Parsed with the decision, in the log worker: a flood of event lines must not hold this event loop.
            self.pending_chunk = LogChunk(text, verifier.key, verifier.last_seq)
            text = ""
        parsed = parse_log(text.splitlines(), verifier)
        rt = self.rt
        noticed = await node_notices(
            rt.kube, self.namespace, cluster.name, taints=rt.config.node_notices, watched=rt.watched
        )
        return Observed(
            node_notices=noticed,
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

    def _ray(self) -> RayJobs:
        return self.rt.ray(self.address, self.token)

    # --- writing, then acting ---
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
            written = await self.rt.kube.patch_job_status(self.namespace, self.name, merge_patch(stored, new))
        except KubeError:
            self.rt.metrics.status_writes.labels("failed").inc()
            raise
        self.written_version = str((written.get("metadata") or {}).get("resourceVersion") or "")
        self.rt.watched.job(self.namespace, self.name, written)  # the job as of this write, until the watch's newer
        self.rt.metrics.status_writes.labels("written").inc()
        self.status, self.written, self.pending_write, self.last_write = status, new, False, now
        self._status_moved_on()

    async def act(self, obj: Obj, decision: Decision) -> None:
        """Take each action (a cluster's Secret and NetworkPolicy at once: `together`); one that fails does not keep
        the others from running, except the RayCluster's own create after what it needs failed."""
        missing, refused, created_any = "", [], False
        for batch in together(decision.actions):
            if isinstance(batch[0], PostEvent) and self.first_pass_due:
                # A first pass's work is done once its cluster is asked for: its events wait for the other first passes.
                self._end_first_pass()
                await self.rt.after_first_passes()
            if isinstance(batch[0], CreateRayCluster) and missing:
                # Only a missing cluster makes a pass create these again: created now, it would wait for ever for a
                # Secret its head cannot start without, or run with Ray's ports open.
                self.log.warning(f"RayCluster not created before its {missing}; the next pass retries")
                continue
            outcomes = await asyncio.gather(*(self._act_one(obj, decision, a) for a in batch), return_exceptions=True)
            for action, e in zip(batch, outcomes, strict=True):
                if e is None:
                    created_any = created_any or isinstance(action, _CREATES)
                    continue
                if not isinstance(e, KubeError | RayUnavailable | ObjectNotOurs):
                    raise e
                # Level-triggered: the next pass decides the same action again if it is still needed.
                self.log.warning(f"{type(action).__name__} failed, the next pass retries: {e}")
                if isinstance(action, PREREQUISITES):
                    missing = KIND[type(action)]
                if isinstance(e, KubeError) and isinstance(action, _CREATES) and not e.transient:
                    # RBAC, admission, validation or quota: repeating the request changes nothing; say so in status.
                    refused.append(f"the API server refused the job's {KIND[type(action)]}: {str(e)[:600]}")
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
                self.rt.watched.cluster(namespace, name, None)  # gone or going: read it again if asked
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
            case DeletePod(namespace=namespace, name=name, uid=uid):
                if await self.rt.kube.delete_pod(namespace, name, uid):
                    self.log.info(f"pod {name} deleted: its node goes away (its preStop hook saves a checkpoint)")
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
