"""Where an instance type can run now: offers, On-Demand quota, Spot placement scores, optional probes (boto3).

`check(...)` looks at every region concurrently and returns a `Plan`; `rank(plan)` orders its zones,
best first, each with the reasons; `fsdpctl capacity` (`cli.py`) prints that as a table or JSON, and
the operator's `availabilityZone: auto` asks the same code through `ZoneAdvisor`.

Per region: the zones that offer the type (`DescribeInstanceTypeOfferings`); the Service Quotas entry
the type counts against (G and VT: `L-DB2E81BA`, P: `L-417A185B`, in vCPUs) minus the vCPUs of the
running and pending instances that count against it; the Spot placement score per zone, a capacity
signal (single-AZ, for `count` instances); with `probe`, a targeted On-Demand Capacity Reservation
for `count` instances per zone, created and cancelled at once: the only definitive answer EC2 gives.
A reservation is billed from creation to cancellation (seconds here) and is cancelled on every path:
a rejection creates none, an error or Ctrl-C after the request was sent finds it by its tag.

Every AWS error becomes a sentence in the region's or zone's row, never a traceback; only missing
credentials end the whole check (`NoCredentials`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import uuid
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

from fsdp_train.contract import catalog

from fsdp_operator.capacity.plan import (
    Plan,
    Probe,
    ProbeOutcome,
    Quota,
    Region,
    Request,
    Zone,
    ZoneChoice,
    choose_zone,
    leftovers,
)

log = logging.getLogger(__name__)

Client = Any
"""A boto3 client (boto3 ships no type information)."""
ClientFactory = Callable[[str, str], Client]
"""(service name, region) -> client."""

PROBE_TAG = "fsdp.dev/capacity-probe"
MAX_ATTEMPTS = 6
"""Attempts per call, the first included: botocore retries throttling and transient errors, with backoff."""


class NoCredentials(Exception):
    """No AWS credentials could be found: nothing can be checked."""


class UnknownInstanceType(Exception):
    """EC2 does not know the instance type that was asked for."""


# --- what was found -------------------------------------------------------------------------------------------


# --- AWS errors as sentences --------------------------------------------------------------------------------

_DENIED = {"UnauthorizedOperation", "AccessDenied", "AccessDeniedException", "UnauthorizedException"}
_OPT_IN = {"OptInRequired", "AuthFailure", "InvalidClientTokenId", "UnrecognizedClientException"}
_THROTTLED = {"Throttling", "ThrottlingException", "RequestLimitExceeded", "TooManyRequestsException"}
_NOT_OFFERED = {"InvalidAction", "UnsupportedOperation", "UnknownOperationException", "InvalidRequest"}
_EXPIRED = {"ExpiredToken", "ExpiredTokenException", "RequestExpired"}


def describe_error(error: BaseException, what: str, region: str) -> str:
    """One sentence for a failed call: what could not be done, and why, in the user's terms."""
    from botocore.exceptions import (
        BotoCoreError,
        ClientError,
        ConnectTimeoutError,
        EndpointConnectionError,
        NoCredentialsError,
        ReadTimeoutError,
    )

    if isinstance(error, NoCredentialsError):
        raise NoCredentials(str(error)) from error
    if isinstance(error, ClientError):
        info = error.response.get("Error", {})
        code, message = str(info.get("Code", "")), str(info.get("Message", "")).strip()
        attempts = int(error.response.get("ResponseMetadata", {}).get("RetryAttempts", 0)) + 1
        if code in _DENIED:
            return f"{what}: access denied ({code}); the credentials need permission for it"
        if code in _OPT_IN:
            return f"{what}: {region} is not enabled for this account (an opt-in region?) ({code})"
        if code in _THROTTLED:
            return f"{what}: throttled by AWS after {attempts} attempts ({code}); try again later"
        if code in _NOT_OFFERED:
            return f"{what}: the {region} endpoint does not offer this API ({code})"
        if code in _EXPIRED:
            return f"{what}: the credentials have expired ({code})"
        return f"{what}: {code}: {message}" if message else f"{what}: {code}"
    if isinstance(error, EndpointConnectionError):
        return f"{what}: no endpoint reachable in {region} (the region does not offer this service, or no network)"
    if isinstance(error, ConnectTimeoutError | ReadTimeoutError):
        return f"{what}: timed out talking to {region}"
    if isinstance(error, BotoCoreError):
        return f"{what}: {error}"
    return f"{what}: {type(error).__name__}: {error}"


def _client_error_code(error: BaseException) -> str:
    from botocore.exceptions import ClientError

    return str(error.response.get("Error", {}).get("Code", "")) if isinstance(error, ClientError) else ""


# --- one region -----------------------------------------------------------------------------------------------


def _offered_zones(ec2: Client, instance_type: str) -> set[str]:
    zones: set[str] = set()
    pages = ec2.get_paginator("describe_instance_type_offerings").paginate(
        LocationType="availability-zone", Filters=[{"Name": "instance-type", "Values": [instance_type]}]
    )
    for page in pages:
        zones.update(o["Location"] for o in page.get("InstanceTypeOfferings", []) if o.get("Location"))
    return zones


def _zone_ids(ec2: Client) -> dict[str, str]:
    """Zone name -> zone id (`use1-az4`): Spot placement scores name zones by id, users by name."""
    answer = ec2.describe_availability_zones(Filters=[{"Name": "zone-type", "Values": ["availability-zone"]}])
    return {z["ZoneName"]: z.get("ZoneId", "") for z in answer.get("AvailabilityZones", [])}


def instance_vcpus(ec2: Client, types: Iterable[str]) -> dict[str, int]:
    """Default vCPUs per instance type: the catalog's, else `DescribeInstanceTypes` (100 names per call)."""
    result: dict[str, int] = {}
    unknown: list[str] = []
    for name in set(types):
        known = catalog.instance_type(name)
        if known is not None:
            result[name] = known.vcpus
        else:
            unknown.append(name)
    for start in range(0, len(unknown), 100):
        answer = ec2.describe_instance_types(InstanceTypes=sorted(unknown[start : start + 100]))
        for item in answer.get("InstanceTypes", []):
            result[item["InstanceType"]] = int(item["VCpuInfo"]["DefaultVCpus"])
    return result


def _quota_value(quotas: Client, code: str) -> float:
    from botocore.exceptions import ClientError

    try:
        answer = quotas.get_service_quota(ServiceCode="ec2", QuotaCode=code)
    except ClientError as e:
        if _client_error_code(e) != "NoSuchResourceException":
            raise
        # Never changed for this account: the AWS default applies.
        answer = quotas.get_aws_default_service_quota(ServiceCode="ec2", QuotaCode=code)
    return float(answer["Quota"]["Value"])


def _used_vcpus(ec2: Client, quota: catalog.OnDemandQuota) -> int:
    """vCPUs of the pending and running instances that count against `quota` (every page)."""
    counts: dict[str, int] = {}
    pages = ec2.get_paginator("describe_instances").paginate(
        Filters=[{"Name": "instance-state-name", "Values": ["pending", "running"]}]
    )
    for page in pages:
        for reservation in page.get("Reservations", []):
            for instance in reservation.get("Instances", []):
                name = str(instance.get("InstanceType", ""))
                # Spot instances have quotas of their own.
                if instance.get("InstanceLifecycle") != "spot" and catalog.on_demand_quota(name) == quota:
                    counts[name] = counts.get(name, 0) + 1
    vcpus = instance_vcpus(ec2, counts)
    return sum(vcpus[name] * n for name, n in counts.items())


def _quota(ec2: Client, quotas: Client, instance_type: str, region: str) -> Quota | None:
    spec = catalog.on_demand_quota(instance_type)
    if spec is None:
        return None
    try:
        value = _quota_value(quotas, spec.code)
    except Exception as e:
        return Quota(spec.code, spec.name, error=describe_error(e, f"quota {spec.code}", region))
    try:
        used = _used_vcpus(ec2, spec)
    except Exception as e:
        return Quota(spec.code, spec.name, value=value, error=describe_error(e, "running instances", region))
    return Quota(spec.code, spec.name, value=value, used=used)


def _spot_scores(ec2: Client, request: Request, region: str) -> dict[str, int]:
    """Zone id -> Spot placement score (1-10) for `count` instances in one zone."""
    scores: dict[str, int] = {}
    kwargs: dict[str, Any] = {
        "InstanceTypes": [request.instance_type],
        "TargetCapacity": request.count,
        "TargetCapacityUnitType": "units",
        "SingleAvailabilityZone": True,
        "RegionNames": [region],
        "MaxResults": 10,
    }
    while True:
        answer = ec2.get_spot_placement_scores(**kwargs)
        for item in answer.get("SpotPlacementScores", []):
            if item.get("AvailabilityZoneId"):
                scores[item["AvailabilityZoneId"]] = int(item.get("Score", 0))
        token = answer.get("NextToken")
        if not token:
            return scores
        kwargs["NextToken"] = token


_GONE_STATES = {"cancelled", "expired", "failed"}


def _is_gone(ec2: Client, reservation_id: str) -> bool:
    """Whether EC2 says the reservation no longer holds capacity (a cancel that went through unanswered)."""
    try:
        answer = ec2.describe_capacity_reservations(CapacityReservationIds=[reservation_id])
    except Exception as e:
        return _client_error_code(e) == "InvalidCapacityReservationId.NotFound"
    states = {r.get("State") for r in answer.get("CapacityReservations", [])}
    return not states or states <= _GONE_STATES


def _cancel(ec2: Client, reservation_id: str, region: str) -> str:
    """Cancel a reservation; '' when done, else what the user must do.

    Survives a Ctrl-C during the call: the cancel is tried again, and the KeyboardInterrupt is raised once
    the reservation is gone (or the attempts are spent, after the message has been logged)."""
    last = ""
    interrupted = False
    for attempt in range(3):
        try:
            if attempt and _is_gone(ec2, reservation_id):  # an earlier, unanswered cancel went through
                last = ""
                break
            ec2.cancel_capacity_reservation(CapacityReservationId=reservation_id)
            last = ""
            break
        except KeyboardInterrupt:
            interrupted, last = True, "interrupted"
        except Exception as e:
            if _client_error_code(e) == "InvalidCapacityReservationId.NotFound":
                last = ""
                break
            last = describe_error(e, "cancel", region)
    problem = (
        f"reservation {reservation_id} may still be active ({last}): cancel it with "
        f"`aws ec2 cancel-capacity-reservation --region {region} --capacity-reservation-id {reservation_id}`"
        if last
        else ""
    )
    if interrupted:
        if problem:
            log.warning(problem)  # the interrupt travels on: say it before, so it is never lost
        raise KeyboardInterrupt
    return problem


def _find_command(token: str, region: str) -> str:
    return (
        f"`aws ec2 describe-capacity-reservations --region {region} "
        f"--filters Name=tag:{PROBE_TAG},Values={token}` and cancel what it lists"
    )


def _cancel_tagged(ec2: Client, token: str, instance_type: str, zone: str, region: str) -> str:
    """After an interrupted or failed create: find the reservation it may have made, by its tag, and cancel it.

    '' when none is left; else what the user must do. Never raises (but a KeyboardInterrupt during a cancel)."""
    try:
        answer = ec2.describe_capacity_reservations(
            Filters=[
                {"Name": "instance-type", "Values": [instance_type]},
                {"Name": "availability-zone", "Values": [zone]},
                {"Name": "state", "Values": ["active", "pending", "assessing", "scheduled"]},
            ]
        )
    except Exception as e:
        return (
            f"a reservation in {zone} may have been made ({describe_error(e, 'looking it up', region)}): "
            f"find it with {_find_command(token, region)}"
        )
    problems = []
    for reservation in answer.get("CapacityReservations", []):
        tags = {t.get("Key"): t.get("Value") for t in reservation.get("Tags", [])}
        if tags.get(PROBE_TAG) == token and (problem := _cancel(ec2, reservation["CapacityReservationId"], region)):
            problems.append(problem)
    return "; ".join(problems)


_PROBE_REFUSALS: dict[str, ProbeOutcome] = {
    "InsufficientInstanceCapacity": "no-capacity",
    "InsufficientCapacity": "no-capacity",
    "VcpuLimitExceeded": "quota",
    "InstanceLimitExceeded": "quota",
    "ReservationCapacityExceeded": "quota",
    "Unsupported": "unsupported",
    "InvalidParameterValue": "unsupported",
}


def probe_zone(ec2: Client, request: Request, zone: str, region: str) -> Probe:
    """Reserve `count` instances in `zone` and cancel the reservation at once: EC2's definitive answer.

    A refused request creates nothing. Anything else that interrupts the create (Ctrl-C, a lost
    connection after the request was sent, an unexpected answer) may have left a reservation: it is
    found by its tag and cancelled before the exception goes on.
    """
    from botocore.exceptions import ClientError

    token = uuid.uuid4().hex
    try:
        answer = ec2.create_capacity_reservation(
            ClientToken=token,
            InstanceType=request.instance_type,
            InstancePlatform="Linux/UNIX",
            AvailabilityZone=zone,
            InstanceCount=request.count,
            InstanceMatchCriteria="targeted",  # nothing launches into it by accident
            EndDateType="unlimited",
            TagSpecifications=[{"ResourceType": "capacity-reservation", "Tags": [{"Key": PROBE_TAG, "Value": token}]}],
        )
        reservation_id = str(answer["CapacityReservation"]["CapacityReservationId"])
    except ClientError as e:
        code = _client_error_code(e)
        message = str(e.response.get("Error", {}).get("Message", "")).strip()
        outcome = _PROBE_REFUSALS.get(code)
        if outcome is not None:
            return Probe(outcome, f"{code}: {message}" if message else code)
        error = describe_error(e, "probe", region)
        if int(e.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0) < 500:
            return Probe("error", error)  # refused (denied, throttled past the retries): nothing was made
        # A server error: EC2 may have made it before failing to answer.
        return _after_failed_create(ec2, token, request, zone, region, error)
    except KeyboardInterrupt:
        leftover = _cancel_tagged(ec2, token, request.instance_type, zone, region)
        if leftover:
            # Said before the exception travels on, so the message is never lost with it.
            log.warning(leftover)
        raise
    except Exception as e:
        # A lost connection or timeout after the request was sent, an answer without an id: it may exist.
        return _after_failed_create(ec2, token, request, zone, region, describe_error(e, "probe", region))
    problem = _cancel(ec2, reservation_id, region)
    if problem:
        return Probe("reserved", problem, leftover_reservation=reservation_id)
    return Probe("reserved", f"{request.count} reserved and released ({reservation_id})")


def _after_failed_create(ec2: Client, token: str, request: Request, zone: str, region: str, error: str) -> Probe:
    leftover = _cancel_tagged(ec2, token, request.instance_type, zone, region)
    if leftover:
        return Probe("error", f"{error}; {leftover}", leftover_reservation=f"tag {PROBE_TAG}={token}")
    return Probe("error", error)


def check_region(
    factory: ClientFactory,
    region: str,
    request: Request,
    *,
    probe: bool = False,
    stop: threading.Event | None = None,
    step: Callable[[str], None] = lambda _: None,
) -> Region:
    """Everything about one region; errors become sentences in the result."""
    try:
        ec2 = factory("ec2", region)
        step("zones")
        offered = _offered_zones(ec2, request.instance_type)
        ids = _zone_ids(ec2)
    except NoCredentials:
        raise
    except Exception as e:
        return Region(region, error=describe_error(e, "instance type offerings", region))
    step("quota")
    try:
        quota = _quota(ec2, factory("service-quotas", region), request.instance_type, region)
    except NoCredentials:
        raise
    notes: list[str] = []
    scores: dict[str, int] = {}
    if offered:
        step("spot placement score")
        try:
            scores = _spot_scores(ec2, request, region)
        except NoCredentials:
            raise
        except Exception as e:
            notes.append(describe_error(e, "Spot placement score", region))
    zones: list[Zone] = []
    for name in sorted(set(ids) | offered):
        zone_id = ids.get(name, "")
        zones.append(Zone(name, zone_id, name in offered, scores.get(zone_id) if zone_id else None))
    if probe:
        for i, zone in enumerate(zones):
            if not zone.offered:
                continue
            if stop is not None and stop.is_set():
                zones[i] = replace(zone, probe=Probe("skipped", "interrupted before this zone"))
                continue
            step(f"probe {zone.name}")
            zones[i] = replace(zone, probe=probe_zone(ec2, request, zone.name, region))
    return Region(region, tuple(zones), quota, notes=tuple(notes))


def check(
    factory: ClientFactory,
    regions: Sequence[str],
    request: Request,
    *,
    probe: bool = False,
    workers: int = 8,
    on_step: Callable[[str, str], None] = lambda _region, _step: None,
    on_done: Callable[[Region], None] = lambda _: None,
    stop: threading.Event | None = None,
) -> Plan:
    """Every region at once (threads: boto3 is synchronous). Ctrl-C lets probes in flight cancel first.

    `stop` is set on an interrupt: workers probe no further zone once it is.
    """
    stop = stop or threading.Event()
    results: dict[str, Region] = {}
    pool = ThreadPoolExecutor(max_workers=max(1, min(workers, len(regions))), thread_name_prefix="capacity")
    futures: dict[Future[Region], str] = {
        pool.submit(check_region, factory, r, request, probe=probe, stop=stop, step=partial(on_step, r)): r
        for r in regions
    }
    try:
        pending = set(futures)
        while pending:
            # A bounded wait keeps the main thread responsive to Ctrl-C.
            done, pending = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
            for future in done:
                try:
                    region = future.result()
                except NoCredentials:
                    raise
                except Exception as e:  # anything check_region did not turn into a sentence: still the region's row
                    name = futures[future]
                    region = Region(name, error=describe_error(e, "check", name))
                results[region.name] = region
                on_done(region)
    except BaseException:
        # Workers cannot be interrupted; stop new probes and wait, so that each cancels what it reserved.
        stop.set()
        pool.shutdown(wait=True, cancel_futures=True)
        for future in futures:
            if future.done() and not future.cancelled() and future.exception() is None:
                for leftover in leftovers(Plan(request, (future.result(),), probe)):
                    log.warning(leftover)
        raise
    pool.shutdown(wait=True)
    return Plan(request, tuple(results[r] for r in regions), probe)


# --- ranking --------------------------------------------------------------------------------------------------


# --- boto3 wiring ---------------------------------------------------------------------------------------------


@dataclass(slots=True)
class Boto3Clients:
    """Clients from one boto3 session, one per (service, region), with botocore's retries for throttling."""

    profile: str | None = None
    max_attempts: int = MAX_ATTEMPTS
    _session: Any = None
    _clients: dict[tuple[str, str], Client] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def session(self) -> Any:
        if self._session is None:
            import boto3

            self._session = boto3.Session(profile_name=self.profile)
        return self._session

    def require_credentials(self) -> None:
        from botocore.exceptions import BotoCoreError

        try:
            credentials = self.session.get_credentials()
        except BotoCoreError as e:  # a named profile that does not exist, a broken SSO cache
            raise NoCredentials(str(e)) from e
        if credentials is None:
            raise NoCredentials("no AWS credentials found")

    def home_region(self) -> str:
        return str(self.session.region_name or os.environ.get("AWS_REGION") or "us-east-1")

    def known_regions(self) -> list[str]:
        return list(self.session.get_available_regions("ec2"))

    def __call__(self, service: str, region: str) -> Client:
        from botocore.config import Config

        with self._lock:  # boto3 sessions are not thread-safe; clients are
            key = (service, region)
            if key not in self._clients:
                config = Config(
                    retries={"total_max_attempts": self.max_attempts, "mode": "standard"},
                    connect_timeout=10,
                    read_timeout=30,
                )
                self._clients[key] = self.session.client(service, region_name=region, config=config)
            return self._clients[key]


def enabled_regions(ec2: Client) -> tuple[list[str], set[str]]:
    """(regions enabled for the account, opt-in regions it has not enabled)."""
    answer = ec2.describe_regions(AllRegions=True)
    enabled, disabled = [], set()
    for item in answer.get("Regions", []):
        if item.get("OptInStatus") == "not-opted-in":
            disabled.add(item["RegionName"])
        else:
            enabled.append(item["RegionName"])
    return sorted(enabled), disabled


def request_for(ec2: Client, instance_type: str, count: int) -> Request:
    """The request, with vCPUs per instance from the catalog or EC2; UnknownInstanceType when EC2 has no such type."""
    from botocore.exceptions import ClientError

    try:
        vcpus = instance_vcpus(ec2, [instance_type])
    except ClientError as e:
        if _client_error_code(e).startswith("InvalidInstanceType"):
            raise UnknownInstanceType(instance_type) from e
        raise
    if instance_type not in vcpus:
        raise UnknownInstanceType(instance_type)
    return Request(instance_type, count, vcpus[instance_type])


# --- the operator's question: which zone? -----------------------------------------------------------------------


@dataclass(slots=True)
class Ec2ZoneAdvisor:
    """The operator's advisor: the checks of `fsdpctl capacity` in the operator's own region, without probes."""

    clients: Boto3Clients = field(default_factory=Boto3Clients)
    region: str = ""

    async def choose(self, instance_type: str, count: int, zones: Sequence[str]) -> ZoneChoice:
        return await asyncio.to_thread(self._choose, instance_type, count, zones)

    def _choose(self, instance_type: str, count: int, zones: Sequence[str]) -> ZoneChoice:
        self.clients.require_credentials()
        region = self.region or self.clients.home_region()
        try:
            request = request_for(self.clients("ec2", region), instance_type, count)
        except UnknownInstanceType:
            return ZoneChoice("", f"EC2 does not know instance type {instance_type} in {region}")
        except Exception as e:
            return ZoneChoice("", describe_error(e, "instance type", region))
        return choose_zone(Plan(request, (check_region(self.clients, region, request),), False), zones)
