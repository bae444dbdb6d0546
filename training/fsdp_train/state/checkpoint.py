"""Sharded checkpoints with ``torch.distributed.checkpoint``: where they go and how a run resumes.

Two stores share one interface: a directory (or fsspec URI) of ``step_NNNNNNNN`` snapshots under
torchrun, and Ray Train's checkpoint API under Ray (``ray.train.report`` / ``ray.train.get_checkpoint``).

The directory store can write asynchronously (``asynchronous=True``, what torchrun runs use): DCP's
``async_save`` copies the state to host memory and writes it in a background thread while training goes on.
The copy to host runs on its own CUDA stream too; the optimizer waits for it before its next step changes
the weights (a step pre-hook), so what is written is the state after the checkpoint's step. One save is in
flight at a time; a snapshot counts once DCP wrote its ``.metadata``, which it does last. Ray Train's store
stays synchronous (``ray.train.report`` takes finished files). Pinning 19 GB of host memory at 1.5B takes
6.5-8.8 s on an H200, which held the step after each save while a stager was made per save; now the
host buffers are pinned once (``HostStager``: one block pinned in the background from before the first step,
carved into buffers after it) and reused by every save, so a save holds the loop only for the copy into them:
docs/performance.md.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import tempfile
import time
from collections.abc import Iterator, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save
from torch.optim import Optimizer

from fsdp_train.state.staging import HostStager, state_bytes

STEP_DIR = re.compile(r"^step_(\d{8})$")
KEEP_LAST = 2
WRITE_THREADS = 4
"""Threads per rank that write an asynchronous snapshot to a local directory."""
FINGERPRINT_FILE = "fingerprint.json"
"""Beside each snapshot's DCP files: what decided the run's trajectory
(``fsdp_train.datapath.fingerprint.run_fingerprint``)."""

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


# Frozen parameters (a LoRA run's base) are not saved: the base is read again from the model source on resume, and
# a checkpoint holds what training changed. With full fine-tuning no parameter is frozen and nothing is left out.
TRAINED_ONLY = StateDictOptions(ignore_frozen_params=True)
# Loading sets what was saved; the frozen parameters keep what the model source gave them. Every trained tensor is
# still required: DCP's load raises for a requested name the checkpoint lacks.
TRAINED_INTO = StateDictOptions(ignore_frozen_params=True, strict=False)


def app_state(model: nn.Module, optimizer: Optimizer, step: int, extra: Extra | None = None) -> dict[str, Any]:
    model_sd, optim_sd = get_state_dict(model, optimizer, options=TRAINED_ONLY)
    # ignore_frozen_params leaves out each frozen tensor under its first name only: a tied lm_head, frozen with its
    # embedding, would still be saved under its second name.
    frozen = {_state_name(n) for n, p in model.named_parameters(remove_duplicate=False) if not p.requires_grad}
    model_sd = {name: value for name, value in model_sd.items() if name not in frozen}
    return {"model": model_sd, "optim": optim_sd, "train": {"step": step}, **(extra or {})}


def _state_name(name: str) -> str:
    """A parameter's name in a state dict: without the wrappers' prefixes (activation checkpointing, compile)."""
    return name.replace("_checkpoint_wrapped_module.", "").replace("_orig_mod.", "")


def load_into(model: nn.Module, optimizer: Optimizer, checkpoint_id: str, extra: Extra | None = None) -> None:
    """Load a DCP snapshot in place: a directory, or a URI (DCP picks its fsspec reader by itself).

    DCP calls ``load_state_dict`` on the ``Stateful`` objects in ``extra`` itself.
    """
    state = app_state(model, optimizer, 0, extra)
    dcp_load(state, checkpoint_id=checkpoint_id)
    set_state_dict(
        model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"], options=TRAINED_INTO
    )


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
        """Save a snapshot after ``step`` (with ``fingerprint`` beside it); return where it went.

        An asynchronous store returns once the state is staged; ``wait`` finishes the write."""
        ...

    def wait(self, deadline: float | None = None) -> SaveTimes | None:
        """Finish the save in flight, if any (its times), so that the snapshot is complete on return: the next
        attempt finds it. ``deadline`` (``time.time()``): a store that can stop waiting then says so
        (``SaveTimes.complete`` False); a directory's write cannot be abandoned and is waited out."""
        ...


@dataclass(frozen=True, slots=True)
class SaveTimes:
    step: int
    path: str
    blocked_seconds: float
    """How long the training loop waited for this save: inside ``save``, and for the staging copy before the
    next optimizer step (asynchronous)."""
    total_seconds: float
    """From the start of ``save`` to the last file written."""
    waited_seconds: float = 0.0
    """How long ``wait`` waited for the write to finish (at the next save, or at the end of training)."""
    complete: bool = True
    """False: ``wait`` stopped at its deadline before the store had the snapshot; the next attempt may not find it."""


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

    def wait(self, deadline: float | None = None) -> SaveTimes | None:
        return None


@dataclass
class _InFlight:
    step: int
    path: str
    started: float
    blocked_seconds: float
    staged: Future[Any] | None
    written: Future[Any]
    finished: list[float] = field(default_factory=list)


@dataclass(slots=True)
class DirectoryCheckpoints:
    """``<root>/step_NNNNNNNN`` snapshots; one is complete once DCP wrote its ``.metadata``."""

    root: str
    asynchronous: bool = False
    """Write in a background thread (DCP's ``async_save``); the loop only waits for the copy to host memory."""
    _in_flight: _InFlight | None = field(default=None, repr=False)
    _cpu_group: Any = field(default=None, repr=False)
    _hooked: set[int] = field(default_factory=set, repr=False)
    _stager: HostStager | None = field(default=None, repr=False)

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
        if self.asynchronous:
            self._hook(model, optimizer, extra)
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
        self.wait()  # one save in flight at a time
        started = time.perf_counter()
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
        if self.asynchronous:
            self._save_async(model, optimizer, step, extra, path, started)
            return path
        dcp_save(app_state(model, optimizer, step, extra), checkpoint_id=path)
        dist.barrier()
        if dist.get_rank() == 0:
            self._prune()
        return path

    def _save_async(
        self, model: nn.Module, optimizer: Optimizer, step: int, extra: Extra | None, path: str, started: float
    ) -> None:
        from torch.distributed.checkpoint.state_dict_saver import AsyncSaveResponse
        from torch.distributed.checkpoint.state_dict_saver import async_save as dcp_async_save

        if self._cpu_group is None:
            # A gloo group of the checkpoint's own: the background write's collectives need a CPU backend, and on
            # the training group they would interleave with the step's own collectives from the main thread (on
            # gloo that aborted with "Received data size doesn't match expected size", or hung). Made by every rank
            # at the same save, as new_group requires.
            self._cpu_group = dist.new_group(backend="gloo")
        self._hook(model, optimizer, extra)
        writer = None
        if not self.is_uri:
            from torch.distributed.checkpoint.filesystem import FileSystemWriter

            # Off the critical path the write can take several threads (one file per thread and rank).
            writer = FileSystemWriter(path, thread_count=WRITE_THREADS)
        response = dcp_async_save(
            app_state(model, optimizer, step, extra),
            checkpoint_id=path,
            storage_writer=writer,
            process_group=self._cpu_group,
            async_stager=self._host_stager(),
        )
        if isinstance(response, AsyncSaveResponse):
            staged, written = response.staging_completion, response.upload_completion
        else:
            staged, written = None, response
        flight = _InFlight(step, path, started, time.perf_counter() - started, staged, written)
        written.add_done_callback(lambda _: flight.finished.append(time.perf_counter()))
        self._in_flight = flight

    def _host_stager(self) -> HostStager:
        if self._stager is None:
            self._stager = HostStager()
        return self._stager

    def _hook(self, model: nn.Module, optimizer: Optimizer, extra: Extra | None) -> None:
        """Optimizer hooks, once per optimizer: the next step waits for the staging copy (it reads the weights
        and moments the step changes), and after the first step the host buffers are carved in the background
        (the optimizer's moments exist only from then on) from a block pinned from now on, so that the first
        save finds them ready and no step waits for the pinning."""
        if id(optimizer) in self._hooked:
            return
        self._hooked.add(id(optimizer))
        optimizer.register_step_pre_hook(lambda *_: self._wait_staged())
        stager = self._host_stager()
        stager.reserve(state_bytes(model, optimizer))

        def prepare(*_: Any) -> None:
            if not stager.prepared:
                from torch.distributed.checkpoint.state_dict_saver import _stateful_to_state_dict

                stager.prepare(_stateful_to_state_dict(app_state(model, optimizer, 0, extra)))

        optimizer.register_step_post_hook(prepare)

    def _wait_staged(self) -> None:
        flight = self._in_flight
        if flight is not None and flight.staged is not None and not flight.staged.done():
            started = time.perf_counter()
            flight.staged.result()
            flight.blocked_seconds += time.perf_counter() - started

    def wait(self, deadline: float | None = None) -> SaveTimes | None:
        flight = self._in_flight
        if flight is None:
            return None
        self._in_flight = None
        started = time.perf_counter()
        if flight.staged is not None:
            flight.staged.result()
        flight.written.result()
        waited = time.perf_counter() - started
        finished = flight.finished[0] if flight.finished else time.perf_counter()
        if dist.get_rank() == 0:
            self._prune()
        return SaveTimes(flight.step, flight.path, flight.blocked_seconds, finished - flight.started, waited)

    def _prune(self) -> None:
        for old in self.complete_steps()[:-KEEP_LAST]:
            if self.is_uri:
                self._fs().rm(self._path(old), recursive=True)
            else:
                shutil.rmtree(self._path(old))


@dataclass(slots=True)
class _Reported:
    step: int
    path: str
    started: float
    blocked_seconds: float


@dataclass(slots=True)
class RayCheckpoints:
    """Ray Train's checkpoint API: every rank writes its DCP shard to a local staging directory and
    reports it; Ray merges the ranks' files into one checkpoint in the run's storage and hands the
    latest back through ``ray.train.get_checkpoint()`` after a worker-group restart, or to the next run of the same
    name from the record Ray Train's controller keeps in that storage.

    ``ray.train.report`` returns once this rank's files are in storage, before the controller has taken the
    checkpoint in: it does so only once it has collected the report of every rank (each from its rank's result
    queue, polled), and only then writes it into its record. A rank whose process ends right after its report (its
    node goes away: ``fsdp_train.watch.notice``) takes its report with it, and the checkpoint is never recorded:
    ``wait``
    waits until the controller has taken in every report of this rank (``fsdp_train.state.ray_commit``)."""

    _reported: _Reported | None = field(default=None, repr=False)

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

        started = time.perf_counter()
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
        path = str(storage.build_checkpoint_path_from_name(step_dir_name(step)))
        self._reported = _Reported(step, path, started, time.perf_counter() - started)
        return path

    def wait(self, deadline: float | None = None) -> SaveTimes | None:
        reported, self._reported = self._reported, None
        if reported is None:
            return None
        from fsdp_train.state.ray_commit import committed_by_ray

        started = time.perf_counter()
        complete = committed_by_ray(step_dir_name(reported.step), deadline)
        now = time.perf_counter()
        return SaveTimes(
            reported.step,
            reported.path,
            blocked_seconds=reported.blocked_seconds + now - started,
            total_seconds=now - reported.started,
            waited_seconds=now - started,
            complete=complete,
        )


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
