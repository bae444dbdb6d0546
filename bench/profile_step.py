"""Where a training step's GPU time goes: kernels grouped by kind (one process, torch.profiler).

    torchrun --nproc-per-node 1 bench/profile_step.py --batch 8 --config '{"compile": true, ...}'

Builds the training function's model and step exactly as ``train_throughput.py``'s ``ours`` recipes
do, runs the warm-up steps, then profiles ``--steps`` steps and prints the GPU time per kernel group
and the top kernels. The groups are matched on kernel names (cuBLAS/CUTLASS GEMMs, attention, NCCL,
the optimizer, Inductor's Triton kernels, the rest).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections import defaultdict
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "training"))

from fsdp_train.contract.config import TrainConfig
from fsdp_train.models.parallelize import Topology
from fsdp_train.run.loop import build, train_step

GROUPS: tuple[tuple[str, str], ...] = (
    ("attention", r"flash|fmha|attention|sdpa|cudnn"),
    ("nccl", r"nccl"),
    ("optimizer", r"adam|multi_tensor|foreach"),
    ("gemm", r"gemm|cutlass|xmma|nvjet|sm90|matmul|scaled_mm|cublas"),
    ("triton (inductor)", r"^triton_"),
    ("copy / cast", r"copy|memcpy|memset|cast|fill|cat"),
)


def group_of(name: str) -> str:
    for group, pattern in GROUPS:
        if re.search(pattern, name, re.IGNORECASE):
            return group
    return "other"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=4)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--config", type=json.loads, default={}, help="TrainConfig fields as JSON")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--overrides", type=json.loads, default={}, help="Hugging Face config overrides")
    args = parser.parse_args()
    topo = Topology.from_torchrun_env(os.environ)
    if torch.cuda.is_available():
        torch.cuda.set_device(topo.device_index)
        device = torch.device("cuda", topo.device_index)
        dist.init_process_group("nccl", device_id=device)
    else:  # a smoke run of the code path only (CPU kernels)
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    cfg = TrainConfig(
        seq_len=args.seq_len,
        batch_size_per_rank=args.batch,
        steps=args.warmup + args.steps,
        lr_schedule="constant",
        sharding="full",
        probe_size_bytes=0,
        model_overrides=args.overrides,
        **args.config,
    )
    model, optimizer, config = build(cfg, topo, "full", device)
    for step in range(1, args.warmup + 1):
        train_step(cfg, topo, model, optimizer, step, "full", device, config.vocab_size)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    kernel_type = torch.autograd.DeviceType.CUDA if device.type == "cuda" else torch.autograd.DeviceType.CPU
    activities = [
        torch.profiler.ProfilerActivity.CUDA if device.type == "cuda" else torch.profiler.ProfilerActivity.CPU
    ]
    with torch.profiler.profile(activities=activities) as prof:
        for step in range(args.warmup + 1, args.warmup + args.steps + 1):
            train_step(cfg, topo, model, optimizer, step, "full", device, config.vocab_size)
        sync()
    per_kernel: dict[str, float] = defaultdict(float)
    for event in prof.events():
        if event.device_type == kernel_type:
            per_kernel[event.name] += (event.device_time if device.type == "cuda" else event.self_cpu_time_total) / 1e3
    total = sum(per_kernel.values())
    groups: dict[str, float] = defaultdict(float)
    for name, ms in per_kernel.items():
        groups[group_of(name)] += ms
    if topo.rank == 0:
        print(f"\nGPU kernel time over {args.steps} steps: {total:.1f} ms ({total / args.steps:.1f} ms per step)")
        print("| group | ms per step | share |")
        print("|---|---|---|")
        for group, ms in sorted(groups.items(), key=lambda kv: -kv[1]):
            print(f"| {group} | {ms / args.steps:.1f} | {ms / total:.1%} |")
        print(f"\ntop {args.top} kernels:")
        for name, ms in sorted(per_kernel.items(), key=lambda kv: -kv[1])[: args.top]:
            print(f"{ms / args.steps:8.2f} ms  {group_of(name):>18}  {name[:110]}")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
