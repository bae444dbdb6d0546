"""The causal-LM loss of the training loop: lm_head + cross-entropy in chunks of tokens, gradients in one pass.

Hugging Face's path writes the logits (tokens x 151,936 for Qwen2.5) in bf16, upcasts them to fp32 and
keeps them for backward: ~15 GB at 16k tokens per GPU. Here each chunk of tokens gets its logits, its
loss and its logit gradient at once; the gradients for the hidden states and the weight are formed
during forward (the Liger-kernel scheme), so no logits outlive their chunk and backward only scales.
Same FLOPs as the unfused path (three matmuls), one chunk of logits in memory.

With ``torch.compile`` on and no chunking (``loss_chunk_tokens: 0``), the whole batch's logits stay in the compute
dtype and the cross-entropy is compiled (torchtitan's loss): the fp32 upcast is fused into the softmax's
reductions, so no fp32 logits are written either. For Qwen2.5-1.5B on one H200 at 16k tokens a step, the training
function ran 2.2-2.8 % faster than with chunks of 4096 tokens, for 2.1 GiB more peak memory (docs/performance.md,
round eleven); chunks still bound the logits' memory, which grows with the tokens per GPU.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

IGNORE_INDEX = -100
"""Label value that takes no part in the loss (Hugging Face's convention)."""

CHUNKED_MODEL_TYPES = frozenset({"qwen2", "qwen3", "llama", "mistral"})
"""Model types whose logits are exactly ``lm_head(final hidden state)``: no soft-capping or logit scale."""

CeChunk = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


def ce_chunk(logits: torch.Tensor, targets: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed cross-entropy of one chunk (fp32) and its gradient w.r.t. ``logits`` times ``scale``.

    ``logits`` [C, V] in the compute dtype; ``targets`` [C] with ``IGNORE_INDEX`` rows contributing
    neither loss nor gradient. The softmax runs in fp32, as Hugging Face's upcast does. (The gradient as
    one elementwise expression, the one-hot a comparison with the column index, ran 3.2 % slower per
    training step than this ``scatter_add`` on an H200: docs/performance.md, round five.)
    """
    x = logits.to(torch.promote_types(logits.dtype, torch.float32))
    valid = targets != IGNORE_INDEX
    safe = torch.where(valid, targets, 0)
    lse = torch.logsumexp(x, dim=-1)
    picked = x.gather(1, safe[:, None]).squeeze(1)
    loss = torch.where(valid, lse - picked, 0.0).sum()
    probs = torch.exp(x - lse[:, None])
    probs = probs.scatter_add(1, safe[:, None], torch.full_like(picked[:, None], -1.0))
    grad = probs * (valid.to(x.dtype) * scale)[:, None]
    return loss, grad.to(logits.dtype)


_compiled_ce_chunk: CeChunk | None = None


def compiled_ce_chunk() -> CeChunk:
    """``ce_chunk`` through ``torch.compile``: one fused pass for the max/sum and one for the gradient."""
    global _compiled_ce_chunk
    if _compiled_ce_chunk is None:
        _compiled_ce_chunk = torch.compile(ce_chunk, dynamic=False)
    return _compiled_ce_chunk


def cross_entropy_upcast(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Hugging Face's causal-LM loss over logits in the compute dtype: the softmax in fp32 (its ``.float()``), the
    mean over the targets that are not ``IGNORE_INDEX``. ``logits`` [..., V], ``targets`` [...]."""
    upcast = logits.reshape(-1, logits.shape[-1]).to(torch.promote_types(logits.dtype, torch.float32))
    return nn.functional.cross_entropy(upcast, targets.reshape(-1), ignore_index=IGNORE_INDEX)


_compiled_cross_entropy: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None


def compiled_cross_entropy() -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """``cross_entropy_upcast`` through ``torch.compile``: the upcast fused into the reductions, no fp32 logits."""
    global _compiled_cross_entropy
    if _compiled_cross_entropy is None:
        _compiled_cross_entropy = torch.compile(cross_entropy_upcast, dynamic=False)
    return _compiled_cross_entropy


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        targets: torch.Tensor,
        chunk_tokens: int,
        chunk_fn: CeChunk,
    ) -> torch.Tensor:
        grads = ctx.needs_input_grad[0] or ctx.needs_input_grad[1]
        # A frozen lm_head (LoRA) needs no weight gradient: neither its matmul nor its vocab x hidden buffer.
        weight_grads = ctx.needs_input_grad[1]
        # A tensor, not a Python number: counting the valid targets must not wait for the GPU.
        acc_dtype = torch.promote_types(hidden.dtype, torch.float32)
        scale = 1.0 / (targets != IGNORE_INDEX).sum().clamp(min=1).to(acc_dtype)
        total = torch.zeros((), dtype=acc_dtype, device=hidden.device)
        grad_hidden = torch.empty_like(hidden) if grads else None
        grad_weight: torch.Tensor | None = None
        for start in range(0, hidden.shape[0], chunk_tokens):
            h = hidden[start : start + chunk_tokens]
            loss, grad_logits = chunk_fn(h @ weight.t(), targets[start : start + chunk_tokens], scale)
            total += loss
            if grad_hidden is not None:
                rows = grad_hidden[start : start + chunk_tokens]
                if grad_logits.dtype == weight.dtype == rows.dtype:
                    torch.mm(grad_logits, weight, out=rows)
                else:  # under autocast (fp32 weights and hidden states, bf16 matmuls)
                    rows.copy_(grad_logits @ weight)
            if grads and weight_grads:
                part = grad_logits.t() @ h
                # The first chunk's product is kept as it is (one chunk, the common GPU setting, then costs no
                # accumulator at all); later chunks are summed in fp32, without bf16 rounding in between.
                grad_weight = part if grad_weight is None else grad_weight.to(acc_dtype).add_(part)
        ctx.save_for_backward(grad_hidden, grad_weight)
        ctx.weight_dtype = weight.dtype
        return total * scale

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        grad_hidden, grad_weight = ctx.saved_tensors
        return (
            (grad_hidden.to(grad_out.dtype) * grad_out).to(grad_hidden.dtype),
            None if grad_weight is None else (grad_weight * grad_out).to(ctx.weight_dtype),
            None,
            None,
            None,
        )


def linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    *,
    chunk_tokens: int = 4096,
    chunk_fn: CeChunk = ce_chunk,
) -> torch.Tensor:
    """Mean cross-entropy of ``hidden @ weight.T`` against ``targets`` over the non-ignored targets.

    ``hidden`` [N, d], ``weight`` [V, d], ``targets`` [N]. Equals
    ``F.cross_entropy((hidden @ weight.T).float(), targets, ignore_index=-100)`` with logits rounded
    to the compute dtype, as Hugging Face computes them.
    """
    if chunk_tokens <= 0:
        raise ValueError(f"chunk_tokens must be greater than 0, got {chunk_tokens}")
    out: torch.Tensor = _LinearCrossEntropy.apply(  # type: ignore[no-untyped-call]
        hidden, weight, targets, chunk_tokens, chunk_fn
    )
    return out


def shift_labels(labels: torch.Tensor) -> torch.Tensor:
    """Targets of a causal LM: position t predicts label t+1; the last position predicts nothing."""
    return nn.functional.pad(labels, (0, 1), value=IGNORE_INDEX)[..., 1:]


def supports_chunked_loss(model: nn.Module) -> bool:
    config = getattr(model, "config", None)
    return (
        getattr(config, "model_type", None) in CHUNKED_MODEL_TYPES
        and isinstance(getattr(model, "lm_head", None), nn.Linear)
        and isinstance(getattr(model, "model", None), nn.Module)
    )


LossOf = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""(final hidden states [..., d], targets [...]) -> the mean loss."""


def use_loss(model: nn.Module, *, chunk_tokens: int, compiled: bool) -> bool:
    """Make ``model(input_ids=..., labels=...).loss`` one of this module's losses; False (the model's own forward
    kept) where the model's logits are not ``lm_head(final hidden state)`` or neither applies.

    ``chunk_tokens`` > 0: :func:`linear_cross_entropy` in chunks of that many tokens. 0 with ``compiled``: the whole
    batch's logits in the compute dtype, then :func:`compiled_cross_entropy`. 0 without: the model's own loss.
    """
    if not supports_chunked_loss(model) or (chunk_tokens <= 0 and not compiled):
        return False
    head = model.lm_head
    assert isinstance(head, nn.Linear)  # supports_chunked_loss checked
    loss_of: LossOf
    if chunk_tokens > 0:
        chunk_fn = compiled_ce_chunk() if compiled else ce_chunk

        def loss_of(hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
            flat = hidden.reshape(-1, hidden.shape[-1])
            return linear_cross_entropy(
                flat, head.weight, targets.reshape(-1), chunk_tokens=chunk_tokens, chunk_fn=chunk_fn
            )

    else:
        cross_entropy = compiled_cross_entropy()

        def loss_of(hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
            return cross_entropy(head(hidden), targets)

    replace_loss(model, loss_of)
    return True


def replace_loss(model: nn.Module, loss_of: LossOf) -> None:
    """``model(input_ids=..., labels=...).loss`` becomes ``loss_of(final hidden states, shift_labels(labels))``, for a
    model that ``supports_chunked_loss``. The forward is replaced on this instance only, so FSDP2's hooks on the root
    module (which gather the tied embedding / lm_head) still run around it. Without labels it returns the logits as
    before."""
    from transformers.modeling_outputs import CausalLMOutputWithPast

    base, head = model.model, model.lm_head
    assert isinstance(base, nn.Module) and isinstance(head, nn.Linear)

    def forward(
        input_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None, **kwargs: Any
    ) -> CausalLMOutputWithPast:
        hidden = base(input_ids=input_ids, **kwargs).last_hidden_state
        if labels is None:
            return CausalLMOutputWithPast(logits=head(hidden))
        return CausalLMOutputWithPast(loss=loss_of(hidden, shift_labels(labels)))  # type: ignore[arg-type]

    model.forward = forward
