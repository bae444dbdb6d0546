"""Whether Ray Train's controller has recorded a checkpoint that the ranks reported.

``ray.train.report`` returns on a rank once that rank's files are in the run's storage. Ray Train's controller takes
the checkpoint in later: it polls each rank's result queue, and once it holds the report of every rank it records the
checkpoint in the run's snapshot (``checkpoint_manager_snapshot.json`` in the run's storage), which is what the next
run of the same name resumes from (``ray.train.get_checkpoint()``). Until then the report lives only in the ranks'
processes: a rank that ends right after reporting (its node goes away, ``fsdp_train.watch.notice``) takes it along, and
the checkpoint, whole on disk, is never resumed from. ``ray.train.get_all_reported_checkpoints`` with
``CheckpointConsistencyMode.COMMITTED`` blocks until the controller has taken in every report of the calling rank.
"""

from __future__ import annotations

import time
from typing import Any


def committed_by_ray(name: str | None, deadline: float | None = None) -> bool:
    """In a Ray Train worker: wait until Ray Train's controller has taken in every ``ray.train.report`` of this rank
    (then the run's record, which the next run of the same name resumes from, holds them), at most until
    ``deadline`` (``time.time()``). Whether a checkpoint named ``name`` (``step_NNNNNNNN``; None: this rank's latest,
    ``ray.train.get_checkpoint()``) is among the checkpoints the controller recorded."""
    import ray.train

    timeout = None if deadline is None else max(deadline - time.time(), 0.0)
    reported = ray.train.get_all_reported_checkpoints(
        consistency_mode=ray.train.CheckpointConsistencyMode.COMMITTED, timeout_s=timeout
    )
    if name is None:  # after the wait: a report uploading in the background (ASYNC) is this rank's latest by then
        latest = ray.train.get_checkpoint()
        if latest is None:
            return False
        name = _name_of(latest.path)
    return any(_name_of(r.checkpoint.path) == name for r in reported)


def _name_of(path: Any) -> str:
    return str(path).rstrip("/").rsplit("/", 1)[-1]
