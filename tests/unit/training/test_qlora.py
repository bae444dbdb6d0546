"""QLoRA (``training.lora_quantize_base: nf4``): the frozen base's adapted layers held in torchao's NF4, sharded by
FSDP2 as NF4; only the adapters train; two ranks train exactly as one; checkpoints hold the adapters and resume
exactly; the export loads as users load it and is the function that trained.

A tiny Qwen2 saved with ``save_pretrained`` whose MLP projections NF4 can hold (NF4 quantizes groups of 64 x 256
values: 512 x 64 is two, one per rank of two; its 64 x 64 attention projections are refused); one rank in this
process (gloo), or CPU rank processes.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from fsdp_train.contract.config import ConfigError, TrainConfig
from fsdp_train.models.parallelize import Topology
from fsdp_train.models.quantize import NF4_GROUP, is_nf4, quantize_loaded
from fsdp_train.run.loop import build, train_step
from support.adapter_runs import assert_resumes_exactly, export_logits, export_run
from support.cpu_ranks import fixed_batch_steps
from support.rank_processes import rank_context
from support.tiny_hf import documents, save_tiny_model, write_jsonl

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

QUANTIZABLE = {"intermediate_size": 512}
"""The MLP's projections two NF4 groups each (512 x 64), for one rank and for two."""
MLP = ["gate_proj", "up_proj", "down_proj"]

QLORA: dict[str, Any] = {
    "model_init": "pretrained",
    "steps": 5,
    "seq_len": 32,
    "batch_size_per_rank": 2,
    "learning_rate": 1e-2,
    "lr_schedule": "constant",
    "mixed_precision": "bf16",
    "compile": False,
    "probe_size_bytes": 0,
    "lora_rank": 4,
    "lora_alpha": 8,
    "lora_quantize_base": "nf4",
    "lora_target_modules": MLP,
}


def config(tmp_path: Path, **more: Any) -> TrainConfig:
    model = tmp_path / "model"
    if not model.exists():
        save_tiny_model(model, **QUANTIZABLE)
        write_jsonl(tmp_path / "corpus.jsonl", [{"text": d} for d in documents(80)])
    return TrainConfig.from_dict({**QLORA, "model": str(model), "data": str(tmp_path / "corpus.jsonl"), **more})


def nf4_bytes(model: torch.nn.Module) -> dict[str, bytes]:
    """Each NF4 weight's stored bytes (its 4-bit data, scalers and factor), by name."""
    out = {}
    for name, p in model.named_parameters():
        local = getattr(p, "_local_tensor", p)
        if is_nf4(local):
            inner, _ = local.__tensor_flatten__()
            out[name] = b"".join(
                getattr(local, i).reshape(-1).contiguous().view(torch.uint8).numpy().tobytes() for i in inner
            )
    return out


def test_the_base_is_nf4_only_the_adapters_train_and_the_base_keeps_its_bytes(
    one_rank: Topology, tmp_path: Path
) -> None:
    cfg = config(tmp_path)
    model, optimizer, _ = build(cfg, one_rank, "full", torch.device("cpu"))
    quantized = nf4_bytes(model)
    # Every adapted layer's weight, and nothing else: 3 projections in each of 2 blocks.
    assert len(quantized) == 6 and all(".base_layer.weight" in n for n in quantized)
    for name, p in model.named_parameters():
        if name in quantized:  # 4 bits a value and one int8 scaler per 64: about 0.52 bytes a value
            assert len(quantized[name]) < 0.6 * p.numel()
    adapters = {name for name, p in model.named_parameters() if p.requires_grad}
    assert adapters and all("lora_A" in n or "lora_B" in n for n in adapters)
    assert {id(p) for group in optimizer.param_groups for p in group["params"]} == {
        id(p) for n, p in model.named_parameters() if n in adapters
    }
    plain_before = {n: p.detach().full_tensor().clone() for n, p in model.named_parameters() if n not in quantized}
    tokens = torch.randint(0, 512, (2, 32), generator=torch.Generator().manual_seed(0))
    batch = [{"input_ids": tokens, "labels": tokens}]  # one batch again and again: its loss must fall
    cpu = torch.device("cpu")
    losses = [train_step(cfg, one_rank, model, optimizer, s, "full", cpu, 512, batch) for s in (1, 2, 3)]
    assert losses[-1] < losses[0]
    assert nf4_bytes(model) == quantized  # the quantized base is untouched
    changed = {n for n, p in model.named_parameters() if n in plain_before}
    changed = {n for n in changed if not torch.equal(plain_before[n], dict(model.named_parameters())[n].full_tensor())}
    assert changed and changed <= adapters, changed


def test_two_ranks_train_as_one_rank_does(tmp_path: Path) -> None:
    """Each rank keeps its rows of the weight quantized whole: the gathered weight is the one-rank weight, so on
    the same batch the losses are equal to the last digit (the one-rank path keeps the weights out of FSDP2
    altogether)."""
    cfg = config(tmp_path, steps=3)
    as_dict = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}
    ctx = rank_context()
    losses = {}
    for world_size in (1, 2):
        outs = [tmp_path / f"losses-{world_size}-{r}.json" for r in range(world_size)]
        store = str(tmp_path / f"store{world_size}")
        ranks = [
            ctx.Process(target=fixed_batch_steps, args=(r, world_size, store, as_dict, str(outs[r])))
            for r in range(world_size)
        ]
        for p in ranks:
            p.start()
        for p in ranks:
            p.join(timeout=600)
        assert [p.exitcode for p in ranks] == [0] * world_size
        losses[world_size] = [json.loads(o.read_text()) for o in outs]
    (alone,) = losses[1]
    assert len(alone) == cfg.steps and alone[-1] < alone[0]
    assert losses[2] == [alone, alone]


def test_the_export_is_the_function_that_trained(
    one_rank: Topology, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from safetensors import safe_open

    export_run(config, one_rank, tmp_path, capsys)

    directory = tmp_path / "export"
    adapter_config = json.loads((directory / "adapter_config.json").read_text())
    assert adapter_config["r"] == 4 and not (directory / "model.safetensors").exists()
    with safe_open(str(directory / "adapter_model.safetensors"), "pt") as f:  # every adapter, in fp32
        names = list(f.keys())
        assert len(names) == 2 * len(MLP) * 2 and {f.get_slice(k).get_dtype() for k in names} == {"F32"}
    # The quantized base alone, with the adapters, and merged.
    plain, adapted, merged = export_logits(
        tmp_path, lambda base: quantize_loaded(base, list(adapter_config["target_modules"]))
    )
    assert not torch.allclose(adapted, plain, atol=1e-2)
    # The merged export is the dequantized base plus the adapters, written in bf16 as every export is.
    assert torch.allclose(merged, adapted, atol=0.05, rtol=0.02)


def test_resume_from_an_adapter_checkpoint_is_exact(
    one_rank: Topology, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert_resumes_exactly(config, one_rank, tmp_path, capsys)


def test_a_layer_nf4_cannot_hold_is_refused_naming_the_field_and_the_layer(one_rank: Topology, tmp_path: Path) -> None:
    cfg = config(tmp_path, lora_target_modules=[])  # every projection: a 64 x 64 one is a quarter of an NF4 group
    with pytest.raises(ConfigError, match=f"groups of {NF4_GROUP:,} values") as refused:
        build(cfg, one_rank, "full", torch.device("cpu"))
    assert refused.value.field == "lora_quantize_base"
    assert "q_proj" in str(refused.value)


@pytest.mark.parametrize(
    ("more", "field"),
    [
        ({"mixed_precision": "fp32"}, "lora_quantize_base"),
        ({"sharding": "hybrid"}, "lora_quantize_base"),
        ({"precision": "fp8"}, "precision"),
        ({"lora_rank": 0, "lora_target_modules": []}, "lora_quantize_base"),
        ({"lora_quantize_base": "int4"}, "lora_quantize_base"),
    ],
)
def test_settings_that_cannot_go_with_nf4_are_refused_naming_the_field(more: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as refused:
        TrainConfig.from_dict({**QLORA, "model": "/m", **more})
    assert refused.value.field == field
