"""AWS for the capacity tests: moto where it implements the API, botocore's Stubber where it does not.

moto 5.2.5 answers DescribeInstanceTypeOfferings, DescribeInstanceTypes, DescribeInstances,
DescribeAvailabilityZones and DescribeRegions from EC2's published data. It lacks
GetSpotPlacementScores, the Capacity Reservation calls and Service Quotas for EC2: those go to
real botocore clients under a `Stubber`, which checks every request and every canned answer
against the service's own model. What neither reproduces: EC2's real capacity and scores (the
answers are the test's), and timing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import boto3
from botocore.awsrequest import AWSResponse
from botocore.config import Config
from botocore.stub import Stubber
from fsdp_operator.capacity.plan import ZoneChoice

STUBBED_EC2 = frozenset(
    {
        "get_spot_placement_scores",
        "create_capacity_reservation",
        "cancel_capacity_reservation",
        "describe_capacity_reservations",
    }
)
FAKE_KEYS = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}


def client(service: str, region: str, max_attempts: int = 3, **kwargs: Any) -> Any:
    config = Config(retries={"total_max_attempts": max_attempts, "mode": "standard"})
    return boto3.client(service, region_name=region, config=config, **FAKE_KEYS, **kwargs)


class Ec2Split:
    """One region's EC2: moto answers what it implements, a stubbed client the rest (by method name)."""

    def __init__(self, region: str, max_attempts: int = 3) -> None:
        self.moto = client("ec2", region, max_attempts)
        self.stubbed = client("ec2", region, max_attempts)
        self.stub = Stubber(self.stubbed)
        self.stub.activate()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stubbed if name in STUBBED_EC2 else self.moto, name)


class Regions:
    """A `ClientFactory` over moto and stubs: `ec2[region]`, `quotas[region]` are set up by the test."""

    def __init__(self, regions: list[str], max_attempts: int = 3) -> None:
        self.ec2 = {r: Ec2Split(r, max_attempts) for r in regions}
        self.quotas: dict[str, Any] = {}
        self.quota_stubs: dict[str, Stubber] = {}
        for r in regions:
            self.quotas[r] = client("service-quotas", r, max_attempts)
            self.quota_stubs[r] = Stubber(self.quotas[r])
            self.quota_stubs[r].activate()

    def __call__(self, service: str, region: str) -> Any:
        return self.ec2[region] if service == "ec2" else self.quotas[region]

    def assert_all_answered(self) -> None:
        for split in self.ec2.values():
            split.stub.assert_no_pending_responses()
        for stub in self.quota_stubs.values():
            stub.assert_no_pending_responses()


def quota_answer(code: str, value: float) -> dict[str, Any]:
    return {
        "Quota": {
            "ServiceCode": "ec2",
            "QuotaCode": code,
            "QuotaName": "Running On-Demand G and VT instances",
            "Value": value,
            "Unit": "None",
        }
    }


def fail_first(ec2: Any, operation: str, code: str, status: int = 400, times: int | None = None) -> Callable[[], int]:
    """Make `operation` answer an EC2 error `times` times (always when None) before moto answers.

    The error comes back as an HTTP response, so botocore's own retry logic sees it. Returns a
    function that tells how many requests were sent.
    """
    sent = {"count": 0}
    body = (
        f'<?xml version="1.0" encoding="UTF-8"?><Response><Errors><Error><Code>{code}</Code>'
        f"<Message>{code} (test)</Message></Error></Errors><RequestID>r-1</RequestID></Response>"
    ).encode()

    def answer(request: Any, **_: Any) -> AWSResponse | None:
        sent["count"] += 1
        if times is not None and sent["count"] > times:
            return None  # moto answers
        return AWSResponse(request.url, status, {}, _Raw(body))

    # First in line, ahead of moto's own `before-send` handler.
    ec2.moto.meta.events.register_first(f"before-send.ec2.{operation}", answer)
    return lambda: sent["count"]


class _Raw:
    """The raw body botocore's AWSResponse reads."""

    def __init__(self, body: bytes) -> None:
        self.body = body

    def stream(self, **_: Any) -> Any:
        yield self.body


class FixedZone:
    """A `ZoneAdvisor` that always advises one zone, and remembers what it was asked."""

    def __init__(self, zone: str, reason: str = "the only zone of the test") -> None:
        self.zone, self.reason = zone, reason
        self.asked: list[tuple[str, int, list[str]]] = []

    async def choose(self, instance_type: str, count: int, zones: Sequence[str]) -> ZoneChoice:
        self.asked.append((instance_type, count, list(zones)))
        return ZoneChoice(self.zone, self.reason)
