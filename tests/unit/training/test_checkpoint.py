"""Unit tests of the checkpoint stores' restore paths, in one process (DCP without a process group)."""

from __future__ import annotations

from pathlib import Path

import pyarrow.fs
import pytest
import torch
from fsdp_train.checkpoint import app_state, restore_ray_checkpoint
from ray.train import Checkpoint
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

# DCP in one process, without a process group, says so on every call.
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def trained(seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = torch.nn.Linear(4, 3)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn(2, 4)).sum().backward()
    optimizer.step()
    return model, optimizer


def test_ray_checkpoint_in_remote_storage_restores_its_step(tmp_path: Path) -> None:
    """Ray downloads a checkpoint from remote storage (S3, GCS) to a temp dir of another name: the step
    must come from the checkpoint's own name in storage."""
    saved, saved_optimizer = trained(0)
    dcp_save(app_state(saved, saved_optimizer, 7), checkpoint_id=str(tmp_path / "run" / "step_00000007"))
    # Any filesystem but pyarrow's LocalFileSystem takes Ray's download path, as S3 does.
    remote = pyarrow.fs.SubTreeFileSystem(str(tmp_path), pyarrow.fs.LocalFileSystem())
    checkpoint = Checkpoint("run/step_00000007", filesystem=remote)

    model, optimizer = trained(1)
    assert not torch.equal(model.weight, saved.weight)
    assert restore_ray_checkpoint(checkpoint, model, optimizer) == 7
    assert torch.equal(model.weight, saved.weight)
    moments = [o.state_dict()["state"][0]["exp_avg"] for o in (optimizer, saved_optimizer)]
    assert torch.equal(*moments)


def test_ray_checkpoint_not_named_by_step_is_refused(tmp_path: Path) -> None:
    (tmp_path / "latest").mkdir()
    with pytest.raises(ValueError, match="is not named step_NNNNNNNN"):
        restore_ray_checkpoint(Checkpoint.from_directory(str(tmp_path / "latest")), *trained(1))
