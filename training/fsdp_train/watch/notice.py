"""A node that is going away: every rank stops after the same step, saves a checkpoint, and the attempt ends.

The notice is a file. The worker container's ``preStop`` hook (``fsdp_operator.api.render``), run by the kubelet
when the pod is being deleted (a drain, a Spot interruption turned into a drain, ``kubectl delete pod``, the
operator acting on a node's taint), writes ``notice`` into the pod-local directory :data:`NOTICE_DIR_ENV` names:
one line, ``<unix time> <grace seconds> <reason>``. Then it waits, bounded by the grace period, for ``done``.

Every rank looks at that directory at every step boundary (one ``stat``) and all ranks agree with one all-reduce
of four numbers on a gloo group of their own (a CPU collective: no device sync on the step's path), so every rank
stops after the same step: ``[noticed, -deadline, -notice time, expected save seconds]`` reduced by MAX.
The checkpoint is saved when it fits before the deadline (the longest save measured in this run, times
:data:`SAVE_MARGIN`, plus :data:`EXIT_SECONDS`); otherwise the save is abandoned before it starts, and the next
attempt resumes from the last periodic checkpoint (a save cut short is never used either: a snapshot counts once
its ``.metadata`` is written, ``fsdp_train.state.checkpoint``). Either way each node that had the notice writes ``done``
(the hook returns at once) and reports an :class:`fsdp_train.contract.events.Interruption`; rank 0's return value
carries
``interrupted``, and the job's driver exits with :data:`EXIT_INTERRUPTED` so that the attempt ends. The operator
starts the next attempt without counting it against ``backoffLimit`` (docs/reliability.md, "A node that goes
away").

A user's Ray Train function (``spec.trainFunction``) calls :func:`interrupted` at its step boundaries, on every
rank at the same points (it is collective); once it returns True the function reports a checkpoint with
``ray.train.report(..., checkpoint=...)`` and returns. The wrapper then reports the interruption
(:func:`finish_user_function`).
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

NOTICE_DIR_ENV = "FSDP_NOTICE_DIR"
"""The pod-local directory of the notice (set in the worker container by the operator; unset: no notices)."""
NOTICE_FILE = "notice"
DONE_FILE = "done"
RANK_FILE_PREFIX = "rank."
"""``rank.<local rank>`` holds a training rank's pid: the hook waits for ``done`` only while one of them lives."""
EXIT_INTERRUPTED = 3
"""The driver's exit status when the ranks stopped for a notice (Ray marks the job FAILED; the operator resumes)."""
SAVE_MARGIN = 1.5
"""A save is started only when the time left is this many times the longest save measured in this run..."""
EXIT_SECONDS = 1.0
"""... plus this much for the ranks to report and exit before the kubelet stops the container."""
SAVE_SECONDS_ENV = "FSDP_NOTICE_SAVE_SECONDS"
"""A save time to assume (seconds) until a longer one is measured: before the first save of a run, or for a store
whose saves vary (``spec.runtimeEnv.envVars``)."""
DEFAULT_GRACE_SECONDS = 30.0
"""The grace period assumed when the notice does not say (Kubernetes' default terminationGracePeriodSeconds)."""


@dataclass(frozen=True, slots=True)
class Notice:
    """A notice as this rank read it, or as all ranks agreed on it (earliest time, earliest deadline)."""

    time: float
    deadline: float
    reason: str = ""


def read_notice(directory: str | Path) -> Notice | None:
    """The notice in `directory`, or None. A file that does not parse is still a notice: now, default grace."""
    path = Path(directory) / NOTICE_FILE
    try:
        text = path.read_text(errors="replace")[:512]
    except OSError:
        return None
    parts = text.split(maxsplit=2)
    now = time.time()
    try:
        noticed = float(parts[0])
        noticed = noticed if math.isfinite(noticed) and noticed <= now + 5 else now
    except (IndexError, ValueError):
        noticed = now
    try:
        grace = float(parts[1])
        grace = grace if math.isfinite(grace) and grace >= 0 else DEFAULT_GRACE_SECONDS
    except (IndexError, ValueError):
        grace = DEFAULT_GRACE_SECONDS
    reason = parts[2].strip()[:64] if len(parts) > 2 else ""
    return Notice(noticed, noticed + grace, reason)


def write_done(directory: str | Path, step: int, saved: bool) -> None:
    """Tell the waiting ``preStop`` hook that this node's ranks are finished with the notice (written atomically)."""
    target = Path(directory) / DONE_FILE
    partial = target.with_name(f".{DONE_FILE}.{os.getpid()}")
    try:
        partial.write_text(f"{time.time():.3f} {step} {int(saved)}\n")
        partial.replace(target)
    except OSError:
        pass  # the hook then waits out its bound: the pod still goes, only later


@dataclass(frozen=True, slots=True)
class Agreed:
    """What every rank agreed at a step boundary: the earliest notice, and whether the save fits before it."""

    notice: Notice
    save: bool
    expected_save_seconds: float
    why: str = ""


@dataclass
class Watch:
    """One rank's view of notices: look at every step boundary, agree with every other rank."""

    directory: str = ""
    rank: int = 0
    local_rank: int = 0
    pod: str = ""
    node: str = ""
    longest_save: float = 0.0
    """The longest checkpoint save (seconds, start to last file) measured in this run: the save a notice needs."""
    last_checkpoint: int = 0
    """The newest complete checkpoint's step known to this run (resumed from, or saved)."""
    agreed: Agreed | None = None
    ray_train: bool = False
    """A Ray Train worker: a save counts once Ray Train's controller recorded it (``fsdp_train.state.ray_commit``)."""
    incomplete: int = 0
    """The step of a save the store did not complete (record) by the notice's deadline; 0: none."""
    _group: Any = field(default=None, repr=False)

    @classmethod
    def from_env(cls, env: Mapping[str, str], rank: int, local_rank: int, resumed_from: int = 0) -> Watch:
        """This rank's watch; it writes ``rank.<local rank>`` (its pid) there: the hook waits only while one lives."""
        watch = cls(
            directory=env.get(NOTICE_DIR_ENV, ""),
            rank=rank,
            local_rank=local_rank,
            pod=env.get("POD_NAME", ""),
            node=env.get("NODE_NAME", ""),
            last_checkpoint=resumed_from,
        )
        with contextlib.suppress(ValueError):  # not a number: nothing assumed
            watch.measured(float(env.get(SAVE_SECONDS_ENV, "") or 0))
        if watch.directory:
            try:
                Path(watch.directory).mkdir(parents=True, exist_ok=True)
                (Path(watch.directory) / f"{RANK_FILE_PREFIX}{local_rank}").write_text(f"{os.getpid()}\n")
            except OSError:
                pass  # notices are still read; the hook just does not wait for this rank
        return watch

    @property
    def deadline(self) -> float | None:
        """Until when (``time.time()``) a save for the agreed notice may take to complete; None: no notice."""
        return None if self.agreed is None else self.agreed.notice.deadline - EXIT_SECONDS

    def measured(self, seconds: float, incomplete: int = 0) -> None:
        """A save took `seconds`; `incomplete`: its step, when the store did not complete it by the deadline."""
        if math.isfinite(seconds) and seconds > self.longest_save:
            self.longest_save = seconds
        self.incomplete = self.incomplete or incomplete

    def local(self) -> Notice | None:
        return read_notice(self.directory) if self.directory else None

    def check(self) -> Agreed | None:
        """Collective (every rank, at the same step boundary): the agreed notice, or None. Once agreed, stays."""
        if self.agreed is not None:
            return self.agreed
        import torch
        import torch.distributed as dist

        mine = self.local()
        if not dist.is_initialized():
            values = [1.0 if mine else 0.0, -(mine.deadline if mine else math.inf), -(mine.time if mine else math.inf)]
            values.append(self.longest_save)
        else:
            if self._group is None:
                # Its own gloo group: a CPU all-reduce of four numbers, whatever backend the training group has.
                self._group = dist.new_group(backend="gloo")
            flags = torch.tensor(
                [1.0 if mine else 0.0, -(mine.deadline if mine else math.inf), -(mine.time if mine else math.inf),
                 self.longest_save],
                dtype=torch.float64,
            )  # fmt: skip
            dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=self._group)
            values = flags.tolist()
        if values[0] < 1:
            return None
        notice = Notice(time=-values[2], deadline=-values[1], reason=mine.reason if mine else "")
        left = notice.deadline - time.time()
        need = values[3] * SAVE_MARGIN + EXIT_SECONDS
        save = left >= need
        why = "" if save else (
            f"the notice left {max(left, 0.0):.1f} s; a save needs about {values[3]:.1f} s "
            f"(the longest save of this run) x {SAVE_MARGIN} + {EXIT_SECONDS:.0f} s to exit"
        )  # fmt: skip
        self.agreed = Agreed(notice, save, values[3], why)
        return self.agreed

    def finish(self, step: int, saved: bool, why: str = "") -> dict[str, Any]:
        """After the save (or without one): report, release the hook, and say what rank 0's return value carries."""
        from fsdp_train.contract.events import Interruption, emit

        agreed = self.agreed
        assert agreed is not None
        if saved:
            self.last_checkpoint = step
        seconds = max(time.time() - agreed.notice.time, 0.0)
        if self.local() is not None:
            # The report first, then `done`: the hook stops Ray (and with it the log forwarding of this node) once
            # it reads `done`, so a report printed after it could be lost.
            if self.local_rank == 0:  # one report per node that had the notice, naming its pod and node
                emit(
                    Interruption(
                        rank=self.rank,
                        step=step,
                        saved=saved,
                        checkpoint_step=self.last_checkpoint,
                        seconds=seconds,
                        notice_time=agreed.notice.time,
                        pod=self.pod,
                        node=self.node,
                        reason=agreed.notice.reason,
                        message=agreed.why or why or ("" if saved else self._unsaved()),
                    )
                )
            write_done(self.directory, step, saved)
        return {
            "interrupted": {
                "step": step,
                "saved": saved,
                "checkpoint_step": self.last_checkpoint,
                "seconds": round(seconds, 3),
            }
        }

    def _unsaved(self) -> str:
        if self.incomplete:
            return (f"the checkpoint of step {self.incomplete} was not complete by the notice's deadline "
                    "(the store had not recorded it): the next attempt resumes from the one before")  # fmt: skip
        return "the job has no checkpoint storage: nothing to save"


# --- a user's function (spec.trainFunction) ------------------------------------------------------------------

_USER_WATCH: Watch | None = None


def interrupted() -> bool:
    """True once a node of this job has been told it goes away: report a checkpoint now, then return.

    Call it on every rank at the same points (after each step): it is collective (one all-reduce of four numbers on
    a gloo group), so every rank gets the same answer at the same step. Outside a job with notices it returns False.
    """
    global _USER_WATCH
    if _USER_WATCH is None:
        import torch.distributed as dist

        rank = dist.get_rank() if dist.is_initialized() else 0
        local = int(os.environ.get("LOCAL_RANK", "0") or 0)
        ray_train = False
        try:
            import ray.train

            local, ray_train = ray.train.get_context().get_local_rank(), True
        except Exception:  # not under Ray Train (a test, torchrun): LOCAL_RANK as torchrun sets it
            pass
        _USER_WATCH = Watch.from_env(os.environ, rank, local)
        _USER_WATCH.ray_train = ray_train
    return _USER_WATCH.check() is not None


def finish_user_function(result: Any) -> Any:
    """After a user's function returned: when it stopped for a notice, report that and mark rank 0's return value
    (the driver ends the attempt); else its own return value, untouched."""
    watch = _USER_WATCH
    if watch is None or watch.agreed is None:
        return result
    saved, why = True, ""
    if watch.ray_train:
        # Before the hook is told `done` (and this rank's process ends): the function's report is recorded by Ray
        # Train's controller, or the next attempt would not resume from it (fsdp_train.state.ray_commit).
        from fsdp_train.state.ray_commit import committed_by_ray

        saved = committed_by_ray(None, watch.deadline)
        why = "" if saved else "Ray Train's controller had recorded no checkpoint of this rank by the notice's deadline"
    # The step is the one the function reported with its checkpoint (the operator reads it from that report).
    return watch.finish(step=0, saved=saved, why=why)
