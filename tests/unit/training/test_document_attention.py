"""Attention inside documents from document bounds (``fsdp_train.models.attention``), not from a dense mask.

On CPU the bounds become the dense block-causal mask (the fallback); with CUDA the varlen flash kernel
runs, and must give the loss of the dense path. Speed is measured by ``bench/data_runs.sh`` (docs/data.md).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from fsdp_train.datapath.feed import Collate
from fsdp_train.datapath.packing import BOUNDS_KEY, DOC_START, TARGET, Packed, document_bounds
from fsdp_train.models import fa4
from fsdp_train.models.attention import DOCUMENT_ATTENTION, document_attention, register, varlen_available
from fsdp_train.models.model import build_meta_model
from support.tiny_hf import TINY_QWEN2


def packed(rows: int, seq_len: int, seed: int = 0) -> Packed:
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, 64, (rows, seq_len)).astype(np.int32)
    flags = np.full((rows, seq_len), TARGET, np.uint8)
    for row in range(rows):
        for start in rng.choice(np.arange(1, seq_len), 3, replace=False):
            flags[row, start] = DOC_START
    flags[0, 0] = DOC_START
    return Packed(ids, flags)


def test_bounds_are_every_document_and_row_start_of_the_flattened_batch() -> None:
    starts = np.zeros((2, 6), bool)
    starts[0, 3] = starts[1, 2] = starts[1, 5] = True
    assert document_bounds(starts).tolist() == [0, 3, 6, 8, 11, 12]
    assert document_bounds(np.zeros((1, 4), bool)).tolist() == [0, 4]


def models(device: torch.device, dtype: torch.dtype) -> tuple[torch.nn.Module, torch.nn.Module]:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    reference = Qwen2ForCausalLM._from_config(
        Qwen2Config(**TINY_QWEN2, vocab_size=64), attn_implementation="sdpa", dtype=dtype
    ).to(device)
    ours = Qwen2ForCausalLM._from_config(
        Qwen2Config(**TINY_QWEN2, vocab_size=64), attn_implementation=register(), dtype=dtype
    ).to(device)
    ours.load_state_dict(reference.state_dict())
    return reference.eval(), ours.eval()


def losses(device: torch.device, dtype: torch.dtype) -> tuple[float, float, float]:
    """(ours with bounds, transformers' dense mask from position ids, plain causal) on the same rows."""
    reference, ours = models(device, dtype)
    batch = {k: v.to(device) for k, v in Collate(packed(4, 48))(list(range(4))).items() if k != "sample_ids"}
    plain = {k: v for k, v in batch.items() if k in ("input_ids", "labels")}
    dense = {k: v for k, v in batch.items() if k != BOUNDS_KEY}
    with torch.no_grad():
        return (
            float(ours(**batch, use_cache=False).loss),
            float(reference(**dense, use_cache=False).loss),
            float(reference(**plain, use_cache=False).loss),
        )


def test_bounds_keep_attention_inside_documents_as_the_dense_mask_did() -> None:
    bounded, dense, causal = losses(torch.device("cpu"), torch.float32)
    assert bounded == pytest.approx(dense, abs=1e-5)
    assert abs(bounded - causal) > 1e-4  # the documents really are kept apart (a fresh model attends evenly)


def test_the_training_model_uses_the_document_attention_and_builds_no_dense_mask() -> None:
    from transformers import Qwen2Config
    from transformers.masking_utils import create_causal_mask

    model = build_meta_model(Qwen2Config(**TINY_QWEN2, vocab_size=64))
    assert model.config._attn_implementation == DOCUMENT_ATTENTION
    position_ids = torch.tensor([[0, 1, 2, 0, 1, 2]])
    mask = create_causal_mask(
        config=model.config,
        inputs_embeds=torch.zeros(1, 6, 64),
        attention_mask=None,
        past_key_values=None,
        position_ids=position_ids,
    )
    assert mask is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the varlen flash kernel needs a CUDA GPU")
def test_the_varlen_kernel_gives_the_dense_masks_loss() -> None:
    device = torch.device("cuda")
    assert varlen_available(device)
    bounded, dense, causal = losses(device, torch.bfloat16)
    assert bounded == pytest.approx(dense, rel=2e-2)
    assert abs(bounded - causal) > abs(bounded - dense)


def test_flashattention4_is_used_only_where_installed_and_on_its_gpus() -> None:
    """This machine has no GPU: the optional kernel is never chosen here, whether the package is installed or not."""
    assert not fa4.available(torch.device("cpu"))


def test_the_document_attention_takes_flashattention4_where_it_is_available(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where flash-attn-4 runs, the bounds go to it (tokens first, grouped heads as they are), not to torch's varlen."""
    seen: list[tuple[tuple[int, ...], tuple[int, ...], int]] = []

    def kernel(
        q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bounds: torch.Tensor, max_len: int, scale: float | None
    ) -> torch.Tensor:
        seen.append((tuple(q.shape), tuple(k.shape), max_len))
        return torch.zeros_like(q)

    monkeypatch.setattr(fa4, "available", lambda device: True)
    monkeypatch.setattr(fa4, "causal_varlen", kernel)
    query = torch.randn(2, 12, 8, 16, dtype=torch.bfloat16)
    key = value = torch.randn(2, 2, 8, 16, dtype=torch.bfloat16)
    bounds = torch.tensor([0, 3, 8, 16], dtype=torch.int32)
    out, _ = document_attention(torch.nn.Module(), query, key, value, None, **{BOUNDS_KEY: bounds})
    assert seen == [((16, 12, 16), (16, 2, 16), 8)]
    assert out.shape == (2, 8, 12, 16)


def test_flashattention4_ops_give_shapes_to_tracing_and_gradients_to_autograd() -> None:
    """The custom ops' shape functions and backward wiring, traced without the kernels (fake tensors)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        q = torch.empty(32, 12, 128, dtype=torch.bfloat16, requires_grad=True)
        k = torch.empty(32, 2, 128, dtype=torch.bfloat16, requires_grad=True)
        v = torch.empty(32, 2, 128, dtype=torch.bfloat16, requires_grad=True)
        out = fa4.causal_varlen(q, k, v, torch.empty(3, dtype=torch.int32), 16, None)
        out.sum().backward()
        assert out.shape == q.shape
        assert [t.grad.shape for t in (q, k, v) if t.grad is not None] == [q.shape, k.shape, v.shape]
