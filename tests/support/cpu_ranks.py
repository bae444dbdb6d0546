"""Ranks of the training loop as plain processes on CPU, joined through a file store (no port to pick).

`run_rank` is the target of a rank process (`support.rank_processes`): it joins a gloo group through a `FileStore`, runs
`fsdp_train.run.loop.train` with the topology it is given and writes the events it printed to a file. `CPU_STEPS` are
steps small enough for such ranks, and `printed` reads the events a rank in the test process printed.
"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pytest
    from fsdp_train.contract.events import Event

CPU_STEPS: dict[str, Any] = {
    "seq_len": 16,
    "batch_size_per_rank": 2,
    "grad_accum": 2,
    "learning_rate": 1e-3,
    "lr_schedule": "constant",
    "mixed_precision": "fp32",
}
"""Steps of the loop small enough for CPU ranks in a unit test: 16-token sequences, two micro-batches of two, fp32."""


def run_rank(rank: int, world_size: int, ranks_per_node: int, store: str, train: dict[str, Any], out: str) -> None:
    import torch
    import torch.distributed as dist
    from fsdp_train.contract.config import TrainConfig
    from fsdp_train.models.parallelize import Topology
    from fsdp_train.run.loop import Host
    from fsdp_train.run.loop import train as run_train

    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store, world_size), rank=rank, world_size=world_size)
    topo = Topology.from_values(
        rank=rank,
        world_size=world_size,
        local_rank=rank % ranks_per_node,
        local_world_size=ranks_per_node,
        node_rank=rank // ranks_per_node,
        env={},
    )
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):
            run_train(TrainConfig.from_dict(train), topo, Host(node_ip=f"127.0.0.{2 + topo.node_rank}", env={}))
    finally:
        Path(out).write_text(printed.getvalue())
        dist.destroy_process_group()


def printed(capsys: pytest.CaptureFixture[str]) -> list[Event]:
    """The events this process printed since pytest's capture (`capsys`) was last read: a rank run in the test."""
    from fsdp_train.contract.events import parse_lines

    return list(parse_lines(capsys.readouterr().out.splitlines()))


def fixed_batch_steps(rank: int, world_size: int, store: str, train: dict[str, Any], out: str) -> None:
    """Build the model of ``train`` on one of ``world_size`` ranks and run its steps on one fixed batch, the same
    on every rank; write the losses (JSON) to ``out``. The rank's losses then equal one rank's alone, bit for bit,
    where the sharding changes nothing of the arithmetic."""
    import json

    import torch
    import torch.distributed as dist
    from fsdp_train.contract.config import TrainConfig
    from fsdp_train.models.parallelize import Topology
    from fsdp_train.run.loop import build, train_step

    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store, world_size), rank=rank, world_size=world_size)
    try:
        cfg = TrainConfig.from_dict(train)
        topo = Topology(rank, world_size, rank, world_size, 0, 0)
        model, optimizer, _ = build(cfg, topo, "full", torch.device("cpu"))
        tokens = torch.randint(
            0, 512, (cfg.batch_size_per_rank, cfg.seq_len), generator=torch.Generator().manual_seed(0)
        )
        batch = [{"input_ids": tokens, "labels": tokens}]
        cpu = torch.device("cpu")
        losses = [train_step(cfg, topo, model, optimizer, s, "full", cpu, 512, batch) for s in range(1, cfg.steps + 1)]
        Path(out).write_text(json.dumps(losses))
    finally:
        dist.destroy_process_group()
