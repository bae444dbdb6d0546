"""The document mask's attention kernels against plain causal attention, one layer of Qwen2.5-1.5B's shape.

    python bench/doc_attention.py

8 rows of 2,048 tokens, 12 query heads, 2 key/value heads, head dim 128, bf16; documents of the lengths a code
corpus gives (log-normal, median ~600 tokens, cut at row ends as ``fsdp_train.datapath.packing`` cuts them), then of
~4,400 tokens (files longer than a row, as in the standard library's sources: most rows hold one document). Each way's
forward+backward time per layer (CUDA events, median of 50 after 10) and its largest difference from the
variable-length flash kernel's output and gradients (the training function's way today):

- ``causal``: plain causal rows, no document mask (what random tokens run: the baseline), by torch's choice of
  kernel with grouped heads (transformers' way) and by cuDNN's with key and value repeated;
- ``varlen``: ``torch.nn.attention.varlen.varlen_attn`` over the documents (``fsdp_train.models.attention``);
- ``cudnn-mask``: cuDNN's SDPA with the dense block-causal mask as a boolean ``attn_mask``;
- ``flex``: ``flex_attention`` (compiled) with a block mask of the documents, grouped heads as they are;
- ``nested``: the documents as a jagged nested tensor, SDPA with ``is_causal`` on cuDNN's, flash's or the
  memory-efficient kernel.

Where the ``flash-attn-4`` package is installed, FlashAttention-4 runs as three more rows, grouped heads as they
are: its own functions (``fa4 causal``, ``fa4 varlen``) and the training function's wrapping of its varlen kernel
(``fsdp_train.models.fa4``).

A way this torch cannot run prints its error and the others go on.
"""

from __future__ import annotations

import math
import statistics
import sys
from collections.abc import Callable

import torch
import torch.nn.functional as F
from fsdp_train.models import fa4
from fsdp_train.models.attention import _causal_varlen, dense_mask
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, "bench")
from varlen_gqa import bounds

ROWS, SEQ, HQ, HKV, DIM = 8, 2048, 12, 2, 128
Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
"""query [rows*seq, Hq, D], key/value [rows*seq, Hkv, D] -> [rows*seq, Hq, D]."""


def heads_first(t: torch.Tensor) -> torch.Tensor:
    return t.view(ROWS, SEQ, t.shape[1], DIM).transpose(1, 2)


def tokens_first(t: torch.Tensor) -> torch.Tensor:
    return t.transpose(1, 2).reshape(ROWS * SEQ, t.shape[1], DIM)


def causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """What transformers' SDPA path runs for rows without a mask: grouped heads, torch's choice of kernel."""
    query, key, value = (heads_first(t) for t in (q, k, v))
    out = F.scaled_dot_product_attention(query, key, value, is_causal=True, enable_gqa=True)
    return tokens_first(out)


def causal_flash(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """The flash kernel for the same rows, grouped heads as they are (varlen's kernel, without documents)."""
    query, key, value = (heads_first(t) for t in (q, k, v))
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        out = F.scaled_dot_product_attention(query, key, value, is_causal=True, enable_gqa=True)
    return tokens_first(out)


def causal_cudnn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """cuDNN's kernel for the same rows (it takes no grouped heads: key and value repeated per query head)."""
    key, value = (heads_first(t).repeat_interleave(HQ // HKV, dim=1) for t in (k, v))
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        out = F.scaled_dot_product_attention(heads_first(q), key, value, is_causal=True)
    return tokens_first(out)


def ways(cu: torch.Tensor) -> dict[str, Attend]:
    mask = dense_mask(cu, ROWS, SEQ)

    def varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return _causal_varlen(q, k, v, cu, SEQ, None)

    # The kernel's grid is sized by max_seqlen: the longest document, or that rounded up to a power of two
    # (a handful of values, so a compiled block would see few distinct ones), against the row length above.
    longest = int((cu[1:] - cu[:-1]).max().item())
    bucket = 1 << (longest - 1).bit_length()

    def varlen_longest(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return _causal_varlen(q, k, v, cu, longest, None)

    def varlen_bucket(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return _causal_varlen(q, k, v, cu, bucket, None)

    def cudnn_mask(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        groups = HQ // HKV
        key, value = (heads_first(t).repeat_interleave(groups, dim=1) for t in (k, v))
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            out = F.scaled_dot_product_attention(heads_first(q), key, value, attn_mask=mask)
        return tokens_first(out)

    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    doc = torch.repeat_interleave(
        torch.arange(len(cu) - 1, device=cu.device), (cu[1:] - cu[:-1]).long(), output_size=ROWS * SEQ
    ).view(ROWS, SEQ)

    def same_document(b: torch.Tensor, h: torch.Tensor, qi: torch.Tensor, ki: torch.Tensor) -> torch.Tensor:
        return (doc[b, qi] == doc[b, ki]) & (qi >= ki)

    block_mask = create_block_mask(same_document, ROWS, None, SEQ, SEQ, device="cuda")
    compiled_flex = torch.compile(flex_attention, dynamic=False)

    def flex(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        out = compiled_flex(heads_first(q), heads_first(k), heads_first(v), block_mask=block_mask, enable_gqa=True)
        assert isinstance(out, torch.Tensor)
        return tokens_first(out)

    offsets = cu.long()

    def nested(backends: list[SDPBackend]) -> Attend:
        """The documents as a jagged nested tensor [documents, heads, length, dim], SDPA on the chosen kernels."""

        def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            query, key, value = (
                torch.nested.nested_tensor_from_jagged(t, offsets, min_seqlen=1, max_seqlen=SEQ).transpose(1, 2)
                for t in (q, k, v)
            )
            with sdpa_kernel(backends):
                out = F.scaled_dot_product_attention(query, key, value, is_causal=True, enable_gqa=True)
            return out.transpose(1, 2).values()

        return attend

    return {
        **flash_attn_4(cu),
        "nested, cuDNN": nested([SDPBackend.CUDNN_ATTENTION]),
        "nested, flash": nested([SDPBackend.FLASH_ATTENTION]),
        "nested, memory-efficient": nested([SDPBackend.EFFICIENT_ATTENTION]),
        "varlen": varlen,
        f"varlen, max_seqlen {longest}": varlen_longest,
        f"varlen, max_seqlen {bucket}": varlen_bucket,
        "cudnn-mask": cudnn_mask,
        "flex": flex,
    }


def flash_attn_4(cu: torch.Tensor) -> dict[str, Attend]:
    """FlashAttention-4's own functions (``flash_attn.cute``), where that package imports; else no rows."""
    try:
        from flash_attn.cute import flash_attn_func, flash_attn_varlen_func
    except ImportError:
        return {}

    def first(out: torch.Tensor | tuple[torch.Tensor, ...]) -> torch.Tensor:
        return out[0] if isinstance(out, tuple) else out

    def fa4_causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        rows_first = (t.view(ROWS, SEQ, t.shape[1], DIM) for t in (q, k, v))
        return first(flash_attn_func(*rows_first, causal=True)).reshape(ROWS * SEQ, HQ, DIM)

    def fa4_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        bounds = {"cu_seqlens_q": cu, "cu_seqlens_k": cu, "max_seqlen_q": SEQ, "max_seqlen_k": SEQ}
        return first(flash_attn_varlen_func(q, k, v, causal=True, **bounds))

    def ours(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return fa4.causal_varlen(q, k, v, cu, SEQ, None)

    return {"fa4 causal (no mask)": fa4_causal, "fa4 varlen": fa4_varlen, "fsdp_train.models.fa4": ours}


def timed(attend: Attend, leaves: list[torch.Tensor], grad_out: torch.Tensor) -> float:
    times = []
    for _ in range(60):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        attend(*leaves).backward(grad_out)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times[10:])


def outputs(attend: Attend, leaves: list[torch.Tensor], grad_out: torch.Tensor) -> list[torch.Tensor]:
    for t in leaves:
        t.grad = None
    out = attend(*leaves)
    out.backward(grad_out)
    return [out.detach().float(), *(t.grad.float() for t in leaves if t.grad is not None)]


def main() -> None:
    for log_median in (6.4, 8.4):
        print(f"## documents of median length e^{log_median} = {math.exp(log_median):.0f} tokens (log-normal, sigma 1)")
        compare(log_median)


def compare(log_median: float) -> None:
    cu = bounds(ROWS, SEQ, torch.Generator().manual_seed(0), log_median)
    lengths = (cu[1:] - cu[:-1]).float()
    print(
        f"documents: {len(cu) - 1} in {ROWS} rows, mean length {lengths.mean().item():.0f} tokens,"
        f" longest {lengths.max().item():.0f}"
    )
    torch.manual_seed(0)
    leaves = [
        torch.randn(ROWS * SEQ, h, DIM, device="cuda", dtype=torch.bfloat16, requires_grad=True) for h in (HQ, HKV, HKV)
    ]
    grad_out = torch.randn(ROWS * SEQ, HQ, DIM, device="cuda", dtype=torch.bfloat16)
    reference = outputs(ways(cu)["varlen"], leaves, grad_out)
    rows = [
        ("causal (no mask), default", causal, False),
        ("causal (no mask), flash", causal_flash, False),
        ("causal (no mask), cuDNN", causal_cudnn, False),
    ]
    rows += [(name, attend, "no mask" not in name) for name, attend in ways(cu).items()]
    for name, attend, compare in rows:
        try:
            got = outputs(attend, leaves, grad_out)
            diff = max((a - b).abs().max().item() for a, b in zip(got, reference, strict=True)) if compare else None
            ms = timed(attend, leaves, grad_out)
        except Exception as error:  # a way this torch lacks is reported, and the others still run
            print(f"{name:28s} failed: {type(error).__name__}: {str(error)[:300]}")
            continue
        shown = "" if diff is None else f", max |difference from varlen| {diff:.2e}"
        print(f"{name:28s} fwd+bwd {ms:.3f} ms per layer{shown}")


if __name__ == "__main__":
    main()
