"""LoRA on a frozen base (``training.lora_rank``): only the adapters train, checkpoints hold them alone and resume
exactly, and the export loads as users load it (peft onto the base; the merged model alone), to the same logits.

One rank in this process (gloo), a tiny Qwen2 saved with ``save_pretrained``, real checkpoints and exports.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from fsdp_train.contract.config import ConfigError, TrainConfig
from fsdp_train.contract.events import Step
from fsdp_train.models.parallelize import Topology
from fsdp_train.run.loop import build, train_step
from support.adapter_runs import assert_resumes_exactly, export_logits, export_run
from support.tiny_hf import documents, save_tiny_model, write_jsonl

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

LORA: dict[str, Any] = {
    "model_init": "pretrained",
    "steps": 6,
    "seq_len": 32,
    "batch_size_per_rank": 2,
    "learning_rate": 1e-2,
    "lr_schedule": "constant",
    "mixed_precision": "fp32",
    "probe_size_bytes": 0,
    "lora_rank": 4,
    "lora_alpha": 8,
}


def config(tmp_path: Path, **more: Any) -> TrainConfig:
    model = tmp_path / "model"
    if not model.exists():
        save_tiny_model(model)
        write_jsonl(tmp_path / "corpus.jsonl", [{"text": d} for d in documents(80)])
    return TrainConfig.from_dict({**LORA, "model": str(model), "data": str(tmp_path / "corpus.jsonl"), **more})


def test_only_the_adapters_train_and_the_base_keeps_its_bytes(one_rank: Topology, tmp_path: Path) -> None:
    cfg = config(tmp_path, mixed_precision="bf16")
    model, optimizer, _ = build(cfg, one_rank, "full", torch.device("cpu"))
    before = {name: p.detach().full_tensor().clone() for name, p in model.named_parameters()}
    adapters = {name for name, p in model.named_parameters() if p.requires_grad}
    assert adapters and all("lora_A" in n or "lora_B" in n for n in adapters)
    assert {p.dtype for n, p in model.named_parameters() if n not in adapters} == {torch.bfloat16}  # no fp32 base
    assert {p.dtype for n, p in model.named_parameters() if n in adapters} == {torch.float32}
    assert {id(p) for group in optimizer.param_groups for p in group["params"]} == {
        id(p) for n, p in model.named_parameters() if n in adapters
    }
    tokens = torch.randint(0, 512, (2, 32), generator=torch.Generator().manual_seed(0))
    batch = [{"input_ids": tokens, "labels": tokens}]  # one batch again and again: its loss must fall
    cpu = torch.device("cpu")
    losses = [train_step(cfg, one_rank, model, optimizer, s, "full", cpu, 512, batch) for s in (1, 2, 3)]
    after = {name: p.detach().full_tensor() for name, p in model.named_parameters()}
    changed = sorted(n for n in before if not torch.equal(before[n], after[n]))
    assert changed and set(changed) <= adapters, changed
    # B starts at zero (the adapted model is the base itself at step 0) and is trained away from it.
    assert any("lora_B" in n and torch.count_nonzero(after[n]) for n in changed)
    assert losses[-1] < losses[0]


def test_the_export_loads_with_peft_and_merged_to_the_training_models_logits(
    one_rank: Topology, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    events = export_run(config, one_rank, tmp_path, capsys)
    steps = [e for e in events if isinstance(e, Step)]
    assert steps[-1].loss < steps[0].loss

    directory = tmp_path / "export"
    adapter_config = json.loads((directory / "adapter_config.json").read_text())
    assert adapter_config["r"] == 4 and adapter_config["lora_alpha"] == 8
    assert adapter_config["base_model_name_or_path"] == str(tmp_path / "model")
    assert not (directory / "model.safetensors").exists()  # the adapter directory holds the adapters only

    plain, adapted, merged = export_logits(tmp_path)
    assert not torch.allclose(adapted, plain, atol=1e-3)  # the adapters carry what training learned
    # The merged export is written in bf16, as every export is: equal to peft's within bf16's rounding.
    assert torch.allclose(merged, adapted, atol=0.05, rtol=0.02)


def test_resume_from_an_adapter_checkpoint_is_exact(
    one_rank: Topology, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert_resumes_exactly(config, one_rank, tmp_path, capsys)


@pytest.mark.parametrize(
    ("more", "field", "words"),
    [
        ({"lora_target_modules": ["q_proj", "w_qkv"]}, "lora_target_modules", "w_qkv"),
        ({"lora_rank": 4096}, "lora_rank", "larger than the layer"),
    ],
)
def test_what_the_model_cannot_take_is_refused_naming_the_field(
    one_rank: Topology, tmp_path: Path, more: dict[str, Any], field: str, words: str
) -> None:
    cfg = config(tmp_path, **more)
    with pytest.raises(ConfigError, match=words) as refused:
        build(cfg, one_rank, "full", torch.device("cpu"))
    assert refused.value.field == field


@pytest.mark.parametrize(
    ("more", "field"),
    [
        ({"lora_rank": -1}, "lora_rank"),
        ({"lora_alpha": 0}, "lora_alpha"),
        ({"lora_dropout": 1.0}, "lora_dropout"),
        ({"precision": "fp8"}, "precision"),
        ({"lora_rank": 0, "lora_target_modules": ["q_proj"]}, "lora_target_modules"),
        ({"lora_rank": 0, "export_merged": True, "output_path": "/x"}, "export_merged"),
        ({"export_merged": True}, "export_merged"),
        ({"model_init": "random", "output_path": "/x"}, "output_path"),
        ({"lora_target_modules": ["q_proj", "q.proj"]}, "lora_target_modules"),
    ],
)
def test_settings_that_cannot_go_together_are_refused_naming_the_field(more: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as refused:
        TrainConfig.from_dict({**LORA, "model": "/m", **more})
    assert refused.value.field == field
