"""What was found where, and the ranking of zones: the plan `check()` returns. Pure, no boto3."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any, Literal, Protocol

ProbeOutcome = Literal["reserved", "no-capacity", "quota", "unsupported", "error", "skipped"]


@dataclass(frozen=True, slots=True)
class Request:
    instance_type: str
    count: int
    vcpus_per_instance: int

    @property
    def vcpus(self) -> int:
        return self.count * self.vcpus_per_instance


def number(value: float) -> str:
    """A vCPU count as a user types it: 1536, never 1.536e+03 (`:g` keeps only six digits)."""
    return str(int(value)) if float(value).is_integer() else repr(float(value))


@dataclass(frozen=True, slots=True)
class QuotaIncrease:
    """The exact `aws service-quotas request-service-quota-increase` call that would make room."""

    region: str
    quota_code: str
    desired_value: float

    @property
    def command(self) -> str:
        return (
            f"aws service-quotas request-service-quota-increase --region {self.region} --service-code ec2 "
            f"--quota-code {self.quota_code} --desired-value {number(self.desired_value)}"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "region": self.region,
            "ServiceCode": "ec2",
            "QuotaCode": self.quota_code,
            "DesiredValue": self.desired_value,
            "command": self.command,
        }


@dataclass(frozen=True, slots=True)
class Quota:
    code: str
    name: str
    value: float | None = None
    """The account's quota in vCPUs; None when it could not be read."""
    used: int | None = None
    """vCPUs of running and pending instances that count against it; None when they could not be listed."""
    error: str = ""

    @property
    def free(self) -> float | None:
        return None if self.value is None or self.used is None else self.value - self.used

    def enough_for(self, vcpus: int) -> bool | None:
        free = self.free
        return None if free is None else free >= vcpus

    def increase_for(self, region: str, vcpus: int) -> QuotaIncrease | None:
        if self.value is None or self.used is None or self.enough_for(vcpus):
            return None
        return QuotaIncrease(region, self.code, float(self.used + vcpus))


@dataclass(frozen=True, slots=True)
class Probe:
    outcome: ProbeOutcome
    message: str = ""
    leftover_reservation: str = ""
    """A reservation that could not be cancelled (never empty-handed: the message says how to cancel it)."""


@dataclass(frozen=True, slots=True)
class Zone:
    name: str
    zone_id: str = ""
    offered: bool = False
    spot_score: int | None = None
    probe: Probe | None = None


@dataclass(frozen=True, slots=True)
class Region:
    name: str
    zones: tuple[Zone, ...] = ()
    quota: Quota | None = None
    error: str = ""
    """Why the region could not be checked at all (then `zones` is empty)."""
    notes: tuple[str, ...] = ()
    """Parts that could not be checked (Spot placement scores), each a sentence."""


@dataclass(frozen=True, slots=True)
class Plan:
    request: Request
    regions: tuple[Region, ...]
    probed: bool


@dataclass(frozen=True, slots=True)
class Ranked:
    rank: int
    region: str
    zone: Zone
    quota: Quota | None
    usable: bool
    """Offered, no quota shortage known, and not refused by a probe: worth trying."""
    why: str


_PROBE_ORDER: dict[ProbeOutcome | None, int] = {
    "reserved": 0,
    None: 1,
    "skipped": 1,
    "error": 1,
    "quota": 2,
    "unsupported": 3,
    "no-capacity": 3,
}


def _why(zone: Zone, quota: Quota | None, request: Request) -> str:
    parts: list[str] = []
    if not zone.offered:
        return f"{request.instance_type} is not offered in this zone"
    if zone.probe is not None:
        parts.append(
            {
                "reserved": f"probe: capacity for {request.count} confirmed",
                "no-capacity": f"probe: no capacity for {request.count} ({zone.probe.message})",
                "quota": f"probe: refused by the quota ({zone.probe.message})",
                "unsupported": f"probe: refused ({zone.probe.message})",
                "error": f"probe failed ({zone.probe.message})",
                "skipped": "probe skipped (interrupted)",
            }[zone.probe.outcome]
        )
        if zone.probe.leftover_reservation:
            parts.append(zone.probe.message)
    if quota is None:
        parts.append("no vCPU quota known for this family")
    elif quota.error:
        parts.append("quota unknown (the region's note says why)")
    elif quota.free is not None:
        enough = quota.enough_for(request.vcpus)
        relation = ">=" if enough else "<"
        parts.append(f"quota: {number(quota.free)} vCPUs free {relation} {request.vcpus} needed")
    if zone.spot_score is not None:
        parts.append(f"Spot placement score {zone.spot_score}/10")
    else:
        parts.append("no Spot placement score")
    return "; ".join(parts)


def rank(plan: Plan) -> list[Ranked]:
    """Zones best first: offered; then what a probe said (reserved, not probed, over quota, no capacity); then
    quota room (enough, unknown, short); then the Spot placement score, higher first; then the order of the
    regions as given, and the zone name. Regions that could not be checked have no zones here."""
    request = plan.request
    entries: list[tuple[tuple[Any, ...], Ranked]] = []
    for region_index, region in enumerate(plan.regions):
        quota = region.quota
        enough = quota.enough_for(request.vcpus) if quota is not None else None
        quota_order = {True: 0, None: 1, False: 2}[enough]
        for zone in region.zones:
            outcome = zone.probe.outcome if zone.probe else None
            usable = zone.offered and enough is not False and outcome in (None, "reserved", "skipped", "error")
            key = (
                0 if zone.offered else 1,
                _PROBE_ORDER[outcome],
                quota_order,
                -(zone.spot_score or 0),
                region_index,
                zone.name,
            )
            entries.append((key, Ranked(0, region.name, zone, quota, usable, _why(zone, quota, request))))
    entries.sort(key=lambda item: item[0])
    return [replace(entry, rank=i + 1) for i, (_, entry) in enumerate(entries)]


def increases(plan: Plan) -> list[QuotaIncrease]:
    """The quota increases that would let the request run, one per region that offers the type and is short."""
    result = []
    for region in plan.regions:
        if region.quota is None or not any(z.offered for z in region.zones):
            continue
        wanted = region.quota.increase_for(region.name, plan.request.vcpus)
        if wanted is not None:
            result.append(wanted)
    return result


def leftovers(plan: Plan) -> list[str]:
    """Reservations a probe could not cancel, as the sentences that say how to."""
    return [z.probe.message for r in plan.regions for z in r.zones if z.probe and z.probe.leftover_reservation]


def to_json(plan: Plan) -> dict[str, Any]:
    ranked = rank(plan)
    return {
        "instanceType": plan.request.instance_type,
        "count": plan.request.count,
        "vcpusNeeded": plan.request.vcpus,
        "probed": plan.probed,
        "ranking": [
            {
                "rank": r.rank,
                "region": r.region,
                "zone": r.zone.name,
                "zoneId": r.zone.zone_id,
                "offered": r.zone.offered,
                "usable": r.usable,
                "spotScore": r.zone.spot_score,
                "probe": asdict(r.zone.probe) if r.zone.probe else None,
                "why": r.why,
            }
            for r in ranked
        ],
        "regions": [
            {
                "region": region.name,
                "error": region.error or None,
                "notes": list(region.notes),
                "quota": _quota_json(region.quota, region.name, plan.request.vcpus),
            }
            for region in plan.regions
        ],
        "quotaIncreases": [q.to_dict() for q in increases(plan)],
        "leftoverReservations": leftovers(plan),
    }


def _quota_json(quota: Quota | None, region: str, vcpus: int) -> dict[str, Any] | None:
    if quota is None:
        return None
    return {
        "code": quota.code,
        "name": quota.name,
        "value": quota.value,
        "used": quota.used,
        "free": quota.free,
        "enough": quota.enough_for(vcpus),
        "error": quota.error or None,
    }


@dataclass(frozen=True, slots=True)
class ZoneChoice:
    zone: str
    """The chosen zone; empty when none could be chosen (then `reason` says why)."""
    reason: str


class ZoneAdvisor(Protocol):
    """What the operator asks of AWS for `placement.availabilityZone: auto`."""

    async def choose(self, instance_type: str, count: int, zones: Sequence[str]) -> ZoneChoice:
        """The best of `zones` (all of the region's when empty) for `count` instances, and why."""
        ...


def choose_zone(plan: Plan, zones: Sequence[str]) -> ZoneChoice:
    """The best usable zone of the plan among `zones` (all when empty), with the reasons; none when no zone fits."""
    allowed = set(zones)
    candidates = [r for r in rank(plan) if r.usable and (not allowed or r.zone.name in allowed)]
    where = f"among the zones with nodes of the type ({', '.join(sorted(allowed))})" if allowed else "in the region"
    if not candidates:
        region = plan.regions[0] if plan.regions else None
        why = region.error if region is not None and region.error else f"no usable zone {where}"
        return ZoneChoice("", f"no zone for {plan.request.count}x {plan.request.instance_type}: {why}")
    best = candidates[0]
    return ZoneChoice(best.zone.name, f"best of {len(candidates)} usable zone(s) {where}: {best.why}")
