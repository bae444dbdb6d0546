"""Sharded checkpoints with ``torch.distributed.checkpoint``: where they go and how a run resumes.

Two stores share one interface: a directory (or fsspec URI) of ``step_NNNNNNNN`` snapshots under
torchrun, and Ray Train's checkpoint API under Ray (``ray.train.report`` / ``ray.train.get_checkpoint``).
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save
from torch.optim import Optimizer

STEP_DIR = re.compile(r"^step_(\d{8})$")
KEEP_LAST = 2
FINGERPRINT_FILE = "fingerprint.json"
"""Beside each snapshot's DCP files: what decided the run's trajectory (``fsdp_train.fingerprint.run_fingerprint``)."""

Fingerprint = Mapping[str, Any]


class CheckpointMismatch(RuntimeError):
    """The latest checkpoint was written by a run with other settings; resuming would not continue it."""

    reason = "CheckpointMismatch"


def check_fingerprint(stored: Fingerprint | None, current: Fingerprint | None, where: str) -> None:
    """Raise ``CheckpointMismatch`` naming every field whose value differs between the checkpoint and this run.

    A checkpoint without a fingerprint (written before they were stored) is resumed as before.
    """
    if stored is None or current is None:
        return
    changed = sorted(k for k in set(stored) | set(current) if stored.get(k) != current.get(k))
    if changed:
        diffs = ", ".join(f"{k}: {stored.get(k)!r} -> {current.get(k)!r}" for k in changed)
        raise CheckpointMismatch(
            f"the checkpoint at {where} was written by a run with other settings ({diffs}); resuming it would "
            "not continue that run. Point checkpoint.storage somewhere new to start afresh, or restore the "
            "settings to resume"
        )


def step_dir_name(step: int) -> str:
    return f"step_{step:08d}"


Extra = Mapping[str, Any]
"""More state to save and restore beside model and optimizer: DCP ``Stateful`` objects by name (the data position)."""


def app_state(model: nn.Module, optimizer: Optimizer, step: int, extra: Extra | None = None) -> dict[str, Any]:
    model_sd, optim_sd = get_state_dict(model, optimizer)
    return {"model": model_sd, "optim": optim_sd, "train": {"step": step}, **(extra or {})}


def load_into(model: nn.Module, optimizer: Optimizer, checkpoint_id: str, extra: Extra | None = None) -> None:
    """Load a DCP snapshot in place: a directory, or a URI (DCP picks its fsspec reader by itself).

    DCP calls ``load_state_dict`` on the ``Stateful`` objects in ``extra`` itself.
    """
    state = app_state(model, optimizer, 0, extra)
    dcp_load(state, checkpoint_id=checkpoint_id)
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])


class Checkpointer(Protocol):
    def restore(
        self, model: nn.Module, optimizer: Optimizer, extra: Extra | None = None, fingerprint: Fingerprint | None = None
    ) -> int:
        """Load the latest checkpoint into model, optimizer and ``extra``; return its step (0 when none).

        ``CheckpointMismatch`` when its stored fingerprint differs from ``fingerprint``.
        """
        ...

    def save(
        self,
        model: nn.Module,
        optimizer: Optimizer,
        step: int,
        metrics: dict[str, Any],
        extra: Extra | None = None,
        fingerprint: Fingerprint | None = None,
    ) -> str:
        """Save a snapshot after ``step`` (with ``fingerprint`` beside it); return where it went."""
        ...


@dataclass(slots=True)
class NoCheckpoints:
    def restore(
        self, model: nn.Module, optimizer: Optimizer, extra: Extra | None = None, fingerprint: Fingerprint | None = None
    ) -> int:
        return 0

    def save(
        self,
        model: nn.Module,
        optimizer: Optimizer,
        step: int,
        metrics: dict[str, Any],
        extra: Extra | None = None,
        fingerprint: Fingerprint | None = None,
    ) -> str:
        return ""


@dataclass(slots=True)
class DirectoryCheckpoints:
    """``<root>/step_NNNNNNNN`` snapshots; one is complete once DCP wrote its ``.metadata``."""

    root: str

    @property
    def is_uri(self) -> bool:
        return "://" in self.root

    def _fs(self) -> Any:
        from fsspec.core import url_to_fs  # type: ignore[import-untyped]

        return url_to_fs(self.root)[0]

    def complete_steps(self) -> list[int]:
        steps = []
        if self.is_uri:
            fs = self._fs()
            if not fs.exists(self.root):
                return []
            for entry in fs.ls(self.root, detail=False):
                m = STEP_DIR.match(entry.rstrip("/").rsplit("/", 1)[-1])
                if m and fs.exists(f"{entry.rstrip('/')}/.metadata"):
                    steps.append(int(m.group(1)))
        else:
            root = Path(self.root)
            if not root.is_dir():
                return []
            for entry in root.iterdir():
                m = STEP_DIR.match(entry.name)
                if m and (entry / ".metadata").is_file():
                    steps.append(int(m.group(1)))
        return sorted(steps)

    def _path(self, step: int) -> str:
        return f"{self.root.rstrip('/')}/{step_dir_name(step)}"

    def restore(
        self, model: nn.Module, optimizer: Optimizer, extra: Extra | None = None, fingerprint: Fingerprint | None = None
    ) -> int:
        # Rank 0 lists and decides: ranks listing at different moments could disagree, and on object
        # storage every listing costs requests.
        steps = self.complete_steps() if dist.get_rank() == 0 else []
        step = steps[-1] if steps else 0
        chosen: list[Any] = [step, self._read_fingerprint(step) if step else None]
        dist.broadcast_object_list(chosen, src=0)
        step = int(chosen[0])
        if step:
            check_fingerprint(chosen[1], fingerprint, self._path(step))
            load_into(model, optimizer, self._path(step), extra)
        return step

    def _read_fingerprint(self, step: int) -> Fingerprint | None:
        path = f"{self._path(step)}/{FINGERPRINT_FILE}"
        if self.is_uri:
            fs = self._fs()
            return json.loads(fs.cat_file(path)) if fs.exists(path) else None
        return json.loads(Path(path).read_text()) if Path(path).is_file() else None

    def save(
        self,
        model: nn.Module,
        optimizer: Optimizer,
        step: int,
        metrics: dict[str, Any],
        extra: Extra | None = None,
        fingerprint: Fingerprint | None = None,
    ) -> str:
        path = self._path(step)
        if not self.is_uri:
            Path(path).mkdir(parents=True, exist_ok=True)
        if fingerprint is not None and dist.get_rank() == 0:
            # Before the DCP files: a snapshot is complete once .metadata exists, and then has its fingerprint.
            text = json.dumps(dict(fingerprint), sort_keys=True)
            if self.is_uri:
                fs = self._fs()
                # fsspec's local filesystem (file://) writes no missing parent, and DCP makes the step's folder
                # only inside dcp_save, on every rank: without this, the write worked only when another rank's
                # DCP had made the folder first (on S3, where folders do not exist, this is a no-op).
                fs.makedirs(path, exist_ok=True)
                with fs.open(f"{path}/{FINGERPRINT_FILE}", "w") as f:
                    f.write(text)
            else:
                (Path(path) / FINGERPRINT_FILE).write_text(text)
        dcp_save(app_state(model, optimizer, step, extra), checkpoint_id=path)
        dist.barrier()
        if dist.get_rank() == 0:
            self._prune()
        return path

    def _prune(self) -> None:
        for old in self.complete_steps()[:-KEEP_LAST]:
            if self.is_uri:
                self._fs().rm(self._path(old), recursive=True)
            else:
                shutil.rmtree(self._path(old))


@dataclass(slots=True)
class RayCheckpoints:
    """Ray Train's checkpoint API: every rank writes its DCP shard to a local staging directory and
    reports it; Ray merges the ranks' files into one checkpoint in the run's storage and hands the
    latest back through ``ray.train.get_checkpoint()`` after a worker-group restart."""

    def restore(
        self, model: nn.Module, optimizer: Optimizer, extra: Extra | None = None, fingerprint: Fingerprint | None = None
    ) -> int:
        import ray.train

        checkpoint = ray.train.get_checkpoint()
        return 0 if checkpoint is None else restore_ray_checkpoint(checkpoint, model, optimizer, extra, fingerprint)

    def save(
        self,
        model: nn.Module,
        optimizer: Optimizer,
        step: int,
        metrics: dict[str, Any],
        extra: Extra | None = None,
        fingerprint: Fingerprint | None = None,
    ) -> str:
        import ray.train

        with _staging() as staging:
            if fingerprint is not None and dist.get_rank() == 0:
                (Path(staging) / FINGERPRINT_FILE).write_text(json.dumps(dict(fingerprint), sort_keys=True))
            dcp_save(app_state(model, optimizer, step, extra), checkpoint_id=staging)
            ray.train.report(
                metrics,
                checkpoint=ray.train.Checkpoint.from_directory(staging),
                checkpoint_dir_name=step_dir_name(step),
            )
        storage = ray.train.get_context().get_storage()
        return str(storage.build_checkpoint_path_from_name(step_dir_name(step)))


def restore_ray_checkpoint(
    checkpoint: Any,
    model: nn.Module,
    optimizer: Optimizer,
    extra: Extra | None = None,
    fingerprint: Fingerprint | None = None,
) -> int:
    """Load a ``ray.train.Checkpoint`` into model and optimizer; return its step.

    The step comes from the checkpoint's name in storage: from remote storage (S3, GCS) Ray downloads
    it to a temporary directory of another name.
    """
    m = STEP_DIR.match(str(checkpoint.path).rstrip("/").rsplit("/", 1)[-1])
    if m is None:
        raise ValueError(f"checkpoint {checkpoint.path} is not named step_NNNNNNNN")
    with checkpoint.as_directory() as directory:
        stored = Path(directory) / FINGERPRINT_FILE
        found = json.loads(stored.read_text()) if stored.is_file() else None
        check_fingerprint(found, fingerprint, str(checkpoint.path))
        load_into(model, optimizer, directory, extra)
    return int(m.group(1))


@contextlib.contextmanager
def _staging() -> Iterator[str]:
    directory = tempfile.mkdtemp(prefix="fsdp-ckpt-")
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)
