"""Turn training-function logs (``python -m fsdp_train`` under torchrun) into one markdown row each.

    python bench/summarize_events.py run1.log run2.log ...

Reads the ``FSDP_EVENT`` lines only: each rank's transport verdict, the probes, the resolved sharding,
the Summary's tokens/s (mean of steps 2..N) and MFU, the last loss and the peak memory.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "training"))

from fsdp_train.contract.events import Event, Probe, Step, Summary, Transport, parse_lines

HEADER = (
    "| run | transport (rank: verdict) | all-reduce busbw | all-gather busbw | cross-node all-reduce "
    "| sharding | tokens/s/GPU | MFU | loss at last step | peak memory |\n|---|---|---|---|---|---|---|---|---|---|"
)


def row(name: str, events: list[Event]) -> str:
    transports = sorted((e for e in events if isinstance(e, Transport)), key=lambda e: e.rank)
    probes = {e.scope: e for e in events if isinstance(e, Probe)}
    steps = [e for e in events if isinstance(e, Step)]
    summaries = {e.rank: e for e in events if isinstance(e, Summary)}
    summary = summaries.get(0)
    world = max((e.world_size for e in events if hasattr(e, "world_size")), default=1)
    verdicts = ", ".join(f"{t.rank}: `{t.transport}`" for t in transports) or "-"
    everyone, cross = probes.get("all"), probes.get("cross-node")
    if summary is None:
        return f"| {name} | {verdicts} | - | - | - | - | (no summary: failed or cut short) | - | - | - |"
    mfu = f"{summary.mfu * 100:.1f} %" if summary.mfu is not None else "n/a"
    peak = max((s.peak_memory_bytes for s in steps), default=0) / 2**30
    return (
        f"| {name} | {verdicts} "
        f"| {f'{everyone.allreduce_busbw_gbps:.1f} GB/s' if everyone else '-'} "
        f"| {f'{everyone.allgather_busbw_gbps:.1f} GB/s' if everyone else '-'} "
        f"| {f'{cross.allreduce_busbw_gbps:.2f} GB/s' if cross else '-'} "
        f"| {summary.sharding} | {summary.tokens_per_second / world:,.0f} | {mfu} "
        f"| {summary.final_loss:.4f} | {peak:.1f} GiB |"
    )


def main(paths: list[str]) -> int:
    print(HEADER)
    for path in paths:
        text = Path(path).read_text(errors="replace")
        print(row(Path(path).stem, list(parse_lines(text.splitlines()))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
