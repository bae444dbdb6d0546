"""`fsdpctl capacity` against moto (offerings, instance types, instances) and botocore's Stubber (Spot
placement scores, Capacity Reservations, Service Quotas): the ranked plan, errors per region, probes."""

from __future__ import annotations

import asyncio
import io
import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("boto3")
moto = pytest.importorskip("moto")

from botocore.retries import standard  # noqa: E402
from fsdp_operator.capacity import ec2 as capacity  # noqa: E402
from fsdp_operator.capacity import plan as capacity_plan  # noqa: E402
from fsdp_operator.capacity.ec2 import Boto3Clients  # noqa: E402
from fsdp_operator.capacity.plan import Request  # noqa: E402
from fsdp_operator.cli import capacity as capacity_cli  # noqa: E402
from fsdp_operator.cli.main import main  # noqa: E402

from tests.support.aws import Ec2Split, Regions, client, fail_first, quota_answer  # noqa: E402

G6 = "g6.12xlarge"
G_AND_VT = "L-DB2E81BA"


@pytest.fixture(scope="module")
def world() -> Iterator[None]:
    """One moto account for the module (its regions take seconds each to set up): us-east-1 runs one
    g6.12xlarge (48 vCPUs of the G and VT quota) and three m5.large (another quota); us-west-2 runs two
    g6.12xlarge (96 vCPUs) and a p4d.24xlarge (the P quota)."""
    with pytest.MonkeyPatch.context() as patch:
        # botocore's real retry logic, without its real (random, up to seconds) sleeps between attempts.
        patch.setattr(standard.ExponentialBackoff, "delay_amount", lambda self, context: 0.0)
        patch.setenv("AWS_DEFAULT_REGION", "us-east-1")
        # moto's thousands of public AMIs cost seconds per region and nothing here needs them.
        patch.setenv("MOTO_EC2_LOAD_DEFAULT_AMIS", "false")
        with moto.mock_aws():
            _run_instances("us-east-1", G6, 1)
            _run_instances("us-east-1", "m5.large", 3)
            _run_instances("us-west-2", G6, 2)
            _run_instances("us-west-2", "p4d.24xlarge", 1)
            yield


@pytest.fixture
def aws(world: None) -> None:
    """The module's moto account (tests add their own stubbed answers on fresh clients)."""


class PinnedClients(Boto3Clients):
    """The real session helpers (credentials from moto's environment), the region list pinned."""

    def known_regions(self) -> list[str]:
        return ["us-east-1", "us-west-2", "eu-west-1", "eu-north-1", "ap-east-1"]


def _run_instances(region: str, instance_type: str, count: int) -> None:
    ec2 = client("ec2", region)
    ec2.run_instances(ImageId="ami-12c6146b", InstanceType=instance_type, MinCount=count, MaxCount=count)


def _spot(ec2: Ec2Split, region: str, scores: dict[str, int], count: int = 2) -> None:
    ec2.stub.add_response(
        "get_spot_placement_scores",
        {"SpotPlacementScores": [{"Region": region, "AvailabilityZoneId": z, "Score": s} for z, s in scores.items()]},
        {
            "InstanceTypes": [G6],
            "TargetCapacity": count,
            "TargetCapacityUnitType": "units",
            "SingleAvailabilityZone": True,
            "RegionNames": [region],
            "MaxResults": 10,
        },
    )


def _quota(regions: Regions, region: str, value: float) -> None:
    regions.quota_stubs[region].add_response(
        "get_service_quota", quota_answer(G_AND_VT, value), {"ServiceCode": "ec2", "QuotaCode": G_AND_VT}
    )


def _run(regions: Regions, *args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    names = [r for a in args if a.startswith("--regions=") for r in a.split("=", 1)[1].split(",")]
    code = capacity_cli.run(
        G6,
        2,
        regions=names,
        probe="--probe" in args,
        output="json" if "-o=json" in args else "table",
        clients=PinnedClients(),
        factory=regions,
        stdout=out,
        stderr=err,
    )
    return code, out.getvalue(), err.getvalue()


def _three_regions() -> Regions:
    """us-east-1: room for 2x g6.12xlarge; us-west-2: higher Spot scores, quota short; eu-west-1: not offered."""
    regions = Regions(["us-east-1", "us-west-2", "eu-west-1"])
    _quota(regions, "us-east-1", 192)
    _quota(regions, "us-west-2", 128)
    # eu-west-1 never changed its quota: the AWS default answers.
    regions.quota_stubs["eu-west-1"].add_client_error("get_service_quota", "NoSuchResourceException")
    regions.quota_stubs["eu-west-1"].add_response(
        "get_aws_default_service_quota", quota_answer(G_AND_VT, 64), {"ServiceCode": "ec2", "QuotaCode": G_AND_VT}
    )
    # moto's zone ids: us-east-1a..f = use1-az6, az1, az2, az4, az3, az5; us-west-2a..d = usw2-az2, az1, az3, az4.
    _spot(
        regions.ec2["us-east-1"],
        "us-east-1",
        {"use1-az6": 3, "use1-az1": 9, "use1-az2": 5, "use1-az4": 9, "use1-az5": 1},
    )
    _spot(regions.ec2["us-west-2"], "us-west-2", {"usw2-az1": 10, "usw2-az2": 8})
    return regions


def test_three_regions_ranked_best_zone_first(aws: None) -> None:
    regions = _three_regions()
    code, out, err = _run(regions, "--regions=us-east-1,us-west-2,eu-west-1", "-o=json")
    regions.assert_all_answered()
    assert (code, err) == (0, "")
    plan = json.loads(out)
    assert (plan["instanceType"], plan["count"], plan["vcpusNeeded"]) == (G6, 2, 96)
    order = [(r["region"], r["zone"], r["usable"]) for r in plan["ranking"]]
    assert order == [
        *(("us-east-1", f"us-east-1{z}", True) for z in "bdcaf"),  # room in the quota, by Spot score, ties by name
        *(("us-west-2", f"us-west-2{z}", False) for z in "bacd"),  # the best scores, but 32 vCPUs free of 96 needed
        *(("us-east-1", "us-east-1e", False), *(("eu-west-1", f"eu-west-1{z}", False) for z in "abc")),  # not offered
    ]
    best = plan["ranking"][0]
    assert (best["zoneId"], best["spotScore"]) == ("use1-az1", 9)
    assert best["why"] == "quota: 144 vCPUs free >= 96 needed; Spot placement score 9/10"
    assert plan["ranking"][5]["why"] == "quota: 32 vCPUs free < 96 needed; Spot placement score 10/10"
    assert plan["ranking"][7]["spotScore"] is None
    quotas = {r["region"]: r["quota"] for r in plan["regions"]}
    assert (quotas["us-east-1"]["used"], quotas["us-west-2"]["used"], quotas["eu-west-1"]["value"]) == (48, 96, 64)
    # Only the region that offers the type and is short gets an increase: 96 used + 96 needed.
    assert plan["quotaIncreases"] == [
        {
            "region": "us-west-2",
            "ServiceCode": "ec2",
            "QuotaCode": G_AND_VT,
            "DesiredValue": 192.0,
            "command": "aws service-quotas request-service-quota-increase --region us-west-2 --service-code ec2 "
            "--quota-code L-DB2E81BA --desired-value 192",
        }
    ]


def test_table_output(aws: None) -> None:
    code, out, _ = _run(_three_regions(), "--regions=us-east-1,us-west-2,eu-west-1")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].strip() == "2x g6.12xlarge (96 vCPUs)"
    first_row = next(line for line in lines if line.strip().startswith("1 "))
    assert first_row.split()[:6] == ["1", "us-east-1", "us-east-1b", "yes", "144", "9"]
    assert "aws service-quotas request-service-quota-increase --region us-west-2 --service-code ec2 " in out
    assert lines[-1] == "best: us-east-1 us-east-1b"


def test_a_region_that_errors_while_others_answer(aws: None) -> None:
    regions = Regions(["us-east-1", "eu-north-1", "us-west-2", "eu-west-1"])
    _quota(regions, "us-east-1", 192)
    _spot(regions.ec2["us-east-1"], "us-east-1", {"use1-az1": 4})
    # eu-north-1: throttled on every attempt of botocore's retries (3 here).
    sent = fail_first(regions.ec2["eu-north-1"], "DescribeInstanceTypeOfferings", "RequestLimitExceeded", 503)
    # us-west-2: not allowed to read Spot placement scores or the quota; the rest still counts.
    regions.ec2["us-west-2"].stub.add_client_error("get_spot_placement_scores", "UnauthorizedOperation", "denied", 403)
    regions.quota_stubs["us-west-2"].add_client_error("get_service_quota", "AccessDeniedException", "denied", 403)
    # eu-west-1: its Service Quotas endpoint cannot be reached.
    regions.quotas["eu-west-1"] = client("service-quotas", "eu-west-1", 2, endpoint_url="http://127.0.0.1:9")
    code, out, err = _run(regions, "--regions=us-east-1,eu-north-1,us-west-2,eu-west-1,ap-east-1", "-o=json")
    regions.assert_all_answered()
    assert (code, err) == (0, "")
    assert sent() == 3
    plan = json.loads(out)
    by_region = {r["region"]: r for r in plan["regions"]}
    assert by_region["eu-north-1"]["error"] == (
        "instance type offerings: throttled by AWS after 3 attempts (RequestLimitExceeded); try again later"
    )
    assert by_region["ap-east-1"]["error"] == "ap-east-1 is an opt-in region not enabled for this account"
    assert by_region["us-west-2"]["notes"] == [
        "Spot placement score: access denied (UnauthorizedOperation); the credentials need permission for it"
    ]
    assert by_region["us-west-2"]["quota"]["error"] == (
        "quota L-DB2E81BA: access denied (AccessDeniedException); the credentials need permission for it"
    )
    assert by_region["eu-west-1"]["quota"]["error"].startswith("quota L-DB2E81BA: no endpoint reachable in eu-west-1")
    ranking = plan["ranking"]
    # Known room first, then unknown quota (us-west-2, no scores); errored regions have no rows.
    assert [r["zone"] for r in ranking[:2]] == ["us-east-1b", "us-east-1a"]
    assert {r["region"] for r in ranking} == {"us-east-1", "us-west-2", "eu-west-1"}
    assert next(r for r in ranking if r["region"] == "us-west-2")["usable"] is True


def test_throttling_is_retried(aws: None) -> None:
    regions = Regions(["us-west-2"])
    sent = fail_first(regions.ec2["us-west-2"], "DescribeInstanceTypeOfferings", "Throttling", 400, times=2)
    _quota(regions, "us-west-2", 192)
    _spot(regions.ec2["us-west-2"], "us-west-2", {"usw2-az3": 7})
    code, out, _ = _run(regions, "--regions=us-west-2", "-o=json")
    assert (code, sent()) == (0, 3)
    assert json.loads(out)["ranking"][0]["zone"] == "us-west-2c"


def test_nothing_fits_is_a_finding(aws: None) -> None:
    regions = Regions(["eu-west-1"])
    _quota(regions, "eu-west-1", 512)
    code, out, _ = _run(regions, "--regions=eu-west-1")
    assert code == 1
    assert out.splitlines()[-1] == "no zone can take 2x g6.12xlarge now"


def test_bad_input_exits_2(aws: None) -> None:
    regions = Regions(["us-east-1"])
    assert _run(regions, "--regions=us-eest-1")[0] == 2
    out, err = io.StringIO(), io.StringIO()
    code = capacity_cli.run(
        "g9.huge", 2, regions=["us-east-1"], clients=PinnedClients(), factory=regions, stdout=out, stderr=err
    )
    assert (code, err.getvalue()) == (2, "error: --instance-type: EC2 does not know 'g9.huge' (example: g6.12xlarge)\n")


def test_missing_credentials_is_one_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    assert main(["capacity", "--regions", "us-east-1"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == f"error: {capacity_cli.CREDENTIALS_HINT}\n"


# --- probes ---------------------------------------------------------------------------------------------------

REQUEST = Request(G6, 2, 48)


def _create_params(zone: str) -> dict[str, Any]:
    from botocore.stub import ANY

    return {
        "ClientToken": ANY,
        "InstanceType": G6,
        "InstancePlatform": "Linux/UNIX",
        "AvailabilityZone": zone,
        "InstanceCount": 2,
        "InstanceMatchCriteria": "targeted",
        "EndDateType": "unlimited",
        "TagSpecifications": ANY,
    }


def _created(reservation_id: str, zone: str) -> dict[str, Any]:
    return {
        "CapacityReservation": {"CapacityReservationId": reservation_id, "AvailabilityZone": zone, "State": "active"}
    }


def _expect_cancel(ec2: Ec2Split, reservation_id: str) -> None:
    ec2.stub.add_response("cancel_capacity_reservation", {"Return": True}, {"CapacityReservationId": reservation_id})


def test_probe_reserves_and_cancels_or_classifies_the_refusal(aws: None) -> None:
    ec2 = Ec2Split("eu-north-1")
    ec2.stub.add_response("create_capacity_reservation", _created("cr-1", "eu-north-1a"), _create_params("eu-north-1a"))
    _expect_cancel(ec2, "cr-1")
    ec2.stub.add_client_error("create_capacity_reservation", "InsufficientInstanceCapacity", "none left")
    ec2.stub.add_client_error("create_capacity_reservation", "VcpuLimitExceeded", "over the limit")
    assert capacity.probe_zone(ec2, REQUEST, "eu-north-1a", "eu-north-1") == capacity_plan.Probe(
        "reserved", "2 reserved and released (cr-1)"
    )
    assert capacity.probe_zone(ec2, REQUEST, "eu-north-1a", "eu-north-1").outcome == "no-capacity"
    assert capacity.probe_zone(ec2, REQUEST, "eu-north-1a", "eu-north-1") == capacity_plan.Probe(
        "quota", "VcpuLimitExceeded: over the limit"
    )
    ec2.stub.assert_no_pending_responses()  # a refusal creates nothing, so nothing was cancelled


@pytest.mark.parametrize("interruption", [KeyboardInterrupt, ConnectionResetError])
def test_probe_cancels_what_an_interrupted_create_made(aws: None, interruption: type[BaseException]) -> None:
    """Ctrl-C (or a broken connection) after EC2 made the reservation, before its id came back."""
    ec2 = Ec2Split("eu-north-1")
    seen: dict[str, str] = {}
    ec2.stubbed.meta.events.register(
        "provide-client-params.ec2.CreateCapacityReservation", lambda params, **_: seen.update(params)
    )

    def interrupt(**_: Any) -> None:
        # The reservation exists now (the answer arrived); the caller never sees its id. Queue what
        # the lookup will find: ours, by its tag, and someone else's in the same zone.
        ours = {"Key": capacity.PROBE_TAG, "Value": seen["ClientToken"]}
        ec2.stub.add_response(
            "describe_capacity_reservations",
            {
                "CapacityReservations": [
                    {"CapacityReservationId": "cr-other", "State": "active", "Tags": []},
                    {"CapacityReservationId": "cr-ours", "State": "active", "Tags": [ours]},
                ]
            },
        )
        _expect_cancel(ec2, "cr-ours")
        raise interruption()

    ec2.stubbed.meta.events.register("after-call.ec2.CreateCapacityReservation", interrupt)
    ec2.stub.add_response(
        "create_capacity_reservation", _created("cr-ours", "eu-north-1b"), _create_params("eu-north-1b")
    )
    if interruption is KeyboardInterrupt:
        with pytest.raises(KeyboardInterrupt):
            capacity.probe_zone(ec2, REQUEST, "eu-north-1b", "eu-north-1")
    else:  # an error, not an interrupt: a row in the table, after the cleanup
        probe = capacity.probe_zone(ec2, REQUEST, "eu-north-1b", "eu-north-1")
        assert (probe.outcome, probe.leftover_reservation) == ("error", "")
        assert probe.message == "probe: ConnectionResetError: "
    ec2.stub.assert_no_pending_responses()


def test_a_cancel_that_fails_is_reported_with_the_command(aws: None) -> None:
    ec2 = Ec2Split("eu-north-1")
    ec2.stub.add_response("create_capacity_reservation", _created("cr-9", "eu-north-1a"), _create_params("eu-north-1a"))
    for _ in range(3):
        ec2.stub.add_client_error("cancel_capacity_reservation", "InternalError", "try later", 500)
    probe = capacity.probe_zone(ec2, REQUEST, "eu-north-1a", "eu-north-1")
    assert probe.leftover_reservation == "cr-9"
    assert probe.message.endswith(
        "cancel it with `aws ec2 cancel-capacity-reservation --region eu-north-1 --capacity-reservation-id cr-9`"
    )


def _north_probed(regions: Regions) -> None:
    """eu-north-1 with room in its quota: its first probe finds no capacity (eu-north-1a), its second reserves
    eu-north-1b, and that reservation is cancelled."""
    north = regions.ec2["eu-north-1"]
    _quota(regions, "eu-north-1", 192)
    _spot(north, "eu-north-1", {"eun1-az1": 9, "eun1-az2": 2})
    north.stub.add_client_error("create_capacity_reservation", "InsufficientInstanceCapacity", "none left")
    north.stub.add_response(
        "create_capacity_reservation", _created("cr-b", "eu-north-1b"), _create_params("eu-north-1b")
    )
    _expect_cancel(north, "cr-b")


def test_probe_in_the_plan_and_ctrl_c_while_regions_run(aws: None) -> None:
    """With --probe, the confirmed zone ranks first; a Ctrl-C lets the probe in flight cancel its reservation."""
    regions = Regions(["eu-north-1", "us-west-2"])
    _north_probed(regions)
    # us-west-2's first probe is slow: Ctrl-C arrives while it is in flight.
    west = regions.ec2["us-west-2"]
    _quota(regions, "us-west-2", 192)
    _spot(west, "us-west-2", {})
    west.stub.add_response("create_capacity_reservation", _created("cr-w", "us-west-2a"), _create_params("us-west-2a"))
    _expect_cancel(west, "cr-w")
    in_flight, stop = threading.Event(), threading.Event()

    def slow(**_: Any) -> None:
        in_flight.set()
        stop.wait(10)  # until the interrupt has told every worker to stop

    # Every handler of this event runs (the Stubber answers the later `before-call`, ending that one).
    west.stubbed.meta.events.register("before-parameter-build.ec2.CreateCapacityReservation", slow)

    def on_done(region: capacity_plan.Region) -> None:
        in_flight.wait(10)
        raise KeyboardInterrupt

    request = Request(G6, 2, 48)
    with pytest.raises(KeyboardInterrupt):
        capacity.check(regions, ["eu-north-1", "us-west-2"], request, probe=True, on_done=on_done, stop=stop)
    # us-west-2 reserved its first zone and cancelled it; the other zones were never probed.
    regions.assert_all_answered()

    # Without the interruption: the zone a probe confirmed comes first, the refused one last.
    regions = Regions(["eu-north-1"])
    _north_probed(regions)
    code, out, _ = _run(regions, "--regions=eu-north-1", "--probe", "-o=json")
    regions.assert_all_answered()
    ranking = json.loads(out)["ranking"]
    assert code == 0
    assert [(r["zone"], r["probe"]["outcome"] if r["probe"] else None) for r in ranking] == [
        ("eu-north-1b", "reserved"),
        ("eu-north-1a", "no-capacity"),
        ("eu-north-1c", None),
    ]
    assert ranking[0]["why"] == (
        "probe: capacity for 2 confirmed; quota: 192 vCPUs free >= 96 needed; Spot placement score 2/10"
    )
    assert json.loads(out)["leftoverReservations"] == []


# --- the operator's advisor -----------------------------------------------------------------------------------


class AdvisorClients(PinnedClients):
    """The operator's boto3 wiring, its clients from moto and the stubs."""

    def __init__(self, regions: Regions) -> None:
        super().__init__()
        self.regions = regions

    def __call__(self, service: str, region: str) -> Any:
        return self.regions(service, region)


def test_the_operator_advisor_picks_among_the_zones_with_nodes(aws: None) -> None:
    regions = Regions(["us-east-1"])
    _quota(regions, "us-east-1", 192)
    # us-east-1b scores best, but the cluster has no g6.12xlarge nodes there.
    _spot(regions.ec2["us-east-1"], "us-east-1", {"use1-az1": 10, "use1-az2": 4, "use1-az4": 7})
    advisor = capacity.Ec2ZoneAdvisor(AdvisorClients(regions), region="us-east-1")
    choice = asyncio.run(advisor.choose(G6, 2, ["us-east-1c", "us-east-1d"]))
    regions.assert_all_answered()
    assert choice == capacity_plan.ZoneChoice(
        "us-east-1d",
        "best of 2 usable zone(s) among the zones with nodes of the type (us-east-1c, us-east-1d): "
        "quota: 144 vCPUs free >= 96 needed; Spot placement score 7/10",
    )


def test_the_operator_advisor_without_room(aws: None) -> None:
    regions = Regions(["us-west-2"])
    _quota(regions, "us-west-2", 128)  # 96 used: 32 free
    _spot(regions.ec2["us-west-2"], "us-west-2", {"usw2-az1": 9})
    advisor = capacity.Ec2ZoneAdvisor(AdvisorClients(regions), region="us-west-2")
    choice = asyncio.run(advisor.choose(G6, 2, []))
    assert choice == capacity_plan.ZoneChoice("", "no zone for 2x g6.12xlarge: no usable zone in the region")


def test_the_command_line_with_boto3s_own_clients(
    aws: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`fsdpctl capacity` as typed, its clients from a real boto3 session (moto answers what it implements)."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    assert main(["capacity", "--count", "1", "--regions", "us-east-1", "--regions", "ap-east-1", "-o", "json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert (plan["count"], plan["vcpusNeeded"]) == (1, 48)
    assert [(r["zone"], r["usable"]) for r in plan["ranking"]][:2] == [("us-east-1a", True), ("us-east-1b", True)]
    regions = {r["region"]: r for r in plan["regions"]}
    assert regions["ap-east-1"]["error"] == "ap-east-1 is an opt-in region not enabled for this account"
    # moto 5.2.5 has neither Spot placement scores nor EC2's Service Quotas: both become notes, not tracebacks.
    assert regions["us-east-1"]["notes"][0].startswith("Spot placement score: ")
    assert regions["us-east-1"]["quota"]["error"].startswith("quota L-DB2E81BA: ")


# --- edge cases -----------------------------------------------------------------------------------------------


class _InterruptFirstCancel:
    """Ctrl-C during the first cancel: before the request left (`sent=False`) or after EC2 took it."""

    def __init__(self, ec2: Ec2Split, *, sent: bool) -> None:
        self.ec2, self.sent, self.calls = ec2, sent, 0

    def __call__(self, **kwargs: Any) -> Any:
        self.calls += 1
        if self.calls == 1:
            if self.sent:
                self.ec2.stubbed.cancel_capacity_reservation(**kwargs)
            raise KeyboardInterrupt
        return self.ec2.stubbed.cancel_capacity_reservation(**kwargs)


@pytest.mark.parametrize("sent", [False, True], ids=["before-the-cancel-left", "after-ec2-took-it"])
def test_ctrl_c_during_the_cancel_still_cancels_then_stops(aws: None, sent: bool) -> None:
    ec2 = Ec2Split("eu-north-1")
    ec2.stub.add_response("create_capacity_reservation", _created("cr-7", "eu-north-1a"), _create_params("eu-north-1a"))
    if sent:
        _expect_cancel(ec2, "cr-7")
    # The retry first asks whether the interrupted cancel went through.
    state = "cancelled" if sent else "active"
    ec2.stub.add_response(
        "describe_capacity_reservations",
        {"CapacityReservations": [{"CapacityReservationId": "cr-7", "State": state}]},
        {"CapacityReservationIds": ["cr-7"]},
    )
    if not sent:
        _expect_cancel(ec2, "cr-7")
    cancel = _InterruptFirstCancel(ec2, sent=sent)
    ec2.cancel_capacity_reservation = cancel  # type: ignore[method-assign]
    with pytest.raises(KeyboardInterrupt):  # the user's Ctrl-C is not swallowed ...
        capacity.probe_zone(ec2, REQUEST, "eu-north-1a", "eu-north-1")
    ec2.stub.assert_no_pending_responses()  # ... and the reservation is gone first
    assert cancel.calls == (1 if sent else 2)


def test_a_failed_create_whose_lookup_fails_says_how_to_find_the_reservation(aws: None) -> None:
    ec2 = Ec2Split("eu-north-1")

    def broken(**_: Any) -> None:
        ec2.stub.add_client_error("describe_capacity_reservations", "UnauthorizedOperation", "denied", 403)
        raise ConnectionResetError("connection lost")

    ec2.stubbed.meta.events.register("after-call.ec2.CreateCapacityReservation", broken)
    ec2.stub.add_response("create_capacity_reservation", _created("cr-x", "eu-north-1c"), _create_params("eu-north-1c"))
    probe = capacity.probe_zone(ec2, REQUEST, "eu-north-1c", "eu-north-1")
    ec2.stub.assert_no_pending_responses()
    assert probe.outcome == "error" and probe.leftover_reservation.startswith(f"tag {capacity.PROBE_TAG}=")
    assert "probe: ConnectionResetError: connection lost" in probe.message
    assert "looking it up: access denied (UnauthorizedOperation)" in probe.message
    assert f"aws ec2 describe-capacity-reservations --region eu-north-1 --filters Name=tag:{capacity.PROBE_TAG}," in (
        probe.message
    )
    plan = capacity_plan.Plan(
        REQUEST, (capacity_plan.Region("eu-north-1", (capacity_plan.Zone("eu-north-1c", probe=probe),)),), True
    )
    assert capacity_plan.leftovers(plan) == [probe.message]  # printed as a warning by the command


def test_a_server_error_on_create_is_looked_up_a_refusal_is_not(aws: None) -> None:
    ec2 = Ec2Split("eu-north-1", max_attempts=1)
    ec2.stub.add_client_error("create_capacity_reservation", "UnauthorizedOperation", "denied", 403)
    ec2.stub.add_client_error("create_capacity_reservation", "InternalError", "oops", 500)
    ec2.stub.add_response("describe_capacity_reservations", {"CapacityReservations": []})
    denied = capacity.probe_zone(ec2, REQUEST, "eu-north-1a", "eu-north-1")
    assert denied == capacity_plan.Probe(
        "error", "probe: access denied (UnauthorizedOperation); the credentials need permission for it"
    )
    assert capacity.probe_zone(ec2, REQUEST, "eu-north-1a", "eu-north-1") == capacity_plan.Probe(
        "error", "probe: InternalError: oops"
    )
    ec2.stub.assert_no_pending_responses()


def test_every_region_failing_is_a_finding_with_each_reason(aws: None) -> None:
    regions = Regions(["us-east-1", "us-west-2"])
    for region in ("us-east-1", "us-west-2"):
        fail_first(regions.ec2[region], "DescribeInstanceTypeOfferings", "UnauthorizedOperation", 403)
    code, out, err = _run(regions, "--regions=us-east-1,us-west-2,ap-east-1")
    assert (code, err) == (1, "")
    assert "Traceback" not in out
    assert "us-east-1: not checked: instance type offerings: access denied (UnauthorizedOperation)" in out
    assert "us-west-2: not checked: instance type offerings: access denied (UnauthorizedOperation)" in out
    assert "ap-east-1: not checked: ap-east-1 is an opt-in region not enabled for this account" in out
    assert out.splitlines()[-1] == "no zone can take 2x g6.12xlarge now"


def test_the_vcpus_of_an_uncatalogued_type_come_from_a_region_that_answers(aws: None) -> None:
    """The home region (us-east-1) is not asked for; the first listed one is opt-in and not enabled."""
    regions = Regions(["us-east-1", "ap-east-1", "us-west-2"])
    sent = fail_first(regions.ec2["ap-east-1"], "DescribeInstanceTypes", "OptInRequired", 401)
    regions.quota_stubs["us-west-2"].add_response(
        "get_service_quota", quota_answer(G_AND_VT, 200), {"ServiceCode": "ec2", "QuotaCode": G_AND_VT}
    )
    out, err = io.StringIO(), io.StringIO()
    code = capacity_cli.run(
        "g4dn.xlarge", 3, regions=["ap-east-1", "us-west-2"], output="json", clients=PinnedClients(),
        factory=regions, stdout=out, stderr=err,
    )  # fmt: skip
    assert (code, err.getvalue(), sent()) == (0, "", 0), err.getvalue()
    plan = json.loads(out.getvalue())
    assert plan["vcpusNeeded"] == 12  # 3x 4 vCPUs, from DescribeInstanceTypes in us-west-2
    # us-west-2's two g6.12xlarge use 96 of the 200 (its p4d.24xlarge counts against the P quota).
    assert {r["region"]: r["quota"] and r["quota"]["free"] for r in plan["regions"]} == {
        "ap-east-1": None,
        "us-west-2": 104,
    }


def test_quota_usage_counts_on_demand_g_and_vt_only_on_every_page() -> None:
    """describe_instances asked for pending and running only; spot, P, standard types and other pages handled."""
    from botocore.stub import Stubber

    ec2 = client("ec2", "us-east-1")
    stub = Stubber(ec2)
    states = [{"Name": "instance-state-name", "Values": ["pending", "running"]}]

    def page(types: list[tuple[str, str | None]], token: str | None) -> dict[str, Any]:
        instances = [{"InstanceType": t, **({"InstanceLifecycle": life} if life else {})} for t, life in types]
        return {"Reservations": [{"Instances": instances}], **({"NextToken": token} if token else {})}

    stub.add_response(
        "describe_instances",
        page([("g4dn.xlarge", None), ("g5.2xlarge", None), ("p4d.24xlarge", None), ("g5.xlarge", "spot")], "t1"),
        {"Filters": states},
    )
    stub.add_response(
        "describe_instances",
        page([("g5g.xlarge", None), ("gr6.4xlarge", None), ("vt1.3xlarge", None), ("m5.large", None)], "t2"),
        {"Filters": states, "NextToken": "t1"},
    )
    stub.add_response("describe_instances", page([("g6e.xlarge", None), ("g6.xlarge", None)], None),
                      {"Filters": states, "NextToken": "t2"})  # fmt: skip
    # Types the catalog does not know: their default vCPUs from EC2, in one call.
    uncatalogued = {"g4dn.xlarge": 4, "g5g.xlarge": 4, "gr6.4xlarge": 16, "vt1.3xlarge": 12}
    stub.add_response(
        "describe_instance_types",
        {"InstanceTypes": [{"InstanceType": t, "VCpuInfo": {"DefaultVCpus": v}} for t, v in uncatalogued.items()]},
        {"InstanceTypes": sorted(uncatalogued)},
    )
    with stub:
        used = capacity._used_vcpus(ec2, capacity.catalog.G_AND_VT)
    stub.assert_no_pending_responses()
    # g4dn.xlarge 4 + g5.2xlarge 8 + g5g.xlarge 4 + gr6.4xlarge 16 + vt1.3xlarge 12 + g6e.xlarge 4 + g6.xlarge 4
    assert used == 52


def test_quota_numbers_are_printed_whole() -> None:
    increase = capacity_plan.QuotaIncrease("us-east-1", G_AND_VT, 1234560.0)
    assert increase.command.endswith("--desired-value 1234560")
    zone = capacity_plan.Zone("us-east-1a", offered=True)
    quota = capacity_plan.Quota(G_AND_VT, "G and VT", value=0.0, used=0)  # offered, but a quota of zero
    plan = capacity_plan.Plan(Request(G6, 2, 48), (capacity_plan.Region("us-east-1", (zone,), quota),), False)
    (ranked,) = capacity_plan.rank(plan)
    assert not ranked.usable and ranked.why.startswith("quota: 0 vCPUs free < 96 needed")
    assert [q.command for q in capacity_plan.increases(plan)] == [
        "aws service-quotas request-service-quota-increase --region us-east-1 --service-code ec2 "
        "--quota-code L-DB2E81BA --desired-value 96"
    ]


@pytest.mark.parametrize("count", ["0", "-2"])
def test_a_count_below_one_is_bad_input(count: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["capacity", "--count", count, "--regions", "us-east-1"]) == 2
    assert capsys.readouterr().err == f"error: --count must be at least 1, got {count}\n"


def test_an_unexpected_error_in_one_region_is_that_regions_row(aws: None) -> None:
    regions = Regions(["us-east-1", "us-west-2"])
    _quota(regions, "us-east-1", 192)
    _spot(regions.ec2["us-east-1"], "us-east-1", {"use1-az1": 4})

    def factory(service: str, region: str) -> Any:
        if service == "service-quotas" and region == "us-west-2":
            raise RuntimeError("no client for you")
        return regions(service, region)

    plan = capacity.check(factory, ["us-east-1", "us-west-2"], Request(G6, 2, 48))
    assert plan.regions[1] == capacity_plan.Region("us-west-2", error="check: RuntimeError: no client for you")
    assert capacity_plan.rank(plan)[0].usable
