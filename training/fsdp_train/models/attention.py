"""Attention kept inside documents without a dense mask: variable-length flash attention over packed rows.

Packed rows hold several documents; a token must attend only to earlier tokens of its own document.
transformers' ``sdpa`` path turns restarting position ids into a dense [batch, 1, seq, seq] mask, and
SDPA with any mask leaves the flash kernel for the slower memory-efficient one (8.6 % per step at
1.5B, seq 2048). Here the batch is flattened to one stream of documents and the document bounds
(``cu_seqlens``: where each document, or each row, begins in the stream) go to variable-length flash
attention (FlashAttention-4 where ``flash-attn-4`` is installed, ``fsdp_train.models.fa4``; else torch's
``torch.nn.attention.varlen``): causal inside each document, masked blocks never computed. Rows stay full
(``fsdp_train.datapath.packing`` cuts documents at row ends; a row start is a bound).

The model is built with ``attn_implementation=DOCUMENT_ATTENTION``. Batches carry the bounds as the
``document_bounds`` keyword (``document_bounds``), which transformers passes through to the attention
function. Without bounds (random tokens, ``document_mask: false``) it is plain causal SDPA; off CUDA, or
where torch lacks the varlen kernel, the same bounds become a dense block-causal mask for SDPA (the
same result, the old speed).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

import torch

from fsdp_train.datapath.packing import BOUNDS_KEY
from fsdp_train.models import fa4

DOCUMENT_ATTENTION = "fsdp_document_varlen"


def dense_mask(bounds: torch.Tensor, rows: int, seq_len: int) -> torch.Tensor:
    """The block-causal boolean mask [rows, 1, seq_len, seq_len] that ``bounds`` stand for (True: attend)."""
    total = rows * seq_len
    lengths = bounds[1:] - bounds[:-1]
    doc = torch.repeat_interleave(torch.arange(len(lengths), device=bounds.device), lengths.long(), output_size=total)
    doc = doc.view(rows, seq_len)
    same = doc[:, :, None] == doc[:, None, :]
    causal = torch.ones(seq_len, seq_len, dtype=torch.bool, device=bounds.device).tril()
    return (same & causal)[:, None]


def _find_varlen() -> tuple[Callable[..., Any], set[str]] | None:
    """torch's ``varlen_attn`` and its keyword names, or None where this torch has none."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    return varlen_attn, set(inspect.signature(varlen_attn).parameters)


# Looked up once at import, not through a cached function: the attention runs inside compiled blocks, and
# Dynamo does not trace through ``functools`` caches (it warns on every run and calls the function anyway).
_VARLEN = _find_varlen()


def _varlen() -> tuple[Callable[..., Any], set[str]] | None:
    return _VARLEN


def varlen_available(device: torch.device) -> bool:
    return device.type == "cuda" and _VARLEN is not None and torch.cuda.get_device_capability(device) >= (8, 0)


def to_device(batch: Mapping[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    """A micro-batch on ``device`` for the model (``sample_ids`` left out), the document bounds marked dynamic.

    The number of documents in a batch changes from batch to batch, and with it the length of the bounds.
    Marked dynamic before the first compiled call, that length is a symbol in the compiled blocks: one
    graph for every batch, no recompilation as the documents change (the other shapes stay static).
    """
    moved = {k: v.to(device, non_blocking=True) for k, v in batch.items() if k != "sample_ids"}
    bounds = moved.get(BOUNDS_KEY)
    if bounds is not None:
        torch._dynamo.maybe_mark_dynamic(bounds, 0)
    return moved


def _causal_varlen(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, bounds: torch.Tensor, max_len: int, scale: float | None
) -> torch.Tensor:
    found = _varlen()
    assert found is not None
    varlen_attn, params = found
    kwargs: dict[str, Any] = {"scale": scale}
    # torch 2.9-2.11 take is_causal; later releases express causality as a (-1, 0) window.
    if "is_causal" in params:
        kwargs["is_causal"] = True
    else:
        kwargs["window_size"] = (-1, 0)
    if key.shape[1] != query.shape[1] and "enable_gqa" in params:
        kwargs["enable_gqa"] = True
    # Otherwise (torch 2.9-2.11) key and value go to the flash kernel as they are: flash attention shares each
    # key/value head among its group of query heads itself (and sums their gradients), where copying them per
    # query head costs memory traffic forward and a reduction backward (bench/varlen_gqa.py compares both).
    out = varlen_attn(query, key, value, bounds, bounds, max_len, max_len, **kwargs)
    attended: torch.Tensor = out[0] if isinstance(out, tuple) else out
    return attended


def document_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention interface: query [B, Hq, S, D], key/value [B, Hkv, S, D] -> [B, S, Hq, D]."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    bounds = kwargs.pop(BOUNDS_KEY, None)
    if bounds is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
    rows, heads, seq_len, dim = query.shape
    fa4_here = fa4.available(query.device)
    if query.dtype in (torch.bfloat16, torch.float16) and (fa4_here or varlen_available(query.device)):
        q, k, v = (t.transpose(1, 2).reshape(rows * seq_len, t.shape[1], dim) for t in (query, key, value))
        kernel = fa4.causal_varlen if fa4_here else _causal_varlen
        out = kernel(q, k, v, bounds.to(query.device, torch.int32), seq_len, scaling)
        return out.view(rows, seq_len, heads, dim), None
    mask = dense_mask(bounds.to(query.device), rows, seq_len)
    return sdpa_attention_forward(module, query, key, value, mask, dropout, scaling, is_causal=False, **kwargs)


def _no_mask(*args: Any, **kwargs: Any) -> None:
    """The mask builder for ``DOCUMENT_ATTENTION``: the bounds say it all, no dense mask is built."""
    return None


def register() -> str:
    """Make ``DOCUMENT_ATTENTION`` known to transformers (idempotent); return its name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(DOCUMENT_ATTENTION, document_attention)
    AttentionMaskInterface.register(DOCUMENT_ATTENTION, _no_mask)
    return DOCUMENT_ATTENTION
