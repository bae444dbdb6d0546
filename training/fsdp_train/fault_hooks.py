"""Fault injection for the health tests: a rank that blocks in code, or one slower than its peers.

Read by the bundled loop only, from :data:`TEST_HOOK_ENV` in the rank's environment (a test sets it through
``runtimeEnv.envVars``); not a spec field, and nothing happens without it. Its own module so that a stalled rank's
``Stall`` names this file's line, as it would name a user's data reader.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass

TEST_HOOK_ENV = "FSDP_TRAIN_TEST_HEALTH"
"""``stall=RANK:STEP`` blocks that rank (for an hour) before that step, in a run that did not resume;
``slow=RANK:SECONDS`` adds that much to each of its steps. Comma-separated."""


@dataclass(frozen=True, slots=True)
class FaultHook:
    """What :data:`TEST_HOOK_ENV` asks of this rank (nothing by default)."""

    stall_step: int = 0
    slow_seconds: float = 0.0

    @classmethod
    def from_env(cls, env: Mapping[str, str], rank: int) -> FaultHook:
        stall, slow = 0, 0.0
        for part in env.get(TEST_HOOK_ENV, "").split(","):
            what, _, value = part.strip().partition("=")
            target, _, amount = value.partition(":")
            if not amount or not target.isdigit() or int(target) != rank:
                continue
            if what == "stall":
                stall = int(amount)
            elif what == "slow":
                slow = float(amount)
        return cls(stall, slow)

    def before_step(self, step: int, resumed_from: int) -> None:
        if self.slow_seconds:
            time.sleep(self.slow_seconds)
        if self.stall_step and step == self.stall_step and resumed_from == 0:
            blocked_reading_data()


def blocked_reading_data() -> None:
    """Stands for a data reader that never returns (test hook): blocks for an hour."""
    deadline = time.monotonic() + 3600.0
    while time.monotonic() < deadline:
        time.sleep(1.0)
