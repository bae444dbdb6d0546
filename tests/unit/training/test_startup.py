"""Time to first step: the process clock, the phases, the persistent compile cache and the timings event."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from fsdp_train.contract.events import Timings, parse_line
from fsdp_train.watch.startup import (
    BYTECODE_DIR,
    INDUCTOR_CACHE_ENV,
    TRITON_CACHE_ENV,
    StartupClock,
    configure_compile_cache,
    fill_bytecode_cache,
    finish_bytecode_cache,
    process_start_time,
    use_bytecode_cache,
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


def test_no_bytecode_cache_until_a_run_filled_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "pycache_prefix", None)
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    assert not use_bytecode_cache("")
    # An empty prefix would make Python ignore the .pyc files beside the sources: not set before it is filled.
    assert not use_bytecode_cache(str(tmp_path))
    assert sys.pycache_prefix is None and sys.dont_write_bytecode
    (tmp_path / BYTECODE_DIR).mkdir()
    assert use_bytecode_cache(str(tmp_path))
    assert sys.pycache_prefix == str(tmp_path / BYTECODE_DIR)
    assert not sys.dont_write_bytecode


def test_a_filled_bytecode_cache_is_read_by_the_next_process(tmp_path: Path) -> None:
    """A first process fills the cache in the background; a second, with bytecode writing off as in an image
    that sets PYTHONDONTWRITEBYTECODE, imports the module from it instead of compiling the source."""
    sources = tmp_path / "src"
    sources.mkdir()
    (sources / "heavy_module.py").write_text("VALUE = 41 + 1\n")
    cache = tmp_path / "cache"
    script = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(sources)!r})
        from fsdp_train.watch.startup import fill_bytecode_cache, finish_bytecode_cache, use_bytecode_cache
        used = use_bytecode_cache({str(cache)!r})
        import heavy_module
        if not used:
            finish_bytecode_cache(fill_bytecode_cache({str(cache)!r}, list(sys.modules.values())), 60)
        print(used, heavy_module.VALUE, heavy_module.__cached__)
        """
    )
    env = {"PYTHONDONTWRITEBYTECODE": "1", "PYTHONPATH": ":".join(sys.path)}
    first = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    assert first.stdout.split()[:2] == ["False", "42"]
    assert not (sources / "__pycache__").exists()  # nothing written beside the source
    cached = next((cache / BYTECODE_DIR).rglob("heavy_module.*.pyc"))
    written = cached.stat().st_mtime_ns
    second = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    used, value, where = second.stdout.split()
    assert (used, value, where) == ("True", "42", str(cached))
    assert cached.stat().st_mtime_ns == written  # read, not compiled again


def test_no_bytecode_fill_without_a_cache_directory() -> None:
    assert fill_bytecode_cache("", list(sys.modules.values())) is None
    finish_bytecode_cache(None)
