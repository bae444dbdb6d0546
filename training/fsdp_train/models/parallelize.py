"""How the model is spread over ranks: the rank topology, the device mesh, and FSDP2 / HSDP wrapping.

Kept apart from the model and the loop (torchtitan's ``parallelize_*``): activation checkpointing,
then ``torch.compile``, then ``fully_shard`` per decoder block, then the root, in that order.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fsdp_train.models.precision import Float8Choice, convert_to_float8
from fsdp_train.models.quantize import is_nf4

if TYPE_CHECKING:  # torch is imported where it is used: the topology helpers stay import-light
    from torch import nn

FAKE_RANKS_PER_NODE_ENV = "FSDP_TRAIN_RANKS_PER_NODE"
"""Set to N to count every N consecutive ranks as one node (tests of HSDP on one host)."""


@dataclass(frozen=True, slots=True)
class Topology:
    """Where this rank sits: global rank, rank inside its node, node index, and the device it drives."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    device_index: int
    """The accelerator index this process uses (the real local rank, even when nodes are faked)."""

    @property
    def num_nodes(self) -> int:
        return self.world_size // self.local_world_size

    @classmethod
    def from_values(
        cls,
        *,
        rank: int,
        world_size: int,
        local_rank: int,
        local_world_size: int,
        node_rank: int,
        device_index: int | None = None,
        env: Mapping[str, str] | None = None,
    ) -> Topology:
        """Checked topology; ``FSDP_TRAIN_RANKS_PER_NODE`` in ``env`` regroups the ranks into fake nodes.

        ``device_index`` defaults to the local rank (torchrun's convention).
        """
        env = os.environ if env is None else env
        device_index = local_rank if device_index is None else device_index
        fake = env.get(FAKE_RANKS_PER_NODE_ENV, "")
        if fake:
            per_node = int(fake)
            if per_node <= 0 or world_size % per_node:
                raise ValueError(
                    f"{FAKE_RANKS_PER_NODE_ENV}={per_node} must be > 0 and divide the world size {world_size}."
                )
            local_rank, local_world_size, node_rank = rank % per_node, per_node, rank // per_node
        topo = cls(rank, world_size, local_rank, local_world_size, node_rank, device_index)
        if world_size % local_world_size:
            raise ValueError(
                f"world size {world_size} is not a multiple of the ranks per node ({local_world_size}); "
                "hybrid sharding needs the same number of ranks on every node."
            )
        return topo

    @classmethod
    def from_torchrun_env(cls, env: Mapping[str, str] | None = None) -> Topology:
        """From the variables torchrun sets (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK)."""
        env = os.environ if env is None else env
        try:
            rank = int(env["RANK"])
            world_size = int(env["WORLD_SIZE"])
        except KeyError as e:
            raise ValueError(f"{e.args[0]} is not set: start the training function with torchrun.") from e
        local_rank = int(env.get("LOCAL_RANK", "0"))
        local_world_size = int(env.get("LOCAL_WORLD_SIZE", str(world_size)))
        node_rank = int(env.get("GROUP_RANK", str(rank // local_world_size)))
        return cls.from_values(
            rank=rank,
            world_size=world_size,
            local_rank=local_rank,
            local_world_size=local_world_size,
            node_rank=node_rank,
            env=env,
        )

    def check_contiguous(self) -> None:
        """HSDP's 2-D mesh assumes node k holds ranks k·n .. k·n+n-1; say so when it does not."""
        expected = self.node_rank * self.local_world_size + self.local_rank
        if expected != self.rank:
            raise ValueError(
                f"rank {self.rank} is local rank {self.local_rank} of node {self.node_rank} with "
                f"{self.local_world_size} ranks per node; hybrid sharding needs rank {expected} there "
                "(ranks numbered node by node)."
            )


def resolve_sharding(requested: str, num_nodes: int, cross_node_busbw_gbps: float | None, min_gbps: float) -> str:
    """``full`` or ``hybrid``: ``auto`` picks hybrid across nodes unless the link is measured fast."""
    if requested != "auto":
        return requested
    if num_nodes < 2:
        return "full"
    if cross_node_busbw_gbps is None:
        return "hybrid"
    return "hybrid" if cross_node_busbw_gbps < min_gbps else "full"


def build_mesh(topo: Topology, sharding: str, device_type: str) -> Any:
    """1-D mesh (shard over all) for ``full``; 2-D (replicate across nodes, shard within) for ``hybrid``."""
    from torch.distributed.device_mesh import init_device_mesh

    if sharding == "full" or topo.num_nodes == 1:
        return init_device_mesh(device_type, (topo.world_size,), mesh_dim_names=("shard",))
    topo.check_contiguous()
    return init_device_mesh(device_type, (topo.num_nodes, topo.local_world_size), mesh_dim_names=("replicate", "shard"))


def parallelize(
    model: nn.Module,
    blocks: nn.ModuleList,
    mesh: Any,
    *,
    mixed_precision: str,
    activation_checkpointing: bool,
    compile_blocks: bool,
    reshard_after_forward: bool = True,
    float8: Float8Choice | None = None,
) -> nn.Module:
    """Apply fp8, activation checkpointing, per-block compile and FSDP2 to ``model`` (still on meta) in place.

    ``float8``: convert the blocks' chosen linear layers to torchao's float8 training (``precision: fp8``).
    """
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    if float8 is not None:
        convert_to_float8(blocks, float8)
        if compile_blocks:
            # Float8Linear's guards differ per block: without room, Dynamo runs the later blocks eagerly.
            limit = 2 * len(blocks) + 8
            torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, limit)
            torch._dynamo.config.accumulated_recompile_limit = max(
                torch._dynamo.config.accumulated_recompile_limit, 4 * limit
            )

    if mixed_precision == "bf16":
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    else:
        mp = MixedPrecisionPolicy()
    for index, block in enumerate(list(blocks)):
        wrapped = block
        if activation_checkpointing:
            from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

            wrapped = checkpoint_wrapper(wrapped)
        if compile_blocks:
            wrapped.compile()
        # The last block's parameters are needed again at once by backward: keep them gathered.
        reshard = reshard_after_forward and index < len(blocks) - 1
        fully_shard(
            wrapped, mesh=mesh, mp_policy=mp, reshard_after_forward=reshard, ignored_params=unsharded(wrapped, mesh)
        )
        blocks[index] = wrapped
    # The root unit holds what is left: the tied embedding / lm_head and the final norm, used at both
    # ends of forward, so it stays gathered between forward and backward.
    fully_shard(model, mesh=mesh, mp_policy=mp, reshard_after_forward=False)
    return model


def unsharded(module: nn.Module, mesh: Any) -> set[nn.Parameter] | None:
    """Parameters FSDP2 leaves alone: a QLoRA base's NF4 weights when there is one rank to shard over.

    One rank has nothing to cut or gather, and FSDP2's one-rank path copies only the first of the tensors an NF4
    weight gathers as (its data, scalers and factor; pytorch/pytorch#197999): the weight stays a plain NF4 tensor.
    """
    if mesh.size() > 1:
        return None
    return {p for p in module.parameters() if is_nf4(p)} or None
