"""A job's status in a few lines, and its loss curve in the terminal: for `run-local` and `fsdpctl status`.

Pure: a status dict (as the API server stores it) in, text out. The curve is drawn by `uniplot` from
`status.progress.lossHistory`, the bounded history `status.fold_events` keeps.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from uniplot import plot_to_string


def _number(value: Any, digits: int = 4) -> str:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return "-"
    return f"{value:,}" if isinstance(value, int) else f"{value:.{digits}g}"


def summary_lines(status: Mapping[str, Any], *, saved_to: str = "", message: bool = True) -> list[str]:
    """Phase, ranks, transport, bandwidth, steps, loss, tokens/s, and where the full status is.

    `message` False leaves the status message out of the phase line (a caller that prints it on its own).
    """
    phase = status.get("phase") or "no status yet"
    said = f": {status.get('message', '')}" if message and status.get("message") else ""
    lines = [f"phase      {phase}" + (f" ({status['reason']}{said})" if status.get("reason") else "")]
    ranks = [r for r in status.get("ranks") or [] if isinstance(r, Mapping)]
    if ranks:
        nodes = {r.get("nodeIP") or r.get("nodeRank") for r in ranks}
        lines.append(f"ranks      {len(ranks)} on {len(nodes)} node{'s' if len(nodes) != 1 else ''}")
    transport = status.get("transport") or {}
    if transport.get("summary"):
        lines.append(f"transport  {transport['summary']} (requested {transport.get('requested', '-')})")
    for scope, figures in sorted((status.get("interconnect") or {}).items()):
        if isinstance(figures, Mapping) and "allreduceBusbwGBps" in figures:
            lines.append(
                f"bandwidth  {scope}: all-reduce {_number(figures['allreduceBusbwGBps'])} GB/s, "
                f"all-gather {_number(figures.get('allgatherBusbwGBps'))} GB/s"
            )
    progress, result = status.get("progress") or {}, status.get("result") or {}
    if progress.get("stepOfTotal"):
        lines.append(f"steps      {progress['stepOfTotal']}")
    first, last = result.get("firstLoss"), result.get("finalLoss", progress.get("loss"))
    if last is not None:
        lines.append("loss       " + (f"{_number(first)} -> " if first is not None else "") + _number(last))
    if progress.get("evalLoss") is not None:
        lines.append(f"eval loss  {_number(progress['evalLoss'])} after step {progress.get('evalStep', '-')}")
    if progress.get("samplesSeen"):
        lines.append(
            # Counted from 1, as status.result.epochs counts epochs begun (progress.epoch counts from 0).
            f"data       epoch {_int(progress.get('epoch')) + 1}, {_number(progress['samplesSeen'])} sequences, "
            f"{_number(progress.get('tokensSeen', 0))} tokens"
        )
    output = status.get("output") or {}
    if output.get("path"):
        lines.append(f"model      {output['path']} (step {output.get('step', '-')})")
    mean, last = result.get("tokensPerSecond"), progress.get("tokensPerSecond")
    if mean is not None or last is not None:
        # Two figures, each labelled: the mean over training steps 2..N (evaluation, checkpoints and export are
        # outside it), and the last step's, over the last 10 steps, which the TOKENS/S column of `kubectl get` shows.
        figures = [f"{_number(mean)} (mean of training steps 2..N)"] if mean is not None else []
        if last is not None:
            figures.append(f"{_number(last)} (last 10 steps, the table's column)")
        mfu = f", MFU {_number(result['mfu'])}" if "mfu" in result else ""
        lines.append(f"tokens/s   {'; '.join(figures)}{mfu}")
    lines += _attempt_lines(status)
    if status.get("dashboardURL"):
        lines.append(f"dashboard  {status['dashboardURL']}")
    tracking = status.get("tracking") or {}
    if tracking.get("runId"):
        problem = f" (not logging: {tracking['problem']})" if tracking.get("problem") else ""
        lines.append(f"tracking   MLflow run {tracking['runId']} {tracking.get('url', '')}".rstrip() + problem)
    if saved_to:
        lines.append(f"status     {saved_to}")
    return lines


INTERRUPTIONS_SHOWN = 3


def _attempt_lines(status: Mapping[str, Any]) -> list[str]:
    """What the run went through, a line each: its attempts, its last stall, the nodes it lost (the newest few)."""
    lines = []
    attempts, failed = _int(status.get("attempts")), _int(status.get("failedAttempts"))
    interruptions = [e for e in status.get("interruptions") or [] if isinstance(e, Mapping)]
    if attempts > 1:
        parts = [f"{failed} failed"] if failed else []
        if interruptions:
            parts.append(f"{len({_int(e.get('attempt')) for e in interruptions})} interrupted")
        lines.append(f"attempts   {attempts}" + (f" ({', '.join(parts)})" if parts else ""))
    stall = (status.get("health") or {}).get("lastStall")
    if isinstance(stall, Mapping) and stall.get("message"):
        lines.append(f"stalled    attempt {_int(stall.get('attempt'))}: {stall['message']}")
    for entry in interruptions[-INTERRUPTIONS_SHOWN:]:
        where = entry.get("pod") or entry.get("node") or "a worker"
        if entry.get("saved"):
            outcome = f"saved step {_int(entry.get('checkpointStep'))}, {_int(entry.get('stepsLost'))} steps lost"
        elif "saved" in entry:
            outcome = f"not saved: {entry.get('message') or 'no time to save'}"
        else:
            outcome = "noticed; the ranks had not reported yet"
        at = f" at step {_int(entry['step'])}" if entry.get("step") else ""
        why = entry.get("reason", "notice")
        lines.append(f"interrupted attempt {_int(entry.get('attempt'))}{at}: {where} ({why}), {outcome}")
    return lines


def loss_curve(status: Mapping[str, Any], *, width: int = 60, height: int = 10) -> str:
    """The loss over steps as a terminal plot; empty when fewer than two points were reported."""
    history = (status.get("progress") or {}).get("lossHistory") or []
    points = [
        (float(p[0]), float(p[1]))
        for p in history
        if isinstance(p, list) and len(p) == 2 and all(isinstance(v, int | float) for v in p)
    ]
    if len(points) < 2:
        return ""
    steps, losses = zip(*points, strict=True)
    text: str = plot_to_string(
        list(losses), list(steps), lines=True, width=width, height=height, title="loss by step", color=False
    )
    return text


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0
