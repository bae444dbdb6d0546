"""Unit tests of the checkpoint stores' restore paths, in one process (DCP without a process group)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import pyarrow.fs
import pytest
import torch
import torch.distributed as dist
from fsdp_train.state.checkpoint import (
    FINGERPRINT_FILE,
    CheckpointMismatch,
    DirectoryCheckpoints,
    app_state,
    load_into,
    restore_ray_checkpoint,
)
from fsdp_train.state.staging import HostArena, HostStager, state_bytes
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


@pytest.fixture
def one_rank(tmp_path: Path) -> Iterator[None]:
    """A gloo process group of one rank in this process: DirectoryCheckpoints asks for the rank and a barrier."""
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("as_uri", [False, True], ids=["path", "file-uri"])
def test_a_snapshot_in_a_new_folder_gets_its_fingerprint_and_resumes(
    one_rank: None, tmp_path: Path, as_uri: bool
) -> None:
    """Rank 0 writes the fingerprint before DCP makes the step's folder; through a URI (fsspec) that folder must be
    made first too. It was not: the write raised FileNotFoundError unless another rank's DCP had been quicker."""
    root = tmp_path / "ckpt"
    store = DirectoryCheckpoints(root.as_uri() if as_uri else str(root))
    fingerprint = {"seed": 1, "global_batch": 8}
    saved, saved_optimizer = trained(0)
    for step in (5, 10, 15):
        store.save(saved, saved_optimizer, step, {}, fingerprint=fingerprint)
    # The two latest are kept, each with its fingerprint beside the DCP files.
    assert sorted(p.name for p in root.iterdir()) == ["step_00000010", "step_00000015"]
    assert all((root / name / FINGERPRINT_FILE).is_file() for name in ("step_00000010", "step_00000015"))
    model, optimizer = trained(1)
    assert store.restore(model, optimizer, fingerprint=fingerprint) == 15
    assert torch.equal(model.weight, saved.weight)
    with pytest.raises(CheckpointMismatch, match="global_batch: 8 -> 16"):
        store.restore(model, optimizer, fingerprint={**fingerprint, "global_batch": 16})


def test_asynchronous_saves_reuse_one_set_of_host_buffers_and_write_each_steps_state(
    one_rank: None, tmp_path: Path
) -> None:
    """The host buffers are made once (after the first optimizer step, from the block reserved before it) and
    every save copies into them: each snapshot holds the weights of its own step, not the first save's, and no
    save allocates them anew."""
    store = DirectoryCheckpoints(str(tmp_path / "ckpt"), asynchronous=True)
    model, optimizer = trained(0)
    assert store.restore(model, optimizer) == 0
    assert store._stager is not None and store._stager._arena is not None  # reserved before the first step
    block = store._stager._arena.result()._block
    weights = {}
    for step in (1, 2):
        model(torch.randn(2, 4)).sum().backward()
        optimizer.step()  # the first step's post-hook makes the host buffers
        stager = store._stager
        assert stager is not None and stager.prepared
        buffers = stager._buffers
        assert buffers is not None
        carved = [t for t in _tensors(buffers.result()) if t.numel()]
        # Every buffer (weights, both moments, the step counter) lies in the reserved block.
        base, end = block.data_ptr(), block.data_ptr() + block.numel()
        assert carved and all(base <= t.data_ptr() and t.data_ptr() + t.nbytes <= end for t in carved)
        store.save(model, optimizer, step, {})
        assert stager._buffers is buffers  # reused, not made again
        weights[step] = model.weight.detach().clone()
        times = store.wait()
        assert times is not None and times.step == step
    assert not torch.equal(weights[1], weights[2])
    for step in (1, 2):
        restored, restored_optimizer = trained(5)
        load_into(restored, restored_optimizer, str(tmp_path / "ckpt" / f"step_{step:08d}"))
        assert torch.equal(restored.weight, weights[step])


def _tensors(state: object) -> list[torch.Tensor]:
    if isinstance(state, torch.Tensor):
        return [state]
    if isinstance(state, dict):
        return [t for value in state.values() for t in _tensors(value)]
    if isinstance(state, list | tuple):
        return [t for value in state for t in _tensors(value)]
    return []


def test_the_reserved_block_fits_adamws_state_and_a_block_too_small_falls_back_to_one_buffer_each() -> None:
    model = torch.nn.Linear(5, 3)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 5)).sum().backward()
    optimizer.step()
    state = {"model": model.state_dict(), "optim": optimizer.state_dict()}
    wanted = sum(t.nbytes for t in _tensors(state))
    assert wanted <= state_bytes(model, optimizer) <= wanted + 64 * 3 * len(_tensors(state))
    arena = HostArena(state_bytes(model, optimizer), pin=False)
    carved = [arena.take(t.shape, t.dtype) for t in _tensors(state)]
    ranges = sorted((c.data_ptr(), c.data_ptr() + c.nbytes) for c in carved if c is not None)
    assert len(ranges) == len(carved)
    assert all(end <= next_start for (_, end), (next_start, _) in itertools.pairwise(ranges))
    small = HostArena(64, pin=False)
    assert small.take((4,), torch.float32) is not None and small.take((64,), torch.float32) is None


def test_host_buffers_are_made_anew_when_the_state_changes_layout() -> None:
    stager = HostStager()
    staged = stager.stage({"w": torch.ones(3), "step": 1}).result()
    assert torch.equal(staged["w"], torch.ones(3)) and staged["step"] == 1
    staged = stager.stage({"w": torch.full((5,), 2.0), "step": 2}).result()
    assert torch.equal(staged["w"], torch.full((5,), 2.0)) and staged["step"] == 2
    staged = stager.stage({"w": torch.full((5,), 3.0), "extra": torch.zeros(2), "step": 3}).result()
    assert torch.equal(staged["w"], torch.full((5,), 3.0)) and set(staged) == {"w", "extra", "step"}
    stager.close()
