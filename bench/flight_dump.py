"""Record NCCL flight-recorder dumps on one GPU (a one-rank NCCL group records its collectives too).

    python bench/flight_dump.py OUTDIR

Writes OUTDIR/nccl-one-rank-completed.pkl (every collective finished) and OUTDIR/nccl-one-rank-in-flight.pkl (taken
while a large all-reduce may still run), then prints what ``fsdp_train.watch.flight`` reads from each. The dumps are
torch's own pickle (``_dump_fr_trace``, or ``_dump_nccl_trace`` before torch 2.10), without stack traces.
"""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "training"))


def main() -> int:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), TORCH_FR_BUFFER_SIZE="64")
    os.environ.setdefault("TORCH_NCCL_TRACE_BUFFER_SIZE", "64")
    import torch
    import torch.distributed as dist
    from fsdp_train.watch import flight

    torch.cuda.set_device(0)
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))
    t = torch.ones(1 << 20, device="cuda")
    for _ in range(3):
        dist.all_reduce(t)
    dist.all_gather_into_tensor(torch.empty(1 << 20, device="cuda"), t)
    dist.broadcast(t, 0)
    torch.cuda.synchronize()
    (out / "nccl-one-rank-completed.pkl").write_bytes(flight.dump_bytes())
    big = torch.ones(1 << 28, device="cuda")
    dist.all_reduce(big)
    (out / "nccl-one-rank-in-flight.pkl").write_bytes(flight.dump_bytes())  # no synchronisation before it
    torch.cuda.synchronize()
    print(f"torch {torch.__version__}, NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}")
    for path in sorted(out.glob("nccl-*.pkl")):
        for group in flight.summarize(flight.load(path.read_bytes())):
            print(f"{path.name}: {group.text()}")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
