"""QLoRA's frozen base in 4-bit NormalFloat (``training.lora_quantize_base: nf4``), held as torchao's ``NF4Tensor``.

``quantize_base`` runs on the meta model after peft wrapped the target layers and before ``parallelize``: each
wrapped layer's frozen weight (peft's ``base_layer``) becomes an NF4 tensor, so FSDP2 builds its shards as NF4.
torchao's ``NF4Tensor`` implements FSDP2's all-gather extension (``fsdp_pre_all_gather``/``fsdp_post_all_gather``):
a block gathers 4-bit data, and ``F.linear`` on the gathered weight dispatches to torchao's ``linear_nf4``
(dequantize to bf16, matmul; its backward dequantizes again and gives the weight no gradient). torchtune's QLoRA on
FSDP2 is built the same way.

A weight is quantized whole, then cut into the rows each rank keeps (``fill_nf4``): NF4 double-quantizes its
per-block scalers around one mean over the whole tensor, so ranks quantizing their own rows would each get another
mean and the gathered weight would not be the quantized whole.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from fsdp_train.contract.config import ConfigError

NF4_BLOCK = 64
"""Values that share one absmax scaler (torchao's default block size, what torchtune uses)."""
NF4_SCALER_BLOCK = 256
"""Scalers quantized together to int8 (torchao's default): a weight holds whole groups of 64 x 256 values."""
NF4_GROUP = NF4_BLOCK * NF4_SCALER_BLOCK


def is_nf4(tensor: Any) -> bool:
    from torchao.dtypes.nf4tensor import NF4Tensor

    return isinstance(tensor, NF4Tensor)


def _check_shape(name: str, weight: torch.Tensor, shards: int) -> None:
    """An NF4 weight cut into ``shards`` row blocks must give each whole groups of values (torchao's chunk)."""
    rows, numel = weight.shape[0], weight.numel()
    if rows % shards or numel % (NF4_GROUP * shards):
        raise ConfigError(
            "lora_quantize_base",
            f"nf4 cannot hold {name} ({' x '.join(map(str, weight.shape))}) over {shards} rank(s): NF4 quantizes "
            f"groups of {NF4_GROUP:,} values and each rank must keep whole groups of whole rows. Leave out that "
            "layer (lora_target_modules) or use LoRA on a bf16 base (quantize_base none).",
        )


def quantize_base(model: nn.Module, shards: int) -> int:
    """On the meta model: each adapted layer's frozen weight as an NF4 tensor; returns how many were converted.

    ``shards``: the ranks one weight is cut over (FSDP2's shard dimension).
    """
    from torchao.dtypes.nf4tensor import to_nf4

    converted = 0
    for path, module in model.named_modules():
        base = getattr(module, "base_layer", None)
        if not isinstance(base, nn.Linear) or base.weight.requires_grad:
            continue  # only peft's wrapped layers, whose weight is frozen
        _check_shape(f"{path}.weight", base.weight, shards)
        quantized = to_nf4(base.weight.detach().to(torch.bfloat16), NF4_BLOCK, NF4_SCALER_BLOCK)
        base.weight = nn.Parameter(quantized, requires_grad=False)
        converted += 1
    return converted


@torch.no_grad()
def fill_nf4(local: torch.Tensor, full: torch.Tensor, rank: int, shards: int) -> None:
    """Give an NF4 shard its value: ``full`` quantized whole, this rank's rows kept."""
    from torchao.dtypes.nf4tensor import to_nf4

    whole = to_nf4(full.to(device=local.device, dtype=torch.bfloat16), NF4_BLOCK, NF4_SCALER_BLOCK)
    rows = torch.chunk(whole, shards, dim=0)[rank]
    # Its inner tensors replaced, not copied into: ``to_empty`` from meta leaves an NF4 tensor's scaler mean on meta
    # (torchao's empty_like moves the other inner tensors only), and a copy into meta is a no-op.
    names, _ = rows.__tensor_flatten__()  # type: ignore[attr-defined]
    for name in names:
        setattr(local, name, getattr(rows, name))


def dequantized(local: torch.Tensor) -> torch.Tensor:
    """A shard's bf16 rows (an NF4 chunk holds whole rows, so its rows dequantize alone)."""
    return local.get_original_weight() if is_nf4(local) else local  # type: ignore[attr-defined]


def quantize_loaded(model: nn.Module, targets: list[str]) -> None:
    """A loaded (plain) model's linear layers named in ``targets`` with NF4 weights, quantized as training's were:
    the export check's base for a QLoRA adapter."""
    from torchao.dtypes.nf4tensor import to_nf4

    for _, module in model.named_modules():
        for child_name, child in module.named_children():
            if isinstance(child, nn.Linear) and child_name in targets:
                weight = to_nf4(child.weight.detach().to(torch.bfloat16), NF4_BLOCK, NF4_SCALER_BLOCK)
                child.weight = nn.Parameter(weight, requires_grad=False)
