"""The bounds of the event wire format and the text of its fields: what the emitter writes and the parser keeps.

Pure Python, shared by both sides through :mod:`fsdp_train.contract.events`; every field read back from a log is
untrusted.
"""

from __future__ import annotations

import re
from types import UnionType
from typing import Any, Literal, Union, get_args, get_origin

MAX_LINE_CHARS = 64 * 1024
"""A log line longer than this is skipped unread (an event line is a few hundred characters)."""
MAX_RANK = 1 << 20
"""Ranks at or above this are refused at parse time; the operator also drops ranks beyond the job's world size."""
MAX_COUNT = (1 << 53) - 1
"""Bound on any other integer field: JSON numbers above 2^53 lose precision in most readers."""
MAX_TEXT = 256
"""Default bound on a string field, in characters (after control characters are removed)."""
TEXT_LIMITS: dict[str, int] = {"evidence": 512, "source": 512, "path": 1024, "message": 1024, "stack": 2048}
"""Fields allowed more than :data:`MAX_TEXT`: an NCCL line, a checkpoint URI, a failure message."""
MAX_EXTRA = 16
"""Most entries of a ``dict[str, float]`` field (``Step.extra``); a longer mapping is refused."""
MAX_EXTRA_KEY = 64
"""Longest key of such a mapping, in characters."""
TRUNCATED = "…"
"""Appended to a string cut to its bound, so a reader sees that it was cut."""

# ANSI escape sequences (CSI and OSC), then any C0/C1 control character and DEL: a status string must not
# move a terminal's cursor when `kubectl get -o yaml` prints it. Both patterns are linear (no nesting).
_ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?")
# Lone surrogates too (JSON's `\ud800`): no UTF-8 encoder takes them, so a status holding one could not be written.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\ud800-\udfff]")


def clean_text(value: str, limit: int = MAX_TEXT) -> str:
    """`value` without escape sequences and control characters, cut to `limit` characters (cut marked)."""
    text = _CONTROL.sub("", _ANSI_ESCAPE.sub("", value[: limit * 4]))
    return text if len(text) <= limit else text[: limit - len(TRUNCATED)] + TRUNCATED


def safe_str(value: object) -> str:
    """``str(value)``, never raising: an object whose ``__str__`` raises is named by its ``repr``, then its type."""
    for show in (str, repr):
        try:
            text = show(value)
        except Exception:  # any object's own __str__ may raise anything: the line must still go out
            continue
        if isinstance(text, str):
            return text
    return f"<{type(value).__name__}>"


def wire_value(name: str, value: Any) -> Any:
    """`value` as a JSON value the parser keeps: strings cleaned and cut to field `name`'s bound, numbers as they
    are, a mapping's keys as strings, anything else (an exception object, a path) as its ``str()``."""
    if value is None or isinstance(value, bool | int | float):
        return value
    if isinstance(value, str):
        return clean_text(value, TEXT_LIMITS.get(name, MAX_TEXT))
    if isinstance(value, dict):
        return {clean_text(safe_str(k), MAX_EXTRA_KEY): wire_value(name, v) for k, v in list(value.items())[:MAX_EXTRA]}
    return clean_text(safe_str(value), TEXT_LIMITS.get(name, MAX_TEXT))


class Refused(ValueError):
    """A field whose type or range does not fit the schema."""


def check_value(name: str, hint: Any, value: Any) -> Any:
    """`value` as the schema declares field `name` (`hint`), or Refused."""
    origin = get_origin(hint)
    if origin is Literal:
        if isinstance(value, str) and value in get_args(hint):
            return value
        raise Refused(name)
    if origin in (Union, UnionType):
        if value is None and type(None) in get_args(hint):
            return None
        (inner,) = (arg for arg in get_args(hint) if arg is not type(None))
        return check_value(name, inner, value)
    if hint is bool:
        if isinstance(value, bool):
            return value
        raise Refused(name)
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise Refused(name)
        upper = MAX_RANK - 1 if name == "rank" else MAX_COUNT
        if not 0 <= value <= upper:
            raise Refused(name)
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise Refused(name)
        try:
            return float(value)  # NaN and infinities pass: the status writer turns them into null
        except OverflowError as e:
            raise Refused(name) from e
    if hint is str:
        if not isinstance(value, str):
            raise Refused(name)
        return clean_text(value, TEXT_LIMITS.get(name, MAX_TEXT))
    if origin is dict:  # dict[str, float]: names cleaned and bounded, values numbers
        if not isinstance(value, dict) or len(value) > MAX_EXTRA:
            raise Refused(name)
        out = {clean_text(str(k), MAX_EXTRA_KEY): check_value(name, float, v) for k, v in value.items()}
        if len(out) != len(value) or "" in out:  # two names the same once cleaned, or a name of nothing
            raise Refused(name)
        return out
    raise Refused(name)
