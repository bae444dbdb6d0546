"""What a ``Failure`` event carries for an exception: its message, and a reason the operator can act on only for
the project's own errors."""

from __future__ import annotations

from fsdp_train.contract.events import Failure
from fsdp_train.contract.wire import TEXT_LIMITS, clean_text, safe_str

OWN_REASONS: dict[str, str] = {
    "fsdp_train.state.storage.DataUnavailable": "DataUnavailable",
    "fsdp_train.state.checkpoint.CheckpointMismatch": "CheckpointMismatch",
    "fsdp_train.run.preflight.PreflightFailed": "PreflightFailed",
}
"""The project's own exceptions (``module.QualifiedName``) that carry a reason to the operator, and that reason.
Any other exception's ``reason`` attribute (``URLError``'s is an exception object; a model repository's code can
define one of any value) is never signed into a ``Failure``."""

_KNOWN_REASONS = frozenset(OWN_REASONS.values())

OTHER_ERROR = "Error"
"""The reason of an error of a class named like one of the project's reasons but not derived from it."""


def own_reason(error: BaseException) -> str:
    """The reason of an error of the project's own, else ``""``: the one :data:`OWN_REASONS` gives a class of the
    project's that `error` is an instance of (Ray re-raises a task's error as a class derived from it:
    ``RayTaskError(DataUnavailable)``), or the one of the project's reasons its code gave that instance (a preflight
    of the data says ``DataUnavailable``); never what an attribute of another error says."""
    for cls in type(error).__mro__:
        reason = OWN_REASONS.get(f"{cls.__module__}.{cls.__qualname__}")
        if reason:
            given = getattr(error, "reason", None)
            return given if isinstance(given, str) and given in _KNOWN_REASONS else reason
    return ""


def failure_reason(error: BaseException) -> str:
    """The reason a :class:`Failure` for `error` carries, never empty: :func:`own_reason`, else the error's type
    name, so that every failure names one, unless that name is one of the project's reasons (a class in a user's
    or a model repository's code named ``DataUnavailable`` never decides what the operator does)."""
    name = type(error).__name__
    return own_reason(error) or (OTHER_ERROR if name in _KNOWN_REASONS else name[:64])


def failure_message(error: BaseException) -> str:
    """``Type: message`` of any exception, never raising, cut to the ``message`` field's bound."""
    return clean_text(f"{type(error).__name__}: {safe_str(error)}".rstrip(": "), TEXT_LIMITS["message"])


def failure_of(rank: int, error: BaseException) -> Failure:
    """The :class:`Failure` line of any exception: its type and message, and a reason only for the project's own."""
    return Failure(rank=rank, message=failure_message(error), reason=failure_reason(error))
