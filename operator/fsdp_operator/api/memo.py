"""A bounded memo of a pure function of one JSON value, keyed by the value's exact form (for `spec.parse_job`).

The operator parses a job's spec on every pass, the same spec each time until a user changes it: a dozen parses
a job in the load run, 30 % of the operator's CPU there. `functools.lru_cache` needs hashable arguments and
treats 1, 1.0 and True as one key, which parse differently; hence this small memo of its own.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, TypeVar

Result = TypeVar("Result")

_SCALARS = frozenset({str, int, float, bool, type(None)})
MAX_DEPTH = 64
"""Deeper values are not memoised: `repr` recurses, and a hostile manifest may nest thousands of levels."""
MAX_INT_BITS = 256
"""Nor are larger integers: `repr` refuses one of over 4,300 digits (sys.get_int_max_str_digits), and no spec
field takes one of even 256 bits."""


def json_key(value: object, max_chars: int) -> str | None:
    """`repr(value)` where `value` is plain JSON of exact types (dicts with str keys, lists, str, int, float, bool,
    None) no deeper than MAX_DEPTH, its integers within MAX_INT_BITS and its repr at most `max_chars` long; None
    for anything else.

    With exact types `repr` is injective: equal keys mean equal values of equal types (1 and "1", 1 and 1.0,
    1 and True all differ), and dict order counts (a reordered dict is a miss, never a wrong hit)."""
    pending: list[tuple[object, int]] = [(value, 0)]
    while pending:
        item, depth = pending.pop()
        kind = type(item)
        if kind is dict:
            if depth >= MAX_DEPTH:
                return None
            for key, child in item.items():  # type: ignore[attr-defined]
                if type(key) is not str:
                    return None
                pending.append((child, depth + 1))
        elif kind is list:
            if depth >= MAX_DEPTH:
                return None
            pending.extend((child, depth + 1) for child in item)  # type: ignore[attr-defined]
        elif kind not in _SCALARS or (kind is int and item.bit_length() > MAX_INT_BITS):  # type: ignore[attr-defined]
            return None
    key = repr(value)
    return key if len(key) <= max_chars else None


class JsonMemo(Generic[Result]):
    """`compute(value)` remembered for the last `max_entries` distinct values `json_key` accepts (least recently
    used out first); other values are computed every time. Results are shared between callers: frozen ones only.
    No lock: the operator parses on its event loop's thread (its log worker is a process with a memo of its own)."""

    def __init__(self, compute: Callable[[object], Result], max_entries: int, max_key_chars: int) -> None:
        self._compute = compute
        self._max_entries = max_entries
        self._max_key_chars = max_key_chars
        self._results: OrderedDict[str, Result] = OrderedDict()

    def __call__(self, value: object) -> Result:
        key = json_key(value, self._max_key_chars)
        if key is None:
            return self._compute(value)
        if key in self._results:
            self._results.move_to_end(key)
            return self._results[key]
        result = self._compute(value)
        self._results[key] = result
        if len(self._results) > self._max_entries:
            self._results.popitem(last=False)
        return result

    def clear(self) -> None:
        self._results.clear()
