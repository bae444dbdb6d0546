"""The bundled loop's test hooks (``fsdp_train.run.fault_hooks``): what they parse, and the hold on a node's notice."""

from __future__ import annotations

import threading
from pathlib import Path

from fsdp_train.run.fault_hooks import TEST_HOOK_ENV, FaultHook
from fsdp_train.watch.notice import NOTICE_DIR_ENV, NOTICE_FILE


def test_each_rank_reads_only_its_own_hooks() -> None:
    env = {TEST_HOOK_ENV: "stall=1:8, slow=0:0.25,hold=3:15,bogus=2:1,slow=x:1", NOTICE_DIR_ENV: "/n"}
    assert FaultHook.from_env(env, 0) == FaultHook(slow_seconds=0.25, notice_file="/n/notice")
    assert FaultHook.from_env(env, 1) == FaultHook(stall_step=8, notice_file="/n/notice")
    assert FaultHook.from_env(env, 3) == FaultHook(hold_step=15, notice_file=f"/n/{NOTICE_FILE}")
    assert FaultHook.from_env({}, 0) == FaultHook()


def test_a_hold_waits_for_the_nodes_notice_and_only_before_its_step_in_a_fresh_run(tmp_path: Path) -> None:
    hook = FaultHook.from_env({TEST_HOOK_ENV: "hold=0:5", NOTICE_DIR_ENV: str(tmp_path)}, 0)
    hook.before_step(4, 0)  # another step: no wait
    hook.before_step(5, 2)  # a resumed run: no wait
    held = threading.Thread(target=hook.before_step, args=(5, 0), daemon=True)
    held.start()
    held.join(timeout=0.5)
    assert held.is_alive()  # still waiting: no notice yet
    (tmp_path / NOTICE_FILE).write_text("1796300000 60 preStop\n")
    held.join(timeout=60)
    assert not held.is_alive()
