"""Training throughput benchmark (GPU, torchrun): the reference sample's recipe against ours, side by side.

    torchrun --nproc-per-node 2 bench/train_throughput.py --seq-len 2048 --batch 8 --steps 12 --warmup 4 \
        --recipes seed,ours,ours-final

Every recipe runs in the same invocation on the same GPUs with the same seed, the same initial weights
(``fsdp_train.models.model.init_weights``: each parameter from a generator seeded by its name) and the same
random token ids, one after the other (memory is freed in between). Recipes:

- ``seed``: the reference sample, as ``docs/performance.md`` defines it: FSDP1 FULL_SHARD with a
  size-based wrap at 1e7 parameters, bf16 weights and AdamW state (no mixed-precision policy),
  ``torch.optim.AdamW(lr=2e-5)``, ``loss = model(input_ids=x, labels=x).loss``.
- ``ours...``: ``fsdp_train``'s own ``build`` and ``train_step`` (FSDP2 per decoder block + root, fp32
  master weights with bf16 compute and fp32 gradient reduction, fused AdamW, gradient clipping), with
  the ``TrainConfig`` fields that ``VARIANTS`` names; ``ours-final`` is the recommended GPU setting.

A suffix sets the batch per GPU and the micro-batches per step: ``ours-final@b16``, ``ours-final@b8a2``.

Printed per recipe: median tokens/s/GPU over the timed steps (each step timed on its slowest rank),
MFU (6·N + 12·L·d·s FLOPs per token, 989 TFLOP/s peak for H100/H200), peak memory, the loss after
the last step, and the ratio to the first recipe. ``--json`` also keeps every step's loss. Needs
torch and transformers only (no Ray).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import hashlib
import json
import os
import statistics
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "training"))

from fsdp_train.contract.config import TrainConfig
from fsdp_train.models import loss as loss_module
from fsdp_train.models.adapters import adapter_params
from fsdp_train.models.model import build_meta_model, hf_config, init_weights
from fsdp_train.models.parallelize import Topology, parallelize
from fsdp_train.models.precision import DEFAULT_FLOAT8, Float8Choice
from fsdp_train.run import loop
from fsdp_train.run.loop import build, step_figures, train_step
from fsdp_train.watch.metrics import flops_per_token, mfu, peak_flops
from fsdp_train.watch.steps import GC_EVERY_STEPS, collected_every

FINAL: dict[str, Any] = {"compile": True, "loss_chunk_tokens": 4096, "reshard_after_forward": False}
FP8: dict[str, Any] = {**FINAL, "precision": "fp8"}
VARIANTS: dict[str, dict[str, Any]] = {
    # the first measured table's recipes: Hugging Face's loss, eager or per-block compile
    "ours": {"compile": False, "loss_chunk_tokens": 0},
    "ours-compile": {"compile": True, "loss_chunk_tokens": 0},
    # levers, one at a time on top of ours-compile
    "ours-chunked": {"compile": True, "loss_chunk_tokens": 4096},
    "ours-chunked8k": {"compile": True, "loss_chunk_tokens": 8192},
    "ours-gathered": {"compile": True, "loss_chunk_tokens": 0, "reshard_after_forward": False},
    "ours-ac": {"compile": True, "activation_checkpointing": True},
    "ours-eager-chunked": {"compile": False, "loss_chunk_tokens": 4096},
    # what docs/performance.md recommends on GPUs
    "ours-final": {"compile": True, "loss_chunk_tokens": 4096, "reshard_after_forward": False},
    # round two, each on top of ours-final; ``x_`` keys are arguments of ``meta_model_with`` (the levers that
    # did not win) or the ``Float8Choice`` that precision fp8 converts with, not config fields
    "ours-liger": {**FINAL, "x_kernels": "liger"},
    "ours-cudnn": {**FINAL, "x_attention": "cudnn"},
    "ours-liger-cudnn": {**FINAL, "x_kernels": "liger", "x_attention": "cudnn"},
    # precision: fp8 with the torchao recipe and the layers named (the default is ours-fp8's)
    "ours-fp8": {**FP8, "x_float8": Float8Choice("tensorwise", ("mlp.", "self_attn."))},
    "ours-fp8-mlp": {**FP8, "x_float8": Float8Choice("tensorwise", ("mlp.",))},
    "ours-fp8-rw": {**FP8, "x_float8": Float8Choice("rowwise", ("mlp.", "self_attn."))},
    "ours-fp8-rw-mlp": {**FP8, "x_float8": Float8Choice("rowwise", ("mlp.",))},
    "ours-fp8-ag": {**FP8, "x_float8": Float8Choice("tensorwise", ("mlp.", "self_attn."), True)},
    # round three, each on top of ours-final (``levers``): bf16 gradient reduction, gradient clipping on the
    # local shards, the MLP's gate and up projections as one matmul, Inductor's coordinate-descent tuning
    "ours-rbf16": {**FINAL, "x_reduce_bf16": True},
    "ours-clip": {**FINAL, "x_local_clip": True},
    "ours-gateup": {**FINAL, "x_gate_up": True},
    "ours-cdt": {**FINAL, "x_coordinate_descent": True},
    "ours-levers": {
        **FINAL,
        "x_reduce_bf16": True,
        "x_local_clip": True,
        "x_gate_up": True,
        "x_coordinate_descent": True,
    },
    # round five (time these with --timing window: the host may run ahead of the device): the loss read a step
    # late (``x_lazy``, the training loop's way since), the garbage collector every 50 steps (``x_gc``, the
    # loop's too), one loss chunk for the whole batch, the chunk's gradient as one elementwise expression
    # (``x_ce: elementwise``, slower: not kept), and, on one GPU, no FSDP: fp32 weights under bf16 autocast
    # (``x_no_fsdp``, torchtitan's native one-GPU path)
    "ours-elementwise": {**FINAL, "x_ce": "elementwise"},
    "ours-lazy": {**FINAL, "x_lazy": True},
    "ours-lazy-gc": {**FINAL, "x_lazy": True, "x_gc": True},
    # LoRA (training.lora): rank 16 on every linear layer of the blocks, the base frozen in bf16; the gathered
    # weights freed after forward (reshard_after_forward, the config's default: the frozen base's second copy would
    # cost what LoRA saves), with and without activation checkpointing (with it, 1,024-token loss chunks: a 7B
    # model's 152k-vocabulary logits are 0.6 GiB a chunk, fp32)
    "ours-lora": {"compile": True, "loss_chunk_tokens": 4096, "lora_rank": 16, "lora_alpha": 32},
    "ours-lora-ac": {
        "compile": True,
        "loss_chunk_tokens": 1024,
        "lora_rank": 16,
        "lora_alpha": 32,
        "activation_checkpointing": True,
    },
    # QLoRA (training.lora.quantizeBase nf4): the same adapters on a base whose block linears are torchao NF4
    "ours-qlora": {
        "compile": True,
        "loss_chunk_tokens": 4096,
        "lora_rank": 16,
        "lora_alpha": 32,
        "lora_quantize_base": "nf4",
    },
    "ours-qlora-ac": {
        "compile": True,
        "loss_chunk_tokens": 1024,
        "lora_rank": 16,
        "lora_alpha": 32,
        "lora_quantize_base": "nf4",
        "activation_checkpointing": True,
    },
    "ours-r5": {**FINAL, "loss_chunk_tokens": 16384, "x_lazy": True, "x_gc": True},
    "ours-r5-nofsdp": {**FINAL, "loss_chunk_tokens": 16384, "x_lazy": True, "x_gc": True, "x_no_fsdp": True},
    # round eight: the round-five recipe with Inductor's coordinate-descent tuning (round three's one winning
    # lever), with and without FSDP on one GPU, and with Inductor's max-autotune of the matmuls too
    "ours-r8": {**FINAL, "loss_chunk_tokens": 16384, "x_lazy": True, "x_gc": True, "x_coordinate_descent": True},
    "ours-r8-nofsdp": {
        **FINAL,
        "loss_chunk_tokens": 16384,
        "x_lazy": True,
        "x_gc": True,
        "x_coordinate_descent": True,
        "x_no_fsdp": True,
    },
    "ours-r8-autotune": {
        **FINAL,
        "loss_chunk_tokens": 16384,
        "x_lazy": True,
        "x_gc": True,
        "x_coordinate_descent": True,
        "x_max_autotune": True,
    },
    # round nine, on one GPU without FSDP (round eight's ours-r8-nofsdp): the blocks as CUDA graphs (Inductor's
    # "reduce-overhead": no launch cost per kernel, the host's idle gaps gone), and the whole decoder stack
    # compiled as one graph instead of block by block (fusion across block ends, one guard check per step)
    "ours-r9-graphs": {
        **FINAL,
        "loss_chunk_tokens": 16384,
        "x_lazy": True,
        "x_gc": True,
        "x_coordinate_descent": True,
        "x_no_fsdp": "graphs",
    },
    "ours-r9-whole": {
        **FINAL,
        "loss_chunk_tokens": 16384,
        "x_lazy": True,
        "x_gc": True,
        "x_coordinate_descent": True,
        "x_no_fsdp": "whole",
    },
    # round eleven: other losses than one 16k-token chunk of the training function's chunked lm_head +
    # cross-entropy (round five's profile put that loss region, lm_head matmuls and cross-entropy, forward and
    # backward, at 46-48 ms a step against torchtitan's 38): Liger-kernel's fused linear cross-entropy (``x_loss:
    # flce``: its Triton kernel over chunks of its own size, 256 tokens here, the gradients formed in forward), and
    # torchtitan's way (the whole batch's logits in bf16, then a compiled cross-entropy that upcasts: the training
    # function's own with ``loss_chunk_tokens: 0`` since), on round nine's best (CUDA graphs, no FSDP) and on round
    # eight's FSDP path (the training function's)
    "ours-r11-flce": {
        **FINAL,
        "loss_chunk_tokens": 16384,
        "x_lazy": True,
        "x_gc": True,
        "x_coordinate_descent": True,
        "x_no_fsdp": "graphs",
        "x_loss": "flce",
    },
    "ours-r11-fsdp-titanloss": {
        **FINAL,
        "loss_chunk_tokens": 0,
        "x_lazy": True,
        "x_gc": True,
        "x_coordinate_descent": True,
    },
    "ours-r11-titanloss": {
        **FINAL,
        "loss_chunk_tokens": 0,
        "x_lazy": True,
        "x_gc": True,
        "x_coordinate_descent": True,
        "x_no_fsdp": "graphs",
    },
    # round twelve: round eleven's FSDP path (the training function's, ``lossChunkTokens: 0``) with fp8 matmuls in
    # the decoder blocks (``precision: fp8``), and with FSDP's all-gather in fp8 too (nothing to gather on one GPU:
    # it casts the fp32 shards to fp8 instead of to bf16 and then to fp8)
    "ours-r12-fp8": {
        **FP8,
        "loss_chunk_tokens": 0,
        "x_lazy": True,
        "x_gc": True,
        "x_coordinate_descent": True,
    },
    "ours-r12-fp8-ag": {
        **FP8,
        "loss_chunk_tokens": 0,
        "x_lazy": True,
        "x_gc": True,
        "x_coordinate_descent": True,
        "x_float8": Float8Choice("tensorwise", ("mlp.", "self_attn."), True),
    },
}
MODEL_LEVERS = ("kernels", "attention", "gate_up")
"""``x_`` keys that ``meta_model_with`` takes; the others are patched in by ``levers`` for one recipe."""
PEERS = ("peft-plain", "peft-plain-ac")
"""The LoRA peer: peft on a plain Hugging Face model on one GPU, as its documentation shows (sdpa attention, the
model's own loss over the full logits, no compile, no FSDP), with Hugging Face's gradient checkpointing (-ac)."""
RECIPES = ("seed", *PEERS, *VARIANTS)
ADAPTER_PARAMS: dict[str, int] = {}
"""A LoRA recipe's adapter parameters (its MFU counts the frozen base's and the adapters' work apart)."""


@dataclass
class Result:
    recipe: str
    batch: int
    grad_accum: int
    tokens_per_s_per_gpu: float
    mfu: float | None
    peak_memory_gib: float
    final_loss: float
    median_step_s: float
    losses: list[float] = field(default_factory=list)
    peak_reserved_gib: float = 0.0
    """What the caching allocator held at its peak: what a GPU must have free (allocated is what tensors used)."""


@dataclass(frozen=True)
class Recipe:
    name: str
    """``seed`` or a key of ``VARIANTS``."""
    batch: int
    grad_accum: int = 1

    @property
    def label(self) -> str:
        return self.name + (f"@b{self.batch}" + (f"a{self.grad_accum}" if self.grad_accum > 1 else ""))


def parse_recipe(text: str, default_batch: int) -> Recipe:
    """``name`` or ``name@bB`` or ``name@bBaA`` (batch per GPU B, A micro-batches per step)."""
    name, _, suffix = text.partition("@")
    if name not in RECIPES:
        raise ValueError(f"unknown recipe {name!r}; choose from {', '.join(RECIPES)}")
    batch, accum = default_batch, 1
    if suffix:
        head, _, tail = suffix.partition("a")
        if not head.startswith("b") or not head[1:].isdigit() or (tail and not tail.isdigit()):
            raise ValueError(f"bad recipe suffix {suffix!r}: want bB or bBaA, e.g. b16 or b8a2")
        batch, accum = int(head[1:]), int(tail or 1)
    if (name == "seed" or name in PEERS) and accum != 1:
        raise ValueError(f"the {name} recipe has no gradient accumulation")
    return Recipe(name, batch, accum)


class TextWindows:
    """Byte-level tokens from a text file: sample ``i`` of a step is a window whose offset depends only on
    (seed, step, micro, i), like ``random_tokens``; token ids are the UTF-8 bytes (0..255)."""

    def __init__(self, path: str) -> None:
        self.data = torch.frombuffer(bytearray(Path(path).read_bytes()), dtype=torch.uint8)

    def __call__(
        self, *, seed: int, step: int, micro: int, first_sample: int, samples: int, seq_len: int, vocab: int
    ) -> torch.Tensor:
        rows = []
        for i in range(first_sample, first_sample + samples):
            digest = hashlib.sha256(f"text:{seed}:{step}:{micro}:{i}".encode()).digest()
            start = int.from_bytes(digest[:8], "little") % (len(self.data) - seq_len)
            rows.append(self.data[start : start + seq_len].long())
        return torch.stack(rows)


# Levers measured and not kept (docs/performance.md): they live here, not in the training function.


def meta_model_with(
    config: Any, *, kernels: str = "none", attention: str = "sdpa", gate_up: bool = False
) -> torch.nn.Module:
    """``build_meta_model``, then Liger's kernels (``kernels="liger"``), cuDNN attention (``attention="cudnn"``)
    or the MLP's gate and up projections fused into one matmul (``gate_up``)."""
    model = build_meta_model(config)
    if gate_up:
        for block in model.model.layers:  # type: ignore[union-attr]
            block.mlp = GateUpMLP(block.mlp)
    if kernels == "liger":
        from liger_kernel.transformers import apply_liger_kernel_to_qwen2

        apply_liger_kernel_to_qwen2(
            rope=True, rms_norm=True, swiglu=True, cross_entropy=False, fused_linear_cross_entropy=False, model=model
        )
    if attention == "cudnn":
        from transformers import AttentionInterface

        AttentionInterface.register("bench_cudnn", cudnn_attention_forward)
        model.config._attn_implementation = "bench_cudnn"
    return model


class GateUpMLP(torch.nn.Module):
    """Qwen2's SwiGLU MLP with ``gate_proj`` and ``up_proj`` as one ``[2F, D]`` matmul (a new parameter
    ``gate_up_proj.weight``: its random init differs from the two it replaces, so the loss curve does too)."""

    def __init__(self, mlp: torch.nn.Module) -> None:
        super().__init__()
        gate = mlp.gate_proj
        self.gate_up_proj = torch.nn.Linear(gate.in_features, 2 * gate.out_features, bias=False, device="meta")
        self.down_proj = mlp.down_proj
        self.act_fn = mlp.act_fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(self.act_fn(gate) * up)


@torch.no_grad()
def clip_local_shards(parameters: Any, max_norm: float, *args: Any, **kwargs: Any) -> torch.Tensor:
    """``clip_grad_norm_`` for a 1-D FSDP2 mesh on the plain local shards: one foreach norm, one all-reduce
    of the squared sum, one foreach scale, without DTensor's per-parameter dispatch."""
    from torch.distributed.tensor import DTensor

    grads = [p.grad for p in parameters if p.grad is not None]
    local = [g.to_local() if isinstance(g, DTensor) else g for g in grads]
    norms = torch._foreach_norm(local, 2.0)
    total_sq = torch.stack(norms).float().square().sum()
    dist.all_reduce(total_sq)
    total = total_sq.sqrt()
    torch._foreach_mul_(local, (max_norm / (total + 1e-6)).clamp(max=1.0))
    return total


@contextlib.contextmanager
def levers(
    *,
    reduce_bf16: bool = False,
    local_clip: bool = False,
    coordinate_descent: bool = False,
    max_autotune: bool = False,
) -> Iterator[None]:
    """Patch the round-three levers in for one recipe: gradients reduced in bf16 (FSDP2's ``reduce_dtype``),
    ``clip_local_shards`` in place of ``clip_grad_norm_``, Inductor's coordinate-descent tuning; round eight's
    Inductor max-autotune (its Triton matmul templates benchmarked against cuBLAS per shape, no CUDA graphs)."""
    import torch._inductor.config as inductor_config
    import torch.distributed.fsdp as fsdp_module

    policy, clip, tuning = fsdp_module.MixedPrecisionPolicy, torch.nn.utils.clip_grad_norm_, None
    autotune = inductor_config.max_autotune, inductor_config.max_autotune_gemm
    if max_autotune:
        inductor_config.max_autotune = inductor_config.max_autotune_gemm = True
    if reduce_bf16:

        def bf16_reduce(**kw: Any) -> Any:
            return policy(**({**kw, "reduce_dtype": torch.bfloat16} if "param_dtype" in kw else kw))

        fsdp_module.MixedPrecisionPolicy = bf16_reduce  # type: ignore[misc,assignment]
    if local_clip:
        torch.nn.utils.clip_grad_norm_ = clip_local_shards  # type: ignore[assignment]
    if coordinate_descent:
        tuning, inductor_config.coordinate_descent_tuning = inductor_config.coordinate_descent_tuning, True
    try:
        yield
    finally:
        fsdp_module.MixedPrecisionPolicy = policy  # type: ignore[misc]
        torch.nn.utils.clip_grad_norm_ = clip
        if tuning is not None:
            inductor_config.coordinate_descent_tuning = tuning
        inductor_config.max_autotune, inductor_config.max_autotune_gemm = autotune


def cudnn_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Causal attention through cuDNN's fused kernel, K and V expanded to all heads first (cuDNN takes no
    grouped KV heads); the aten op directly, so the block's compiled graph keeps it."""
    from transformers.integrations.sdpa_attention import repeat_kv, sdpa_attention_forward

    if attention_mask is not None or dropout or query.shape[2] != key.shape[2] or query.device.type != "cuda":
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
    groups = int(getattr(module, "num_key_value_groups", 1))
    key, value = repeat_kv(key, groups), repeat_kv(value, groups)
    out = torch.ops.aten._scaled_dot_product_cudnn_attention(
        query, key, value, None, True, 0.0, True, False, scale=scaling
    )[0]
    return out.transpose(1, 2).contiguous(), None


def ce_chunk_elementwise(
    logits: torch.Tensor, targets: torch.Tensor, scale: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The chunk loss with its gradient as one elementwise expression (the one-hot a comparison with the column
    index, no ``scatter_add``): tried in round five, 3.2 % slower per step than ``fsdp_train.models.loss.ce_chunk``."""
    x = logits.float()
    valid = targets != -100
    safe = torch.where(valid, targets, 0)
    lse = torch.logsumexp(x, dim=-1)
    picked = x.gather(1, safe[:, None]).squeeze(1)
    loss = torch.where(valid, lse - picked, 0.0).sum()
    one_hot = (torch.arange(x.shape[1], device=x.device)[None, :] == safe[:, None]).to(x.dtype)
    grad = (torch.exp(x - lse[:, None]) - one_hot) * (valid.to(x.dtype) * scale)[:, None]
    return loss, grad.to(logits.dtype)


def parallelize_plain(
    model: torch.nn.Module, blocks: torch.nn.ModuleList, mesh: Any, *, how: str = "blocks", **kwargs: Any
) -> torch.nn.Module:
    """``parallelize`` without FSDP (one GPU), the weights left as plain fp32 tensors: each block compiled
    (``how`` "blocks"), each block compiled into CUDA graphs ("graphs"), or the decoder stack as one graph
    ("whole")."""
    if not kwargs.get("compile_blocks"):
        return model
    if how == "whole":
        model.model.compile()
        return model
    for block in blocks:
        block.compile(**({"mode": "reduce-overhead"} if how == "graphs" else {}))
    return model


def autocast_forward(model: torch.nn.Module, device: torch.device) -> None:
    """Run ``model``'s forward under bf16 autocast (fp32 weights, bf16 matmuls), as torchtitan does without FSDP."""
    inner = model.forward

    def forward(*args: Any, **kwargs: Any) -> Any:
        with torch.autocast(device.type, dtype=torch.bfloat16):
            return inner(*args, **kwargs)

    model.forward = forward  # type: ignore[method-assign]


def use_flce(model: torch.nn.Module) -> None:
    """Replace the chunked loss that ``build`` put in (``fsdp_train.models.loss.use_loss``) with Liger-kernel's fused
    linear
    cross-entropy, over the same targets and with the same mean."""
    from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss

    head = model.lm_head
    assert isinstance(head, torch.nn.Linear)
    flce = LigerFusedLinearCrossEntropyLoss(ignore_index=loss_module.IGNORE_INDEX, reduction="mean")

    def loss_of(hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        # Liger's order: the weight first, then the [N, d] hidden states and the [N] targets
        return flce(head.weight, hidden.reshape(-1, hidden.shape[-1]), targets.reshape(-1))

    loss_module.replace_loss(model, loss_of)


def _tokens(
    args: argparse.Namespace, batch: int, rank: int, step: int, vocab: int, device: torch.device
) -> torch.Tensor:
    return loop.random_tokens(
        seed=args.seed,
        step=step,
        micro=0,
        first_sample=rank * batch,
        samples=batch,
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


def _plain_steps(
    args: argparse.Namespace,
    recipe: Recipe,
    topo: Topology,
    device: torch.device,
    model: Any,
    optimizer: torch.optim.Optimizer,
    vocab: int,
) -> tuple[list[float], list[float]]:
    """The reference recipes' loop (seed, peft-plain): ``model(input_ids=x, labels=x).loss``, each step synced."""
    times, losses = [], []
    for step in range(1, args.warmup + args.steps + 1):
        x = _tokens(args, recipe.batch, topo.rank, step, vocab, device)
        _sync(device)
        t0 = time.perf_counter()
        loss = model(input_ids=x, labels=x).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        _sync(device)
        if step > args.warmup:
            times.append(time.perf_counter() - t0)
        losses.append(_global_mean(loss))
    del model, optimizer
    return times, losses


def run_seed(
    args: argparse.Namespace, recipe: Recipe, topo: Topology, device: torch.device
) -> tuple[list[float], list[float]]:
    from torch.distributed.fsdp import FullyShardedDataParallel
    from torch.distributed.fsdp.wrap import size_based_auto_wrap_policy
    from transformers import AutoModelForCausalLM

    config = hf_config(TrainConfig(model=args.model, seq_len=args.seq_len, model_overrides=args.overrides))
    # from_config(dtype=bfloat16) in the sample; here the same architecture from the meta device, then
    # the name-seeded init that ours uses, rounded to bf16: both recipes start from the same weights.
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16, attn_implementation="sdpa")
    init_weights(model, config, args.seed, device)
    model = FullyShardedDataParallel(
        model,
        auto_wrap_policy=partial(size_based_auto_wrap_policy, min_num_params=int(1e7)),
        # FSDP1 needs the device named on CPU (smoke runs); on GPU the model's device is used.
        **({"device_id": device} if device.type == "cpu" else {}),
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    return _plain_steps(args, recipe, topo, device, model, optimizer, config.vocab_size)


def run_peft_plain(
    args: argparse.Namespace, recipe: Recipe, topo: Topology, device: torch.device
) -> tuple[list[float], list[float]]:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    if topo.world_size != 1:
        raise ValueError("the peft-plain peer is a one-GPU recipe")
    config = hf_config(TrainConfig(model=args.model, seq_len=args.seq_len, model_overrides=args.overrides))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16, attn_implementation="sdpa")
    init_weights(model, config, args.seed, device)  # the same base weights as ours, rounded to bf16
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=targets))
    if recipe.name.endswith("-ac"):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.enable_input_require_grads()
    ADAPTER_PARAMS[recipe.label] = sum(p.numel() for p in model.parameters() if p.requires_grad)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=args.lr, fused=True)
    return _plain_steps(args, recipe, topo, device, model, optimizer, config.vocab_size)


def run_ours(
    args: argparse.Namespace, recipe: Recipe, topo: Topology, device: torch.device
) -> tuple[list[float], list[float]]:
    cfg = TrainConfig(
        model=args.model,
        seq_len=args.seq_len,
        batch_size_per_rank=recipe.batch,
        grad_accum=recipe.grad_accum,
        steps=args.warmup + args.steps,
        learning_rate=args.lr,
        lr_schedule="constant",
        warmup_steps=args.lr_warmup,
        sharding="full",
        mixed_precision="bf16",
        seed=args.seed,
        probe_size_bytes=0,
        model_overrides=args.overrides,
        **{k: v for k, v in VARIANTS[recipe.name].items() if not k.startswith("x_")},
    )
    extra = {k[2:]: v for k, v in VARIANTS[recipe.name].items() if k.startswith("x_")}
    loop.DEFAULT_FLOAT8 = extra.pop("float8", DEFAULT_FLOAT8)  # what build() converts with for precision fp8
    model_levers = {k: extra.pop(k) for k in MODEL_LEVERS if k in extra}
    hot_path = {k: bool(extra.pop(k, False)) for k in ("lazy", "gc")}
    no_fsdp = extra.pop("no_fsdp", False)
    flce = extra.pop("loss", "") == "flce"
    how = no_fsdp if isinstance(no_fsdp, str) else "blocks"  # True: round five's per-block compile
    if no_fsdp and topo.world_size != 1:
        raise ValueError("x_no_fsdp is a one-GPU lever")
    if extra.pop("ce", "") == "elementwise":
        loss_module._compiled_ce_chunk = torch.compile(ce_chunk_elementwise, dynamic=False)
    loop.build_meta_model = partial(meta_model_with, **model_levers)  # type: ignore[assignment]
    if no_fsdp:
        loop.parallelize = partial(parallelize_plain, how=how)  # type: ignore[assignment]
    with levers(**extra):
        try:
            model, optimizer, config = build(cfg, topo, "full", device)
            ADAPTER_PARAMS[recipe.label] = adapter_params(model) if cfg.lora_rank else 0
        finally:
            loop.build_meta_model, loop.DEFAULT_FLOAT8 = build_meta_model, DEFAULT_FLOAT8
            loop.parallelize = parallelize
            loss_module._compiled_ce_chunk = None
        if flce:
            use_flce(model)
        if no_fsdp:
            autocast_forward(model, device)
        if cfg.precision == "fp8":
            fp8_layers = sum(type(m).__name__ == "Float8Linear" for m in model.modules())
            if topo.rank == 0:
                print(f"# {recipe.label}: {fp8_layers} Float8Linear layers", flush=True)
            if not fp8_layers:
                raise RuntimeError("precision fp8 converted no layer")
        times, losses = _timed_steps(
            args, cfg, topo, model, optimizer, config, device, graphs=how == "graphs", **hot_path
        )
    del model, optimizer
    return times, losses


def _timed_steps(
    args: argparse.Namespace,
    cfg: TrainConfig,
    topo: Topology,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    config: Any,
    device: torch.device,
    *,
    lazy: bool = False,
    gc: bool = False,
    graphs: bool = False,
) -> tuple[list[float], list[float]]:
    """Each step's seconds (``--timing step``: a device sync around every step) or, with ``--timing window``,
    the mean over the timed steps between one sync before them and one after (the host may run ahead).
    ``lazy``: read each loss a step late (no wait at a step's start); ``gc``: the collector every 50 steps;
    ``graphs``: the blocks run as CUDA graphs (a new step marked for Inductor's graph trees)."""
    times: list[float] = []
    losses: list[float] = []
    queued: list[torch.Tensor] = []
    window = args.timing == "window"
    start = 0.0
    with collected_every(GC_EVERY_STEPS if gc else 0) as collect:
        if not gc:
            import gc as gc_module

            gc_module.enable()  # the round-three behaviour: Python's automatic collector on
        for step in range(1, cfg.steps + 1):
            collect(step)
            if graphs:
                torch.compiler.cudagraph_mark_step_begin()
            if not window or step == args.warmup + 1:
                _sync(device)
                start = time.perf_counter()
            if lazy:
                queued.append(step_figures(cfg, topo, model, optimizer, step, "full", device, config.vocab_size)[0])
                if len(queued) > 1:
                    losses.append(float(queued.pop(0).item()))
            else:
                losses.append(train_step(cfg, topo, model, optimizer, step, "full", device, config.vocab_size))
            if not window:
                _sync(device)
                if step > args.warmup:
                    times.append(time.perf_counter() - start)
        losses.extend(float(q.item()) for q in queued)
        if window:
            _sync(device)
            timed = cfg.steps - args.warmup
            times = [(time.perf_counter() - start) / timed] * timed
    return times, losses


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="Qwen/Qwen2.5-1.5B")
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=8, help="samples per GPU per step")
    parser.add_argument("--steps", type=int, default=12, help="timed steps (the median is reported)")
    parser.add_argument("--warmup", type=int, default=4, help="untimed steps first")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--recipes", default="seed,ours-final", help=f"comma-separated of {RECIPES}, each with an optional @bBaA"
    )
    parser.add_argument("--json", default="", help="also write the results to this file (rank 0)")
    parser.add_argument(
        "--overrides", type=json.loads, default={}, help="JSON of Hugging Face config overrides (smaller models)"
    )
    parser.add_argument("--lr", type=float, default=2e-5, help="AdamW learning rate (constant)")
    parser.add_argument("--lr-warmup", type=int, default=0, help="linear warm-up steps (ours recipes)")
    parser.add_argument(
        "--text", default="", help="train on this text file's bytes (token ids 0..255) instead of random tokens"
    )
    parser.add_argument(
        "--timing",
        choices=("step", "window"),
        default="step",
        help="step: median of device-synced steps; window: one sync before and after the timed steps",
    )
    args = parser.parse_args()
    if args.text:
        loop.random_tokens = TextWindows(args.text)  # type: ignore[assignment]  # what train_step draws from
    try:
        recipes = [parse_recipe(r, args.batch) for r in args.recipes.split(",") if r]
    except ValueError as e:
        parser.error(str(e))
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
    if topo.rank == 0:
        import transformers

        print(
            f"# {topo.world_size}x {device_name}, torch {torch.__version__}, transformers "
            f"{transformers.__version__}, seq {args.seq_len}, default batch {args.batch}/GPU, "
            f"{args.warmup} warm-up + {args.steps} timed steps, {fpt / 1e9:.2f} GFLOP/token",
            flush=True,
        )

    results: list[Result] = []
    failed: list[str] = []
    for recipe in recipes:
        # Fresh compile caches per recipe: dynamo's recompile limit must not turn a later recipe eager.
        torch._dynamo.reset()
        if device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
        run = run_seed if recipe.name == "seed" else run_peft_plain if recipe.name in PEERS else run_ours
        try:
            times, losses = run(args, recipe, topo, device)
        except Exception as e:  # one recipe that cannot run (a kernel that refuses a shape) costs one row
            if topo.world_size > 1:
                raise
            import traceback

            traceback.print_exc()
            print(f"# failed {recipe.label}: {type(e).__name__}: {str(e)[:300]}", flush=True)
            failed.append(f"{recipe.label}: {type(e).__name__}: {str(e)[:200]}")
            gc.collect()
            continue
        on_gpu = device.type == "cuda"
        peak_mem = torch.tensor(
            [torch.cuda.max_memory_allocated(device), torch.cuda.max_memory_reserved(device)] if on_gpu else [0, 0],
            device=device,
        )
        dist.all_reduce(peak_mem, op=dist.ReduceOp.MAX)
        slowest = torch.tensor(times, device=device, dtype=torch.float64)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)  # a step lasts as long as its slowest rank
        median = statistics.median(slowest.tolist())
        tps = recipe.batch * recipe.grad_accum * args.seq_len / median
        result = Result(
            recipe.label,
            recipe.batch,
            recipe.grad_accum,
            tps,
            mfu(tps, flops_per_token(config, args.seq_len, ADAPTER_PARAMS.get(recipe.label, 0)), peak),
            peak_mem[0].item() / 2**30,
            losses[-1],
            median,
            losses,
            peak_mem[1].item() / 2**30,
        )
        results.append(result)
        if topo.rank == 0:
            brief = {k: v for k, v in asdict(result).items() if k != "losses"}
            print(f"# done {recipe.label}: {json.dumps(brief)}", flush=True)
        gc.collect()

    if topo.rank == 0:
        base = results[0].tokens_per_s_per_gpu if results else float("nan")
        tail = min(20, args.warmup + args.steps)
        print(f"\n{topo.world_size} GPU(s), seq {args.seq_len}, {args.warmup} + {args.steps} steps")
        print(
            "| recipe | tokens/GPU/step | tokens/s/GPU | MFU | peak memory | peak reserved "
            f"| loss after {args.warmup + args.steps} steps | mean loss, last {tail} steps | ratio |"
        )
        print("|---|---|---|---|---|---|---|---|---|")
        for r in results:
            m = f"{r.mfu * 100:.1f} %" if r.mfu is not None else "n/a"
            print(
                f"| {r.recipe} | {r.batch * r.grad_accum * args.seq_len:,} | {r.tokens_per_s_per_gpu:,.0f} | {m} "
                f"| {r.peak_memory_gib:.1f} GiB | {r.peak_reserved_gib:.1f} GiB | {r.final_loss:.4f} "
                f"| {statistics.fmean(r.losses[-tail:]):.4f} "
                f"| {r.tokens_per_s_per_gpu / base:.3f} |"
            )
        for line in failed:
            print(f"| {line} | failed |")
        if args.json:
            Path(args.json).write_text(json.dumps([asdict(r) for r in results], indent=2))
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
