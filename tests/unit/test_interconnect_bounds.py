"""InterconnectHealthy at its edges: the floor on both sides, and probes that measured nothing usable."""

from __future__ import annotations

import math

import pytest
from fsdp_operator.decide.transport import INTERCONNECT_CONDITION, interconnect_status
from fsdp_train.contract.events import Probe


def cross(busbw: float) -> Probe:
    return Probe(
        rank=0, scope="cross-node", ranks=2, size_bytes=1024, allreduce_busbw_gbps=busbw, allgather_busbw_gbps=1.0
    )


@pytest.mark.parametrize(
    ("busbw", "status", "reason"),
    [
        (4.99, "False", "BelowFloor"),  # just under the floor
        (5.0, "True", "Healthy"),  # exactly the floor clears it
        (5.01, "True", "Healthy"),
    ],
)
def test_the_floor_on_both_sides(busbw: float, status: str, reason: str) -> None:
    condition = interconnect_status([cross(busbw)], floor_gbps=5.0).condition
    assert (condition["type"], condition["status"], condition["reason"]) == (INTERCONNECT_CONDITION, status, reason)


@pytest.mark.parametrize("busbw", [math.nan, math.inf, -math.inf])
def test_a_probe_without_a_usable_figure_is_never_healthy(busbw: float) -> None:
    """A probe timed at zero seconds gives infinity, a broken one NaN: neither proves the link is fine."""
    condition = interconnect_status([cross(busbw)], floor_gbps=5.0).condition
    assert (condition["status"], condition["reason"]) == ("Unknown", "NotMeasured")
    assert condition["message"].startswith("the cross-node probe gave no usable all-reduce bus bandwidth")


@pytest.mark.parametrize("floor", [0.0, 5.0])
def test_no_probe_at_all_is_unknown(floor: float) -> None:
    condition = interconnect_status([], floor_gbps=floor).condition
    assert (condition["status"], condition["reason"], condition["message"]) == (
        "Unknown",
        "NotMeasured",
        "no probe yet",
    )
