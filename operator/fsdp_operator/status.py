"""FSDPTrainingJob.status: phases, the closed reason enum, conditions, and folding the ranks' events into it.

Pure data and pure functions. `reconcile.py` decides transitions; this module owns the shape that
`kubectl get trainingjobs` reads (the printer columns of `schema.PRINTER_COLUMNS`) and how the training
function's structured events (`fsdp_train.events`) become `ranks[]`, `progress`, `result`,
`transport` and `interconnect`.
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, get_args

from fsdp_train.events import (
    MAX_COUNT,
    TRUNCATED,
    Checkpoint,
    Evaluation,
    Event,
    Export,
    Failure,
    Placement,
    Probe,
    Step,
    Summary,
    Timings,
    Transport,
    TransportName,
)

from fsdp_operator import formats
from fsdp_operator import transport as transport_mod
from fsdp_operator.schema import MESSAGE_LIMIT
from fsdp_operator.spec import MAX_STEPS, Job


class Phase(StrEnum):
    """The operator's lifecycle of a job (KubeRay's `jobDeploymentStatus` axis)."""

    PENDING = "Pending"
    """Identities (RayCluster name, submission id) recorded; nothing created yet."""
    PROVISIONING = "Provisioning"
    """RayCluster created; waiting for the head and every worker to join Ray."""
    SUBMITTING = "Submitting"
    """Every worker joined; the training function is being submitted to Ray's job API."""
    RUNNING = "Running"
    """Ray knows the job (its own state is mirrored in `rayJobStatus`)."""
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    SUSPENDED = "Suspended"
    """`runPolicy.suspend`: Ray job stopped, RayCluster deleted; resumes as a new attempt."""


TERMINAL_PHASES = frozenset({Phase.SUCCEEDED, Phase.FAILED})


class Reason(StrEnum):
    """Why the job is in its phase: a closed set, paired with a free `message`."""

    VALIDATION_FAILED = "ValidationFailed"
    CREATED = "Created"
    RESUMED = "Resumed"
    CLUSTER_CREATING = "ClusterCreating"
    WORKERS_NOT_READY = "WorkersNotReady"
    UNSCHEDULABLE = "Unschedulable"
    CREATE_REFUSED = "CreateRefused"
    WORKERS_READY = "WorkersReady"
    JOB_RUNNING = "JobRunning"
    RAY_UNREACHABLE = "RayUnreachable"
    RETRYING = "Retrying"
    COMPLETED = "Completed"
    SUBMISSION_FAILED = "SubmissionFailed"
    RAY_JOB_FAILED = "RayJobFailed"
    RAY_JOB_STOPPED = "RayJobStopped"
    RAY_JOB_LOST = "RayJobLost"
    DEADLINE_EXCEEDED = "DeadlineExceeded"
    WAIT_FOR_WORKERS_TIMEOUT = "WaitForWorkersTimeout"
    CLUSTER_LOST = "ClusterLost"
    CLUSTER_NAME_TAKEN = "ClusterNameTaken"
    """A RayCluster (or the job's auth Secret) under the job's name exists and was not created for this job."""
    TRANSPORT_FALLBACK = transport_mod.FAILURE_REASON
    TRANSPORT_UNVERIFIED = transport_mod.UNVERIFIED_REASON
    """`requireEFA`: a rank had no verified transport by the first training step (or when the Ray job ended)."""
    SUSPENDED = "Suspended"
    DATA_UNAVAILABLE = "DataUnavailable"
    """spec.data.source cannot be read, holds no documents, or too few for one global batch."""


# Reasons posted as Warning events (everything in phase Failed is a Warning too). Waiting for workers
# is the normal start of every job and posts Normal events; a pod the scheduler cannot place is a Warning,
# as the scheduler's own FailedScheduling event is.
WARNING_REASONS = frozenset({Reason.UNSCHEDULABLE, Reason.CREATE_REFUSED, Reason.RAY_UNREACHABLE, Reason.RETRYING})


class ConditionType(StrEnum):
    VALIDATED = "Validated"
    WORKERS_READY = "WorkersReady"
    JOB_SUBMITTED = "JobSubmitted"
    RUNNING = "Running"
    TRANSPORT_VERIFIED = transport_mod.TRANSPORT_CONDITION
    INTERCONNECT_HEALTHY = transport_mod.INTERCONNECT_CONDITION
    COMPLETE = "Complete"
    FAILED = "Failed"
    RECONCILE_ERROR = "ReconcileError"
    """True while the operator's own passes over the job fail (the message names the error)."""
    ZONE_PLACED = "ZonePlaced"
    EVENTS_AUTHENTIC = "EventsAuthentic"
    """False once an event line of the current attempt failed the signature check (docs/reliability.md)."""


@dataclass(frozen=True, slots=True)
class ConditionRule:
    """How one condition type behaves; `CONDITIONS` below is the only place that says it."""

    reasons: frozenset[str]
    """Every reason the operator writes with this type (tests hold the code to this list)."""
    resets_on_new_attempt: bool
    """Removed when a retry or resume starts a new submission (it spoke for the previous attempt's ranks)."""
    warning_when_false: bool
    """Turning False posts a Warning event with the condition's reason and message."""
    set_once: bool = False
    """Once True, never changed or removed (batch/v1 Job's `Complete` and `Failed`)."""
    doc: str = ""


_FAILURE_REASONS = frozenset(
    {
        Reason.VALIDATION_FAILED,
        Reason.UNSCHEDULABLE,
        Reason.SUBMISSION_FAILED,
        Reason.RAY_JOB_FAILED,
        Reason.RAY_JOB_STOPPED,
        Reason.RAY_JOB_LOST,
        Reason.RAY_UNREACHABLE,
        Reason.DEADLINE_EXCEEDED,
        Reason.WAIT_FOR_WORKERS_TIMEOUT,
        Reason.CLUSTER_LOST,
        Reason.CLUSTER_NAME_TAKEN,
        Reason.TRANSPORT_FALLBACK,
        Reason.TRANSPORT_UNVERIFIED,
        Reason.DATA_UNAVAILABLE,
    }
)

CONDITIONS: Mapping[ConditionType, ConditionRule] = {
    ConditionType.VALIDATED: ConditionRule(
        reasons=frozenset({"Valid", "Invalid"}),
        resets_on_new_attempt=False,
        warning_when_false=False,  # the ValidationFailed phase event says it
        doc="The spec passed validation.",
    ),
    ConditionType.WORKERS_READY: ConditionRule(
        reasons=frozenset(
            {"AllWorkersJoined", Reason.WORKERS_NOT_READY, Reason.UNSCHEDULABLE, Reason.CREATE_REFUSED, "Suspended"}
        ),
        resets_on_new_attempt=False,  # a retry reuses the RayCluster and re-checks it
        warning_when_false=False,  # False while provisioning is the normal start
        doc="Every worker pod is ready and joined Ray with its GPUs.",
    ),
    ConditionType.JOB_SUBMITTED: ConditionRule(
        reasons=frozenset({"Accepted", "Suspended"}) | _FAILURE_REASONS,
        resets_on_new_attempt=False,  # set False with the failed attempt's reason on retry
        warning_when_false=False,  # the phase or Retrying event says it
        doc="Ray's job API accepted the current submission.",
    ),
    ConditionType.RUNNING: ConditionRule(
        reasons=frozenset({Reason.JOB_RUNNING}) | frozenset(Reason),
        resets_on_new_attempt=False,
        warning_when_false=False,
        doc="The Ray job of the current attempt runs (phase Running); False with the phase's reason otherwise.",
    ),
    ConditionType.TRANSPORT_VERIFIED: ConditionRule(
        reasons=frozenset({"Verified", "SocketFallback", "PluginMissing", "NotObserved", "Unverified"}),
        resets_on_new_attempt=True,
        warning_when_false=True,
        doc="Every networked rank's NCCL log shows the requested transport.",
    ),
    ConditionType.INTERCONNECT_HEALTHY: ConditionRule(
        reasons=frozenset({"Healthy", "BelowFloor", "NotMeasured"}),
        resets_on_new_attempt=True,
        warning_when_false=True,
        doc="The measured cross-node bus bandwidth is above the instance type's floor.",
    ),
    ConditionType.COMPLETE: ConditionRule(
        reasons=frozenset({Reason.COMPLETED}),
        resets_on_new_attempt=False,
        warning_when_false=False,
        set_once=True,
        doc="The job finished successfully (as batch/v1 Job: `kubectl wait --for=condition=Complete`).",
    ),
    ConditionType.FAILED: ConditionRule(
        reasons=_FAILURE_REASONS,
        resets_on_new_attempt=False,
        warning_when_false=False,
        set_once=True,
        doc="The job failed for good (as batch/v1 Job: `kubectl wait --for=condition=Failed`).",
    ),
    ConditionType.RECONCILE_ERROR: ConditionRule(
        reasons=frozenset({"PassFailed", "PassSucceeded"}),
        resets_on_new_attempt=False,
        warning_when_false=False,  # turning True posts the Warning (`reconcile.pass_failed`)
        doc="A pass of the operator over the job raised; the message names the error. False once a pass succeeds.",
    ),
    ConditionType.ZONE_PLACED: ConditionRule(
        reasons=frozenset({"ZoneChosen", "NoZoneChosen"}),
        resets_on_new_attempt=False,  # a retry reuses the RayCluster, so its zone
        warning_when_false=False,  # not an error: the workers run, only without a zone constraint
        doc="placement.availabilityZone: auto picked a zone (status.placement says which and why); False: "
        "the workers run without a zone constraint, and the message says why.",
    ),
    ConditionType.EVENTS_AUTHENTIC: ConditionRule(
        reasons=frozenset({"AllSigned", "UnsignedLines"}),
        resets_on_new_attempt=True,
        warning_when_false=True,
        doc="Every event line of the current attempt carried a valid signature of its emitter; False: some did "
        "not (printed by other code, or replayed), were never folded, and are counted in forgedEvents.",
    ),
}


def is_terminal(phase: Phase | str | None) -> bool:
    return phase in TERMINAL_PHASES


def format_time(moment: datetime) -> str:
    """RFC 3339 in UTC with second precision, as the API server writes timestamps."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(text: str | None) -> datetime | None:
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


Condition = dict[str, Any]


def set_condition(
    conditions: Iterable[Condition],
    type_: str,
    status: str,
    reason: str,
    message: str,
    *,
    now: datetime,
    generation: int,
) -> list[Condition]:
    """The conditions with `type_` set; lastTransitionTime moves only when the status flips."""
    result: list[Condition] = []
    found = False
    for condition in conditions:
        if condition.get("type") != type_:
            result.append(dict(condition))
            continue
        found = True
        moved = condition.get("status") != status
        result.append(
            {
                "type": type_,
                "status": status,
                "reason": reason,
                "message": message,
                "lastTransitionTime": format_time(now) if moved else condition.get("lastTransitionTime", ""),
                "observedGeneration": generation,
            }
        )
    if not found:
        result.append(
            {
                "type": type_,
                "status": status,
                "reason": reason,
                "message": message,
                "lastTransitionTime": format_time(now),
                "observedGeneration": generation,
            }
        )
    return result


def get_condition(conditions: Iterable[Condition], type_: str) -> Condition | None:
    return next((c for c in conditions if c.get("type") == type_), None)


@dataclass(slots=True)
class JobStatus:
    """The typed view of `status`; `to_dict()` is what the API server stores.

    Lists and dicts inside are never mutated in place: every change goes through `replace()`.
    """

    phase: Phase | None = None
    reason: Reason | None = None
    message: str = ""
    workers: str = ""
    """`ready/desired` worker pods (printer column)."""
    ray_cluster_name: str = ""
    submission_id: str = ""
    attempts: int = 0
    """Submission ids handed out so far; the current one ends in `-<attempts>`."""
    failed_attempts: int = 0
    """Attempts that failed and count against `runPolicy.backoffLimit`."""
    observed_generation: int = 0
    start_time: datetime | None = None
    end_time: datetime | None = None
    provisioning_since: datetime | None = None
    """When the current wait for workers began (`waitForWorkersTimeoutSeconds` counts from here)."""
    ray_unreachable_since: datetime | None = None
    """When Ray's job API stopped answering a live job (the operator's `ray_unreachable_timeout` counts from here)."""
    ray_job_status: str = ""
    """Ray's own job state (PENDING, RUNNING, SUCCEEDED, FAILED, STOPPED), apart from `phase`."""
    log_offset: int = 0
    """How much of the current submission's log has been folded in."""
    skipped_events: int = 0
    """Event lines of the current submission skipped: malformed, or naming a rank the job does not have."""
    forged_events: int = 0
    """Event lines of the current submission refused by the signature check (never folded)."""
    dashboard_url: str = ""
    """Ray's dashboard (and job API) of the job's RayCluster, as KubeRay's RayJob reports `dashboardURL`."""
    placement: dict[str, Any] = field(default_factory=dict)
    """For `placement.availabilityZone: auto`: the zone chosen ('' for none) and why; empty until decided."""
    conditions: list[Condition] = field(default_factory=list)
    ranks: list[dict[str, Any]] = field(default_factory=list)
    progress: dict[str, Any] = field(default_factory=dict)
    transport: dict[str, Any] = field(default_factory=dict)
    interconnect: dict[str, Any] = field(default_factory=dict)
    probes: list[dict[str, Any]] = field(default_factory=list)
    result: dict[str, Any] = field(default_factory=dict)
    checkpoint: dict[str, Any] = field(default_factory=dict)
    output: dict[str, Any] = field(default_factory=dict)
    """The exported Hugging Face directory: path, step, seconds (spec.output)."""
    timings: dict[str, Any] = field(default_factory=dict)
    """Where the time to the first step went (rank 0's ``timings`` event)."""
    rank_failures: list[dict[str, Any]] = field(default_factory=list)
    worker_restarts: int = 0
    """Ray Train restarts of the worker group within this attempt (rank 0 started again)."""
    worker_group_start: datetime | None = None
    """When rank 0 of the current worker group reported its placement (second precision)."""

    @property
    def terminal(self) -> bool:
        return is_terminal(self.phase)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "phase": self.phase.value if self.phase else None,
            "reason": self.reason.value if self.reason else None,
            "message": self.message,
            "workers": self.workers,
            "rayClusterName": self.ray_cluster_name,
            "submissionId": self.submission_id,
            "attempts": self.attempts,
            "failedAttempts": self.failed_attempts,
            "observedGeneration": self.observed_generation,
            "startTime": format_time(self.start_time) if self.start_time else None,
            "endTime": format_time(self.end_time) if self.end_time else None,
            "provisioningSince": format_time(self.provisioning_since) if self.provisioning_since else None,
            "rayUnreachableSince": format_time(self.ray_unreachable_since) if self.ray_unreachable_since else None,
            "rayJobStatus": self.ray_job_status,
            "logOffset": self.log_offset,
            "skippedEvents": self.skipped_events,
            "forgedEvents": self.forged_events,
            "dashboardURL": self.dashboard_url,
            "placement": self.placement,
            "conditions": self.conditions,
            "ranks": self.ranks,
            "progress": self.progress,
            "transport": self.transport,
            "interconnect": self.interconnect,
            "probes": self.probes,
            "result": self.result,
            "checkpoint": self.checkpoint,
            "output": self.output,
            "timings": self.timings,
            "rankFailures": self.rank_failures,
            "workerRestarts": self.worker_restarts,
            "workerGroupStartTime": format_time(self.worker_group_start) if self.worker_group_start else None,
        }
        # Empty and zero fields are left out, so a fresh status is small and `kubectl get -o yaml` readable.
        return copy.deepcopy({k: v for k, v in out.items() if v not in (None, "", [], {}, 0)})

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any] | None) -> JobStatus:
        raw = raw or {}

        def integer(key: str) -> int:
            value = raw.get(key)
            return value if isinstance(value, int) and not isinstance(value, bool) else 0

        def mapping(key: str) -> dict[str, Any]:
            value = raw.get(key)
            return copy.deepcopy(dict(value)) if isinstance(value, Mapping) else {}

        def listing(key: str) -> list[dict[str, Any]]:
            value = raw.get(key)
            return [copy.deepcopy(dict(v)) for v in value if isinstance(v, Mapping)] if isinstance(value, list) else []

        phase_text, reason_text = str(raw.get("phase") or ""), str(raw.get("reason") or "")
        return cls(
            phase=Phase(phase_text) if phase_text in Phase._value2member_map_ else None,
            reason=Reason(reason_text) if reason_text in Reason._value2member_map_ else None,
            message=str(raw.get("message") or ""),
            workers=str(raw.get("workers") or ""),
            ray_cluster_name=str(raw.get("rayClusterName") or ""),
            submission_id=str(raw.get("submissionId") or ""),
            attempts=integer("attempts"),
            failed_attempts=integer("failedAttempts"),
            observed_generation=integer("observedGeneration"),
            start_time=parse_time(raw.get("startTime")),
            end_time=parse_time(raw.get("endTime")),
            provisioning_since=parse_time(raw.get("provisioningSince")),
            ray_unreachable_since=parse_time(raw.get("rayUnreachableSince")),
            ray_job_status=str(raw.get("rayJobStatus") or ""),
            log_offset=integer("logOffset"),
            skipped_events=integer("skippedEvents"),
            forged_events=integer("forgedEvents"),
            dashboard_url=str(raw.get("dashboardURL") or ""),
            placement=mapping("placement"),
            conditions=listing("conditions"),
            ranks=listing("ranks"),
            progress=mapping("progress"),
            transport=mapping("transport"),
            interconnect=mapping("interconnect"),
            probes=listing("probes"),
            result=mapping("result"),
            checkpoint=mapping("checkpoint"),
            output=mapping("output"),
            timings=mapping("timings"),
            rank_failures=listing("rankFailures"),
            worker_restarts=integer("workerRestarts"),
            worker_group_start=parse_time(raw.get("workerGroupStartTime")),
        )


def _resets(type_: str) -> bool:
    rule = CONDITIONS.get(ConditionType(type_)) if type_ in ConditionType._value2member_map_ else None
    return rule is None or rule.resets_on_new_attempt


def with_lifecycle_conditions(old: JobStatus, new: JobStatus, *, now: datetime, generation: int) -> JobStatus:
    """`Running`, `Complete` and `Failed` follow phase changes: one place, applied after every decision.

    `Running` is True while the phase is Running and False, with the new phase's reason, once it has left
    it. `Complete` and `Failed` are set once, as batch/v1 Job's: True with the reason and message of the
    terminal phase when it is entered, never False and never changed afterwards.
    """
    if new.phase is None or new.phase == old.phase:
        return new
    conditions = new.conditions
    reason = new.reason.value if new.reason else new.phase.value
    running = new.phase == Phase.RUNNING
    if running or get_condition(conditions, ConditionType.RUNNING) is not None:
        message = "the Ray job runs" if running else new.message[:1024]
        conditions = set_condition(
            conditions, ConditionType.RUNNING, str(running), reason, message, now=now, generation=generation
        )
    terminal_type = {Phase.SUCCEEDED: ConditionType.COMPLETE, Phase.FAILED: ConditionType.FAILED}.get(new.phase)
    if terminal_type is not None and get_condition(conditions, terminal_type) is None:
        conditions = set_condition(
            conditions, terminal_type, "True", reason, new.message[:1024], now=now, generation=generation
        )
    return replace(new, conditions=conditions)


def cleared_run_data(status: JobStatus) -> JobStatus:
    """The status without anything a previous attempt's ranks reported (a new submission starts clean)."""
    kept = [c for c in status.conditions if not _resets(str(c.get("type")))]
    return replace(
        status,
        ray_job_status="",
        ray_unreachable_since=None,
        log_offset=0,
        skipped_events=0,
        forged_events=0,
        conditions=kept,
        ranks=[],
        progress={},
        transport={},
        interconnect={},
        probes=[],
        result={},
        checkpoint={},
        output={},
        rank_failures=[],
        worker_restarts=0,
        worker_group_start=None,
    )


# --- folding the training function's events -------------------------------------------------------------


def _round(value: float | None, digits: int = 4) -> float | None:
    """Rounded for the status; None for NaN and infinities, which JSON (and so the API server) cannot carry."""
    return round(float(value), digits) if value is not None and math.isfinite(value) else None


def _whole(value: float) -> int | None:
    """A count for an integer-typed printer column; None when not finite (a diverged or zero-time step) or
    beyond what a JSON reader holds exactly (the API server refuses integers past int64)."""
    return round(value) if math.isfinite(value) and abs(value) <= MAX_COUNT else None


def _int(value: Any, default: int = 0) -> int:
    """An integer read back from a stored status, which a user with status access can have written."""
    return value if isinstance(value, int) and not isinstance(value, bool) else default


class _Ranks:
    """`status.ranks` while folding, indexed by rank (a world of thousands of ranks folds in linear time)."""

    def __init__(self, entries: Iterable[Mapping[str, Any]]) -> None:
        self.by_rank: dict[Any, dict[str, Any]] = {}
        for entry in entries:
            self.by_rank.setdefault(entry.get("rank"), dict(entry))

    def entry(self, rank: int) -> dict[str, Any]:
        return self.by_rank.setdefault(rank, {"rank": rank})

    def sorted(self) -> list[dict[str, Any]]:
        return sorted(self.by_rank.values(), key=lambda r: _int(r.get("rank")))


def _transport_events(status: JobStatus) -> list[Transport]:
    events: list[Transport] = []
    stored = status.transport.get("ranks")
    for item in stored if isinstance(stored, list) else []:
        if not isinstance(item, Mapping) or item.get("transport") not in get_args(TransportName):
            continue
        try:
            events.append(
                Transport(
                    rank=int(item["rank"]),
                    transport=item["transport"],
                    plugin=str(item.get("plugin", "")),
                    provider=str(item.get("provider", "")),
                    evidence=str(item.get("evidence", "")),
                    time=0.0,
                )
            )
        except (KeyError, TypeError, ValueError):
            continue
    return events


def _probe_events(status: JobStatus) -> list[Probe]:
    probes: list[Probe] = []
    for item in status.probes:
        if item.get("scope") not in ("all", "cross-node"):
            continue
        try:
            probes.append(
                Probe(
                    rank=int(item.get("rank", 0)),
                    scope=item["scope"],
                    ranks=int(item["ranks"]),
                    size_bytes=int(item["sizeBytes"]),
                    allreduce_busbw_gbps=float(item["allreduceBusbwGBps"]),
                    allgather_busbw_gbps=float(item["allgatherBusbwGBps"]),
                    time=0.0,
                )
            )
        except (KeyError, TypeError, ValueError):
            continue
    return probes


LOSS_HISTORY_POINTS = 64
"""At most this many [step, loss] points in `progress.lossHistory` (a few hundred bytes)."""


def _with_loss_point(history: Any, step: int, loss: float | None) -> list[list[float]]:
    """The bounded loss history with `[step, loss]` added: the whole run at a coarser grain as it grows.

    When full, every other point is dropped (the first and the newest stay), so the curve always spans
    the whole run and its size is bounded whatever the number of steps. A re-read step replaces itself.
    """
    points = [list(p) for p in history if isinstance(p, list) and len(p) == 2] if isinstance(history, list) else []
    if loss is None:
        return points  # a diverged (non-finite) loss has no place on the curve; phase and message say it
    if points and points[-1][0] >= step:
        points = [p for p in points if p[0] < step]
    points.append([step, loss])
    if len(points) > LOSS_HISTORY_POINTS:
        points = [*points[:-1:2], points[-1]]
    return points


@dataclass(frozen=True, slots=True)
class Folded:
    """The status after folding events, and the transport verdict that came with it."""

    status: JobStatus
    transport_failure: str | None
    """The failure message when `requireEFA` is set and a rank is not on EFA; None otherwise."""
    rejected: int = 0
    """Events refused for naming a rank outside the job's world size, or a number no run can produce."""
    unverified_transport: str | None = None
    """`requireEFA` and its deadline passed with a rank on no verified transport: the failure message."""


RANK_FAILURES_KEPT = 16
"""`status.rankFailures` keeps the newest this many distinct failures."""
TRANSPORT_DEADLINE_SECONDS = 60.0
"""`requireEFA`: every rank must have reported a verified transport this long after the operator read rank 0's
first step (or when the Ray job ends, whichever is first). Each rank reports it before its first collective of
training, so only log delivery from other nodes stands between; docs/reliability.md."""


def fold_events(
    job: Job,
    status: JobStatus,
    events: Iterable[Event],
    *,
    now: datetime,
    forged: int = 0,
    job_ended: bool = False,
) -> Folded:
    """Fold the ranks' structured events into `status` (idempotent: re-reading a log gives the same result).

    Linear in the events, with bounded state. `forged` event lines (refused by the signature check) are
    counted and turn `EventsAuthentic` False; none of them reaches the fold. `job_ended`: the Ray job ended
    and its whole log is read (the `requireEFA` deadline).
    """
    ranks = _Ranks(status.ranks)
    progress = dict(status.progress)
    result = dict(status.result)
    checkpoint = dict(status.checkpoint)
    output = dict(status.output)
    timings = dict(status.timings)
    probes = [dict(p) for p in status.probes]
    # A dict keyed by the failure itself: dedup in constant time, insertion order kept, at most a bound kept.
    failures: dict[tuple[Any, ...], dict[str, Any]] = {_failure_key(f): dict(f) for f in status.rank_failures}
    restarts, group_start = status.worker_restarts, status.worker_group_start
    transports = _transport_events(status)
    saw_transport = saw_probe = False
    world_size = job.spec.workers.world_size
    # The configured steps bound every step number; the spec's maximum, not its current value, which an edit of
    # the spec can change under a running attempt.
    total_steps = MAX_STEPS
    max_restarts = job.spec.run_policy.max_worker_restarts
    rejected = 0

    for event in events:
        if not _fits_world(event, world_size) or not _possible(event, total_steps):
            # A rank the job does not have, or a number no run of this job produces. Never a status entry.
            rejected += 1
            continue
        if isinstance(event, Placement):
            if event.rank == 0:
                # Rank 0 placed again, later than the group we know (a re-read line has the same second): Ray
                # Train restarted the worker group.
                started = _moment(event.time)  # None: a time no clock shows (NaN, past year 9999)
                if started is not None and group_start is not None and started > group_start:
                    # Ray Train restarts a group at most maxWorkerRestarts times in an attempt: more is no restart.
                    restarts = min(restarts + 1, max(max_restarts, 0))
                if started is not None and (group_start is None or started > group_start):
                    group_start = started
            entry = ranks.entry(event.rank)
            entry.update(
                localRank=event.local_rank,
                nodeRank=event.node_rank,
                nodeIP=event.node_ip,
                pod=event.pod,
                hostname=event.hostname,
                device=event.device,
            )
            if event.device_uuid:
                entry["deviceUUID"] = event.device_uuid
        elif isinstance(event, Transport):
            transports.append(event)
            saw_transport = True
            ranks.entry(event.rank)["transport"] = event.transport
        elif isinstance(event, Probe):
            probes = [p for p in probes if p.get("scope") != event.scope]
            probes.append(
                {
                    "rank": event.rank,
                    "scope": event.scope,
                    "ranks": event.ranks,
                    "sizeBytes": event.size_bytes,
                    "allreduceBusbwGBps": _round(event.allreduce_busbw_gbps, 3),
                    "allgatherBusbwGBps": _round(event.allgather_busbw_gbps, 3),
                }
            )
            saw_probe = True
        elif isinstance(event, Step):
            if event.step < _int(progress.get("step")):
                continue  # an older line re-read after a restart
            history = _with_loss_point(progress.get("lossHistory"), event.step, _round(event.loss))
            evaluation: dict[str, Any] = {k: progress[k] for k in ("evalLoss", "evalStep") if k in progress}
            # The operator's clock, not the rank's: the requireEFA deadline counts from when the step was seen.
            first_step = progress.get("firstStepTime") or format_time(now)
            progress = {
                "step": event.step,
                "totalSteps": event.total_steps,
                "stepOfTotal": f"{event.step}/{event.total_steps}",
                "loss": _round(event.loss),
                # An integer: the printer column is typed integer.
                "tokensPerSecond": _whole(event.tokens_per_second),
                "tokensPerSecondPerDevice": _whole(event.tokens_per_second_per_device),
            }
            if event.mfu is not None:
                progress["mfu"] = _round(event.mfu)
            if event.step_seconds:
                progress["stepSeconds"] = _round(event.step_seconds)
            if event.peak_memory_bytes:
                progress["peakMemoryBytes"] = event.peak_memory_bytes
            if history:
                progress["lossHistory"] = history
            if event.samples_seen:  # a data source (random tokens have no epochs)
                progress.update(epoch=event.epoch, samplesSeen=event.samples_seen, tokensSeen=event.tokens_seen)
            progress.update(evaluation)
            if first_step:
                progress["firstStepTime"] = first_step
        elif isinstance(event, Evaluation):
            if event.step >= _int(progress.get("evalStep")):
                progress.update(evalLoss=_round(event.loss), evalStep=event.step)
        elif isinstance(event, Export):
            output = {"path": event.path, "step": event.step, "seconds": _round(event.seconds, 2)}
            if event.verified or event.check or event.training_loss is not None:  # the export self-check ran
                output.update(verified=event.verified, trainingLoss=_round(event.training_loss))
                output["exportLoss"] = _round(event.export_loss)
                if event.check:
                    output["check"] = event.check
        elif isinstance(event, Checkpoint):
            checkpoint = {"step": event.step, "path": event.path, "seconds": _round(event.seconds, 2)}
            if event.resumed:  # resumed from, not written: a rerun with the same settings continues the run
                checkpoint["resumed"] = True
        elif isinstance(event, Timings):
            timings = {
                "toFirstStepSeconds": _round(event.to_first_step_seconds, 2),
                "startupSeconds": _round(event.startup_seconds, 2),
                "probeSeconds": _round(event.probe_seconds, 2),
                "buildSeconds": _round(event.build_seconds, 2),
                "firstStepSeconds": _round(event.first_step_seconds, 2),
            }
            if event.compile_cache:
                timings["compileCache"] = event.compile_cache
        elif isinstance(event, Summary):
            if event.rank != 0:
                continue  # rank 0's summary is the job's result
            result = {
                "steps": event.steps,
                "firstLoss": _round(event.first_loss),
                "finalLoss": _round(event.final_loss),
                "tokensPerSecond": _whole(event.tokens_per_second),
                "seconds": _round(event.seconds, 2),
            }
            if event.mfu is not None:
                result["mfu"] = _round(event.mfu)
            if event.sharding:
                result["sharding"] = event.sharding
            if event.resumed_from_step:
                result["resumedFromStep"] = event.resumed_from_step
            if event.eval_loss is not None:
                result["evalLoss"] = _round(event.eval_loss)
            if event.epochs:
                result["epochs"] = event.epochs
            if event.precision:
                result["precision"] = event.precision
            # Where the run's time went beside the steps that tokensPerSecond is over.
            for key, seconds in (
                ("stepSeconds", event.step_seconds),
                ("evalSeconds", event.eval_seconds),
                ("exportSeconds", event.export_seconds),
            ):
                if seconds:
                    result[key] = _round(seconds, 2)
        elif isinstance(event, Failure):
            failure = {"rank": event.rank, "message": event.message[:1000]}
            if event.reason:
                failure["reason"] = event.reason[:64]
            failures.setdefault(_failure_key(failure), failure)
            while len(failures) > RANK_FAILURES_KEPT:
                del failures[next(iter(failures))]

    new = replace(
        status,
        ranks=ranks.sorted(),
        progress=progress,
        result=result,
        checkpoint=checkpoint,
        output=output,
        timings=timings,
        probes=probes,
        rank_failures=list(failures.values())[-RANK_FAILURES_KEPT:],
        worker_restarts=restarts,
        worker_group_start=group_start,
    )
    spec = job.spec
    conditions = new.conditions
    verdict: str | None = None
    if saw_transport or status.transport:
        seen = transport_mod.transport_status(
            spec.network.transport, spec.network.require_efa, transports, spec.workers.world_size
        )
        new = replace(new, transport=seen.to_status())
        conditions = _apply(conditions, seen.condition, now=now, generation=job.generation)
        verdict = seen.failure_message if seen.fail else None
    unverified = _transport_unverified(job, new, transports, now=now, job_ended=job_ended) if not verdict else None
    if unverified:
        condition = {"type": ConditionType.TRANSPORT_VERIFIED, "status": "False", "reason": "Unverified"}
        conditions = _apply(conditions, {**condition, "message": unverified}, now=now, generation=job.generation)
    if saw_probe or status.interconnect:
        link = transport_mod.interconnect_status(_probe_events(new), spec.network.min_cross_node_gbps)
        new = replace(new, interconnect=link.to_status())
        conditions = _apply(conditions, link.condition, now=now, generation=job.generation)
    if forged or status.forged_events:
        total = status.forged_events + forged
        authentic = {"type": ConditionType.EVENTS_AUTHENTIC, "status": "False", "reason": "UnsignedLines"}
        message = (
            f"{total} event line(s) of this attempt failed the signature check (printed by other code than the "
            "bundled training function, or replayed); none was folded into this status"
        )
        conditions = _apply(conditions, {**authentic, "message": message}, now=now, generation=job.generation)
    skipped = status.skipped_events + rejected
    new = replace(new, conditions=conditions, skipped_events=skipped, forged_events=status.forged_events + forged)
    return Folded(new, verdict, rejected, unverified)


def _failure_key(failure: Mapping[str, Any]) -> tuple[Any, ...]:
    return (failure.get("rank"), failure.get("message"), failure.get("reason"))


def _finite(value: float, *, upper: float = math.inf) -> bool:
    """Within [0, upper], or NaN, or (with no finite upper bound) infinite: a zero-time step or a diverged run
    reports those honestly, and the status shows them as null. A negative number, or one past `upper`, no run
    produces."""
    return math.isnan(value) or 0 <= value <= upper


def _loss(value: float) -> bool:
    """Not negative (cross-entropy never is); NaN and infinities pass: a diverged run reports them."""
    return not (math.isfinite(value) and value < 0)


def _possible(event: Event, total_steps: int) -> bool:
    """Whether the event's numbers are ones a run of this job can produce (docs/reliability.md, "Threat model").

    Steps within the run (step <= totalSteps <= the most a spec may ask for), MFU a fraction, rates, times and
    losses not negative. NaN and infinities stay possible (a diverged loss, a zero-time step) and become null.
    """
    if isinstance(event, Step):
        return (
            1 <= event.step <= event.total_steps <= total_steps
            and _loss(event.loss)
            and _finite(event.tokens_per_second)
            and _finite(event.tokens_per_second_per_device)
            and (event.mfu is None or _finite(event.mfu, upper=1.0))
            and _finite(event.step_seconds)
            and event.samples_seen >= 0
        )
    if isinstance(event, Summary):
        return (
            event.steps <= total_steps
            and event.resumed_from_step <= total_steps
            and _loss(event.final_loss)
            and _loss(event.first_loss)
            and (event.eval_loss is None or _loss(event.eval_loss))
            and _finite(event.tokens_per_second)
            and (event.mfu is None or _finite(event.mfu, upper=1.0))
            and _finite(event.seconds)
        )
    if isinstance(event, Evaluation):
        return event.step <= total_steps and _loss(event.loss) and _finite(event.seconds)
    if isinstance(event, Export | Checkpoint):
        return event.step <= total_steps and _finite(event.seconds)
    if isinstance(event, Probe):
        return _finite(event.allreduce_busbw_gbps) and _finite(event.allgather_busbw_gbps)
    if isinstance(event, Timings):
        times = (event.to_first_step_seconds, event.startup_seconds, event.probe_seconds, event.build_seconds)
        return all(_finite(t) for t in (*times, event.first_step_seconds))
    return True


def _transport_unverified(
    job: Job, status: JobStatus, transports: list[Transport], *, now: datetime, job_ended: bool
) -> str | None:
    """`requireEFA` fails closed: the message when its deadline passed with a rank on no verified transport.

    The deadline: the Ray job's end, or `TRANSPORT_DEADLINE_SECONDS` after rank 0's first step. Verified is
    `efa`; `none` (intra-node peers only) counts only in a single-node job, where nothing crosses the network.
    """
    spec = job.spec
    if not spec.network.require_efa or spec.network.transport == "socket":
        return None
    first_step = parse_time(_text(status.progress.get("firstStepTime")))
    due = first_step is not None and (now - first_step).total_seconds() >= TRANSPORT_DEADLINE_SECONDS
    if not (job_ended or due):
        return None
    accepted = {"efa", "none"} if spec.workers.replicas == 1 else {"efa"}
    latest = {t.rank: t.transport for t in transports}
    missing = [r for r in range(spec.workers.world_size) if latest.get(r) not in accepted]
    if not missing:
        return None
    shown = ", ".join(map(str, missing[:8])) + (", ..." if len(missing) > 8 else "")
    when = "when the Ray job ended" if job_ended else f"{TRANSPORT_DEADLINE_SECONDS:.0f}s after the first step"
    return (
        f"EFA required but {len(missing)} of {spec.workers.world_size} ranks (rank {shown}) had reported no verified "
        f"EFA transport {when}"
    )


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def without_rank_detail(status: JobStatus) -> JobStatus:
    """The status without what the ranks reported one by one (for a write the API server refused): phase,
    reason, conditions, progress and the transport verdict stay."""
    kept = {k: v for k, v in status.transport.items() if k in ("requested", "summary", "fallbackRanks", "evidence")}
    return replace(status, ranks=[], transport=kept, probes=[], rank_failures=[])


def _moment(seconds: float) -> datetime | None:
    """A rank's Unix time as a whole-second moment, or None when no datetime holds it (read from a log)."""
    try:
        return datetime.fromtimestamp(int(seconds), UTC)
    except (ValueError, OverflowError, OSError):
        return None


def _fits_world(event: Event, world_size: int) -> bool:
    """Whether every rank the event names (its own, a placement's local and node rank) exists in the job."""
    if not 0 <= event.rank < world_size:
        return False
    if isinstance(event, Placement):
        return event.local_rank < world_size and event.node_rank < world_size
    # A probe's `ranks` is a measured group size, kept as reported (bounded by the parser): it makes no entries.
    return True


def _apply(
    conditions: list[Condition], condition: Mapping[str, str], *, now: datetime, generation: int
) -> list[Condition]:
    return set_condition(
        conditions,
        condition["type"],
        condition["status"],
        condition["reason"],
        condition["message"],
        now=now,
        generation=generation,
    )


# --- what to write ----------------------------------------------------------------------------------

# Fields that change with every training step; writes that only touch these are rate-limited.
PROGRESS_FIELDS = frozenset({"progress", "logOffset", "skippedEvents"})


def progress_only(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """True when `new` differs from `old` only in per-step fields (or not at all)."""
    keys = (set(old) | set(new)) - PROGRESS_FIELDS
    return all(old.get(k) == new.get(k) for k in keys)


def merge_patch(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """The RFC 7386 merge patch that turns `old` into `new` (null removes a key)."""
    patch: dict[str, Any] = {}
    for key in set(old) | set(new):
        if key not in new:
            patch[key] = None
        elif key not in old:
            patch[key] = copy.deepcopy(new[key])
        elif isinstance(old[key], Mapping) and isinstance(new[key], Mapping):
            inner = merge_patch(old[key], new[key])
            if inner:
                patch[key] = inner
        elif old[key] != new[key]:
            patch[key] = copy.deepcopy(new[key])
    return patch


# --- the size budget of one status ------------------------------------------------------------------------

STATUS_BUDGET_BASE = 16 * 1024
STATUS_BUDGET_PER_RANK = 2 * 1024
STATUS_BUDGET_MAX = 1024 * 1024
"""The whole object (spec and metadata too) must stay under etcd's 1.5 MiB; the status gets at most 1 MiB."""


def status_budget(ranks: int) -> int:
    """Bytes of JSON a status may take with `ranks` ranks reported: a base plus a few KiB per rank, capped."""
    return min(STATUS_BUDGET_BASE + STATUS_BUDGET_PER_RANK * max(ranks, 0), STATUS_BUDGET_MAX)


def _size(value: Any) -> int:
    # errors="replace": a lone surrogate (only a stored status can hold one now) counts as the byte it becomes.
    return len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode(errors="replace"))


def _cut(text: Any, limit: int) -> Any:
    if isinstance(text, str) and len(text) > limit:
        return text[: limit - len(TRUNCATED)] + TRUNCATED
    return text


def _visible(value: Any) -> Any:
    """A copy of `value` whose strings show their control and format characters as escapes.

    Messages carry text from outside (a rank's exception, a user's output, an API answer): a U+202E
    there would make `kubectl get` show a reason that reads backwards.
    """
    if isinstance(value, str):
        return formats.visible(value)
    if isinstance(value, dict):
        return {_visible(k): _visible(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_visible(item) for item in value]
    return value


def within_budget(status: Mapping[str, Any]) -> dict[str, Any]:
    """`status` (a `JobStatus.to_dict()`) cut to its size budget, with `truncated` saying what was cut.

    Messages are always cut to `MESSAGE_LIMIT`. Past the budget, per-rank detail goes first (NCCL evidence
    lines, host names, pod names, device UUIDs), then rank entries beyond the first N; the job-level
    verdicts (`transport.summary`, `transport.evidence`, conditions, progress, result) always stay.
    """
    out: dict[str, Any] = _visible(dict(status))
    out.pop("truncated", None)
    if "message" in out:
        out["message"] = _cut(out["message"], MESSAGE_LIMIT)
    out["conditions"] = [
        {**c, "message": _cut(c.get("message"), MESSAGE_LIMIT)} if "message" in c else c
        for c in out.get("conditions") or []
    ]
    if not out["conditions"]:
        del out["conditions"]
    stored_transport = out.get("transport")
    transport: dict[str, Any] = stored_transport if isinstance(stored_transport, dict) else {}
    ranks, transport_ranks = list(out.get("ranks") or []), list(transport.get("ranks") or [])
    budget = status_budget(max(len(ranks), len(transport_ranks)))
    if _size(out) <= budget:
        return out
    notes = []
    if any("evidence" in r for r in transport_ranks):
        transport_ranks = [{k: v for k, v in r.items() if k != "evidence"} for r in transport_ranks]
        notes.append("per-rank NCCL evidence (transport.evidence kept)")
    detail = ("hostname", "pod", "deviceUUID")
    if any(key in r for r in ranks for key in detail):
        ranks = [{k: v for k, v in r.items() if k not in detail} for r in ranks]
        notes.append("ranks[].hostname, pod and deviceUUID")
    shown = len(ranks), len(transport_ranks)
    while True:
        if transport:
            out["transport"] = {**transport, "ranks": transport_ranks}
        if ranks or "ranks" in out:
            out["ranks"] = ranks
        size = _size(out)
        if size <= budget or not (ranks or transport_ranks):
            break
        keep = max(int(max(len(ranks), len(transport_ranks)) * budget / size * 0.9), 0)
        ranks, transport_ranks = ranks[:keep], transport_ranks[:keep]
    if (len(ranks), len(transport_ranks)) != shown:
        notes.append(f"rank entries after the first {len(ranks)} of {shown[0]}")
    out["truncated"] = f"left out to stay within the {budget}-byte status budget: " + "; ".join(notes)
    return out
