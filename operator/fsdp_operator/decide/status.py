"""FSDPTrainingJob.status: phases, the closed reason enum, conditions, and the `JobStatus` they make up.

Pure data and pure functions. `reconcile.py` decides transitions; this module owns the shape that
`kubectl get trainingjobs` reads (the printer columns of `schema.PRINTER_COLUMNS`); `folding.py` turns the
training function's structured events (`fsdp_train.contract.events`) into `ranks[]`, `progress`, `result`,
`transport` and `interconnect`, and `budget.py` bounds what one write holds.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from fsdp_operator.api import formats
from fsdp_operator.decide import transport as transport_mod


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
    QUEUED = "Queued"
    """`queueName`: the RayCluster exists, suspended, until Kueue admits it (Kueue's own reason in `message`)."""
    PREEMPTED = "Preempted"
    """Kueue suspended the admitted RayCluster (preemption, eviction): the Ray job is stopped; Queued again next."""


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
    QUEUED = "Queued"
    """Waiting for Kueue to admit the RayCluster; the message carries the Workload's own condition."""
    QUEUE_UNAVAILABLE = "QueueUnavailable"
    """Kueue's Workloads cannot be read (Kueue not installed, or the operator may not read them)."""
    ADMITTED = "Admitted"
    PREEMPTED = "Preempted"
    """Kueue evicted the admitted RayCluster (preempted, or another eviction reason, named in the message)."""
    INTERRUPTED = "Interrupted"
    """A worker's node went away (a drain, a Spot interruption): the ranks saved and the next attempt resumes."""
    RANK_STALLED = "RankStalled"
    """A rank made no progress for spec.health's hang timeout (status.health says which, and where each rank was)."""


# Reasons posted as Warning events (everything in phase Failed is a Warning too). Waiting for workers
# is the normal start of every job and posts Normal events; a pod the scheduler cannot place is a Warning,
# as the scheduler's own FailedScheduling event is.
WARNING_REASONS = frozenset(
    {
        Reason.UNSCHEDULABLE,
        Reason.CREATE_REFUSED,
        Reason.RAY_UNREACHABLE,
        Reason.RETRYING,
        Reason.QUEUE_UNAVAILABLE,
        Reason.PREEMPTED,
    }
)


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
    PROGRESSING = "Progressing"
    STRAGGLER = "Straggler"
    """False once an event line of the current attempt failed the signature check (docs/reliability.md)."""
    TRACKING_HEALTHY = "TrackingHealthy"
    RECONCILING = "Reconciling"  # kstatus's and Flux's (`decide/lifecycle.py`)
    STALLED = "Stalled"
    READY = "Ready"


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
    warning_when_true: bool = False
    """Turning True posts a Warning event (a condition that names a problem when True: `Straggler`)."""
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
        Reason.RANK_STALLED,
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
            {
                "AllWorkersJoined",
                Reason.WORKERS_NOT_READY,
                Reason.UNSCHEDULABLE,
                Reason.CREATE_REFUSED,
                "Suspended",
                Reason.PREEMPTED,
            }
        ),
        resets_on_new_attempt=False,  # a retry reuses the RayCluster and re-checks it
        warning_when_false=False,  # False while provisioning is the normal start
        doc="Every worker pod is ready and joined Ray with its GPUs.",
    ),
    ConditionType.JOB_SUBMITTED: ConditionRule(
        reasons=frozenset({"Accepted", "Suspended", Reason.PREEMPTED, Reason.INTERRUPTED}) | _FAILURE_REASONS,
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
    ConditionType.PROGRESSING: ConditionRule(
        reasons=frozenset({"RanksProgressing", Reason.RANK_STALLED}),
        resets_on_new_attempt=True,
        warning_when_false=True,
        doc="Every rank finishes steps; False (RankStalled): a rank made no progress for spec.health's hang "
        "timeout, and status.health says which rank, on which node, and where each rank was (docs/health.md).",
    ),
    ConditionType.STRAGGLER: ConditionRule(
        reasons=frozenset({"NoStraggler", "SlowRank"}),
        resets_on_new_attempt=True,
        warning_when_false=False,
        warning_when_true=True,
        doc="True (SlowRank): a rank's own work per step is spec.health.stragglerRatio times the median or more.",
    ),
    ConditionType.TRACKING_HEALTHY: ConditionRule(
        reasons=frozenset({"Logging", "TrackerUnreachable"}),
        resets_on_new_attempt=True,
        warning_when_false=True,  # never a failed job: training goes on without the records (docs/tracking.md)
        doc="spec.tracking: the run's records reach the tracker; False: some did not, and the message says why.",
    ),
    # What GitOps tools read (docs/gitops.md), derived from the phase alone by `lifecycle.kstatus_conditions`.
    ConditionType.RECONCILING: ConditionRule(
        reasons=frozenset(Reason),
        resets_on_new_attempt=False,
        warning_when_false=False,
        doc="kstatus: True while the job is on its way (Pending, Provisioning, Submitting, Running, Queued, "
        "Preempted, Suspended), with the phase's reason and message (kstatus reads InProgress); False once it ended.",
    ),
    ConditionType.STALLED: ConditionRule(
        reasons=frozenset(Reason),
        resets_on_new_attempt=False,
        warning_when_false=False,  # the Failed phase's event says it
        doc="kstatus: True once the job Failed, with the failure's reason and one-line message (kstatus reads "
        "Failed); False otherwise.",
    ),
    ConditionType.READY: ConditionRule(
        reasons=frozenset(Reason),
        resets_on_new_attempt=False,
        warning_when_false=False,
        doc="True once the job Succeeded (Flux's sense of Ready); False, with the phase's reason, before and on "
        "failure.",
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
    tracking: dict[str, Any] = field(default_factory=dict)
    """spec.tracking: the MLflow run (runId, url) of the job's current generation."""
    rank_failures: list[dict[str, Any]] = field(default_factory=list)
    failure_log: str = ""
    """The end of a failed Ray job's output (Ray's "last available logs"): the detail behind a one-line `message`."""
    worker_restarts: int = 0
    """Ray Train restarts of the worker group within this attempt (rank 0 started again)."""
    worker_group_start: datetime | None = None
    """When rank 0 of the current worker group reported its placement (second precision)."""
    queued_since: datetime | None = None
    """When the current wait in Kueue's queue began (phase Queued); None when not waiting."""
    interruptions: list[dict[str, Any]] = field(default_factory=list)
    """Notices that a worker's node goes away, as the ranks reported them (`decide/interruptions.py`); kept across
    attempts."""
    queue: dict[str, Any] = field(default_factory=dict)
    """`queueName`: the LocalQueue, the Workload, the ClusterQueue that admitted it, seconds queued in all, and how
    often it was admitted and preempted (`decide/queue.py`)."""
    health: dict[str, Any] = field(default_factory=dict)
    """The ranks' step timings, stalls and stragglers (`decide/health.py`); `lastStall` outlives the attempt."""

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
            "tracking": self.tracking,
            "rankFailures": self.rank_failures,
            "failureLog": self.failure_log,
            "workerRestarts": self.worker_restarts,
            "workerGroupStartTime": format_time(self.worker_group_start) if self.worker_group_start else None,
            "queuedSince": format_time(self.queued_since) if self.queued_since else None,
            "queue": self.queue,
            "interruptions": self.interruptions,
            "health": self.health,
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
            tracking=mapping("tracking"),
            rank_failures=listing("rankFailures"),
            failure_log=str(raw.get("failureLog") or ""),
            worker_restarts=integer("workerRestarts"),
            worker_group_start=parse_time(raw.get("workerGroupStartTime")),
            queued_since=parse_time(raw.get("queuedSince")),
            queue=mapping("queue"),
            interruptions=listing("interruptions"),
            health=mapping("health"),
        )


def _resets(type_: str) -> bool:
    rule = CONDITIONS.get(ConditionType(type_)) if type_ in ConditionType._value2member_map_ else None
    return rule is None or rule.resets_on_new_attempt


def cleared_run_data(status: JobStatus) -> JobStatus:
    """The status without anything a previous attempt's ranks reported but the loss curve, which spans the run."""
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
        progress={k: v for k, v in status.progress.items() if k == "lossHistory"},
        transport={},
        interconnect={},
        probes=[],
        result={},
        checkpoint={},
        output={},
        rank_failures=[],
        failure_log="",
        worker_restarts=0,
        worker_group_start=None,
    )


# --- folding the training function's events -------------------------------------------------------------


RANK_FAILURES_KEPT = 16
"""`status.rankFailures` keeps the newest this many distinct failures."""
TRANSPORT_DEADLINE_SECONDS = 60.0
"""`requireEFA`: every rank must have reported a verified transport this long after the operator read rank 0's
first step (or when the Ray job ends, whichever is first). Each rank reports it before its first collective of
training, so only log delivery from other nodes stands between; docs/reliability.md."""


def _failure_key(failure: Mapping[str, Any]) -> tuple[Any, ...]:
    return (failure.get("rank"), failure.get("message"), failure.get("reason"))


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


# --- what to write ----------------------------------------------------------------------------------


# --- the size budget of one status ------------------------------------------------------------------------


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
