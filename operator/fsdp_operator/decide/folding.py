"""Folding the ranks' structured events (`fsdp_train.contract.events`) into the job's status. Pure."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, get_args

from fsdp_train.contract.events import (
    MAX_COUNT,
    Checkpoint,
    Evaluation,
    Event,
    Export,
    Failure,
    Interruption,
    Placement,
    Probe,
    Step,
    Summary,
    Timings,
    Tracking,
    Transport,
    TransportName,
)

from fsdp_operator.api.spec import Job
from fsdp_operator.api.training_spec import MAX_STEPS
from fsdp_operator.decide import health as health_mod
from fsdp_operator.decide import interruptions as interruptions_mod
from fsdp_operator.decide import tracking as tracking_mod
from fsdp_operator.decide import transport as transport_mod
from fsdp_operator.decide.status import (
    RANK_FAILURES_KEPT,
    TRANSPORT_DEADLINE_SECONDS,
    Condition,
    ConditionType,
    JobStatus,
    _failure_key,
    _text,
    format_time,
    parse_time,
    set_condition,
)


def _round(value: float | None, digits: int = 4) -> float | None:
    """Rounded for the status; None for NaN and infinities, which JSON (and so the API server) cannot carry."""
    return round(float(value), digits) if value is not None and math.isfinite(value) else None


def _whole(value: float | None) -> int | None:
    """A count for an integer-typed printer column; None when unknown or not finite (a diverged or zero-time
    step) or beyond what a JSON reader holds exactly (the API server refuses integers past int64)."""
    return round(value) if value is not None and math.isfinite(value) and abs(value) <= MAX_COUNT else None


def _known(figures: dict[str, Any]) -> dict[str, Any]:
    """`figures` without the unknown ones: an absent figure is left out, never shown as 0 or null."""
    return {key: value for key, value in figures.items() if value is not None}


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
    tracking, tracker_problem = dict(status.tracking), None
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
    interrupted = status.interruptions
    health_events: list[health_mod.HealthEvent] = []

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
                # A user function that does not report its total: 0, no total shown (docs/byo-function.md).
                **({"totalSteps": event.total_steps} if event.total_steps else {}),
                "stepOfTotal": f"{event.step}/{event.total_steps}" if event.total_steps else str(event.step),
                # Unknown figures (a user function that reports no rate, a diverged loss) are left out.
                **_known(
                    {
                        "loss": _round(event.loss),
                        # An integer: the printer column is typed integer.
                        "tokensPerSecond": _whole(event.tokens_per_second),
                        "tokensPerSecondPerDevice": _whole(event.tokens_per_second_per_device),
                    }
                ),
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
            elif event.tokens_seen:  # a user function that reports the tokens it trained on
                progress["tokensSeen"] = event.tokens_seen
            if event.extra:  # a user function's other metrics (bounded by the event parser)
                progress["metrics"] = _known({name: _round(value) for name, value in sorted(event.extra.items())})
            progress.update(evaluation)
            if first_step:
                progress["firstStepTime"] = first_step
        elif isinstance(event, Evaluation):
            if event.step >= _int(progress.get("evalStep")) and _round(event.loss) is not None:
                progress.update(evalLoss=_round(event.loss), evalStep=event.step)
        elif isinstance(event, Export):
            if output and event.step < _int(output.get("step")):
                continue  # status only moves forward: an older export (a replayed line, after a restart too)
            output = {"path": event.path, "step": event.step, "seconds": _round(event.seconds, 2)}
            if event.verified or event.check or event.training_loss is not None:  # the export self-check ran
                output.update(verified=event.verified, trainingLoss=_round(event.training_loss))
                output["exportLoss"] = _round(event.export_loss)
                if event.check:
                    output["check"] = event.check
        elif isinstance(event, Checkpoint):
            if checkpoint and event.step < _int(checkpoint.get("step")):
                continue  # status only moves forward: an older checkpoint's record (a replayed line) changes nothing
            checkpoint = {"step": event.step, "path": event.path, "seconds": _round(event.seconds, 2)}
            if event.resumed:  # resumed from, not written: a rerun with the same settings continues the run
                checkpoint["resumed"] = True
                if "step" not in progress:
                    # Where the rerun stands before a step of its own (a finished run's rerun trains none).
                    total = job.spec.training.steps if job.spec.train_function is None else 0
                    progress.update(
                        step=event.step,
                        stepOfTotal=f"{event.step}/{total}" if total else str(event.step),
                        **({"totalSteps": total} if total else {}),
                    )
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
            # The run's first loss, not this attempt's, when it resumed: the curve spans every attempt.
            curve = progress.get("lossHistory") or []
            first_loss = event.first_loss
            if (
                event.resumed_from_step
                and curve
                and isinstance(curve[0], list)
                and curve[0][0] <= event.resumed_from_step
            ):
                first_loss = curve[0][1]
            result = {
                "steps": event.steps,
                # A rerun of a finished run trains no step: no losses, no rate (absent, not NaN or 0).
                **_known(
                    {
                        "firstLoss": _round(first_loss),
                        "finalLoss": _round(event.final_loss),
                        "tokensPerSecond": _whole(event.tokens_per_second),
                    }
                ),
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
        elif isinstance(event, health_mod.HealthEvent):
            health_events.append(event)
        elif isinstance(event, Tracking):
            tracking = tracking_mod.fold(tracking, event)
            tracker_problem = event.problem
        elif isinstance(event, Failure):
            failure = {"rank": event.rank, "message": event.message[:1000]}
            if event.reason:
                failure["reason"] = event.reason[:64]
            failures.setdefault(_failure_key(failure), failure)
            while len(failures) > RANK_FAILURES_KEPT:
                del failures[next(iter(failures))]
        elif isinstance(event, Interruption):
            interrupted = interruptions_mod.folded(interrupted, event, status.attempts, total_steps)

    new = replace(
        status,
        ranks=ranks.sorted(),
        progress=progress,
        result=result,
        checkpoint=checkpoint,
        output=output,
        timings=timings,
        tracking=tracking,
        probes=probes,
        rank_failures=list(failures.values())[-RANK_FAILURES_KEPT:],
        worker_restarts=restarts,
        worker_group_start=group_start,
        interruptions=interrupted,
        health=health_mod.fold(status.health, health_events, attempt=status.attempts, world_size=world_size)
        if health_events or status.health
        else {},
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
    if tracker_problem is not None:
        conditions = _apply(conditions, tracking_mod.condition(tracker_problem), now=now, generation=job.generation)
    skipped = status.skipped_events + rejected
    new = replace(new, conditions=conditions, skipped_events=skipped, forged_events=status.forged_events + forged)
    return Folded(new, verdict, rejected, unverified)


def _finite(value: float | None, *, upper: float = math.inf) -> bool:
    """Within [0, upper], or NaN, or (with no finite upper bound) infinite: a zero-time step or a diverged run
    reports those honestly, and the status shows them as null. A negative number, or one past `upper`, no run
    produces. None: not known."""
    return value is None or math.isnan(value) or 0 <= value <= upper


def _loss(value: float | None) -> bool:
    """Not negative (cross-entropy never is); NaN and infinities pass: a diverged run reports them. None: not
    known."""
    return value is None or not (math.isfinite(value) and value < 0)


def _possible(event: Event, total_steps: int) -> bool:
    """Whether the event's numbers are ones a run of this job can produce (docs/reliability.md, "Threat model").

    Steps within the run (step <= totalSteps <= the most a spec may ask for), MFU a fraction, rates, times and
    losses not negative. NaN and infinities stay possible (a diverged loss, a zero-time step) and become null.
    """
    if isinstance(event, Step):
        return (
            1 <= event.step <= (event.total_steps or total_steps)  # 0: a user function's total, unknown
            and event.total_steps <= total_steps
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
