"""What every structured event is (``fsdp_train.contract.events`` holds the schema, the parser and the signing).

The base class lives apart so that event types declared in other modules (``fsdp_train.contract.health_events``) can
derive from it while ``fsdp_train.contract.events`` lists them all in its schema, with no import cycle.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, Protocol

from fsdp_train.contract.wire import wire_value

PREFIX = "FSDP_EVENT"
SCHEMA_VERSION = 1


class LineSigner(Protocol):
    """What signs a line (``fsdp_train.contract.events.Signer``)."""

    def line(self, payload: dict[str, Any]) -> str: ...


@dataclass(kw_only=True, slots=True)
class Event:
    """Fields every event carries."""

    kind: ClassVar[str] = ""
    rank: int
    """Global rank of the process that emitted the event."""
    time: float = field(default_factory=time.time)
    """Unix time when the event was emitted."""

    def to_line(self, signer: LineSigner | None = None) -> str:
        """The event's log line; signed (with the next sequence number of this rank) when `signer` is given.

        Never raises: a field holding something JSON cannot carry (an exception object in a ``reason``) goes out as
        its ``str()``, and strings are cut to the bound the parser keeps, so the line stays within
        :data:`MAX_LINE_CHARS` and is read back rather than skipped.
        """
        payload = {"v": SCHEMA_VERSION, "kind": self.kind}
        payload.update((f.name, wire_value(f.name, getattr(self, f.name))) for f in fields(self))
        if signer is None:
            return f"{PREFIX} {json.dumps(payload, separators=(',', ':'), sort_keys=True)}"
        return signer.line(payload)
