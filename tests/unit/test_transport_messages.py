"""TransportVerified and InterconnectHealthy, branch by branch: the exact verdict and words a reader sees.

Each row is a request, what the ranks reported, and the summary, fallback ranks, evidence, condition and
failure message written out in full, so that a changed word, rank list or joiner shows up here.
"""

from __future__ import annotations

from typing import Any

import pytest
from fsdp_operator.decide.transport import interconnect_status, transport_status
from fsdp_train.contract.events import Probe, Transport, TransportName


def t(rank: int, kind: TransportName, evidence: str = "", plugin: str = "", provider: str = "") -> Transport:
    return Transport(rank=rank, transport=kind, evidence=evidence, plugin=plugin, provider=provider)


CASES: dict[str, tuple[Any, ...]] = {
    # name: (requested, requireEFA, events, world size)
    #    -> (summary, fallback ranks, evidence, fail, failure message, (status, reason, message))
    "auto without EFA anywhere: only a failed init is a fallback": (
        ("auto", False, [t(0, "socket", "S0"), t(1, "init-failed", "F1")], 2),
        ("mixed", (1,), "F1", False, "",
         ("False", "PluginMissing", "auto requested, NCCL could not initialise any network plugin on rank 1: F1")),
    ),
    "socket: a failed init, no evidence line": (
        ("socket", False, [t(0, "socket"), t(1, "init-failed")], 2),
        ("mixed", (1,), "", False, "",
         ("False", "PluginMissing", "socket requested, NCCL could not initialise any network plugin on rank 1")),
    ),
    "socket never fails the job, whatever requireEFA says": (
        ("socket", True, [t(0, "socket"), t(1, "init-failed", "F1")], 2),
        ("mixed", (1,), "F1", False, "",
         ("False", "PluginMissing", "socket requested, NCCL could not initialise any network plugin on rank 1: F1")),
    ),
    "socket accepts any network transport": (
        ("socket", False, [t(0, "efa", "E0"), t(1, "socket", "S1")], 2),
        ("mixed", (), "E0", False, "",
         ("True", "Verified", "socket requested, NCCL used efa/socket on every networked rank")),
    ),
    "intra-node ranks are named": (
        ("socket", False, [t(0, "ib", "I0"), t(1, "socket", "S1"), t(2, "none", "N2")], 3),
        ("mixed", (), "I0", False, "",
         ("True", "Verified", "socket requested, NCCL used ib/socket on every networked rank; rank 2 intra-node only")),
    ),
    "only intra-node peers: nothing proven": (
        ("efa", True, [t(0, "none", "N0"), t(1, "none")], 2),
        ("none", (), "N0", False, "",
         ("Unknown", "NotObserved",
          "every rank talks only to peers on its own node (P2P/SHM/NVLink); no network transport was used")),
    ),
    "efa without plugin or provider printed": (
        ("efa", True, [t(0, "efa"), t(1, "efa")], 2),
        ("efa", (), "", False, "",
         ("True", "Verified",
          "efa requested, NCCL used efa (Libfabric, provider not printed) on every networked rank")),
    ),
    "efa with the plugin named and intra-node ranks": (
        ("efa", True, [t(0, "efa", "E0", "OFI", "efa"), t(1, "none"), t(2, "none")], 3),
        ("efa", (), "E0", False, "",
         ("True", "Verified",
          "efa requested, NCCL used efa (OFI, provider efa) on every networked rank; ranks 1, 2 intra-node only")),
    ),
    "IB instead of EFA": (
        ("efa", False, [t(0, "ib", "I0"), t(1, "ib")], 2),
        ("ib", (0, 1), "I0", False, "",
         ("False", "PluginMissing", "efa requested, NCCL used IB, not the Libfabric (EFA) plugin, on ranks 0, 1: I0")),
    ),
    "requireEFA with socket and IB ranks fails with every one of them": (
        ("efa", True, [t(0, "efa", "E0"), t(1, "socket"), t(2, "ib", "I2"), t(3, "socket", "S3")], 4),
        ("mixed", (1, 2, 3), "", True,
         "EFA required but NCCL used ib/socket on ranks 1, 2, 3 (of 4): no evidence line",
         ("False", "SocketFallback", "efa requested, NCCL fell back to sockets on ranks 1, 3 of 4")),
    ),
    "requireEFA: the fallback rank's evidence": (
        ("auto", True, [t(0, "efa", "E0"), t(1, "socket", "S1")], 2),
        ("mixed", (1,), "S1", True, "EFA required but NCCL used socket on rank 1 (of 2): S1",
         ("False", "SocketFallback", "auto requested, NCCL fell back to sockets on rank 1 of 2: S1")),
    ),
    "a rank whose log said nothing": (
        ("efa", True, [t(0, "efa", "E0"), t(1, "unknown")], 2),
        ("unknown", (), "E0", False, "",
         ("Unknown", "NotObserved", "the NCCL log did not show the transport on rank 1")),
    ),
    "a rank whose log said nothing, with its last line": (
        ("efa", True, [t(0, "unknown", "U0"), t(1, "efa", "E1")], 2),
        ("unknown", (), "E1", False, "",
         ("Unknown", "NotObserved", "the NCCL log did not show the transport on rank 0: U0")),
    ),
    "no EFA rank: the first rank's evidence": (
        ("socket", False, [t(1, "socket", "S1"), t(0, "socket", "S0")], 2),
        ("socket", (), "S0", False, "",
         ("True", "Verified", "socket requested, NCCL used socket on every networked rank")),
    ),
    "not every rank reported yet": (
        ("efa", True, [t(0, "efa", "E0")], 2),
        ("pending", (), "E0", False, "", ("Unknown", "NotObserved", "1/2 ranks reported their NCCL transport")),
    ),
    "a fallback shows before the others report": (
        ("efa", False, [t(3, "socket", "S3")], 4),
        ("socket", (3,), "S3", False, "",
         ("False", "SocketFallback", "efa requested, NCCL fell back to sockets on rank 3 of 4: S3")),
    ),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(CASES))
def test_transport_verdicts_word_for_word(name: str) -> None:
    (requested, require_efa, events, world_size), (summary, fallback, evidence, fail, failure, cond) = CASES[name]
    s = transport_status(requested, require_efa, events, world_size)
    assert (s.summary, s.fallback_ranks, s.evidence, s.fail, s.failure_message) == (
        summary, fallback, evidence, fail, failure,
    )  # fmt: skip
    assert s.condition == {"type": "TransportVerified", "status": cond[0], "reason": cond[1], "message": cond[2]}
    assert s.to_status()["requested"] == requested
    assert s.to_status()["fallbackRanks"] == list(fallback)


def test_the_latest_event_of_a_rank_wins() -> None:
    s = transport_status("efa", True, [t(0, "socket", "S0"), t(1, "efa"), t(0, "efa", "E0")], 2)
    assert (s.summary, s.fail, s.fallback_ranks) == ("efa", False, ())
    assert [r["transport"] for r in s.to_status()["ranks"]] == ["efa", "efa"]


def probe(scope: str, ranks: int, allreduce: float, allgather: float) -> Probe:
    return Probe(rank=0, scope=scope, ranks=ranks, size_bytes=4096, allreduce_busbw_gbps=allreduce,  # type: ignore[arg-type]
                 allgather_busbw_gbps=allgather)  # fmt: skip


def test_interconnect_with_the_all_ranks_probe_only() -> None:
    s = interconnect_status([probe("all", 8, 41.23456, 39.87654)], 3.14159)
    assert s.condition == {
        "type": "InterconnectHealthy",
        "status": "Unknown",
        "reason": "NotMeasured",
        "message": "no cross-node probe (ranks on one node, or not reported yet); all 8 ranks: all-reduce 41.23 GB/s",
    }
    assert s.to_status() == {
        "floorGBps": 3.142,
        "allRanks": {"ranks": 8, "sizeBytes": 4096, "allreduceBusbwGBps": 41.235, "allgatherBusbwGBps": 39.877},
    }


def test_interconnect_below_and_above_the_floor_word_for_word() -> None:
    below = interconnect_status([probe("cross-node", 2, 1.23456, 2.0)], 3.14159)
    assert below.condition["message"] == (
        "cross-node all-reduce bus bandwidth 1.23 GB/s over 2 ranks is below the floor of 3.14 GB/s"
    )
    assert below.to_status()["crossNode"] == {
        "ranks": 2, "sizeBytes": 4096, "allreduceBusbwGBps": 1.235, "allgatherBusbwGBps": 2.0,
    }  # fmt: skip
    above = interconnect_status([probe("cross-node", 2, 1.0, 1.0), probe("cross-node", 4, 7.5, 6.0)], 5.0)
    assert above.condition == {
        "type": "InterconnectHealthy",
        "status": "True",
        "reason": "Healthy",
        "message": "cross-node all-reduce bus bandwidth 7.50 GB/s over 4 ranks, floor 5.00 GB/s",
    }
    assert "allRanks" not in above.to_status()
