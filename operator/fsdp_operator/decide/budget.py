"""What one status write holds: the progress-only patch, the merge patch, the size budget. Pure."""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from typing import Any

from fsdp_train.contract.events import (
    TRUNCATED,
)

from fsdp_operator.api.schema import MESSAGE_LIMIT
from fsdp_operator.decide.status import _visible

# Fields that change with every training step; writes that only touch these are rate-limited.
# `health` too: the ranks' timing reports; a stall or a straggler also changes a condition, which is written at once.
PROGRESS_FIELDS = frozenset({"progress", "logOffset", "skippedEvents", "health"})


def progress_only(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """True when `new` differs from `old` only in per-step fields (or not at all)."""
    keys = (set(old) | set(new)) - PROGRESS_FIELDS
    return all(old.get(k) == new.get(k) for k in keys)


def merge_patch(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """The RFC 7386 merge patch that turns `old` into `new` (null removes a key)."""
    patch: dict[str, Any] = {}
    for key in set(old) | set(new):
        if key not in new:
            patch[key] = None
        elif key not in old:
            patch[key] = copy.deepcopy(new[key])
        elif isinstance(old[key], Mapping) and isinstance(new[key], Mapping):
            inner = merge_patch(old[key], new[key])
            if inner:
                patch[key] = inner
        elif old[key] != new[key]:
            patch[key] = copy.deepcopy(new[key])
    return patch


STATUS_BUDGET_BASE = 16 * 1024


STATUS_BUDGET_PER_RANK = 2 * 1024


STATUS_BUDGET_MAX = 1024 * 1024
"""The whole object (spec and metadata too) must stay under etcd's 1.5 MiB; the status gets at most 1 MiB."""


def status_budget(ranks: int) -> int:
    """Bytes of JSON a status may take with `ranks` ranks reported: a base plus a few KiB per rank, capped."""
    return min(STATUS_BUDGET_BASE + STATUS_BUDGET_PER_RANK * max(ranks, 0), STATUS_BUDGET_MAX)


def _size(value: Any) -> int:
    # errors="replace": a lone surrogate (only a stored status can hold one now) counts as the byte it becomes.
    return len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode(errors="replace"))


def _cut(text: Any, limit: int) -> Any:
    if isinstance(text, str) and len(text) > limit:
        return text[: limit - len(TRUNCATED)] + TRUNCATED
    return text


def within_budget(status: Mapping[str, Any]) -> dict[str, Any]:
    """`status` (a `JobStatus.to_dict()`) cut to its size budget, with `truncated` saying what was cut.

    Messages are always cut to `MESSAGE_LIMIT`. Past the budget, per-rank detail goes first (NCCL evidence
    lines, host names, pod names, device UUIDs), then rank entries beyond the first N; the job-level
    verdicts (`transport.summary`, `transport.evidence`, conditions, progress, result) always stay.
    """
    out: dict[str, Any] = _visible(dict(status))
    out.pop("truncated", None)
    if "message" in out:
        out["message"] = _cut(out["message"], MESSAGE_LIMIT)
    out["conditions"] = [
        {**c, "message": _cut(c.get("message"), MESSAGE_LIMIT)} if "message" in c else c
        for c in out.get("conditions") or []
    ]
    if not out["conditions"]:
        del out["conditions"]
    stored_transport = out.get("transport")
    transport: dict[str, Any] = stored_transport if isinstance(stored_transport, dict) else {}
    ranks, transport_ranks = list(out.get("ranks") or []), list(transport.get("ranks") or [])
    budget = status_budget(max(len(ranks), len(transport_ranks)))
    if _size(out) <= budget:
        return out
    notes = []
    if any("evidence" in r for r in transport_ranks):
        transport_ranks = [{k: v for k, v in r.items() if k != "evidence"} for r in transport_ranks]
        notes.append("per-rank NCCL evidence (transport.evidence kept)")
    detail = ("hostname", "pod", "deviceUUID")
    if any(key in r for r in ranks for key in detail):
        ranks = [{k: v for k, v in r.items() if k not in detail} for r in ranks]
        notes.append("ranks[].hostname, pod and deviceUUID")
    shown = len(ranks), len(transport_ranks)
    while True:
        if transport:
            out["transport"] = {**transport, "ranks": transport_ranks}
        if ranks or "ranks" in out:
            out["ranks"] = ranks
        size = _size(out)
        if size <= budget or not (ranks or transport_ranks):
            break
        keep = max(int(max(len(ranks), len(transport_ranks)) * budget / size * 0.9), 0)
        ranks, transport_ranks = ranks[:keep], transport_ranks[:keep]
    if (len(ranks), len(transport_ranks)) != shown:
        notes.append(f"rank entries after the first {len(ranks)} of {shown[0]}")
    out["truncated"] = f"left out to stay within the {budget}-byte status budget: " + "; ".join(notes)
    return out
