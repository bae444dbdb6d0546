"""Ray Train's checkpoint bookkeeping in a rank process without a Ray cluster: ``ray.train``'s worker API answered
the way Ray Train 2.58's controller answers it, installed through Ray's own hook for that
(``ray.train.v2._internal.execution.train_fn_utils.set_train_fn_utils``: "This class can be patched if new user APIs
behaviors is wanted").

What it keeps of the real thing (ray/train/v2/_internal/execution: ``context.py``, ``checkpoint/report_handler.py``,
``checkpoint/checkpoint_manager.py``):

- ``ray.train.report`` copies the rank's files into ``<storage>/<checkpoint_dir_name>`` (the ranks' files merge
  there) and returns; the report then waits in the rank's process until the controller polls it.
- The controller takes a rank's report in at a later poll (``poll_seconds`` on). A rank whose pod is gone by then
  (its ``preStop`` hook was released: ``done`` in its notice directory, and the kubelet stops the pod right after)
  never hands it over: the report is lost.
- A checkpoint is recorded once the report of every rank was taken in (``_TrainingReport`` consolidation); the next
  run of the same name resumes from the newest recorded one (``ray.train.get_checkpoint()`` at its start).
- ``ray.train.get_all_reported_checkpoints(COMMITTED, timeout_s)`` blocks until every report of the calling rank
  was taken in, or the timeout; then it lists the recorded checkpoints.

The record is a directory of marker files, ``<storage>/.taken/<checkpoint_dir_name>.<rank>``.
"""

from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path
from typing import Any

from ray.train import Checkpoint, ReportedCheckpointStatus
from ray.train.v2._internal.execution.train_fn_utils import TrainFnUtils, set_train_fn_utils
from ray.train.v2.api.reported_checkpoint import ReportedCheckpoint


def recorded(storage: str | Path, world_size: int) -> list[str]:
    """The checkpoints the controller recorded (every rank's report taken in), oldest first."""
    taken = Path(storage) / ".taken"
    if not taken.is_dir():
        return []
    names: dict[str, set[int]] = {}
    for marker in taken.iterdir():
        name, _, rank = marker.name.rpartition(".")
        names.setdefault(name, set()).add(int(rank))
    return sorted(n for n, ranks in names.items() if len(ranks) == world_size)


class _Storage:
    def __init__(self, root: Path) -> None:
        self.root = root

    def build_checkpoint_path_from_name(self, name: str) -> str:
        return str(self.root / name)


class _Context:
    def __init__(self, root: Path, rank: int, local_rank: int) -> None:
        self._storage = _Storage(root)
        self._rank = rank
        self._local_rank = local_rank

    def get_storage(self) -> _Storage:
        return self._storage

    def get_world_rank(self) -> int:
        return self._rank

    def get_local_rank(self) -> int:
        return self._local_rank


class ControllerStandIn(TrainFnUtils):
    def __init__(
        self, storage: str, rank: int, local_rank: int, world_size: int, notice_dir: str, poll_seconds: float
    ) -> None:
        self.storage = Path(storage)
        self.rank = rank
        self.world_size = world_size
        self.notice_dir = Path(notice_dir)
        self.poll_seconds = poll_seconds
        self._context = _Context(self.storage, rank, local_rank)
        self._condition = threading.Condition()
        self._reported = self._taken = 0
        self._names: list[str] = []
        names = recorded(self.storage, world_size)
        self._latest = Checkpoint(str(self.storage / names[-1])) if names else None

    def install(self) -> None:
        set_train_fn_utils(self)

    def report(
        self,
        metrics: dict[str, Any],
        checkpoint: Checkpoint | None = None,
        checkpoint_dir_name: str | None = None,
        *args: Any,
        **kwargs: Any,
    ) -> None:
        name = checkpoint_dir_name or f"checkpoint_{self._reported}"
        if checkpoint is not None:
            shutil.copytree(checkpoint.path, self.storage / name, dirs_exist_ok=True)
            self._latest = Checkpoint(str(self.storage / name))
        with self._condition:
            self._reported += 1
            self._names += [name] if checkpoint is not None else []
        poll = threading.Timer(self.poll_seconds, self._take_in, (name if checkpoint is not None else None,))
        poll.daemon = True  # a report still queued when the process ends is gone with it
        poll.start()

    def _take_in(self, name: str | None) -> None:
        if (self.notice_dir / "done").exists():
            return  # the hook was released: the kubelet stopped this pod before the controller's poll
        if name is not None:
            (self.storage / ".taken").mkdir(parents=True, exist_ok=True)
            (self.storage / ".taken" / f"{name}.{self.rank}").touch()
        with self._condition:
            self._taken += 1
            self._condition.notify_all()

    def get_all_reported_checkpoints(
        self, consistency_mode: Any = None, timeout_s: float | None = None
    ) -> list[ReportedCheckpoint]:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._condition:
            self._condition.wait_for(lambda: self._taken >= self._reported, timeout_s)
        # The controller's record holds a checkpoint once every rank's report was taken in.
        while not self._all_taken() and (deadline is None or time.monotonic() < deadline):
            time.sleep(0.05)
        return [
            ReportedCheckpoint(Checkpoint(str(self.storage / n)), {}, ReportedCheckpointStatus.COMMITTED)
            for n in recorded(self.storage, self.world_size)
        ]

    def _all_taken(self) -> bool:
        return set(self._names) <= set(recorded(self.storage, self.world_size))

    def get_checkpoint(self) -> Checkpoint | None:
        return self._latest

    def get_context(self) -> Any:
        return self._context

    def get_dataset_shard(self, dataset_info: Any) -> Any:
        raise NotImplementedError("no datasets in this stand-in")

    def get_preemption_info(self) -> Any:
        return None

    def is_distributed(self) -> bool:
        return True

    def barrier(self) -> None:
        import torch.distributed as dist

        dist.barrier()

    def broadcast_from_rank_zero(self, data: Any) -> Any:
        import torch.distributed as dist

        box = [data]
        dist.broadcast_object_list(box, src=0)
        return box[0]
