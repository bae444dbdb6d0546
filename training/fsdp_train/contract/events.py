"""The structured events a training rank prints and the operator reads back: one schema, both sides.

Each event is one line on stdout: the fixed prefix, a space, then one JSON object. Ray prepends
``(RayTrainWorker pid=..., ip=...) `` to worker output, so the parser looks for the prefix anywhere
in the line. This module is pure Python (no torch, no Kubernetes): the operator imports it too.

Under the operator every line is signed: ``FSDP_EVENT <hmac> {json}``, the HMAC-SHA256 (hex) of the JSON
text under the attempt's key, the JSON carrying a sequence number ``seq`` of its signer (a rank, the driver, the
controller). The key reaches the job's driver in :data:`KEY_ENV`; :func:`take_key` reads it once and removes it
from the environment and from Ray's copy of the job's runtime environment; the driver hands it on
(:func:`signing_key`, :func:`use_key`). A :class:`Verifier` refuses lines without a valid MAC under its key, and
replays (a ``seq`` not above its signer's last one). Parsing never raises, for any input.
docs/reliability.md, "Threat model", says what this protects against and what it cannot.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Callable, Iterable, Iterator, MutableMapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any, ClassVar, Literal, get_type_hints

from fsdp_train.contract.event_base import PREFIX as PREFIX
from fsdp_train.contract.event_base import SCHEMA_VERSION as SCHEMA_VERSION
from fsdp_train.contract.event_base import Event as Event
from fsdp_train.contract.health_events import RankHealth, Stall
from fsdp_train.contract.signing import CONTROLLER as CONTROLLER
from fsdp_train.contract.signing import DRIVER as DRIVER
from fsdp_train.contract.signing import EMITTERS as EMITTERS
from fsdp_train.contract.signing import MAC_HEX
from fsdp_train.contract.signing import Signer as Signer
from fsdp_train.contract.signing import Verifier as Verifier
from fsdp_train.contract.signing import attempt_key as attempt_key
from fsdp_train.contract.signing import line_mac as line_mac
from fsdp_train.contract.signing import mac_shaped as mac_shaped
from fsdp_train.contract.wire import MAX_COUNT as MAX_COUNT
from fsdp_train.contract.wire import MAX_EXTRA as MAX_EXTRA
from fsdp_train.contract.wire import MAX_EXTRA_KEY as MAX_EXTRA_KEY
from fsdp_train.contract.wire import MAX_LINE_CHARS as MAX_LINE_CHARS
from fsdp_train.contract.wire import MAX_RANK as MAX_RANK
from fsdp_train.contract.wire import MAX_TEXT as MAX_TEXT
from fsdp_train.contract.wire import TEXT_LIMITS as TEXT_LIMITS
from fsdp_train.contract.wire import TRUNCATED as TRUNCATED
from fsdp_train.contract.wire import Refused, check_value
from fsdp_train.contract.wire import clean_text as clean_text
from fsdp_train.contract.wire import safe_str as safe_str

KEY_ENV = "FSDP_EVENT_KEY"
"""The attempt's signing key (hex) as the operator hands it to the job; :func:`take_key` removes it."""

TransportName = Literal["efa", "socket", "ib", "none", "init-failed", "unknown"]


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
    loss: float | None
    """None when not known (a user function that reports none; a non-finite loss is sent as None too)."""
    tokens_per_second: float | None
    """Tokens per second over all ranks; None when not known (a user function that reports none)."""
    tokens_per_second_per_device: float | None
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
    """A fingerprint of this step's sample ids in order (``fsdp_train.datapath.packing.samples_digest``)."""
    extra: dict[str, float] = field(default_factory=dict)
    """Other numeric metrics of the step, at most :data:`MAX_EXTRA` of them: a user function's
    (``fsdp_train.run.user_function``); the bundled function's ``grad_norm`` (before clipping)."""


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
    verified: bool = False
    """The export, loaded as a user loads it, matched the training run (``fsdp_train.models.weights.verify_export``)."""
    training_loss: float | None = None
    """Loss of the model in training on the self-check's rows, just before the export."""
    export_loss: float | None = None
    """Loss of the exported directory, loaded with ``AutoModelForCausalLM``, on the same rows."""
    check: str = ""
    """Why the self-check failed; empty when it passed."""


@dataclass(kw_only=True, slots=True)
class Checkpoint(Event):
    """A checkpoint was written (rank 0 reports)."""

    kind: ClassVar[str] = "checkpoint"
    step: int
    path: str
    seconds: float = 0.0
    resumed: bool = False
    """True: not written but resumed from (same fingerprint, ``fsdp_train.datapath.fingerprint.run_fingerprint``), at
    ``step``."""


@dataclass(kw_only=True, slots=True)
class Summary(Event):
    """The end of training on this rank (rank 0's is the job's result)."""

    kind: ClassVar[str] = "summary"
    steps: int
    final_loss: float | None
    """None when this run trained no step (a rerun of a finished run) or the loss was not finite."""
    first_loss: float | None
    tokens_per_second: float | None
    """Training steps only: tokens over the time of steps 2..N (``step_seconds``), all ranks; None without steps."""
    mfu: float | None = None
    seconds: float = 0.0
    """The whole run on this rank: start-up, steps, evaluation, checkpoints, export."""
    sharding: str = ""
    """The sharding actually used (``full`` or ``hybrid``), after ``auto`` was resolved."""
    resumed_from_step: int = 0
    eval_loss: float | None = None
    epochs: int = 0
    """Epochs begun (1 while the first is running); 0 with random data."""
    precision: str = ""
    """The matmul precision actually used (``bf16``, ``fp8``, or ``fp32`` without mixed precision)."""
    step_seconds: float = 0.0
    """The training steps' time that ``tokens_per_second`` is over (steps 2..N: the first pays for compiling)."""
    eval_seconds: float = 0.0
    """Time in evaluation: outside ``tokens_per_second``, inside ``seconds``."""
    export_seconds: float = 0.0
    """Time writing and self-checking the export: outside ``tokens_per_second``, inside ``seconds``."""


@dataclass(kw_only=True, slots=True)
class Resolved(Event):
    """What rank 0 resolved from the job's settings before its first step (``auto``, fp32 on a CPU): sent now, so
    that a run that fails before its summary still says what it ran."""

    kind: ClassVar[str] = "resolved"
    sharding: str
    """``full`` or ``hybrid``, after ``auto`` was resolved (as ``Summary.sharding``)."""
    precision: str
    """``bf16``, ``fp8``, or ``fp32`` without mixed precision (as ``Summary.precision``)."""


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


@dataclass(kw_only=True, slots=True)
class Interruption(Event):
    """A node of the job was told it goes away (``fsdp_train.watch.notice``): where the ranks stopped, and the save."""

    kind: ClassVar[str] = "interruption"
    step: int
    saved: bool
    checkpoint_step: int = 0  # the checkpoint the next attempt resumes from: ``step`` when saved
    seconds: float = 0.0  # from the notice to the checkpoint written (or to the decision that it would not fit)
    notice_time: float = 0.0
    pod: str = ""
    node: str = ""
    reason: str = ""
    message: str = ""


@dataclass(kw_only=True, slots=True)
class Tracking(Event):
    """The tracker's run and whether logging to it works (``fsdp_train.watch.tracking``); ``problem`` empty: it does."""

    kind: ClassVar[str] = "tracking"
    run_id: str = ""
    url: str = ""
    problem: str = ""


_DECLARED_HERE = (
    Placement, Transport, Probe, Step, Evaluation, Export, Checkpoint, Summary, Resolved, Timings, Failure,
)  # fmt: skip
EVENT_TYPES: dict[str, type[Event]] = {
    cls.kind: cls for cls in (*_DECLARED_HERE, Interruption, Tracking, RankHealth, Stall)
}


_DECODER = json.JSONDecoder()


def _hints(cls: type[Event]) -> dict[str, Any]:
    known = {f.name for f in fields(cls)}
    return {name: hint for name, hint in get_type_hints(cls).items() if name in known}


_HINTS = {kind: _hints(cls) for kind, cls in EVENT_TYPES.items()}
"""Each event type's fields and their types, resolved once."""


class Malformed:
    """Marks a line that carries the event prefix but no event the schema accepts."""

    __slots__ = ()


MALFORMED = Malformed()


class Forged:
    """Marks an event line a :class:`Verifier` refused: unsigned, a MAC that does not verify, or a replay."""

    __slots__ = ()


FORGED = Forged()


# --- signing (fsdp_train.contract.signing): only the bundled emitter of this attempt holds the key --------------

_signer: Signer | None = None


RAY_JOB_CONFIG_ENV = "RAY_JOB_CONFIG_JSON_ENV_VAR"
"""Where Ray's job supervisor hands its driver the job's runtime environment (JSON); ``ray.init`` makes it the
runtime environment of every worker of the job, and Ray Train's run state (its dashboard) records it."""


def take_key(environ: MutableMapping[str, str] | None = None, emitter: str = "") -> bool:
    """Read the attempt's key from :data:`KEY_ENV` once, remove it from the environment, sign from now on.

    Called first thing in the Ray driver (and in a torchrun rank), before any user-influenced code (data, a
    dependency, a model's config) runs. The key is also removed from the copy of the job's runtime environment Ray
    keeps in :data:`RAY_JOB_CONFIG_ENV`, so that the driver's ``ray.init`` does not hand it to every worker of the
    job (Ray Data's tasks, the tasks a rank starts) nor record it in Ray Train's run state; the driver hands it to
    the ranks and the controller itself (:func:`signing_key`, :func:`use_key`). False when no (valid) key was given.
    """
    env = os.environ if environ is None else environ
    raw = env.pop(KEY_ENV, "")
    _drop_from_job_config(env)
    return use_key(raw, emitter)


def use_key(key_hex: str, emitter: str = "") -> bool:
    """Sign from now on with the key `key_hex` (as :func:`signing_key` gave it), as `emitter`; False when it is no
    valid key (then nothing is signed, and the operator refuses every line)."""
    global _signer
    try:
        key = bytes.fromhex(key_hex)
    except (ValueError, TypeError):
        key = b""
    if len(key) >= 16:
        _signer = Signer(key, emitter=emitter)
    return _signer is not None


def signing_key() -> str:
    """The key this process signs with (hex), to hand to the processes it starts; empty when it has none."""
    return _signer._key.hex() if _signer is not None else ""


def _drop_from_job_config(env: MutableMapping[str, str]) -> None:
    """:data:`KEY_ENV` out of the runtime environment in :data:`RAY_JOB_CONFIG_ENV` (left as it is when it does not
    parse: Ray would refuse it too)."""
    text = env.get(RAY_JOB_CONFIG_ENV)
    if not text:
        return
    try:
        config = json.loads(text)
    except ValueError:
        return
    runtime_env = config.get("runtime_env") if isinstance(config, dict) else None
    env_vars = runtime_env.get("env_vars") if isinstance(runtime_env, dict) else None
    if isinstance(env_vars, dict) and KEY_ENV in env_vars:
        del env_vars[KEY_ENV]
        env[RAY_JOB_CONFIG_ENV] = json.dumps(config)


MAX_CANDIDATES = 16
"""Most places on one line the parser tries an event from (each a ``FSDP_EVENT `` in it): text a process printed
without a newline before the emitter's line leaves prefixes of its own before the genuine one."""


def parse_event(line: str | bytes, verifier: Verifier | None = None) -> Event | Malformed | Forged | None:
    """The event on this log line; :data:`MALFORMED` for an event line that does not parse; None for other lines.

    With a `verifier`, an event line it does not accept is :data:`FORGED`. Without one (local tools reading
    their own logs) signed and unsigned lines are both read, unchecked.

    The emitter owns its line: text before an event on the same line (a ``print(..., end="")`` of other code, an
    unfinished line of any length) is not part of it. The parser tries each ``FSDP_EVENT `` of the line in turn
    (at most :data:`MAX_CANDIDATES`) and returns the first event it accepts, else what the first one was; a line
    longer than :data:`MAX_LINE_CHARS` is read from its last :data:`MAX_LINE_CHARS` characters, where the event of a
    line ends (an event is always shorter).

    Never raises, for any input (any ``str``, surrogates and NUL included, any ``bytes``): every field is
    type-checked and bounded, strings are cleaned, and unknown fields are ignored (a newer emitter may add some).
    """
    if isinstance(line, bytes | bytearray):
        line = bytes(line).decode("utf-8", "replace")
    if not isinstance(line, str):
        return None
    over_long = len(line) > MAX_LINE_CHARS
    text = line[-MAX_LINE_CHARS:] if over_long else line
    first: Event | Malformed | Forged | None = None
    at = text.find(PREFIX + " ")
    tried = 0
    while at >= 0 and tried < MAX_CANDIDATES:
        found = _event_at(text, at, verifier)
        if isinstance(found, Event):
            return found
        first = first or found
        tried += 1
        at = text.find(PREFIX + " ", at + 1)
    if first is None and over_long and PREFIX in line:
        return MALFORMED  # a prefix in the part of an over-long line that is not read
    return first


def _event_at(line: str, start: int, verifier: Verifier | None) -> Event | Malformed | Forged:
    """The event that begins at `start` (a ``FSDP_EVENT `` of `line`), or why there is none there."""
    begin = start + len(PREFIX) + 1
    mac = ""
    if not line.startswith("{", begin):
        mac, begin = line[begin : begin + MAC_HEX], begin + MAC_HEX + 1
        if not line.startswith(" {", begin - 1):
            return FORGED if verifier is not None else MALFORMED
        if verifier is not None and not mac_shaped(mac):
            return FORGED  # not a MAC at all: refused before the JSON is even read
    elif verifier is not None:
        return FORGED  # unsigned: anything can print such a line
    try:
        # raw_decode: what follows the object (a terminal's colour reset, a stray CR) does not spoil it.
        payload, end = _DECODER.raw_decode(line, begin)
    except (ValueError, RecursionError):  # RecursionError: nesting deeper than the interpreter's stack
        return FORGED if verifier is not None else MALFORMED
    if verifier is not None and not verifier.authentic(mac, line[begin:end]):
        return FORGED
    if not isinstance(payload, dict):
        return MALFORMED
    kind = payload.get("kind")
    if not isinstance(kind, str) or kind not in EVENT_TYPES:
        return MALFORMED
    cls = EVENT_TYPES[kind]
    try:
        hints = _HINTS[kind]
        values = {name: check_value(name, hint, payload[name]) for name, hint in hints.items() if name in payload}
        event = cls(**values)
    except (Refused, TypeError):  # TypeError: a required field is missing
        return MALFORMED
    if verifier is not None and not verifier.fresh(event.rank, payload.get("seq"), payload.get("emitter", "")):
        return FORGED  # a replay of a line this attempt's emitter printed before
    return event


def parse_line(line: str | bytes) -> Event | None:
    """The event on this log line, or None when the line carries none or a malformed one."""
    event = parse_event(line)
    return event if isinstance(event, Event) else None


def parse_lines(lines: Iterable[str | bytes]) -> Iterator[Event]:
    """Every well-formed event in a stream of log lines, in order."""
    for line in lines:
        event = parse_line(line)
        if event is not None:
            yield event


@dataclass(frozen=True, slots=True)
class ParsedLog:
    """The events in a piece of log, and how many event lines were refused."""

    events: tuple[Event, ...]
    malformed: int
    forged: int = 0
    """Event lines the verifier refused (unsigned, a MAC that does not verify, a replay)."""


def parse_log(lines: Iterable[str | bytes], verifier: Verifier | None = None) -> ParsedLog:
    """Every well-formed (and, with a `verifier`, verified) event in the lines, and counts of those refused."""
    events: list[Event] = []
    malformed = forged = 0
    for line in lines:
        event = parse_event(line, verifier)
        if isinstance(event, Event):
            events.append(event)
        elif event is MALFORMED:
            malformed += 1
        elif event is FORGED:
            forged += 1
    return ParsedLog(tuple(events), malformed, forged)


_emitting = threading.Lock()
"""Signing and writing are one step: two threads cannot write lines against their ``seq`` order (a replay)."""


LISTENERS: list[Callable[[Event], None]] = []
"""Handed each event this process emits (``fsdp_train.watch.tracking`` queues it); they never block and never raise."""


def emit(event: Event) -> None:
    """Print one event on a line of its own (signed once :func:`take_key` found a key), flushed at once.

    The write starts with a newline, so text printed without one just before ends there. Newline, line and newline
    go out in one write: ranks share one stdout pipe, whose lines could interleave otherwise. The line is ASCII
    written as bytes past the text layer, so a ``PYTHONIOENCODING`` cannot garble it.
    """
    for listener in list(LISTENERS):
        listener(event)
    with _emitting:
        line = "\n" + event.to_line(_signer) + "\n"
        buffer = getattr(sys.stdout, "buffer", None)
        if buffer is None:  # a replaced stdout (a test's capture): text is all it takes
            sys.stdout.write(line)
            sys.stdout.flush()
            return
        sys.stdout.flush()  # what was printed before goes out before this line
        buffer.write(line.encode("ascii", "backslashreplace"))
        buffer.flush()


def as_dict(event: Event) -> dict[str, Any]:
    return {"kind": event.kind, **asdict(event)}
