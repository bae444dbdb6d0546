"""The reason a ``Failure`` event carries: every failure has one."""

from __future__ import annotations


def failure_reason(error: BaseException) -> str:
    """The error's own ``reason`` (``DataUnavailable``, ``CheckpointMismatch``, ...), else its type's name."""
    reason = getattr(error, "reason", "")
    return reason if isinstance(reason, str) and reason else type(error).__name__
