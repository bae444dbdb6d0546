"""Small Ray Train functions as a user writes them: `ray.train.report` with metrics and checkpoints.

`train` trains a linear model on a fixed problem, all-reducing its gradients; it checkpoints every
`checkpoint_every` steps and resumes from `ray.train.get_checkpoint()`. With `kill_rank`/`kill_at_step` that rank
SIGKILLs itself once, in a run that did not resume; with `forge` every rank prints event lines of its own making.
With `stall_rank`/`stall_at_step` that rank blocks in its own code before the step's all-reduce (in a run that
did not resume, or that resumed from step `stall_when_resumed_from`) while the others wait in it;
`slow_rank`/`slow_seconds` make that rank slower by a fixed time per step. `fail` raises after its first report.
"""

from __future__ import annotations

import os
import signal
import tempfile
import time
from pathlib import Path
from typing import Any

import ray.train
import torch
import torch.distributed as dist

from byo_checks.plain import FORGED


def train(config: dict[str, Any]) -> dict[str, Any]:
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=float(config.get("lr", 0.1)))
    start = 0
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as directory:
            state = torch.load(Path(directory) / "state.pt")
        model.load_state_dict(state["model"])
        start = int(state["step"])
    if config.get("forge"):
        for line in FORGED:
            print(line, flush=True)
    steps, every = int(config["steps"]), int(config.get("checkpoint_every", 0))
    inputs = torch.randn(64, 8, generator=torch.Generator().manual_seed(rank))
    targets = inputs.sum(dim=1, keepdim=True)
    for step in range(start + 1, steps + 1):
        began = time.perf_counter()
        loss = torch.nn.functional.mse_loss(model(inputs), targets)
        optimizer.zero_grad()
        loss.backward()
        if config.get("slow_rank") == rank:
            time.sleep(float(config.get("slow_seconds", 0.0)))
        stalls = config.get("stall_rank") == rank and config.get("stall_at_step") == step
        if stalls and start == int(config.get("stall_when_resumed_from", 0)):
            wait_for_a_lock_nobody_releases()
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= world
        optimizer.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        metrics = {
            "step": step,
            "total_steps": steps,
            "loss": float(mean) / world,
            "tokens": step * 64 * world,
            "tokens_per_second": 64 * world / max(time.perf_counter() - began, 1e-9),
            "resumed_from": start,
        }
        if every and step % every == 0:
            with tempfile.TemporaryDirectory() as directory:
                if rank == 0:
                    torch.save({"model": model.state_dict(), "step": step}, Path(directory) / "state.pt")
                saved = ray.train.Checkpoint.from_directory(directory) if rank == 0 else None
                ray.train.report(metrics, checkpoint=saved)
        else:
            ray.train.report(metrics)
        if config.get("kill_rank") == rank and config.get("kill_at_step") == step and start == 0:
            time.sleep(1.0)  # the controller collects the step's checkpoint before the rank is gone
            os.kill(os.getpid(), signal.SIGKILL)
    # What Ray can carry back may be no JSON (a set): it is the function's own, not the job's summary.
    return {"steps": steps, "ranks": {rank}}


def wait_for_a_lock_nobody_releases() -> None:
    """A user's code stuck (an hour, so that the stall is found long before it ends)."""
    deadline = time.monotonic() + 3600
    while time.monotonic() < deadline:
        time.sleep(1.0)


def fail(config: dict[str, Any]) -> None:
    ray.train.report({"step": 1, "loss": 1.0})
    raise ValueError(f"the user's code gave up: {config.get('why', 'no reason')}")
