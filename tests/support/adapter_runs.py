"""Runs of the training loop for the LoRA and QLoRA tests (`tests/unit/training/test_lora.py`, `test_qlora.py`):
one call of `train` with a checkpointer when the config has a checkpoint path, and the exact-resume check both
tests hold."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pytest
    from fsdp_train.contract.config import TrainConfig
    from fsdp_train.models.parallelize import Topology


def run(cfg: TrainConfig, topo: Topology, env: dict[str, str] | None = None) -> None:
    from fsdp_train.run.loop import Host, train
    from fsdp_train.state.checkpoint import DirectoryCheckpoints

    host = Host(node_ip="127.0.0.1", env=env or {})
    if cfg.checkpoint_path:
        host = dataclasses.replace(host, checkpointer=DirectoryCheckpoints(cfg.checkpoint_path))
    train(cfg, topo, host)


def assert_resumes_exactly(
    whole: TrainConfig, topo: Topology, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`whole` (checkpoints every 2 steps) run through, then cut at step 3 and resumed: the resumed steps' losses are
    the uninterrupted run's, and the step-2 checkpoint holds adapter tensors only."""
    import pytest
    from fsdp_train.contract.events import Step
    from fsdp_train.run.loop import FAIL_AT_STEP_ENV
    from torch.distributed.checkpoint import FileSystemReader

    from support.cpu_ranks import printed

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
