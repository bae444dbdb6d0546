"""Fixtures of the training package's unit tests: the loop's one rank, in the test process."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fsdp_train.models.parallelize import Topology


@pytest.fixture
def one_rank(tmp_path: Path) -> Iterator[Topology]:
    """A gloo group of one, in this process, met through a `FileStore` (no port); the loop leaves a group it did not
    create alone."""
    import torch.distributed as dist  # here, not at import: most tests of this folder start no group

    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        yield Topology(rank=0, world_size=1, local_rank=0, local_world_size=1, node_rank=0, device_index=0)
    finally:
        dist.destroy_process_group()
