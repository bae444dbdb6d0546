"""Flight-recorder dumps of a one-rank NCCL group: the fixtures of the operator's flight-recorder parser.

    torchrun --nproc-per-node 1 bench/fr_dump.py OUTDIR

With ``TORCH_NCCL_TRACE_BUFFER_SIZE`` set, the NCCL process group records every collective it runs (a one-rank
group too). This runs a few of the collectives a training step makes (all-gather, reduce-scatter, all-reduce,
broadcast), then writes the recorder's dump as torch writes it on a timeout (pickle) and in its JSON form, once
with every collective completed and once with one left in flight (launched on a side stream held back).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("TORCH_NCCL_TRACE_BUFFER_SIZE", "2000")
os.environ.setdefault("TORCH_NCCL_ENABLE_TIMING", "1")

import torch
import torch.distributed as dist


def dump(out: Path, name: str) -> None:
    c10d = torch._C._distributed_c10d
    try:
        (out / f"{name}.pickle").write_bytes(c10d._dump_nccl_trace(includeCollectives=True, includeStackTraces=True))
    except (AttributeError, RuntimeError, TypeError) as e:
        print(f"{name}: no pickle dump: {e!r}")
    json_dump = getattr(c10d, "_dump_nccl_trace_json", None)
    if json_dump is not None:
        try:
            text = json_dump(includeCollectives=True, onlyActive=False)
            (out / f"{name}.json").write_bytes(text if isinstance(text, bytes) else text.encode())
        except (RuntimeError, TypeError) as e:
            print(f"{name}: no JSON dump: {e!r}")
    print(f"wrote {name}: {sorted(p.name for p in out.glob(name + '.*'))}")


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", device_id=torch.device("cuda", 0))
    x = torch.ones(1 << 20, device="cuda")
    gathered = torch.empty(1 << 20, device="cuda")
    for _ in range(3):
        dist.all_gather_into_tensor(gathered, x)
        dist.reduce_scatter_tensor(x, gathered)
        dist.all_reduce(x)
    dist.broadcast(x, src=0)
    torch.cuda.synchronize()
    dump(out, "fr-completed")
    # One collective left in flight: queued behind a long kernel, so the dump sees it started but not completed.
    big = torch.randn(8192, 8192, device="cuda")
    for _ in range(40):
        big = big @ big
        big = big / big.norm()
    work = dist.all_reduce(x, async_op=True)
    dump(out, "fr-in-flight")
    assert work is not None
    work.wait()
    torch.cuda.synchronize()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
