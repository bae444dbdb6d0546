"""training.precision: which GPUs may run fp8, what auto picks, and torchao's conversion of the blocks."""

from __future__ import annotations

import pytest
import torch
from fsdp_train.contract.config import ConfigError, TrainConfig
from fsdp_train.models.model import build_meta_model, decoder_blocks, hf_config
from fsdp_train.models.precision import Float8Choice, convert_to_float8, has_fp8_tensor_cores, resolve_precision

TINY = {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
        "num_hidden_layers": 2, "vocab_size": 512}  # fmt: skip


B8 = 2048 * 8  # seq 2048 x batch 8: the micro-batch at which fp8 won for Qwen2.5-1.5B


@pytest.mark.parametrize(
    ("requested", "device", "capability", "hidden", "tokens", "expected"),
    [
        ("bf16", "NVIDIA H200", (9, 0), 3584, B8, "bf16"),
        ("fp8", "NVIDIA H200", (9, 0), 1536, 2048, "fp8"),  # asked for: taken where it is slower too
        ("fp8", "NVIDIA L4", (8, 9), 1536, B8, "fp8"),
        ("auto", "NVIDIA H200", (9, 0), 3584, 2048, "fp8"),  # wide: at any micro-batch
        ("auto", "NVIDIA H100 80GB HBM3", (9, 0), 4096, B8, "fp8"),
        ("auto", "NVIDIA H200", (9, 0), 1536, B8, "fp8"),  # 1.117x, the loss on text within 0.25 %
        ("auto", "NVIDIA H200", (9, 0), 1536, 4096 * 4, "fp8"),  # 1.119x
        ("auto", "NVIDIA H200", (9, 0), 1536, B8 - 1, "bf16"),  # not measured between 8,192 and 16,384 tokens
        ("auto", "NVIDIA H200", (9, 0), 1536, 2048 * 4, "bf16"),  # 0.898x
        ("auto", "NVIDIA H200", (9, 0), 1535, 4 * B8, "bf16"),  # narrower than measured
        ("auto", "NVIDIA L4", (8, 9), 4096, B8, "bf16"),  # fp8 tensor cores, not measured
        ("auto", "NVIDIA A100-SXM4-80GB", (8, 0), 4096, B8, "bf16"),
        ("auto", "cpu", None, 4096, B8, "bf16"),
    ],
)
def test_resolve_precision(requested: str, device: str, capability: tuple[int, int] | None, hidden: int,
                           tokens: int, expected: str) -> None:  # fmt: skip
    chosen = resolve_precision(
        requested, device_name=device, capability=capability, hidden_size=hidden, tokens_per_micro_batch=tokens
    )
    assert chosen == expected


@pytest.mark.parametrize(
    ("device", "capability"),
    [("NVIDIA A100-SXM4-80GB", (8, 0)), ("NVIDIA A10G", (8, 6)), ("cpu", None)],
)
def test_fp8_is_refused_without_fp8_tensor_cores(device: str, capability: tuple[int, int] | None) -> None:
    with pytest.raises(ValueError, match=r"training\.precision: fp8 needs a GPU with fp8 tensor cores") as info:
        resolve_precision("fp8", device_name=device, capability=capability, hidden_size=4096, tokens_per_micro_batch=B8)
    assert device in str(info.value)


def test_fp8_tensor_cores_by_name_when_the_capability_is_unknown() -> None:
    assert has_fp8_tensor_cores("NVIDIA L4", None)
    assert has_fp8_tensor_cores("NVIDIA H200", None)
    assert not has_fp8_tensor_cores("NVIDIA A10G", None)
    assert not has_fp8_tensor_cores("some accelerator", None)


def test_config_checks_precision() -> None:
    assert TrainConfig().precision == "bf16"
    with pytest.raises(ConfigError, match=r"training\.precision must be one of bf16, fp8, auto"):
        TrainConfig(precision="int8")
    with pytest.raises(ConfigError, match=r"fp8 needs training\.mixed_precision bf16") as info:
        TrainConfig(precision="fp8", mixed_precision="fp32")
    assert info.value.field == "precision"
    with pytest.raises(ConfigError, match="must be an absolute path") as info:
        TrainConfig(compile_cache_dir="cache")
    assert info.value.field == "compile_cache_dir"


def test_conversion_picks_the_named_layers_of_every_block() -> None:
    model = build_meta_model(hf_config(TrainConfig(model_overrides=TINY)))
    blocks = decoder_blocks(model)
    assert convert_to_float8(blocks, Float8Choice("tensorwise", ("mlp.",))) == 2 * 3
    assert convert_to_float8(blocks, Float8Choice("tensorwise", ("self_attn.",))) == 2 * 4
    names = [n for n, m in model.named_modules() if type(m).__name__ == "Float8Linear"]
    assert "model.layers.1.mlp.down_proj" in names and "model.layers.0.self_attn.k_proj" in names
    assert type(model.lm_head).__name__ == "Linear"  # the head stays in bf16 (the chunked loss uses its weight)


def test_shapes_fp8_matmuls_refuse_stay_in_bf16() -> None:
    model = build_meta_model(hf_config(TrainConfig(model_overrides={**TINY, "intermediate_size": 120})))
    # gate/up (64 -> 120) and down (120 -> 64) have a dimension that is not a multiple of 16
    assert convert_to_float8(decoder_blocks(model), Float8Choice("tensorwise", ("mlp.",))) == 0


def test_an_fp8_block_computes_what_the_bf16_block_does_within_fp8_rounding() -> None:
    torch.manual_seed(0)
    config = hf_config(TrainConfig(model_overrides=TINY))
    mlp = type(build_meta_model(config).model.layers[0].mlp)(config).to(torch.bfloat16)
    fp8 = type(mlp)(config).to(torch.bfloat16)
    fp8.load_state_dict(mlp.state_dict())
    convert_to_float8(torch.nn.ModuleList([torch.nn.ModuleDict({"mlp": fp8})]), Float8Choice())
    x = torch.randn(64, 64, dtype=torch.bfloat16, requires_grad=True)
    ref, out = mlp(x), fp8(x)
    rel = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
    assert 0 < rel < 0.1  # fp8 (e4m3) operands: a few percent, never exact
    out.sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()
