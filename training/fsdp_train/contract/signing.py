"""Signing event lines: an attempt's key, the MAC of a line, the :class:`Signer` a process signs with and the
:class:`Verifier` the operator reads with (``fsdp_train.contract.events`` says how lines are signed and parsed).

Pure Python, no torch: the operator imports it too.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import time
from typing import Any

from fsdp_train.contract.event_base import PREFIX
from fsdp_train.contract.wire import MAX_COUNT, MAX_RANK, safe_str

_MAC_CONTEXT = b"fsdp-event-v1\n"
"""Prepended to the JSON text before the MAC: a key used for anything else cannot sign an event line."""
MAC_HEX = 64
"""A MAC's length in hex characters."""

CONTROLLER = "controller"
"""The emitter name of Ray Train's controller process, which reports a user function's metrics."""
DRIVER = "driver"
"""The emitter name of the Ray job's driver (``fsdp_train.run.ray_entry.main``), which reports its own failures."""
EMITTERS = ("", CONTROLLER, DRIVER)
"""Who signs: a training rank (no name: torchrun's and Ray Train's ranks), the controller, or the driver. The
verifier keeps one sequence per (emitter, rank)."""


def attempt_key(job_key: bytes, submission_id: str) -> bytes:
    """The key of one attempt: lines signed for another attempt (another submission id) do not verify under it."""
    return hmac.new(job_key, b"fsdp-event-attempt\n" + submission_id.encode(), hashlib.sha256).digest()


def line_mac(key: bytes, text: str) -> str:
    """The MAC of an event's JSON text. Total: a lone surrogate (no genuine line has one: the JSON is ASCII) is
    encoded as it stands rather than raising."""
    return hmac.new(key, _MAC_CONTEXT + text.encode("utf-8", "surrogatepass"), hashlib.sha256).hexdigest()


_MAC_SHAPE = re.compile(r"[0-9a-f]{64}")
"""What a MAC is: exactly 64 lowercase hex characters (``hexdigest``). Anything else is refused before any
comparison: ``hmac.compare_digest`` raises ``TypeError`` for a non-ASCII ``str``."""


def mac_shaped(mac: object) -> bool:
    return isinstance(mac, str) and len(mac) == MAC_HEX and _MAC_SHAPE.fullmatch(mac) is not None


class Signer:
    """Signs one process's event lines; sequence numbers are microseconds of the wall clock, never repeating.

    A clock-based number lets a restarted process (Ray Train's new worker group) continue above its
    predecessor's numbers without knowing them, so the verifier keeps one number per (emitter, rank).
    """

    def __init__(self, key: bytes, clock_ns: Any = time.time_ns, emitter: str = "") -> None:
        self._key = key
        self._clock_ns = clock_ns
        self._last = 0
        self._emitter = emitter

    def line(self, payload: dict[str, Any]) -> str:
        self._last = max(self._last + 1, int(self._clock_ns()) // 1000)
        signed = {**payload, "seq": self._last, **({"emitter": self._emitter} if self._emitter else {})}
        # ASCII (ensure_ascii): a genuine line never holds anything else, which the verifier relies on.
        text = json.dumps(signed, separators=(",", ":"), sort_keys=True, default=safe_str)
        return f"{PREFIX} {line_mac(self._key, text)} {text}"


class Verifier:
    """Accepts the lines of one attempt's emitter only: a valid MAC under its key, each rank's ``seq`` rising.

    State is one number per rank that ever sent a verified line (bounded by the parser's rank bound).
    """

    def __init__(self, key: bytes) -> None:
        self.key = key
        self.last_seq: dict[int, int] = {}

    def copy(self) -> Verifier:
        twin = Verifier(self.key)
        twin.last_seq = dict(self.last_seq)
        return twin

    def authentic(self, mac: object, text: object) -> bool:
        """Whether `mac` is the MAC of `text` under the key. Total: a MAC not of the shape ``hexdigest`` writes, or a
        text that is not ASCII (the emitter's JSON always is), is refused before any comparison."""
        if not (mac_shaped(mac) and isinstance(mac, str) and isinstance(text, str) and text.isascii()):
            return False
        return hmac.compare_digest(mac, line_mac(self.key, text))

    def fresh(self, rank: int, seq: Any, emitter: Any = "") -> bool:
        """Whether `seq` is a new number for `rank` from `emitter` (and remember it)."""
        if isinstance(seq, bool) or not isinstance(seq, int) or not 0 < seq <= MAX_COUNT:
            return False
        if not isinstance(emitter, str) or emitter not in EMITTERS:
            return False
        # Each signer rises on its own: each rank's process, the Ray driver (it signs as rank 0 too, a data failure)
        # and Ray Train's controller are processes of their own whose lines reach the job log by different paths
        # (their own output), so the order between two of them is not their clocks'. The emitter is signed, so no
        # line moves from one sequence to another.
        channel = EMITTERS.index(emitter) * MAX_RANK + rank
        if seq <= self.last_seq.get(channel, 0):
            return False
        self.last_seq[channel] = seq
        return True
