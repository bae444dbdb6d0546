"""FlashAttention-4's variable-length kernel for the document mask, where the ``flash-attn-4`` package is installed.

On Hopper (and Blackwell) its kernel runs attention inside documents about as fast as cuDNN runs plain causal rows,
where torch's own ``varlen_attn`` (FlashAttention-2) is 1.5x slower (docs/performance.md, round ten). It is optional:
the Ray Train image does not ship it (``pip install flash-attn-4``, e.g. in the job's runtime environment); without it,
or on another GPU, ``fsdp_train.models.attention`` uses torch's kernel.

Wrapped here as two custom ops, forward and backward, with shapes for tracing: torch.compile keeps them opaque (the
kernels are compiled by their own DSL at first call), and autograd calls the backward op. torch 2.11's own switch,
``activate_flash_attention_impl("FA4")``, cannot be used with flash-attn-4 4.0.0b36: torch unpacks two results from a
forward that now returns five.
"""

from __future__ import annotations

import importlib.util
import math
from typing import Any

import torch

# Compute capabilities with FlashAttention-4 kernels (Hopper, Blackwell).
_ARCHES = (9, 10)


def _installed() -> bool:
    try:
        return importlib.util.find_spec("flash_attn.cute") is not None
    except ImportError:  # a ``flash_attn`` without the ``cute`` package
        return False


# Looked up once at import (not imported: its DSL loads at the first call): the check runs inside compiled blocks.
INSTALLED = _installed()


def available(device: torch.device) -> bool:
    """Whether ``flash_attn.cute`` is installed and ``device`` is a GPU it has kernels for."""
    return INSTALLED and device.type == "cuda" and torch.cuda.get_device_capability(device)[0] in _ARCHES


@torch.library.custom_op("fsdp_train::fa4_varlen_fwd", mutates_args=())
def _forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bounds: torch.Tensor, max_len: int, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    from flash_attn.cute.interface import _flash_attn_fwd

    kw: dict[str, Any] = {"cu_seqlens_q": bounds, "cu_seqlens_k": bounds, "max_seqlen_q": max_len}
    out, lse, *_ = _flash_attn_fwd(
        q, k, v, **kw, max_seqlen_k=max_len, softmax_scale=scale, causal=True, return_lse=True
    )
    return out, lse


@_forward.register_fake
def _forward_shapes(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bounds: torch.Tensor, max_len: int, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    # The kernel's log-sum-exp of a variable-length batch is [heads, tokens], fp32.
    return torch.empty_like(q), q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32)


@torch.library.custom_op("fsdp_train::fa4_varlen_bwd", mutates_args=())
def _backward_op(
    grad_out: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    bounds: torch.Tensor,
    max_len: int,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    from flash_attn.cute.interface import _flash_attn_bwd

    kw: dict[str, Any] = {"cu_seqlens_q": bounds, "cu_seqlens_k": bounds, "max_seqlen_q": max_len}
    grads = _flash_attn_bwd(
        q, k, v, out, grad_out.contiguous(), lse, softmax_scale=scale, causal=True, **kw, max_seqlen_k=max_len
    )
    return grads[0], grads[1], grads[2]


@_backward_op.register_fake
def _backward_shapes(
    grad_out: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    bounds: torch.Tensor,
    max_len: int,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _save(ctx: Any, inputs: tuple[Any, ...], output: tuple[torch.Tensor, torch.Tensor]) -> None:
    q, k, v, bounds, max_len, scale = inputs
    ctx.save_for_backward(q, k, v, bounds, *output)
    ctx.max_len, ctx.scale = max_len, scale


def _backward(ctx: Any, grad_out: torch.Tensor, grad_lse: torch.Tensor | None) -> tuple[Any, ...]:
    q, k, v, bounds, out, lse = ctx.saved_tensors
    dq, dk, dv = _backward_op(grad_out, q, k, v, out, lse, bounds, ctx.max_len, ctx.scale)
    return dq, dk, dv, None, None, None


_forward.register_autograd(_backward, setup_context=_save)


def causal_varlen(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, bounds: torch.Tensor, max_len: int, scale: float | None
) -> torch.Tensor:
    """Causal attention inside each document: query [tokens, Hq, D], key/value [tokens, Hkv, D] -> [tokens, Hq, D].

    Grouped key/value heads go to the kernel as they are (it shares each among its query heads).
    """
    softmax_scale = scale if scale is not None else 1.0 / math.sqrt(query.shape[-1])
    out: torch.Tensor = _forward(query, key, value, bounds, max_len, softmax_scale)[0]
    return out
