"""Ranks of the training loop as CPU processes (`support.rank_processes`) with a notice directory per simulated node.

`run_rank_with_notices` joins a gloo group through a `FileStore`, runs `fsdp_train.run.loop.train` with a directory
checkpointer and `FSDP_NOTICE_DIR` set to its node's folder (as the worker pod's environment sets it), and writes
the events it printed and its return value to files. With `ray_storage`, Ray Train's checkpoints instead, in a rank
process without a cluster (`support.ray_controller`).
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from typing import Any


def run_rank_with_notices(
    rank: int,
    world_size: int,
    ranks_per_node: int,
    store: str,
    train: dict[str, Any],
    out: str,
    notices: str,
    ckpt: str,
    ray_storage: str = "",
    ray_poll_seconds: float = 1.0,
) -> None:
    import torch
    import torch.distributed as dist
    from fsdp_train.contract.config import TrainConfig
    from fsdp_train.models.parallelize import Topology
    from fsdp_train.run.loop import Host
    from fsdp_train.run.loop import train as run_train
    from fsdp_train.state.checkpoint import DirectoryCheckpoints

    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store, world_size), rank=rank, world_size=world_size)
    node = rank // ranks_per_node
    topo = Topology.from_values(
        rank=rank,
        world_size=world_size,
        local_rank=rank % ranks_per_node,
        local_world_size=ranks_per_node,
        node_rank=node,
        env={},
    )
    env = {"FSDP_NOTICE_DIR": str(Path(notices) / f"node{node}"), "POD_NAME": f"pod-{node}", "NODE_NAME": f"n{node}"}
    checkpointer: Any = DirectoryCheckpoints(ckpt)
    if ray_storage:  # Ray Train's checkpoints, its controller's bookkeeping stood in for (support.ray_controller)
        from fsdp_train.state.checkpoint import RayCheckpoints

        from support.ray_controller import ControllerStandIn

        notice_dir = env["FSDP_NOTICE_DIR"]
        ControllerStandIn(ray_storage, rank, rank % ranks_per_node, world_size, notice_dir, ray_poll_seconds).install()
        checkpointer = RayCheckpoints()
    host = Host(node_ip=f"127.0.0.{2 + node}", checkpointer=checkpointer, env=env)
    printed = io.StringIO()
    result: dict[str, Any] = {}
    try:
        with contextlib.redirect_stdout(printed):
            result = run_train(TrainConfig.from_dict(train), topo, host)
    finally:
        Path(out).write_text(printed.getvalue())
        Path(out + ".json").write_text(json.dumps(result, default=str))
        dist.destroy_process_group()
