"""The structured events a training rank prints and the operator reads back: one schema, both sides.

Each event is one line on stdout: the fixed prefix, a space, then one JSON object. Ray prepends
``(RayTrainWorker pid=..., ip=...) `` to worker output, so the parser looks for the prefix anywhere
in the line. This module is pure Python (no torch, no Kubernetes): the operator imports it too.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field, fields
from typing import Any, ClassVar, Literal

PREFIX = "FSDP_EVENT"
SCHEMA_VERSION = 1

TransportName = Literal["efa", "socket", "ib", "none", "init-failed", "unknown"]


@dataclass(kw_only=True, slots=True)
class Event:
    """Fields every event carries."""

    kind: ClassVar[str] = ""
    rank: int
    """Global rank of the process that emitted the event."""
    time: float = field(default_factory=time.time)
    """Unix time when the event was emitted."""

    def to_line(self) -> str:
        payload = {"v": SCHEMA_VERSION, "kind": self.kind, **asdict(self)}
        return f"{PREFIX} {json.dumps(payload, separators=(',', ':'), sort_keys=True)}"


@dataclass(kw_only=True, slots=True)
class Placement(Event):
    """Where a rank runs; emitted once per rank at start."""

    kind: ClassVar[str] = "placement"
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    node_ip: str
    hostname: str
    pod: str
    """Pod name from the environment (``POD_NAME`` or ``HOSTNAME``); empty outside Kubernetes."""
    device: str
    """GPU name (``NVIDIA L4``) or ``cpu``."""
    device_uuid: str = ""
    backend: str = ""


@dataclass(kw_only=True, slots=True)
class Transport(Event):
    """The network transport NCCL chose, read back from this rank's own NCCL log."""

    kind: ClassVar[str] = "transport"
    transport: TransportName
    plugin: str = ""
    provider: str = ""
    nccl_version: str = ""
    ofi_version: str = ""
    evidence: str = ""
    """The log line that decided the verdict."""
    source: str = ""
    """Where the verdict comes from: an NCCL debug file path, or ``backend:gloo`` without NCCL."""


@dataclass(kw_only=True, slots=True)
class Probe(Event):
    """Collective bandwidth measured before training (rank 0 reports for the group).

    Bus bandwidth follows nccl-tests: all-reduce busbw = size/time * 2(n-1)/n,
    all-gather busbw = size/time * (n-1)/n, with ``size`` the full output buffer in bytes.
    """

    kind: ClassVar[str] = "probe"
    scope: Literal["all", "cross-node"]
    """``all``: every rank in one group; ``cross-node``: one rank per node (local rank 0s)."""
    ranks: int
    size_bytes: int
    allreduce_busbw_gbps: float
    """All-reduce bus bandwidth in GB/s (10^9 bytes per second)."""
    allgather_busbw_gbps: float
    """All-gather bus bandwidth in GB/s."""


@dataclass(kw_only=True, slots=True)
class Step(Event):
    """Progress after one optimizer step (rank 0 only)."""

    kind: ClassVar[str] = "step"
    step: int
    total_steps: int
    loss: float
    tokens_per_second: float
    """Tokens per second over all ranks."""
    tokens_per_second_per_device: float
    mfu: float | None = None
    """Model FLOPs utilisation, 0..1; None on CPU (no known peak)."""
    step_seconds: float = 0.0
    peak_memory_bytes: int = 0
    epoch: int = 0
    """Epoch of the data this step trained on (0-based); 0 with random data."""
    samples_seen: int = 0
    """Packed sequences trained on so far, all ranks and epochs (a resumed run counts the earlier ones)."""
    tokens_seen: int = 0
    samples_digest: str = ""
    """A fingerprint of this step's sample ids in order (``fsdp_train.data.samples_digest``)."""


@dataclass(kw_only=True, slots=True)
class Evaluation(Event):
    """Loss on the validation data (rank 0 reports the mean over all ranks)."""

    kind: ClassVar[str] = "evaluation"
    step: int
    loss: float
    tokens: int = 0
    """Target tokens the loss is the mean over."""
    seconds: float = 0.0


@dataclass(kw_only=True, slots=True)
class Export(Event):
    """The model was written as a Hugging Face directory (rank 0 reports)."""

    kind: ClassVar[str] = "export"
    step: int
    path: str
    seconds: float = 0.0


@dataclass(kw_only=True, slots=True)
class Checkpoint(Event):
    """A checkpoint was written (rank 0 reports)."""

    kind: ClassVar[str] = "checkpoint"
    step: int
    path: str
    seconds: float = 0.0


@dataclass(kw_only=True, slots=True)
class Summary(Event):
    """The end of training on this rank (rank 0's is the job's result)."""

    kind: ClassVar[str] = "summary"
    steps: int
    final_loss: float
    first_loss: float
    tokens_per_second: float
    mfu: float | None = None
    seconds: float = 0.0
    sharding: str = ""
    """The sharding actually used (``full`` or ``hybrid``), after ``auto`` was resolved."""
    resumed_from_step: int = 0
    eval_loss: float | None = None
    epochs: int = 0
    """Epochs begun (1 while the first is running); 0 with random data."""
    precision: str = ""
    """The matmul precision actually used (``bf16``, ``fp8``, or ``fp32`` without mixed precision)."""


@dataclass(kw_only=True, slots=True)
class Timings(Event):
    """Where the time to the first optimizer step went (rank 0 reports, once, after that step)."""

    kind: ClassVar[str] = "timings"
    to_first_step_seconds: float
    """From process start to the end of the first optimizer step."""
    startup_seconds: float = 0.0
    """Process start to the training function: interpreter, imports, process group."""
    probe_seconds: float = 0.0
    """First collective and the bandwidth probe."""
    build_seconds: float = 0.0
    """Architecture, sharding, weight init or load, checkpoint restore."""
    first_step_seconds: float = 0.0
    """The first step itself, compilation included."""
    compile_cache: str = ""
    """Persistent compile cache as found: ``cold`` (empty), ``warm``, or empty when none is configured."""


@dataclass(kw_only=True, slots=True)
class Failure(Event):
    """The training function failed on this rank; the message says why."""

    kind: ClassVar[str] = "failure"
    message: str
    reason: str = ""
    """A reason the operator maps to the job's (``DataUnavailable``); empty for any other error."""


EVENT_TYPES: dict[str, type[Event]] = {
    cls.kind: cls
    for cls in (Placement, Transport, Probe, Step, Evaluation, Export, Checkpoint, Summary, Timings, Failure)
}


def parse_line(line: str) -> Event | None:
    """The event on this log line, or None when the line carries none or a malformed one."""
    start = line.find(PREFIX + " ")
    if start < 0:
        return None
    try:
        payload = json.loads(line[start + len(PREFIX) + 1 :])
    except ValueError:
        return None
    if not isinstance(payload, dict):
        return None
    cls = EVENT_TYPES.get(str(payload.get("kind")))
    if cls is None:
        return None
    known = {f.name for f in fields(cls)}
    try:
        return cls(**{k: v for k, v in payload.items() if k in known})
    except TypeError:
        return None


def parse_lines(lines: Iterable[str]) -> Iterator[Event]:
    """Every well-formed event in a stream of log lines, in order."""
    for line in lines:
        event = parse_line(line)
        if event is not None:
            yield event


def emit(event: Event) -> None:
    """Print one event as a single line, flushed at once so log tailing sees it.

    Line and newline go out in one write: ranks share one stdout pipe (torchrun, Ray), and with
    ``PYTHONUNBUFFERED=1`` ``print`` writes them separately, so lines of two ranks could interleave.
    """
    sys.stdout.write(event.to_line() + "\n")
    sys.stdout.flush()


def as_dict(event: Event) -> dict[str, Any]:
    return {"kind": event.kind, **asdict(event)}
