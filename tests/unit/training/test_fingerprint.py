"""The run fingerprint stored beside each checkpoint: every setting that changes the trajectory changes it."""

from __future__ import annotations

from typing import Any

import pytest
from fsdp_train.contract.config import TrainConfig
from fsdp_train.datapath.fingerprint import run_fingerprint

BASE: dict[str, Any] = {"steps": 4, "seq_len": 16, "batch_size_per_rank": 2, "grad_accum": 1}


def fingerprint(world_size: int = 2, **more: Any) -> dict[str, Any]:
    return run_fingerprint(TrainConfig.from_dict({**BASE, **more}), world_size)


@pytest.mark.parametrize(
    ("change", "world_size"),
    [({"grad_accum": 2}, 2), ({"batch_size_per_rank": 4}, 2), ({}, 4)],
)
def test_the_global_batch_counts_ranks_batch_and_gradient_accumulation(change: dict[str, Any], world_size: int) -> None:
    """Twice the samples per optimizer step is another run, whichever factor doubled them (grad_accum too)."""
    assert fingerprint(world_size, **change)["global_batch"] == 2 * fingerprint()["global_batch"] == 8
    assert fingerprint(world_size, **change) != fingerprint()


def test_the_same_global_batch_split_otherwise_is_the_same_run() -> None:
    """One rank with two micro-batches of 2 takes the samples two ranks take with one: the same trajectory."""
    assert fingerprint(1, grad_accum=2) == fingerprint(2)
