"""`placement.availabilityZone: auto` through the real operator: nodes listed over HTTP, the zone recorded in
status, the RayCluster constrained to it; without AWS credentials the job runs unconstrained and says so."""

from __future__ import annotations

from typing import Any

import pytest
from fsdp_operator.capacity.ec2 import Boto3Clients, Ec2ZoneAdvisor, NoCredentials
from fsdp_operator.local.server import ThreadedApiServer
from support.aws import FixedZone
from support.kopf_runner import eventually
from test_operator import World, manifest, scenario

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

ZONE = "topology.kubernetes.io/zone"


def _node(w: World, name: str, instance_type: str, zone: str) -> None:
    labels = {"node.kubernetes.io/instance-type": instance_type, ZONE: zone}
    w.call("POST", "/api/v1/nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}})


def _worker_selector(w: World) -> dict[str, str]:
    (cluster,) = w.clusters()
    (workers,) = cluster["spec"]["workerGroupSpecs"]
    return dict(workers["template"]["spec"]["nodeSelector"])


def _placed(status: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in status["conditions"] if c["type"] == "ZonePlaced")


def test_auto_places_the_workers_in_the_advised_zone(apiserver: ThreadedApiServer) -> None:
    advisor = FixedZone("us-east-1c", "best of 2 usable zone(s)")

    async def body(w: World) -> None:
        _node(w, "gpu-b", "g6.12xlarge", "us-east-1b")
        _node(w, "gpu-c", "g6.12xlarge", "us-east-1c")
        _node(w, "cpu-a", "m5.large", "us-east-1a")
        async with w.operator() as runtime:
            runtime.zones = advisor
            w.apply(manifest(placement={"availabilityZone": "auto"}, runPolicy={"cleanup": "Keep"}))
            status = await w.phase("Succeeded")
        assert _worker_selector(w)[ZONE] == "us-east-1c"
        assert status["placement"] == {"availabilityZone": "us-east-1c", "reason": "best of 2 usable zone(s)"}
        assert (_placed(status)["status"], _placed(status)["reason"]) == ("True", "ZoneChosen")

    scenario(apiserver, body)
    # Asked once, for the zones where the cluster has nodes of the type.
    assert advisor.asked == [("g6.12xlarge", 2, ["us-east-1b", "us-east-1c"])]


def test_auto_without_aws_credentials_runs_unconstrained(apiserver: ThreadedApiServer) -> None:
    class NoAws(Boto3Clients):
        def require_credentials(self) -> None:
            raise NoCredentials("no AWS credentials found")

    async def body(w: World) -> None:
        async with w.operator() as runtime:
            runtime.zones = Ec2ZoneAdvisor(NoAws())
            w.apply(manifest(placement={"availabilityZone": "auto"}, runPolicy={"cleanup": "Keep"}))
            status = await w.phase("Succeeded")
            await eventually(lambda: bool(w.clusters()))
        assert ZONE not in _worker_selector(w)
        assert status["placement"]["availabilityZone"] == ""
        placed = _placed(status)
        assert (placed["status"], placed["reason"]) == ("False", "NoZoneChosen")
        assert placed["message"] == (
            "workers run without a zone constraint: no AWS credentials (IRSA or an instance role) for the operator"
        )

    scenario(apiserver, body)
