"""Training throughput benchmark (GPU, torchrun): the reference sample's recipe against ours, side by side.

    torchrun --nproc-per-node 2 bench/train_throughput.py --seq-len 2048 --batch 8 --steps 12 --warmup 4

Every recipe runs in the same invocation on the same GPUs with the same seed and the same random
token ids, one after the other (memory is freed in between). Recipes:

- ``seed``: the reference sample, as ``docs/performance.md`` defines it: FSDP1 FULL_SHARD with a
  size-based wrap at 1e7 parameters, bf16 weights and AdamW state (no mixed-precision policy),
  ``torch.optim.AdamW(lr=2e-5)``, ``loss = model(input_ids=x, labels=x).loss``.
- ``ours``: ``fsdp_train``'s loop step: FSDP2 per decoder block + root, fp32 master weights with
  bf16 compute and fp32 gradient reduction, fused AdamW, gradient clipping.
- ``ours-compile``: the same with ``torch.compile`` per block.
- ``ours-ac``: the same as ``ours`` with activation checkpointing.

Printed per recipe: median tokens/s/GPU over the timed steps, MFU (6·N + 12·L·d·s FLOPs per token,
989 TFLOP/s peak for H100/H200), peak memory, the loss after the last step, and the ratio to the
first recipe. Needs torch and transformers only (no Ray).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "training"))

from fsdp_train.config import TrainConfig
from fsdp_train.loop import build, random_tokens, train_step
from fsdp_train.metrics import flops_per_token, mfu, peak_flops
from fsdp_train.model import hf_config
from fsdp_train.parallelize import Topology

RECIPES = ("seed", "ours", "ours-compile", "ours-ac")


@dataclass
class Result:
    recipe: str
    tokens_per_s_per_gpu: float
    mfu: float | None
    peak_memory_gib: float
    final_loss: float
    median_step_s: float


def _tokens(args: argparse.Namespace, rank: int, step: int, vocab: int, device: torch.device) -> torch.Tensor:
    return random_tokens(
        seed=args.seed,
        step=step,
        micro=0,
        first_sample=rank * args.batch,
        samples=args.batch,
        seq_len=args.seq_len,
        vocab=vocab,
    ).to(device)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _global_mean(value: torch.Tensor) -> float:
    value = value.detach().float().clone()
    dist.all_reduce(value)
    return float(value.item()) / dist.get_world_size()


def run_seed(args: argparse.Namespace, topo: Topology, device: torch.device) -> tuple[list[float], float]:
    from torch.distributed.fsdp import FullyShardedDataParallel
    from torch.distributed.fsdp.wrap import size_based_auto_wrap_policy
    from transformers import AutoModelForCausalLM

    config = hf_config(TrainConfig(model=args.model, seq_len=args.seq_len, model_overrides=args.overrides))
    torch.manual_seed(args.seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16, attn_implementation="sdpa")
    model = model.to(device)  # ray.train.torch.prepare_model moves the model first, then wraps it
    model = FullyShardedDataParallel(
        model,
        auto_wrap_policy=partial(size_based_auto_wrap_policy, min_num_params=int(1e7)),
        # FSDP1 needs the device named on CPU (smoke runs); on GPU the model's device is used.
        **({"device_id": device} if device.type == "cpu" else {}),
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5)
    times, loss_value = [], float("nan")
    for step in range(1, args.warmup + args.steps + 1):
        x = _tokens(args, topo.rank, step, config.vocab_size, device)
        _sync(device)
        t0 = time.perf_counter()
        loss = model(input_ids=x, labels=x).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        _sync(device)
        if step > args.warmup:
            times.append(time.perf_counter() - t0)
        loss_value = _global_mean(loss)
    del model, optimizer
    return times, loss_value


def run_ours(
    args: argparse.Namespace, topo: Topology, device: torch.device, *, compile_blocks: bool, ac: bool
) -> tuple[list[float], float]:
    cfg = TrainConfig(
        model=args.model,
        seq_len=args.seq_len,
        batch_size_per_rank=args.batch,
        steps=args.warmup + args.steps,
        learning_rate=2e-5,
        lr_schedule="constant",
        sharding="full",
        mixed_precision="bf16",
        compile=compile_blocks,
        activation_checkpointing=ac,
        seed=args.seed,
        probe_size_bytes=0,
        model_overrides=args.overrides,
    )
    model, optimizer, config = build(cfg, topo, "full", device)
    times, loss_value = [], float("nan")
    for step in range(1, cfg.steps + 1):
        _sync(device)
        t0 = time.perf_counter()
        loss_value = train_step(cfg, topo, model, optimizer, step, "full", device, config.vocab_size)
        _sync(device)
        if step > args.warmup:
            times.append(time.perf_counter() - t0)
    del model, optimizer
    return times, loss_value


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="Qwen/Qwen2.5-1.5B")
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=8, help="samples per GPU per step")
    parser.add_argument("--steps", type=int, default=12, help="timed steps (the median is reported)")
    parser.add_argument("--warmup", type=int, default=4, help="untimed steps first")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--recipes", default="seed,ours,ours-compile", help=f"comma-separated of {RECIPES}")
    parser.add_argument("--json", default="", help="also write the results to this file (rank 0)")
    parser.add_argument(
        "--overrides", type=json.loads, default={}, help="JSON of Hugging Face config overrides (smaller models)"
    )
    args = parser.parse_args()
    recipes = [r for r in args.recipes.split(",") if r]
    unknown = [r for r in recipes if r not in RECIPES]
    if unknown:
        parser.error(f"unknown recipe {unknown[0]!r}; choose from {', '.join(RECIPES)}")
    topo = Topology.from_torchrun_env(os.environ)
    if torch.cuda.is_available():
        torch.cuda.set_device(topo.device_index)
        device = torch.device("cuda", topo.device_index)
        dist.init_process_group("nccl", device_id=device)
        device_name = torch.cuda.get_device_name(device)
    else:  # a smoke run of the code paths only; its numbers mean nothing
        device = torch.device("cpu")
        dist.init_process_group("gloo")
        device_name = "cpu"
    config = hf_config(TrainConfig(model=args.model, seq_len=args.seq_len, model_overrides=args.overrides))
    fpt = flops_per_token(config, args.seq_len)
    peak = peak_flops(device_name) if device.type == "cuda" else None
    tokens_per_gpu_step = args.batch * args.seq_len
    if topo.rank == 0:
        print(
            f"# {topo.world_size}x {device_name}, torch {torch.__version__}, "
            f"seq {args.seq_len}, batch {args.batch}/GPU ({tokens_per_gpu_step} tokens/GPU/step), "
            f"{args.warmup} warm-up + {args.steps} timed steps, {fpt / 1e9:.2f} GFLOP/token",
            flush=True,
        )

    results: list[Result] = []
    for recipe in recipes:
        if device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
        if recipe == "seed":
            times, loss = run_seed(args, topo, device)
        else:
            times, loss = run_ours(args, topo, device, compile_blocks=recipe == "ours-compile", ac=recipe == "ours-ac")
        peak_mem = torch.tensor(torch.cuda.max_memory_allocated(device) if device.type == "cuda" else 0, device=device)
        dist.all_reduce(peak_mem, op=dist.ReduceOp.MAX)
        slowest = torch.tensor(times, device=device, dtype=torch.float64)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)  # a step lasts as long as its slowest rank
        median = statistics.median(slowest.tolist())
        tps = tokens_per_gpu_step / median
        result = Result(recipe, tps, mfu(tps, fpt, peak), peak_mem.item() / 2**30, loss, median)
        results.append(result)
        if topo.rank == 0:
            print(f"# done {recipe}: {json.dumps(asdict(result))}", flush=True)
        gc.collect()

    if topo.rank == 0:
        base = results[0].tokens_per_s_per_gpu
        print(f"\n| recipe | tokens/s/GPU | MFU | peak memory | loss after {args.warmup + args.steps} steps | ratio |")
        print("|---|---|---|---|---|---|")
        for r in results:
            m = f"{r.mfu * 100:.1f} %" if r.mfu is not None else "n/a"
            print(
                f"| {r.recipe} | {r.tokens_per_s_per_gpu:,.0f} | {m} | {r.peak_memory_gib:.1f} GiB "
                f"| {r.final_loss:.4f} | {r.tokens_per_s_per_gpu / base:.3f} |"
            )
        if args.json:
            Path(args.json).write_text(json.dumps([asdict(r) for r in results], indent=2))
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
