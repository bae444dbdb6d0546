"""Variable-length flash attention with grouped key/value heads: passed as they are against repeated per query head.

    python bench/varlen_gqa.py

Qwen2.5-1.5B's attention shape (12 query heads, 2 key/value heads, head dim 128), 8 rows of 2,048 tokens cut into
documents of the lengths a code corpus gives (log-normal, median ~600 tokens). Prints whether both ways give the
same output and gradients (to bf16 rounding) and the forward+backward time of each (CUDA events, median of 50).
"""

from __future__ import annotations

import inspect
import statistics

import torch
from torch.nn.attention.varlen import varlen_attn


def bounds(rows: int, seq: int, generator: torch.Generator, log_median: float = 6.4) -> torch.Tensor:
    cuts = [0]
    for row in range(rows):
        start, end = row * seq, (row + 1) * seq
        at = start
        while at < end:
            length = int(torch.empty(1).log_normal_(log_median, 1.0, generator=generator).item()) + 1
            at = min(end, at + length)
            cuts.append(at)
    return torch.tensor(cuts, dtype=torch.int32, device="cuda")


def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu: torch.Tensor, seq: int, repeat: bool) -> torch.Tensor:
    if repeat:
        groups = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    causal = (
        {"is_causal": True} if "is_causal" in inspect.signature(varlen_attn).parameters else {"window_size": (-1, 0)}
    )
    out = varlen_attn(q, k, v, cu, cu, seq, seq, **causal)
    return out[0] if isinstance(out, tuple) else out


def main() -> None:
    rows, seq, hq, hkv, dim = 8, 2048, 12, 2, 128
    generator = torch.Generator().manual_seed(0)
    cu = bounds(rows, seq, generator)
    torch.manual_seed(0)
    leaves = [
        torch.randn(rows * seq, h, dim, device="cuda", dtype=torch.bfloat16, requires_grad=True) for h in (hq, hkv, hkv)
    ]
    grad_out = torch.randn(rows * seq, hq, dim, device="cuda", dtype=torch.bfloat16)
    results = {}
    for repeat in (True, False):
        for t in leaves:
            t.grad = None
        out = run(*leaves, cu, seq, repeat)
        out.backward(grad_out)
        results[repeat] = [out.detach().clone(), *(t.grad.clone() for t in leaves)]
    for name, a, b in zip(("out", "dq", "dk", "dv"), results[True], results[False], strict=True):
        print(
            f"{name}: max |repeat - native| = {(a.float() - b.float()).abs().max().item():.3e}"
            f" (max |value| {a.float().abs().max().item():.3e})"
        )
    print(f"documents: {len(cu) - 1} in {rows} rows")
    for repeat in (True, False, True, False):
        times = []
        for _ in range(60):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            run(*leaves, cu, seq, repeat).backward(grad_out)
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        way = "repeated" if repeat else "native  "
        print(f"{way} key/value heads: fwd+bwd {statistics.median(times[10:]):.3f} ms per layer, median of 50")


if __name__ == "__main__":
    main()
