"""`fsdpctl diagnose nccl FILE...`: the transport verdict for NCCL logs a user already has.

The logs can come from ``kubectl logs``, Ray session logs or ``NCCL_DEBUG_FILE`` files; ``-`` reads
stdin and ``.gz`` files are read as gzip. One verdict per file and per rank, as text or JSON.
Exit status: 0 when every file shows EFA, 1 when any shows a fallback, a failed init, no network
transport or nothing decisive, 2 when an input cannot be read (one line on stderr, no traceback).
"""

from __future__ import annotations

import gzip
import json
import sys
import zlib
from dataclasses import asdict
from typing import Any

from fsdp_train.contract.nccl import NcclVerdict, classify_by_rank, combine

EXIT_EFA = 0
EXIT_NOT_EFA = 1
EXIT_UNREADABLE = 2

OUTPUTS = ("text", "json")


def _read(path: str) -> str:
    if path == "-":
        return sys.stdin.read()
    if path.endswith(".gz"):
        with gzip.open(path, "rt", encoding="utf-8", errors="replace") as f:
            return f.read()
    # NCCL logs are ASCII; a stray byte must not stop the diagnosis.
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()


def _meaning(verdict: NcclVerdict) -> str:
    return {
        "efa": "EFA in use",
        "socket": "NCCL used TCP sockets, not EFA",
        "ib": "NCCL used InfiniBand verbs, not EFA",
        "none": "intra-node only (P2P/SHM/NVLink), no network transport in use",
        "init-failed": "NCCL could not initialise a network plugin",
        "unknown": "the log does not show which transport NCCL used",
    }[verdict.transport]


def _details(verdict: NcclVerdict) -> str:
    parts = [
        f"{label}={value}"
        for label, value in (
            ("plugin", verdict.plugin),
            ("provider", verdict.provider),
            ("nccl", verdict.nccl_version),
            ("aws-ofi-nccl", verdict.ofi_version),
        )
        if value
    ]
    return "  ".join(parts)


def _text(path: str, verdict: NcclVerdict, ranks: dict[str, NcclVerdict]) -> list[str]:
    name = "<stdin>" if path == "-" else path
    lines = [f"{name}: {verdict.transport} ({_meaning(verdict)})"]
    if details := _details(verdict):
        lines.append(f"  {details}")
    lines.append(f"  evidence: {verdict.evidence or '-'}")
    if len(ranks) > 1 or any(v.rank is not None for v in ranks.values()):
        for key, rank in ranks.items():
            label = f"rank {key}" if rank.rank is not None and key == str(rank.rank) else key
            where = f" ({rank.process})" if rank.process and rank.process != key else ""
            lines.append(f"  {label}{where}: {rank.transport}  {rank.evidence or '-'}")
    return lines


def _json(path: str, verdict: NcclVerdict, ranks: dict[str, NcclVerdict]) -> dict[str, Any]:
    def plain(v: NcclVerdict) -> dict[str, Any]:
        data = asdict(v)
        data["evidence_lines"] = list(v.evidence_lines)
        return data

    result = plain(verdict)
    # Per-file: the evidence lines are in the ranks; process and rank belong to the ranks.
    del result["process"], result["rank"], result["evidence_lines"]
    return {"path": path, "efa": verdict.transport == "efa", **result, "ranks": {k: plain(v) for k, v in ranks.items()}}


def diagnose_nccl(paths: list[str], output: str = "text") -> int:
    """Print one verdict per file and per rank; return the exit status (see the module docstring)."""
    if output not in OUTPUTS:
        print(f"diagnose nccl: unknown output {output!r}; use one of {', '.join(OUTPUTS)}", file=sys.stderr)
        return EXIT_UNREADABLE
    if not paths:
        print("diagnose nccl: no log files given ('-' reads stdin)", file=sys.stderr)
        return EXIT_UNREADABLE
    status = EXIT_EFA
    reports: list[dict[str, Any]] = []
    for path in paths:
        try:
            text = _read(path)
        except (OSError, EOFError, zlib.error) as e:
            # OSError covers missing files, directories and permissions; EOFError a truncated gzip.
            print(f"diagnose nccl: cannot read {path}: {getattr(e, 'strerror', None) or e}", file=sys.stderr)
            status = EXIT_UNREADABLE
            reports.append({"path": path, "error": str(e)})
            continue
        ranks = classify_by_rank(text)
        verdict = combine(ranks.values())
        if verdict.transport != "efa" and status == EXIT_EFA:
            status = EXIT_NOT_EFA
        if output == "json":
            reports.append(_json(path, verdict, ranks))
        else:
            print("\n".join(_text(path, verdict, ranks)))
    if output == "json":
        print(json.dumps({"files": reports, "efa": status == EXIT_EFA}, indent=2))
    return status
