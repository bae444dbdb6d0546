"""Runs of the training loop for the LoRA and QLoRA tests (`tests/unit/training/test_lora.py`, `test_qlora.py`):
one call of `train` with a checkpointer when the config has a checkpoint path, the export run both tests load, and
the exact-resume check both tests hold."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable

    import pytest
    import torch
    from fsdp_train.contract.config import TrainConfig
    from fsdp_train.contract.events import Event
    from fsdp_train.models.parallelize import Topology


def run(cfg: TrainConfig, topo: Topology, env: dict[str, str] | None = None) -> None:
    from fsdp_train.run.loop import Host, train
    from fsdp_train.state.checkpoint import DirectoryCheckpoints

    host = Host(node_ip="127.0.0.1", env=env or {})
    if cfg.checkpoint_path:
        host = dataclasses.replace(host, checkpointer=DirectoryCheckpoints(cfg.checkpoint_path))
    train(cfg, topo, host)


def export_run(
    config: Callable[..., TrainConfig], topo: Topology, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> list[Event]:
    """A run that exports the adapters and the merged model to `tmp_path/export`, with activation checkpointing (the
    wrapper's part in the modules' names must not hide the adapters from peft: an adapter file with no tensor at all
    was written so, and loaded as the base itself): its export verified; every event it printed."""
    from fsdp_train.contract.events import Export

    from support.cpu_ranks import printed

    more: dict[str, Any] = {"export_merged": True, "validation_split": 0.2, "activation_checkpointing": True}
    run(config(tmp_path, output_path=str(tmp_path / "export"), **more), topo)
    events = printed(capsys)
    (export,) = [e for e in events if isinstance(e, Export)]
    assert export.verified, export.check  # both parts, each against training's loss on the same rows
    return events


def export_logits(
    tmp_path: Path, prepare_base: Callable[[Any], None] | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The logits of the same tokens from the base alone, the base with the exported adapters (peft) and the merged
    export, each loaded from its directory as a user loads it (fp32); `prepare_base` makes the loaded base what
    training had (QLoRA quantizes it)."""
    import torch
    from fsdp_train.contract.config import MERGED_DIR
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    directory = tmp_path / "export"
    tokens = torch.randint(0, 512, (2, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        base = AutoModelForCausalLM.from_pretrained(str(tmp_path / "model"), dtype=torch.float32)
        if prepare_base is not None:
            prepare_base(base)
        plain = base(input_ids=tokens).logits
        adapted = PeftModel.from_pretrained(base, str(directory))(input_ids=tokens).logits
        merged = AutoModelForCausalLM.from_pretrained(str(directory / MERGED_DIR), dtype=torch.float32)
        return plain, adapted, merged(input_ids=tokens).logits


def assert_resumes_exactly(
    config: Callable[..., TrainConfig], topo: Topology, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run that checkpoints every 2 steps run through, then cut at step 3 and resumed: the resumed steps' losses
    are the uninterrupted run's, and the step-2 checkpoint holds adapter tensors only."""
    import pytest
    from fsdp_train.contract.events import Step
    from fsdp_train.run.loop import FAIL_AT_STEP_ENV
    from torch.distributed.checkpoint import FileSystemReader

    from support.cpu_ranks import printed

    whole = config(tmp_path, checkpoint_path=str(tmp_path / "whole"), checkpoint_interval=2)
    run(whole, topo)
    uninterrupted = [e.loss for e in printed(capsys) if isinstance(e, Step)]

    cut = dataclasses.replace(whole, checkpoint_path=str(tmp_path / "cut"))
    with pytest.raises(RuntimeError):
        run(cut, topo, env={FAIL_AT_STEP_ENV: "3"})
    printed(capsys)
    saved = FileSystemReader(str(tmp_path / "cut" / "step_00000002")).read_metadata().state_dict_metadata
    tensors = [name.split(".", 1)[1] for name in saved if name.startswith("model.")]
    assert tensors and all(".lora_A." in n or ".lora_B." in n for n in tensors), tensors  # no base tensor
    run(cut, topo)
    resumed = [e.loss for e in printed(capsys) if isinstance(e, Step)]
    assert resumed == uninterrupted[2:]
