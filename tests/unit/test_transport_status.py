"""status.transport / status.interconnect and their conditions, from rank events (no Kubernetes)."""

from __future__ import annotations

from pathlib import Path

import pytest
from fsdp_operator.decide.transport import (
    FAILURE_REASON,
    INTERCONNECT_CONDITION,
    TRANSPORT_CONDITION,
    interconnect_status,
    transport_status,
)
from fsdp_train.contract.events import Probe, Transport, TransportName, parse_line
from fsdp_train.contract.nccl import classify_by_rank

NCCL_DIR = Path(__file__).resolve().parents[1] / "data" / "nccl"
EFA_LINE = "ip-10-0-1-17:2211:2211 [0] NCCL INFO NET/OFI Selected provider is efa, fabric is efa (found 1 nics)"
SOCKET_LINE = "vm:883:883 [1] NCCL INFO Channel 00/0 : 0[0] -> 1[1] [receive] via NET/Socket/0"


def event(rank: int, transport: TransportName, evidence: str = "") -> Transport:
    plugin = {"efa": "Libfabric", "socket": "Socket", "ib": "IB"}.get(transport, "")
    provider = "efa" if transport == "efa" else ""
    return Transport(rank=rank, transport=transport, plugin=plugin, provider=provider, evidence=evidence)


def efa(rank: int) -> Transport:
    return event(rank, "efa", EFA_LINE)


def test_nothing_reported_is_pending_and_not_observed() -> None:
    s = transport_status("efa", True, [], world_size=4)
    assert (s.summary, s.fail, s.evidence, s.fallback_ranks) == ("pending", False, "", ())
    assert s.condition == {
        "type": TRANSPORT_CONDITION,
        "status": "Unknown",
        "reason": "NotObserved",
        "message": "0/4 ranks reported their NCCL transport",
    }
    assert s.to_status() == {"requested": "efa", "summary": "pending", "ranks": [], "fallbackRanks": [], "evidence": ""}


def test_efa_on_every_rank_is_verified() -> None:
    s = transport_status("efa", True, [efa(r) for r in (3, 1, 0, 2)], world_size=4)
    assert (s.summary, s.fail, s.fallback_ranks) == ("efa", False, ())
    assert (s.condition["status"], s.condition["reason"]) == ("True", "Verified")
    assert "efa (Libfabric, provider efa)" in s.condition["message"]
    status = s.to_status()
    assert [r["rank"] for r in status["ranks"]] == [0, 1, 2, 3]
    assert status["ranks"][0] == {
        "rank": 0,
        "transport": "efa",
        "plugin": "Libfabric",
        "provider": "efa",
        "evidence": EFA_LINE,
    }
    assert status["evidence"] == EFA_LINE


def test_partial_efa_is_pending() -> None:
    s = transport_status("efa", True, [efa(0), efa(1)], world_size=4)
    assert (s.summary, s.condition["status"], s.condition["reason"]) == ("pending", "Unknown", "NotObserved")
    assert "2/4" in s.condition["message"]


def test_first_socket_rank_fails_a_require_efa_job_at_once() -> None:
    s = transport_status("efa", True, [event(1, "socket", SOCKET_LINE)], world_size=8)
    assert s.fail
    assert s.summary == "socket"
    assert s.fallback_ranks == (1,)
    assert s.evidence == SOCKET_LINE
    assert (s.condition["status"], s.condition["reason"]) == ("False", "SocketFallback")
    assert SOCKET_LINE in s.condition["message"] and SOCKET_LINE in s.failure_message
    assert "rank 1" in s.failure_message
    assert FAILURE_REASON == "TransportFallback"


def test_fallback_without_require_efa_is_a_warning_only() -> None:
    s = transport_status("efa", False, [efa(0), event(1, "socket", SOCKET_LINE)], world_size=2)
    assert not s.fail and s.failure_message == ""
    assert s.summary == "mixed"
    assert s.fallback_ranks == (1,)
    assert (s.condition["status"], s.condition["reason"]) == ("False", "SocketFallback")
    # The fallback rank's line is the telling one, not rank 0's EFA line.
    assert s.evidence == SOCKET_LINE


def test_init_failure_is_plugin_missing() -> None:
    line = "[2026-11-29 20:12:42] vm:818:818 [0] plugin/net.cc:379 NCCL WARN Failed to initialize any NET plugin"
    s = transport_status("efa", True, [event(0, "init-failed", line), event(1, "init-failed", line)], world_size=2)
    assert s.fail and s.summary == "init-failed"
    assert (s.condition["status"], s.condition["reason"]) == ("False", "PluginMissing")
    assert line in s.condition["message"]


def test_ib_instead_of_efa_is_plugin_missing() -> None:
    s = transport_status("efa", True, [efa(0), event(1, "ib", "via NET/IB/0")], world_size=2)
    assert s.fail and s.fallback_ranks == (1,)
    assert s.condition["reason"] == "PluginMissing"


def test_intra_node_only_ranks_do_not_count_against_efa() -> None:
    s = transport_status("efa", True, [efa(0), event(1, "none", "via P2P/CUMEM")], world_size=2)
    assert (s.summary, s.fail, s.condition["reason"]) == ("efa", False, "Verified")
    assert "rank 1 intra-node only" in s.condition["message"]


def test_every_rank_intra_node_is_not_observed_and_does_not_fail() -> None:
    s = transport_status("efa", True, [event(r, "none") for r in range(4)], world_size=4)
    assert (s.summary, s.fail) == ("none", False)
    assert (s.condition["status"], s.condition["reason"]) == ("Unknown", "NotObserved")


def test_unknown_rank_leaves_the_condition_unknown() -> None:
    s = transport_status("efa", True, [efa(0), event(1, "unknown", "NCCL_DEBUG_FILE is not set")], world_size=2)
    assert (s.summary, s.fail) == ("unknown", False)
    assert (s.condition["status"], s.condition["reason"]) == ("Unknown", "NotObserved")
    assert s.condition["message"].endswith("on rank 1: NCCL_DEBUG_FILE is not set")


def test_socket_requested_socket_is_verified() -> None:
    s = transport_status("socket", False, [event(r, "socket", SOCKET_LINE) for r in range(2)], world_size=2)
    assert (s.summary, s.fail, s.fallback_ranks) == ("socket", False, ())
    assert (s.condition["status"], s.condition["reason"]) == ("True", "Verified")


def test_socket_requested_ignores_require_efa() -> None:
    s = transport_status("socket", True, [event(0, "socket", SOCKET_LINE)], world_size=1)
    assert not s.fail


def test_auto_accepts_one_transport_but_not_a_mix() -> None:
    uniform = transport_status("auto", False, [event(r, "socket", SOCKET_LINE) for r in range(2)], world_size=2)
    assert (uniform.fail, uniform.summary, uniform.condition["reason"]) == (False, "socket", "Verified")
    mixed = transport_status("auto", False, [efa(0), event(1, "socket", SOCKET_LINE)], world_size=2)
    assert (mixed.fail, mixed.summary, mixed.fallback_ranks) == (False, "mixed", (1,))
    assert mixed.condition["reason"] == "SocketFallback"


def test_auto_with_require_efa_is_held_to_efa() -> None:
    s = transport_status("auto", True, [event(r, "socket", SOCKET_LINE) for r in range(2)], world_size=2)
    assert (s.fail, s.fallback_ranks, s.condition["reason"]) == (True, (0, 1), "SocketFallback")


def test_a_later_event_of_a_rank_replaces_the_earlier_one() -> None:
    s = transport_status("efa", True, [event(0, "unknown"), efa(0)], world_size=1)
    assert (s.summary, s.condition["reason"]) == ("efa", "Verified")


def test_from_real_logs_through_events() -> None:
    """The path the operator takes: NCCL log -> rank's Transport event line -> status."""
    ranks = classify_by_rank((NCCL_DIR / "h200-silent-socket-fallback.log").read_text())
    lines = [
        Transport(rank=v.rank or 0, transport=v.transport, plugin=v.plugin, evidence=v.evidence).to_line()
        for v in ranks.values()
    ]
    events = [e for e in map(parse_line, lines) if isinstance(e, Transport)]
    s = transport_status("efa", True, events, world_size=2)
    assert s.fail and s.fallback_ranks == (0, 1)
    assert "via NET/Socket" in s.failure_message


# --- interconnect ----------------------------------------------------------------------------------------


def probe(scope: str, allreduce: float, ranks: int = 2) -> Probe:
    assert scope in ("all", "cross-node")
    return Probe(
        rank=0,
        scope=scope,  # type: ignore[arg-type]
        ranks=ranks,
        size_bytes=256 << 20,
        allreduce_busbw_gbps=allreduce,
        allgather_busbw_gbps=allreduce / 2,
    )


def test_no_probe_is_not_measured() -> None:
    s = interconnect_status([], floor_gbps=5.0)
    assert s.to_status() == {"floorGBps": 5.0}
    assert (s.condition["type"], s.condition["status"], s.condition["reason"]) == (
        INTERCONNECT_CONDITION,
        "Unknown",
        "NotMeasured",
    )


def test_single_node_probe_is_reported_but_health_unknown() -> None:
    s = interconnect_status([probe("all", 296.04)], floor_gbps=5.0)
    assert s.to_status()["allRanks"] == {
        "ranks": 2,
        "sizeBytes": 256 << 20,
        "allreduceBusbwGBps": 296.04,
        "allgatherBusbwGBps": 148.02,
    }
    assert "crossNode" not in s.to_status()
    assert s.condition["status"] == "Unknown"
    assert "296.04 GB/s" in s.condition["message"]


@pytest.mark.parametrize(("busbw", "status", "reason"), [(3.7, "False", "BelowFloor"), (12.5, "True", "Healthy")])
def test_cross_node_against_the_floor(busbw: float, status: str, reason: str) -> None:
    s = interconnect_status([probe("all", 40.0, 8), probe("cross-node", busbw)], floor_gbps=5.0)
    assert (s.condition["status"], s.condition["reason"]) == (status, reason)
    assert s.to_status()["crossNode"]["allreduceBusbwGBps"] == busbw
    assert f"{busbw:.2f} GB/s" in s.condition["message"]


def test_latest_probe_per_scope_wins() -> None:
    s = interconnect_status([probe("cross-node", 1.0), probe("cross-node", 9.0)], floor_gbps=5.0)
    assert s.condition["reason"] == "Healthy"
