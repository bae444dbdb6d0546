"""Fault injection for the end-to-end tests: a rank that blocks in code, one slower than its peers, one that holds a
step until its node's notice comes.

Read by the bundled loop only, from :data:`TEST_HOOK_ENV` in the rank's environment (a test sets it through
``runtimeEnv.envVars``); not a spec field, and nothing happens without it. Its own module so that a stalled rank's
``Stall`` names this file's line, as it would name a user's data reader.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass

from fsdp_train.watch.notice import NOTICE_DIR_ENV, NOTICE_FILE

TEST_HOOK_ENV = "FSDP_TRAIN_TEST_HEALTH"
"""``stall=RANK:STEP`` blocks that rank (for an hour) before that step, in a run that did not resume;
``slow=RANK:SECONDS`` adds that much to each of its steps; ``hold=RANK:STEP`` holds that rank before that step, in
a run that did not resume, until its node's notice file exists (``fsdp_train.watch.notice``; at most
:data:`HOLD_SECONDS`),
so that a test drains a worker at a known step however fast the steps run. Comma-separated."""
HOLD_SECONDS = 900.0


@dataclass(frozen=True, slots=True)
class FaultHook:
    """What :data:`TEST_HOOK_ENV` asks of this rank (nothing by default)."""

    stall_step: int = 0
    slow_seconds: float = 0.0
    hold_step: int = 0
    notice_file: str = ""

    @classmethod
    def from_env(cls, env: Mapping[str, str], rank: int) -> FaultHook:
        stall, slow, hold = 0, 0.0, 0
        for part in env.get(TEST_HOOK_ENV, "").split(","):
            what, _, value = part.strip().partition("=")
            target, _, amount = value.partition(":")
            if not amount or not target.isdigit() or int(target) != rank:
                continue
            if what == "stall":
                stall = int(amount)
            elif what == "slow":
                slow = float(amount)
            elif what == "hold":
                hold = int(amount)
        directory = env.get(NOTICE_DIR_ENV, "")
        return cls(stall, slow, hold, os.path.join(directory, NOTICE_FILE) if directory else "")

    def before_step(self, step: int, resumed_from: int) -> None:
        if self.slow_seconds:
            time.sleep(self.slow_seconds)
        if self.stall_step and step == self.stall_step and resumed_from == 0:
            blocked_reading_data()
        if self.hold_step and step == self.hold_step and resumed_from == 0 and self.notice_file:
            deadline = time.monotonic() + HOLD_SECONDS
            while not os.path.exists(self.notice_file) and time.monotonic() < deadline:
                time.sleep(0.1)


def blocked_reading_data() -> None:
    """Stands for a data reader that never returns (test hook): blocks for an hour."""
    deadline = time.monotonic() + 3600.0
    while time.monotonic() < deadline:
        time.sleep(1.0)
