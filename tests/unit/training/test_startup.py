"""Time to first step: the process clock, the phases, the persistent compile cache and the timings event."""

from __future__ import annotations

import time
from pathlib import Path

from fsdp_train.events import Timings, parse_line
from fsdp_train.startup import (
    INDUCTOR_CACHE_ENV,
    TRITON_CACHE_ENV,
    StartupClock,
    configure_compile_cache,
    process_start_time,
)


def test_process_start_is_before_now_and_after_boot() -> None:
    started = process_start_time()
    assert started is not None
    uptime = float(Path("/proc/uptime").read_text().split()[0])
    assert time.time() - uptime - 5 <= started <= time.time()


def test_phases_follow_each_other() -> None:
    clock = StartupClock(origin=100.0, entered=106.0)
    clock.marks = {"probe": 106.5, "build": 115.0, "first_step": 129.0}
    event = clock.timings(0, "warm")
    expected = Timings(
        rank=0,
        time=event.time,
        to_first_step_seconds=29.0,
        startup_seconds=6.0,
        probe_seconds=0.5,
        build_seconds=8.5,
        first_step_seconds=14.0,
        compile_cache="warm",
    )
    assert event == expected


def test_timings_event_round_trips_through_a_log_line() -> None:
    event = Timings(rank=0, to_first_step_seconds=19.3, build_seconds=10.0, compile_cache="cold")
    assert parse_line("(RayTrainWorker pid=1) " + event.to_line()) == event


def test_compile_cache_is_cold_then_warm(tmp_path: Path) -> None:
    env: dict[str, str] = {}
    assert configure_compile_cache("", env) == "" and env == {}
    root = tmp_path / "cache"
    assert configure_compile_cache(str(root), env) == "cold"
    assert env == {INDUCTOR_CACHE_ENV: str(root / "inductor"), TRITON_CACHE_ENV: str(root / "triton")}
    assert configure_compile_cache(str(root), env) == "cold"  # still empty: nothing was compiled
    (root / "inductor" / "fxgraph").mkdir()
    assert configure_compile_cache(str(root), env) == "warm"
