"""Unit tests of the chunked lm_head + cross-entropy against PyTorch's and Hugging Face's own losses."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from fsdp_train.models.loss import (
    IGNORE_INDEX,
    ce_chunk,
    linear_cross_entropy,
    shift_labels,
    use_loss,
)
from torch.utils.flop_counter import FlopCounterMode

TINY = {
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 64,
    "vocab_size": 97,
}


def reference(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    logits = hidden @ weight.t()
    upcast = logits.to(torch.promote_types(logits.dtype, torch.float32))  # as Hugging Face's .float()
    return F.cross_entropy(upcast, targets, ignore_index=IGNORE_INDEX)


@pytest.mark.parametrize("chunk_tokens", [1, 7, 16, 64])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_loss_and_gradients_match_cross_entropy(chunk_tokens: int, dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(chunk_tokens)
    hidden = torch.randn(37, 24, generator=gen, dtype=dtype)
    weight = torch.randn(53, 24, generator=gen, dtype=dtype) * 0.3
    targets = torch.randint(0, 53, (37,), generator=gen)
    targets[[0, 5, 36]] = IGNORE_INDEX
    grad_scale = 0.25  # as after dividing the loss by the accumulation steps

    h1, w1 = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    got = linear_cross_entropy(h1, w1, targets, chunk_tokens=chunk_tokens)
    (got * grad_scale).backward()
    h2, w2 = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    want = reference(h2, w2, targets)
    (want * grad_scale).backward()

    tol = 1e-12 if dtype == torch.float64 else 1e-5
    assert got.dtype == dtype
    assert got.item() == pytest.approx(want.item(), rel=tol)
    assert h1.grad is not None and h2.grad is not None and w1.grad is not None and w2.grad is not None
    assert (h1.grad - h2.grad).norm() / h2.grad.norm() < tol * 10
    assert (w1.grad - w2.grad).norm() / w2.grad.norm() < tol * 10
    assert h1.grad[[0, 5, 36]].abs().max() == 0  # ignored positions get no gradient


@pytest.mark.parametrize("chunk_tokens", [7, 64])
def test_a_frozen_weight_gets_no_gradient_and_the_hidden_states_the_right_one(chunk_tokens: int) -> None:
    """A LoRA run's lm_head is frozen: no weight gradient is made (no matmul, no buffer); the hidden states, theirs."""
    gen = torch.Generator().manual_seed(3)
    hidden = torch.randn(37, 24, generator=gen, dtype=torch.float64)
    weight = torch.randn(53, 24, generator=gen, dtype=torch.float64) * 0.3
    targets = torch.randint(0, 53, (37,), generator=gen)
    h1, frozen = hidden.clone().requires_grad_(), weight.clone()
    with FlopCounterMode(display=False) as counted:
        got = linear_cross_entropy(h1, frozen, targets, chunk_tokens=chunk_tokens)
    matmul = 2 * 37 * 53 * 24
    assert counted.get_total_flops() == 2 * matmul  # the logits and the hidden states' gradient, no weight gradient
    got.backward()
    h2 = hidden.clone().requires_grad_()
    reference(h2, weight.clone(), targets).backward()
    assert frozen.grad is None
    assert h1.grad is not None and h2.grad is not None
    assert (h1.grad - h2.grad).norm() / h2.grad.norm() < 1e-11


def test_bf16_matches_the_upcast_reference() -> None:
    """With bf16 operands the result follows Hugging Face's recipe: bf16 logits, fp32 softmax."""
    gen = torch.Generator().manual_seed(3)
    hidden = torch.randn(64, 32, generator=gen).bfloat16().requires_grad_()
    weight = (torch.randn(211, 32, generator=gen) * 0.2).bfloat16().requires_grad_()
    targets = torch.randint(0, 211, (64,), generator=gen)
    got = linear_cross_entropy(hidden, weight, targets, chunk_tokens=16)
    got.backward()
    assert hidden.grad is not None and weight.grad is not None
    assert (hidden.grad.dtype, weight.grad.dtype) == (torch.bfloat16, torch.bfloat16)
    h, w = hidden.detach().clone().requires_grad_(), weight.detach().clone().requires_grad_()
    want = reference(h, w, targets)
    want.backward()
    assert got.item() == pytest.approx(want.item(), rel=1e-5)
    assert h.grad is not None and w.grad is not None
    assert ((hidden.grad.float() - h.grad.float()).norm() / h.grad.float().norm()).item() < 1e-2
    assert ((weight.grad.float() - w.grad.float()).norm() / w.grad.float().norm()).item() < 1e-2


def test_without_grad_and_all_ignored() -> None:
    hidden, weight = torch.randn(5, 4), torch.randn(9, 4)
    targets = torch.tensor([1, 2, 3, 4, 5])
    with torch.no_grad():
        loss = linear_cross_entropy(hidden, weight, targets, chunk_tokens=2)
    assert loss.item() == pytest.approx(reference(hidden, weight, targets).item(), rel=1e-6)
    nothing = torch.full((5,), IGNORE_INDEX)
    assert linear_cross_entropy(hidden, weight, nothing).item() == 0.0
    with pytest.raises(ValueError, match="chunk_tokens must be greater than 0"):
        linear_cross_entropy(hidden, weight, targets, chunk_tokens=0)


def test_ce_chunk_gradient_is_softmax_minus_one_hot() -> None:
    logits = torch.tensor([[0.0, 0.0], [2.0, 0.0]])
    loss, grad = ce_chunk(logits, torch.tensor([1, IGNORE_INDEX]), torch.tensor(0.5))
    assert loss.item() == pytest.approx(torch.log(torch.tensor(2.0)).item())
    assert grad.tolist() == [[0.25, -0.25], [0.0, 0.0]]


def test_shift_labels() -> None:
    assert shift_labels(torch.tensor([[1, 2, 3]])).tolist() == [[2, 3, IGNORE_INDEX]]


@pytest.mark.parametrize(
    ("tied", "chunk_tokens", "compiled"),
    [
        (True, 5, False),
        (False, 5, False),
        # No chunks, compiled: the whole batch's logits, then the compiled cross-entropy (Inductor on the CPU here).
        (True, 0, True),
    ],
)
def test_model_forward_matches_hugging_face(tied: bool, chunk_tokens: int, compiled: bool) -> None:
    """The patched forward gives Hugging Face's loss and parameter gradients (tied and untied head; chunked, and
    whole and compiled)."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    torch.manual_seed(0)
    config = Qwen2Config(**TINY, tie_word_embeddings=tied)
    ours = AutoModelForCausalLM.from_config(config)
    theirs = AutoModelForCausalLM.from_config(config)
    theirs.load_state_dict(ours.state_dict())
    assert use_loss(ours, chunk_tokens=chunk_tokens, compiled=compiled)
    tokens = torch.randint(0, TINY["vocab_size"], (3, 11))

    got = ours(input_ids=tokens, labels=tokens).loss
    want = theirs(input_ids=tokens, labels=tokens).loss
    assert got.item() == pytest.approx(want.item(), rel=1e-6)
    got.backward()
    want.backward()
    grads = dict(theirs.named_parameters())
    for name, param in ours.named_parameters():
        assert param.grad is not None and grads[name].grad is not None
        assert torch.allclose(param.grad, grads[name].grad, rtol=1e-4, atol=1e-6), name
    # Without labels the logits come back as before.
    assert torch.allclose(ours(input_ids=tokens).logits, theirs(input_ids=tokens).logits, atol=1e-6)


def test_unsupported_or_disabled_keeps_the_model_forward() -> None:
    from transformers import AutoModelForCausalLM, Gemma2Config, Qwen2Config

    model = AutoModelForCausalLM.from_config(Qwen2Config(**TINY))
    assert not use_loss(model, chunk_tokens=0, compiled=False)  # no chunks and no compile: the model's own loss
    assert "forward" not in vars(model)
    # Gemma 2 soft-caps its logits: lm_head(hidden) alone would be the wrong loss.
    gemma = AutoModelForCausalLM.from_config(Gemma2Config(**TINY, head_dim=8))
    assert not use_loss(gemma, chunk_tokens=8, compiled=False)
    assert not use_loss(gemma, chunk_tokens=0, compiled=True)
    assert "forward" not in vars(gemma)
