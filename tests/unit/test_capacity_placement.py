"""Zone placement in the job: `spec.placement` reaches the rendered RayCluster; `auto` is decided once, in status."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import jsonschema
import pytest
from fsdp_operator.api import render
from fsdp_operator.capacity.plan import ZoneChoice
from fsdp_operator.decide.observed import CreateRayCluster, Decision, Observed
from fsdp_operator.decide.reconcile import reconcile
from fsdp_operator.decide.status import ConditionType, JobStatus, Phase, get_condition
from test_reconcile import NOW, PACKAGE, at, manifest
from test_render import KUBERAY_VERSIONS, group, job, kuberay_schema, unknown_fields

ZONE = "topology.kubernetes.io/zone"
RESERVATION = "karpenter.k8s.aws/capacity-reservation-id"


def selector(rc: dict[str, Any]) -> dict[str, str]:
    return dict(group(rc)["template"]["spec"]["nodeSelector"])


def test_a_zone_and_a_reservation_constrain_the_workers_only() -> None:
    rc = render.raycluster(
        job({"placement": {"availabilityZone": "us-east-1b", "capacityReservationId": "cr-0123456789abcdef0"}})
    )
    assert selector(rc) == {
        "node.kubernetes.io/instance-type": "g6.12xlarge",
        ZONE: "us-east-1b",
        RESERVATION: "cr-0123456789abcdef0",
    }
    assert "nodeSelector" not in rc["spec"]["headGroupSpec"]["template"]["spec"]  # the head needs no EFA
    # Without placement: no zone constraint at all.
    assert ZONE not in selector(render.raycluster(job()))


def test_auto_uses_the_zone_the_operator_chose() -> None:
    auto = job({"placement": {"availabilityZone": "auto"}})
    assert selector(render.raycluster(auto, chosen_zone="us-west-2c"))[ZONE] == "us-west-2c"
    assert ZONE not in selector(render.raycluster(auto))  # none chosen: unconstrained
    # A zone given in the spec is the zone, whatever was chosen before.
    fixed = job({"placement": {"availabilityZone": "us-east-1b"}})
    assert selector(render.raycluster(fixed, chosen_zone="us-west-2c"))[ZONE] == "us-east-1b"


@pytest.mark.parametrize("version", KUBERAY_VERSIONS)
def test_placement_is_valid_for_kuberay(version: str) -> None:
    openapi = kuberay_schema(version)
    rc = render.raycluster(
        job({"placement": {"availabilityZone": "auto", "capacityReservationId": "cr-0123456789abcdef0"}}),
        chosen_zone="us-east-1b",
    )
    assert [e.message for e in jsonschema.Draft7Validator(openapi).iter_errors(rc)] == []
    assert unknown_fields(openapi, rc) == []


def _auto(zone: str = "auto") -> dict[str, Any]:
    m = manifest()
    m["spec"]["placement"] = {"availabilityZone": zone}
    return m


def _provision(m: dict[str, Any], status: JobStatus, choice: ZoneChoice | None) -> Decision:
    return reconcile(m, status, Observed(now=NOW, zone_choice=choice), training_package=PACKAGE)


def _created(d: Decision) -> dict[str, Any]:
    (create,) = [a for a in d.actions if isinstance(a, CreateRayCluster)]
    return create.manifest


def test_auto_records_the_choice_and_why_before_the_cluster() -> None:
    d = _provision(_auto(), at(Phase.PENDING), ZoneChoice("us-east-1c", "best of 2 usable zone(s)"))
    assert d.status.phase == Phase.PROVISIONING
    assert d.status.placement == {"availabilityZone": "us-east-1c", "reason": "best of 2 usable zone(s)"}
    placed = get_condition(d.status.conditions, ConditionType.ZONE_PLACED)
    assert placed is not None
    assert (placed["status"], placed["reason"], placed["message"]) == (
        "True",
        "ZoneChosen",
        "workers placed in us-east-1c: best of 2 usable zone(s)",
    )
    assert selector(_created(d))[ZONE] == "us-east-1c"
    assert JobStatus.from_dict(d.status.to_dict()).placement == d.status.placement


def test_auto_without_aws_runs_unconstrained_and_says_so() -> None:
    d = _provision(_auto(), at(Phase.PENDING), ZoneChoice("", "no AWS credentials (IRSA or an instance role)"))
    assert d.status.phase == Phase.PROVISIONING  # not an error
    assert d.status.placement == {"availabilityZone": "", "reason": "no AWS credentials (IRSA or an instance role)"}
    placed = get_condition(d.status.conditions, ConditionType.ZONE_PLACED)
    assert placed is not None and (placed["status"], placed["reason"]) == ("False", "NoZoneChosen")
    assert placed["message"] == "workers run without a zone constraint: no AWS credentials (IRSA or an instance role)"
    assert ZONE not in selector(_created(d))
    assert not [a for a in d.actions if getattr(a, "type", "") == "Warning"]


def test_the_recorded_zone_holds_when_the_cluster_is_created_again() -> None:
    """A RayCluster lost while provisioning comes back in the zone recorded, whatever AWS would say now."""
    status = at(Phase.PROVISIONING, placement={"availabilityZone": "us-east-1c", "reason": "r"})
    d = _provision(_auto(), status, ZoneChoice("us-east-1a", "a newer opinion"))
    assert d.status.placement["availabilityZone"] == "us-east-1c"
    assert selector(_created(d))[ZONE] == "us-east-1c"


def test_a_given_zone_needs_no_decision() -> None:
    d = _provision(_auto("us-east-1b"), at(Phase.PENDING), None)
    assert d.status.placement == {}
    assert get_condition(d.status.conditions, ConditionType.ZONE_PLACED) is None
    assert selector(_created(d))[ZONE] == "us-east-1b"


def test_resume_looks_for_a_zone_again() -> None:
    suspended = replace(at(Phase.SUSPENDED), placement={"availabilityZone": "us-east-1c", "reason": "r"}, reason=None)
    d = _provision(_auto(), suspended, None)
    assert d.status.phase == Phase.PENDING and d.status.placement == {}
