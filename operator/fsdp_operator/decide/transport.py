"""status.transport and status.interconnect from the ranks' Transport and Probe events (pure, no I/O).

The reconcile loop feeds in the events seen so far and writes back what these functions return:
the two status sections, their conditions (``TransportVerified``, ``InterconnectHealthy``; the status
writer adds ``lastTransitionTime``), and whether the job must fail (``requireEFA`` and a rank off EFA).

Transport semantics, per rank (from ``fsdp_train.contract.nccl``): ``efa``, ``socket``, ``ib``, ``none``
(intra-node peers only, which says nothing about the network), ``init-failed``, ``unknown``.
A *fallback rank* is one whose transport contradicts the request:

- ``efa``: any rank on ``socket``, ``ib`` or ``init-failed``.
- ``auto`` (use EFA when NCCL finds it): ``init-failed`` ranks, and ``socket``/``ib`` ranks when
  another rank does use EFA (a ring with one socket link runs at socket speed) or ``requireEFA``
  is set (then ``auto`` is held to EFA like ``efa``).
- ``socket``: ``init-failed`` ranks; any network transport is accepted.

``requireEFA`` fails the job on the first fallback rank of an ``efa`` or ``auto`` request; ``none``
and ``unknown`` ranks never fail it (nothing proves a fallback), they leave the condition Unknown.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fsdp_train.contract.events import Probe, Transport

if TYPE_CHECKING:
    from fsdp_operator.api.spec import Transport as RequestedTransport

TRANSPORT_CONDITION = "TransportVerified"
INTERCONNECT_CONDITION = "InterconnectHealthy"
FAILURE_REASON = "TransportFallback"
"""The job's failure reason when ``requireEFA`` is set and a rank is not on EFA."""
UNVERIFIED_REASON = "TransportUnverified"
"""The job's failure reason when ``requireEFA`` is set and a rank reported no verified transport in time."""

Condition = dict[str, str]
"""A ``metav1.Condition`` without ``lastTransitionTime``: type, status, reason, message."""

_NOT_EFA = ("socket", "ib", "init-failed")
_NETWORK = ("efa", "socket", "ib")


def _condition(type_: str, status: str, reason: str, message: str) -> Condition:
    return {"type": type_, "status": status, "reason": reason, "message": message}


def _ranks_text(ranks: Iterable[int]) -> str:
    items = sorted(ranks)
    return ("rank " if len(items) == 1 else "ranks ") + ", ".join(map(str, items))


@dataclass(frozen=True, slots=True)
class TransportStatus:
    """What the ranks' NCCL logs say about the network, measured against what the spec asked for."""

    requested: str
    summary: str
    """``efa``, ``socket``, ``ib``, ``none``, ``init-failed``, ``unknown``, ``mixed`` or ``pending``."""
    ranks: tuple[Transport, ...]
    """The latest event of each rank that reported, by rank."""
    fallback_ranks: tuple[int, ...]
    evidence: str
    """The most telling NCCL line: a fallback rank's when there is one."""
    condition: Condition
    """The ``TransportVerified`` condition."""
    fail: bool
    """True when the job must fail now with reason :data:`FAILURE_REASON`."""
    failure_message: str
    """The job's failure message (set when ``fail``): which ranks, which transport, the evidence."""

    def to_status(self) -> dict[str, Any]:
        """The ``status.transport`` section."""
        return {
            "requested": self.requested,
            "summary": self.summary,
            "ranks": [
                {
                    "rank": e.rank,
                    "transport": e.transport,
                    "plugin": e.plugin,
                    "provider": e.provider,
                    "evidence": e.evidence,
                }
                for e in self.ranks
            ],
            "fallbackRanks": list(self.fallback_ranks),
            "evidence": self.evidence,
        }


def transport_status(
    requested: RequestedTransport,
    require_efa: bool,
    events: Iterable[Transport],
    world_size: int,
) -> TransportStatus:
    """Fold the Transport events seen so far (later events of a rank replace earlier ones)."""
    latest: dict[int, Transport] = {}
    for event in events:
        latest[event.rank] = event
    ranks = tuple(latest[r] for r in sorted(latest))
    by_kind: dict[str, list[int]] = {}
    for event in ranks:
        by_kind.setdefault(event.transport, []).append(event.rank)

    fallback = _fallback_ranks(requested, require_efa, by_kind)
    summary = _summary(by_kind, complete=len(ranks) >= world_size)
    telling = next((latest[r] for r in fallback), None) or next(
        (e for e in ranks if e.transport == "efa"), ranks[0] if ranks else None
    )
    evidence = telling.evidence if telling else ""
    condition = _transport_condition(requested, latest, by_kind, fallback, world_size)

    not_efa = [r for r in fallback if latest[r].transport in _NOT_EFA]
    # A socket request never fails on transport (the spec rejects requireEFA with it anyway).
    fail = require_efa and requested != "socket" and bool(not_efa)
    failure_message = ""
    if fail:
        first = latest[not_efa[0]]
        kinds = sorted({latest[r].transport for r in not_efa})
        failure_message = (
            f"EFA required but NCCL used {'/'.join(kinds)} on {_ranks_text(not_efa)} "
            f"(of {world_size}): {first.evidence or 'no evidence line'}"
        )
    return TransportStatus(
        requested=requested,
        summary=summary,
        ranks=ranks,
        fallback_ranks=tuple(fallback),
        evidence=evidence,
        condition=condition,
        fail=fail,
        failure_message=failure_message,
    )


def _fallback_ranks(requested: str, require_efa: bool, by_kind: dict[str, list[int]]) -> list[int]:
    if requested == "efa" or (requested == "auto" and require_efa):
        kinds: tuple[str, ...] = _NOT_EFA
    elif requested == "auto":
        kinds = _NOT_EFA if by_kind.get("efa") else ("init-failed",)
    else:
        kinds = ("init-failed",)
    return sorted(r for kind in kinds for r in by_kind.get(kind, []))


def _summary(by_kind: dict[str, list[int]], *, complete: bool) -> str:
    if not by_kind:
        return "pending"
    network = set(by_kind) - {"none"}
    if network & set(_NOT_EFA):
        # A fallback shows at once, before the other ranks report.
        return network.pop() if len(network) == 1 else "mixed"
    if not complete:
        return "pending"
    if not network:
        return "none"
    if "unknown" in network:
        return "unknown"
    return network.pop() if len(network) == 1 else "mixed"


def _transport_condition(
    requested: str,
    latest: dict[int, Transport],
    by_kind: dict[str, list[int]],
    fallback: list[int],
    world_size: int,
) -> Condition:
    def make(status: str, reason: str, message: str) -> Condition:
        return _condition(TRANSPORT_CONDITION, status, reason, message)

    def evidence(ranks: list[int]) -> str:
        line = latest[ranks[0]].evidence
        return f": {line}" if line else ""

    if fallback:
        socket = [r for r in fallback if latest[r].transport == "socket"]
        if socket:
            return make(
                "False",
                "SocketFallback",
                f"{requested} requested, NCCL fell back to sockets on {_ranks_text(socket)} of {world_size}"
                + evidence(socket),
            )
        failed = [r for r in fallback if latest[r].transport == "init-failed"]
        if failed:
            what = f"NCCL could not initialise any network plugin on {_ranks_text(failed)}" + evidence(failed)
        else:
            what = f"NCCL used IB, not the Libfabric (EFA) plugin, on {_ranks_text(fallback)}" + evidence(fallback)
        return make("False", "PluginMissing", f"{requested} requested, {what}")
    observed = len(latest)
    if observed < world_size:
        return make("Unknown", "NotObserved", f"{observed}/{world_size} ranks reported their NCCL transport")
    if unknown := by_kind.get("unknown"):
        return make(
            "Unknown",
            "NotObserved",
            f"the NCCL log did not show the transport on {_ranks_text(unknown)}" + evidence(unknown),
        )
    network = sorted(set(by_kind) & set(_NETWORK))
    if not network:
        return make(
            "Unknown",
            "NotObserved",
            "every rank talks only to peers on its own node (P2P/SHM/NVLink); no network transport was used",
        )
    used = "/".join(network)
    if network == ["efa"]:
        first = latest[by_kind["efa"][0]]
        used = f"efa ({first.plugin or 'Libfabric'}, provider {first.provider or 'not printed'})"
    local = by_kind.get("none", [])
    local_note = f"; {_ranks_text(local)} intra-node only" if local else ""
    return make("True", "Verified", f"{requested} requested, NCCL used {used} on every networked rank{local_note}")


@dataclass(frozen=True, slots=True)
class InterconnectStatus:
    """The collective probe's bus bandwidth, and whether the cross-node figure clears the floor."""

    all_ranks: Probe | None
    cross_node: Probe | None
    floor_gbps: float
    """The cross-node all-reduce floor in GB/s (10^9 bytes per second, the unit of Probe's fields)."""
    condition: Condition
    """The ``InterconnectHealthy`` condition."""

    def to_status(self) -> dict[str, Any]:
        """The ``status.interconnect`` section."""
        status: dict[str, Any] = {"floorGBps": round(self.floor_gbps, 3)}
        if self.all_ranks is not None:
            status["allRanks"] = _probe_status(self.all_ranks)
        if self.cross_node is not None:
            status["crossNode"] = _probe_status(self.cross_node)
        return status


def _finite(value: float) -> float | None:
    # JSON, and so the API server, has no NaN or infinity (a probe timed at zero seconds gives one).
    return round(value, 3) if math.isfinite(value) else None


def _probe_status(probe: Probe) -> dict[str, Any]:
    return {
        "ranks": probe.ranks,
        "sizeBytes": probe.size_bytes,
        "allreduceBusbwGBps": _finite(probe.allreduce_busbw_gbps),
        "allgatherBusbwGBps": _finite(probe.allgather_busbw_gbps),
    }


def interconnect_status(probes: Iterable[Probe], floor_gbps: float) -> InterconnectStatus:
    """Latest probe per scope; ``InterconnectHealthy`` is False when cross-node all-reduce < floor."""
    latest: dict[str, Probe] = {}
    for probe in probes:
        latest[probe.scope] = probe
    all_ranks, cross = latest.get("all"), latest.get("cross-node")

    def make(status: str, reason: str, message: str) -> Condition:
        return _condition(INTERCONNECT_CONDITION, status, reason, message)

    if cross is None:
        measured = (
            f"; all {all_ranks.ranks} ranks: all-reduce {all_ranks.allreduce_busbw_gbps:.2f} GB/s" if all_ranks else ""
        )
        what = "no cross-node probe (ranks on one node, or not reported yet)" if all_ranks else "no probe yet"
        condition = make("Unknown", "NotMeasured", what + measured)
    elif not math.isfinite(cross.allreduce_busbw_gbps):
        # NaN compares False with any floor and infinity clears every floor: neither proves the link is healthy.
        condition = make(
            "Unknown",
            "NotMeasured",
            f"the cross-node probe gave no usable all-reduce bus bandwidth ({cross.allreduce_busbw_gbps} GB/s)",
        )
    else:
        busbw = cross.allreduce_busbw_gbps
        figures = f"cross-node all-reduce bus bandwidth {busbw:.2f} GB/s over {cross.ranks} ranks"
        if busbw < floor_gbps:
            condition = make("False", "BelowFloor", f"{figures} is below the floor of {floor_gbps:.2f} GB/s")
        else:
            condition = make("True", "Healthy", f"{figures}, floor {floor_gbps:.2f} GB/s")
    return InterconnectStatus(all_ranks=all_ranks, cross_node=cross, floor_gbps=floor_gbps, condition=condition)
