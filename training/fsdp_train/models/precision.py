"""Matmul precision of the decoder blocks: bf16, or fp8 through torchao's float8 training where it pays.

``resolve_precision`` turns ``training.precision`` (``bf16 | fp8 | auto``) into what this rank runs,
refusing fp8 where the GPU has no fp8 tensor cores; ``convert_to_float8`` swaps the chosen
``nn.Linear`` layers of the decoder blocks for torchao's ``Float8Linear`` (dynamic scaling: fp8
operands, bf16 outputs, high-precision master weights and optimizer untouched).

Kept free of torch imports at module level: the operator may import the pure rules.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fsdp_train.contract.catalog import gpu_for_device

if TYPE_CHECKING:
    from torch import nn

FP8_MIN_COMPUTE_CAPABILITY = (8, 9)
"""fp8 tensor cores arrived with Ada (8.9: L4, L40S) and Hopper (9.0: H100, H200); A100/A10G have none."""

FP8_AUTO_GPUS = ("H100", "H200", "GH200")
"""GPUs (Hopper) on which fp8 was measured to win (docs/performance.md, rounds two, four and twelve). Ada GPUs (L4,
L40S) have fp8 tensor cores but far less memory bandwidth for the casts and were not measured: ``auto`` keeps them on
bf16."""

FP8_AUTO_MIN_HIDDEN = 3584
"""``auto`` picks fp8 from this hidden size up at any batch: a Qwen2.5-7B-shaped model ran 1.26x bf16's tokens/s at
16,384 tokens a micro-batch and 1.12x at 4,096, its loss on text within 1 % of bf16's over 300 steps."""

FP8_AUTO_NARROW = (1536, 16_384)
"""``auto`` also picks fp8 from a hidden size of 1536 (Qwen2.5-1.5B) up where a rank's micro-batch holds at least
16,384 tokens: 1.117x and 1.119x bf16 (seq 2048 x 8, seq 4096 x 4; round twelve), the loss on text within 1 % of
bf16's at every one of 50 steps. At 8,192 tokens fp8 was slower (0.898x), at 4,096 too (0.78x, round four): the
matmuls are too small to repay fp8's casts and scales. Between 8,192 and 16,384 tokens nothing was measured: bf16."""


@dataclass(frozen=True, slots=True)
class Float8Choice:
    """How the fp8 conversion is done (the settings docs/performance.md measured best)."""

    recipe: str = "tensorwise"
    """torchao recipe: ``tensorwise`` (one scale per tensor) or ``rowwise``."""
    targets: tuple[str, ...] = ("mlp.", "self_attn.")
    """Which linear layers of a block, by name fragment: the MLP and the attention projections."""
    fsdp_float8_all_gather: bool = False
    """All-gather the weights in fp8 (tensorwise only; halves FSDP's weight traffic)."""


DEFAULT_FLOAT8 = Float8Choice()


def has_fp8_tensor_cores(device_name: str, capability: tuple[int, int] | None) -> bool:
    """True on GPUs with fp8 tensor cores: by compute capability when known, else by the hardware catalog."""
    if capability is not None:
        return capability >= FP8_MIN_COMPUTE_CAPABILITY
    gpu = gpu_for_device(device_name)
    return gpu is not None and gpu.supports_fp8


def resolve_precision(
    requested: str,
    *,
    device_name: str,
    capability: tuple[int, int] | None,
    hidden_size: int,
    tokens_per_micro_batch: int,
) -> str:
    """``bf16`` or ``fp8``: what this rank runs for ``training.precision`` on this device and model.

    ``fp8`` on a device without fp8 tensor cores (or a CPU: ``capability`` None and no known name)
    raises ``ValueError`` naming the field; ``auto`` is fp8 only on ``FP8_AUTO_GPUS``, from
    ``FP8_AUTO_MIN_HIDDEN`` up or within ``FP8_AUTO_NARROW`` (a rank's micro-batch of ``tokens_per_micro_batch``
    tokens), bf16 elsewhere.
    """
    if requested == "bf16":
        return "bf16"
    fp8_ok = has_fp8_tensor_cores(device_name, capability)
    if requested == "fp8":
        if not fp8_ok:
            cc = f" (compute capability {capability[0]}.{capability[1]})" if capability else ""
            raise ValueError(
                f"training.precision: fp8 needs a GPU with fp8 tensor cores (compute capability 8.9 or newer: "
                f"L4, L40S, H100, H200); this rank runs on {device_name}{cc}. Use bf16 or auto."
            )
        return "fp8"
    if requested == "auto":
        gpu = gpu_for_device(device_name)
        measured = gpu is not None and gpu.name in FP8_AUTO_GPUS
        narrow_hidden, narrow_tokens = FP8_AUTO_NARROW
        wins = hidden_size >= FP8_AUTO_MIN_HIDDEN or (
            hidden_size >= narrow_hidden and tokens_per_micro_batch >= narrow_tokens
        )
        return "fp8" if fp8_ok and measured and wins else "bf16"
    raise ValueError(f"training.precision must be one of bf16, fp8, auto; got {requested!r}.")


def float8_filter(choice: Float8Choice) -> Any:
    """torchao's ``module_filter_fn``: the targeted linear layers whose shapes fp8 GEMMs accept."""
    from torch import nn

    def keep(module: nn.Module, fqn: str) -> bool:
        if not isinstance(module, nn.Linear) or not any(t in fqn for t in choice.targets):
            return False
        # torch._scaled_mm needs both dimensions divisible by 16.
        return module.in_features % 16 == 0 and module.out_features % 16 == 0

    return keep


def convert_to_float8(blocks: nn.ModuleList, choice: Float8Choice = DEFAULT_FLOAT8) -> int:
    """Swap the chosen linear layers of every block for ``Float8Linear``, in place; returns how many.

    Run on the meta model before ``fully_shard`` (torchao's documented order: convert, compile, shard).
    """
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    config = Float8LinearConfig.from_recipe_name(choice.recipe)
    if choice.fsdp_float8_all_gather:
        if choice.recipe != "tensorwise":
            raise ValueError("fp8 all-gather needs the tensorwise recipe")
        config = Float8LinearConfig(enable_fsdp_float8_all_gather=True)
    keep = float8_filter(choice)
    converted = 0
    for block in blocks:
        before = sum(type(m).__name__ == "Float8Linear" for m in block.modules())
        convert_to_float8_training(block, config=config, module_filter_fn=keep)
        converted += sum(type(m).__name__ == "Float8Linear" for m in block.modules()) - before
    return converted


def float8_step_hook(model: nn.Module, optimizer: Any, choice: Float8Choice = DEFAULT_FLOAT8) -> None:
    """With fp8 all-gather, compute next step's weight scales in one pass after each optimizer step."""
    if not choice.fsdp_float8_all_gather:
        return
    from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp

    optimizer.register_step_post_hook(lambda *_: precompute_float8_dynamic_scale_for_fsdp(model))
