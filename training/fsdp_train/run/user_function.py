"""A user's Ray Train function, wrapped: the bundled function's reports first, then the user's code.

Every rank runs :func:`run_user_function`: ``Placement``, the first collective's ``Transport`` verdict and the
bandwidth ``Probe`` (``report.verify_link``, what the bundled loop runs too), then the user's
``package.module:function`` called with its ``config``; an exception there becomes this rank's ``Failure``
with its type, message and the last frames of its traceback. What the function passes to ``ray.train.report``
reaches the operator through Ray Train's controller: :func:`events_from_report` turns rank 0's metrics into
``Step`` (and ``Evaluation``, ``Checkpoint``) events there (``fsdp_train.run.ray_entry.reported_metrics_callback``).
Nothing the user's code prints becomes an event: it holds no key (docs/byo-function.md).
"""

from __future__ import annotations

import importlib
import math
import sys
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from fsdp_train.contract.events import (
    MAX_COUNT,
    MAX_EXTRA,
    MAX_EXTRA_KEY,
    TEXT_LIMITS,
    Checkpoint,
    Evaluation,
    Event,
    Failure,
    Step,
    clean_text,
    emit,
)
from fsdp_train.contract.failures import failure_message, failure_reason
from fsdp_train.run import preflight

REMOTE_CODE_SCHEMES = ("s3://", "gs://")
"""`code` locations Ray's runtime environment fetches itself (a ``.zip``); anything else is a local directory."""
TRACEBACK_FRAMES = 4
"""Frames of a user exception's traceback kept in its ``Failure`` message (the innermost ones)."""
STEP_KEYS = ("step", "iteration")
"""Metric names a function may report its step under, in order of preference; else the reports are counted."""
KNOWN_METRICS = frozenset({*STEP_KEYS, "loss", "total_steps", "tokens", "tokens_per_second", "eval_loss", "epoch"})
"""Metrics with a place of their own in the status; every other number goes to ``Step.extra``."""

_FUNCTION_KEYS = {"callable", "code", "config", "probe_size_bytes"}


@dataclass(kw_only=True, slots=True)
class FunctionConfig:
    """Which user function a job runs, with what, and how large the bandwidth probe before it is."""

    callable: str
    """``package.module:function`` (the part after the colon may be dotted: ``module:Class.method``)."""
    code: str = ""
    """A directory on every node, put first on ``sys.path``; or an ``s3://``/``gs://`` ``.zip`` that Ray's
    runtime environment unpacks as the working directory (then empty here: the working directory is on the path)."""
    config: dict[str, Any] = field(default_factory=dict)
    probe_size_bytes: int = 0

    @classmethod
    def from_dict(cls, d: Any) -> FunctionConfig:
        if not isinstance(d, dict):
            raise ValueError("function must be a mapping.")
        unknown = sorted(set(d) - _FUNCTION_KEYS)
        if unknown:
            raise ValueError(
                f"function.{unknown[0]} is not a known field (known: {', '.join(sorted(_FUNCTION_KEYS))})."
            )
        target = d.get("callable")
        if not isinstance(target, str) or ":" not in target:
            raise ValueError(f"function.callable must be 'package.module:function', got {target!r}.")
        code = d.get("code") or ""
        config = d.get("config") or {}
        size = d.get("probe_size_bytes", 0)
        if not isinstance(code, str):
            raise ValueError(f"function.code must be a string, got {code!r}.")
        if not isinstance(config, dict):
            raise ValueError("function.config must be a mapping.")
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise ValueError(f"function.probe_size_bytes must be an integer of 0 or more, got {size!r}.")
        return cls(callable=target, code=code, config=config, probe_size_bytes=size)

    def to_dict(self) -> dict[str, Any]:
        return {
            "callable": self.callable,
            "code": self.code,
            "config": self.config,
            "probe_size_bytes": self.probe_size_bytes,
        }


def load_callable(target: str, code: str = "") -> Callable[[dict[str, Any]], Any]:
    """The function `target` names (``package.module:function``), its directory `code` first on ``sys.path``."""
    if code and not code.startswith(REMOTE_CODE_SCHEMES) and code not in sys.path:
        sys.path.insert(0, code)
    module_name, _, attribute = target.partition(":")
    found: Any = importlib.import_module(module_name)
    for part in attribute.split("."):
        found = getattr(found, part)
    if not callable(found):
        raise TypeError(f"{target} is a {type(found).__name__}, not a function")
    return found  # type: ignore[no-any-return]


def _library(filename: str) -> bool:
    return filename.startswith("<frozen ") or any(part in filename for part in ("site-packages", "dist-packages"))


def failure(rank: int, error: BaseException) -> Failure:
    """This rank's ``Failure`` for a user exception: its type and message, then where it was raised.

    One line (the parser removes line breaks): ``ValueError: bad | at train.py:12 in step: loss = f(x) | ...``,
    the innermost :data:`TRACEBACK_FRAMES` frames, the message cut so that they fit the field's bound.
    """
    # Not the wrapper's own frames: the user's code is where the story is.
    frames = [f for f in traceback.extract_tb(error.__traceback__) if f.filename != __file__]
    # The user's own frames when there are any (not the import machinery's, not a library's).
    frames = [f for f in frames if not _library(f.filename)] or frames
    frames = frames[-TRACEBACK_FRAMES:]
    where = [
        f"at {frame.filename.rsplit('/', 1)[-1]}:{frame.lineno} in {frame.name}"
        + (f": {frame.line}" if frame.line else "")
        for frame in frames
    ]
    tail = clean_text(" | ".join(where), TEXT_LIMITS["message"] // 2)
    head = clean_text(failure_message(error), TEXT_LIMITS["message"] - len(tail) - 3)
    # A reason only for the project's own errors: a user's exception with a `reason` attribute (any value, an
    # exception object in URLError's) must not fail the job as DataUnavailable, nor keep its Failure from printing.
    return Failure(rank=rank, message=f"{head} | {tail}" if tail else head, reason=failure_reason(error))


def run_user_function(function: FunctionConfig, rank: int, verify: Callable[[], object]) -> Any:
    """Verify the link (`verify`: ``report.verify_link`` for this rank), then run the user's function.

    Any exception, the link's or the user's, is this rank's ``Failure`` before it propagates.
    """
    try:
        if function.code:  # a directory on this node (a remote .zip is Ray's working directory by now)
            preflight.check(preflight.function_problems(function.callable, function.code))
        verify()
        target = load_callable(function.callable, function.code)
        return target(dict(function.config))
    except BaseException as e:
        emit(failure(rank, e))
        raise


# --- the controller's side: ray.train.report's metrics as events ------------------------------------------


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        return float(value)
    except OverflowError:
        return None


def _count(value: Any) -> int | None:
    """A whole number in the event schema's range (an integral float counts), else None."""
    number = _number(value)
    if number is None or not math.isfinite(number) or not number.is_integer() or not 0 <= number <= MAX_COUNT:
        return None
    return int(number)


def reported_step(metrics: Any, reports: int) -> int:
    """The step a report names: ``step``, else ``iteration``, else the count of reports (`reports`)."""
    if not isinstance(metrics, Mapping):
        return reports
    return next((s for key in STEP_KEYS if (s := _count(metrics.get(key))) is not None and s >= 1), reports)


def events_from_report(
    metrics: Mapping[str, Any], *, reports: int, world_size: int, checkpoint_path: str | None
) -> list[Event]:
    """The events for one ``ray.train.report`` (rank 0's `metrics`, the `reports`-th report of this run).

    ``step`` (else ``iteration``, else the count of reports), ``loss``, ``total_steps``, ``tokens`` (trained on so
    far) and ``tokens_per_second`` go into ``Step``; ``eval_loss`` into an ``Evaluation``; any other number, up
    to :data:`MAX_EXTRA` of them in name order, into ``Step.extra``. A checkpoint adds a ``Checkpoint``.
    Non-numbers are left out; nothing raises, whatever the metrics hold.
    """
    step = reported_step(metrics, reports)
    loss = _number(metrics.get("loss"))
    total = _count(metrics.get("total_steps"))
    rate = _number(metrics.get("tokens_per_second"))
    # Not reported (or not a rate): absent, never 0, which would read as a stall.
    rate = rate if rate is not None and math.isfinite(rate) and rate >= 0 else None
    extra: dict[str, float] = {}
    for name in sorted(k for k in metrics if isinstance(k, str) and k not in KNOWN_METRICS):
        value = _number(metrics[name])
        key = clean_text(name, MAX_EXTRA_KEY)
        # A non-finite figure (a NaN grad norm) is unknown: left out, never NaN on the wire.
        if value is not None and math.isfinite(value) and key and key not in extra and len(extra) < MAX_EXTRA:
            extra[key] = value
    events: list[Event] = [
        Step(
            rank=0,
            step=step,
            total_steps=total if total is not None and total >= step else 0,
            loss=loss if loss is not None and math.isfinite(loss) else None,
            tokens_per_second=rate,
            tokens_per_second_per_device=rate / max(world_size, 1) if rate is not None else None,
            epoch=_count(metrics.get("epoch")) or 0,
            tokens_seen=_count(metrics.get("tokens")) or 0,
            extra=extra,
        )
    ]
    eval_loss = _number(metrics.get("eval_loss"))
    if eval_loss is not None and math.isfinite(eval_loss):
        events.append(Evaluation(rank=0, step=step, loss=eval_loss))
    if checkpoint_path is not None:
        events.append(Checkpoint(rank=0, step=step, path=checkpoint_path))
    return events


def checkpoint_uri(storage: str | None, path: str) -> str:
    """A Ray checkpoint's location as a user writes it: Ray gives the path within its file system, without the
    scheme of the storage (``bucket/prefix/...`` for ``s3://bucket/prefix``)."""
    if storage and "://" in storage and "://" not in path:
        return f"{storage.split('://', 1)[0]}://{path.lstrip('/')}"
    return path
