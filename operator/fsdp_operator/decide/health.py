"""The ranks' health reports (`fsdp_train.contract.health_events`) folded into `status.health`, and the verdicts on
them.

Pure. `fold` keeps each rank's latest step figures and stall; `judge` names the stalled rank(s) and the
stragglers with their node, pod and GPU and sets the `Progressing` and `Straggler` conditions; `stall_to_act_on`
says when a stall is settled enough for `spec.health.onHang` (every rank reported, or a grace period passed).

Straggler statistics are medians, never one sample: each rank reports the median of its own step times over a
window of steps and the share of its sampled stacks inside a collective; its own work per step is
``stepSeconds * (1 - collectiveFraction)``, and it is a straggler when that is `stragglerRatio` times the median of
the other ranks' (and at least :data:`MIN_EXCESS_SECONDS` more: a 2 ms step twice as long is noise; a median
under :data:`OWN_SECONDS_RESOLUTION` counts as that much).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import replace
from datetime import datetime
from typing import Any

from fsdp_train.contract.health_events import SAMPLE_SECONDS, RankHealth, Stall

from fsdp_operator.api.spec import Job
from fsdp_operator.decide.status import ConditionType, JobStatus, Reason, format_time, parse_time, set_condition

RANKS_KEPT = 256
"""`status.health.ranks` keeps at most this many ranks: stalled and slow ones first, then by rank."""
STALL_GRACE_SECONDS = 20.0
"""After the first stall report, how long the operator waits for the other ranks' before acting on it (their
watchdogs fire within a sample of each other; their lines may come later). It acts at once when all reported."""
MIN_EXCESS_SECONDS = 0.05
"""A straggler's own work per step exceeds the others' median by at least this much."""
OWN_SECONDS_RESOLUTION = SAMPLE_SECONDS
"""Own work per step below this is under what the ranks' stack samples (one per ``SAMPLE_SECONDS``) resolve, and the
ratio divides by at least this: where every other rank waited its whole step (own work 0), a rank that did not is
still named, with a finite ratio."""
MIN_RANKS = 2
STACK_KEPT = 1024
HealthEvent = RankHealth | Stall


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else -1


def _round(value: float, digits: int = 4) -> float | None:
    return round(value, digits) if math.isfinite(value) else None


def fold(health: Mapping[str, Any], events: Iterable[HealthEvent], *, attempt: int, world_size: int) -> dict[str, Any]:
    """`health` with the events of the current attempt folded in (a new attempt starts over; `lastStall` stays)."""
    out = dict(health)
    if _int(out.get("attempt")) != attempt:
        out = {"attempt": attempt, **({"lastStall": health["lastStall"]} if "lastStall" in health else {})}
    ranks: dict[int, dict[str, Any]] = {}
    for entry in out.get("ranks") or []:
        if isinstance(entry, Mapping) and 0 <= _int(entry.get("rank")) < world_size:
            ranks[_int(entry["rank"])] = dict(entry)
    for event in events:
        if not 0 <= event.rank < world_size or not math.isfinite(event.time):
            continue
        entry = ranks.setdefault(event.rank, {"rank": event.rank})
        last = _num(entry.get("reportedAt"))
        if last is not None and event.time < last:
            continue  # an older line re-read (the rank's clock orders its own lines, a restarted group's too)
        # Exact, not rounded: the next line's time is compared with it (a report 0.3 ms after a stall, rounded up
        # to the millisecond, read as older and was dropped: the rank stayed stalled).
        entry["reportedAt"] = event.time
        if isinstance(event, RankHealth):
            _unstall(entry)  # a later report: the rank finished steps since (a restarted group starts lower)
            own = event.step_seconds * (1.0 - min(max(event.collective_fraction, 0.0), 1.0))
            entry.update(
                step=event.step,
                steps=event.steps,
                stepSeconds=_round(event.step_seconds),
                dataSeconds=_round(event.data_seconds),
                collectiveFraction=_round(event.collective_fraction, 3),
                ownSeconds=_round(own),
                timeoutSeconds=_round(event.hang_timeout_seconds, 1),
            )
        else:
            entry.update(
                state="Stalled",
                stalledAtStep=event.step,
                stalledSeconds=_round(event.seconds, 1),
                where=event.where,
                at=event.at,
                collective=event.collective,
                stack=event.stack[:STACK_KEPT],
            )
            entry["step"] = event.step
    out["ranks"] = [ranks[r] for r in sorted(ranks)]
    return out


def _unstall(entry: dict[str, Any]) -> None:
    for key in ("state", "stalledAtStep", "stalledSeconds", "where", "at", "collective", "stack"):
        entry.pop(key, None)


def _placement(status: JobStatus) -> dict[int, Mapping[str, Any]]:
    return {_int(r.get("rank")): r for r in status.ranks if isinstance(r, Mapping)}


def where_runs(rank: int, placed: Mapping[int, Mapping[str, Any]]) -> dict[str, Any]:
    """Node, pod and GPU of `rank` from its placement report (what is known of them)."""
    p = placed.get(rank) or {}
    device = str(p.get("device") or "")
    gpu = f"{device} (local rank {p.get('localRank')})" if device and device != "cpu" else device
    if p.get("deviceUUID"):
        gpu = f"{gpu} {p['deviceUUID']}"
    found = {"node": p.get("nodeIP") or p.get("hostname"), "pod": p.get("pod") or p.get("hostname"), "gpu": gpu}
    return {k: v for k, v in found.items() if v}


def _named(rank: int, placed: Mapping[int, Mapping[str, Any]]) -> str:
    at = where_runs(rank, placed)
    detail = ", ".join(f"{k} {v}" for k, v in at.items())
    return f"rank {rank}" + (f" ({detail})" if detail else "")


def _ranks_text(ranks: list[int]) -> str:
    shown = ", ".join(str(r) for r in ranks[:8])
    return f"rank{'s' if len(ranks) > 1 else ''} {shown}" + (f" and {len(ranks) - 8} more" if len(ranks) > 8 else "")


def stalled(health: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [dict(r) for r in health.get("ranks") or [] if isinstance(r, Mapping) and r.get("state") == "Stalled"]


def stall_suspects(health: Mapping[str, Any], world_size: int) -> list[int]:
    """Who holds the others up: stalled ranks in code (not waiting in a collective); else ranks that reported no
    stall while the others wait in collectives (a rank too stuck to report); else every stalled rank."""
    stuck = stalled(health)
    in_code = [r["rank"] for r in stuck if r.get("where") != "collective"]
    if in_code:
        return in_code
    reported = {r["rank"] for r in stuck}
    silent = [r for r in range(world_size) if r not in reported]
    return silent or sorted(reported)


def stall_message(health: Mapping[str, Any], placed: Mapping[int, Mapping[str, Any]], world_size: int) -> str:
    stuck = {r["rank"]: r for r in stalled(health)}
    suspects = stall_suspects(health, world_size)
    parts = []
    for rank in suspects[:4]:
        entry = stuck.get(rank)
        if entry is None:
            parts.append(f"{_named(rank, placed)} reported nothing (alive but silent, or gone)")
            continue
        where = (
            f"waiting in {entry.get('collective') or 'a collective'} at {entry.get('at')}"
            if entry.get("where") == "collective"
            else f"in code at {entry.get('at')}"
        )
        parts.append(
            f"{_named(rank, placed)} made no progress for {entry.get('stalledSeconds')}s after step "
            f"{entry.get('stalledAtStep')}: {where}"
        )
    waiting: dict[str, list[int]] = {}
    for rank, entry in sorted(stuck.items()):
        if rank not in suspects and entry.get("where") == "collective":
            waiting.setdefault(str(entry.get("collective") or "a collective"), []).append(rank)
    for collective, ranks in list(waiting.items())[:3]:
        parts.append(f"{_ranks_text(ranks)} wait in {collective}")
    return "; ".join(parts)


def _stragglers(health: Mapping[str, Any], ratio: float) -> list[tuple[int, float, float, float]]:
    """(rank, ratio, own seconds, the others' median) of each straggler, slowest first."""
    own = {
        _int(r.get("rank")): v
        for r in health.get("ranks") or []
        if isinstance(r, Mapping) and (v := _num(r.get("ownSeconds"))) is not None and r.get("state") != "Stalled"
    }
    found = []
    if len(own) < MIN_RANKS:
        return []
    for rank, mine in own.items():
        others = statistics.median([v for r, v in own.items() if r != rank])
        times = mine / max(others, OWN_SECONDS_RESOLUTION)
        if times >= ratio and mine - others >= MIN_EXCESS_SECONDS:
            found.append((rank, times, mine, others))
    return sorted(found, key=lambda f: -f[1])


def judge(job: Job, status: JobStatus, *, now: datetime) -> JobStatus:
    """Suspects, ratios and the `Progressing` and `Straggler` conditions from `status.health` (each turning bad posts
    a Warning Event: `reconcile._with_transition_events`)."""
    health = dict(status.health)
    if not health.get("ranks"):
        return status
    world = job.spec.workers.world_size
    placed = _placement(status)
    conditions = status.conditions
    gen = job.generation
    suspects: list[dict[str, Any]] = []
    if stalled(health):
        health.setdefault("stalledSince", format_time(now))
        message = stall_message(health, placed, world)
        conditions = set_condition(
            conditions, ConditionType.PROGRESSING, "False", Reason.RANK_STALLED, message[:1024], now=now, generation=gen
        )
        for rank in stall_suspects(health, world):
            suspects.append({"rank": rank, "reason": Reason.RANK_STALLED.value, **where_runs(rank, placed)})
    else:
        health.pop("stalledSince", None)
        conditions = set_condition(
            conditions, ConditionType.PROGRESSING, "True", "RanksProgressing", "every rank reports steps",
            now=now, generation=gen,
        )  # fmt: skip
    slow = _stragglers(health, job.spec.health.straggler_ratio)
    ratios = {rank: r for rank, r, _, _ in slow}
    for entry in health["ranks"]:
        entry.pop("ratio", None)
        if entry.get("rank") in ratios:
            entry["ratio"] = _round(ratios[entry["rank"]], 2)
            entry.setdefault("state", "Straggler")
        elif entry.get("state") == "Straggler":
            entry.pop("state")
    if slow:
        rank, ratio, mine, others = slow[0]
        floor = OWN_SECONDS_RESOLUTION
        counted = f" (counted as {floor:g}s, what the samples resolve)" if others < floor else ""
        message = (
            f"{_named(rank, placed)} is a straggler: its own work per step is {mine:.3f}s, {ratio:.2f}x the other "
            f"ranks' median {others:.3f}s{counted} (stragglerRatio {job.spec.health.straggler_ratio:g})"
        )
        if len(slow) > 1:
            message += f"; also {_ranks_text([s[0] for s in slow[1:]])}"
        conditions = set_condition(
            conditions, ConditionType.STRAGGLER, "True", "SlowRank", message[:1024], now=now, generation=gen
        )
        for rank, ratio, _, _ in slow:
            suspects.append({"rank": rank, "reason": "SlowRank", "ratio": _round(ratio, 2), **where_runs(rank, placed)})
    elif sum(1 for r in health["ranks"] if "ownSeconds" in r) >= MIN_RANKS:
        conditions = set_condition(
            conditions, ConditionType.STRAGGLER, "False", "NoStraggler", "no rank is slower than the others",
            now=now, generation=gen,
        )  # fmt: skip
    named = {s["rank"] for s in suspects[:16]}
    for entry in health["ranks"]:
        if entry.get("rank") not in named:
            entry.pop("stack", None)  # a stack per suspect: a few KiB whatever the world size
    health["suspects"] = suspects[:16]
    if not suspects:
        health.pop("suspects")
    keep = sorted(health["ranks"], key=lambda r: ("state" not in r, _int(r.get("rank"))))[:RANKS_KEPT]
    health["ranks"] = sorted(keep, key=lambda r: _int(r.get("rank")))
    return replace(status, health=health, conditions=conditions)


def stall_to_act_on(job: Job, status: JobStatus, *, now: datetime) -> str | None:
    """The stall's message once it is settled: every rank reported its stall, or :data:`STALL_GRACE_SECONDS`
    passed since the first report was read. None while no rank is stalled, or still within the grace."""
    health = status.health
    stuck = stalled(health)
    if not stuck:
        return None
    world = job.spec.workers.world_size
    since = parse_time(health.get("stalledSince")) if isinstance(health.get("stalledSince"), str) else None
    waited = (now - since).total_seconds() if since is not None else 0.0
    if len(stuck) < world and waited < STALL_GRACE_SECONDS:
        return None
    return stall_message(health, _placement(status), world) or "a rank made no progress"


def with_last_stall(status: JobStatus, message: str, now: datetime) -> JobStatus:
    """`status.health.lastStall`: the evidence of this stall, kept through the next attempt."""
    health = dict(status.health)
    health["lastStall"] = {
        "time": format_time(now),
        "attempt": status.attempts,
        "message": message[:1024],
        "suspects": health.get("suspects", []),
        "ranks": [
            {k: r[k] for k in ("rank", "stalledAtStep", "stalledSeconds", "where", "at", "collective") if k in r}
            for r in stalled(health)[:64]
        ],
    }
    return replace(status, health=health)
