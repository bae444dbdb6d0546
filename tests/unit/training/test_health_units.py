"""The rank's health watchdog in pure units (no Ray, no torch, no processes): where a thread stands (frames made to
look like torch's, Ray Train's, a user's), the config's refusals word for word, and the monitor's figures and stalls
on a fake clock, its watchdog ticked from the test."""

from __future__ import annotations

import functools
import os
import queue
import sys
import threading
import types
from collections.abc import Callable
from typing import Any

import pytest
from fsdp_train.contract.health_events import RankHealth, Stall
from fsdp_train.watch import flight, health
from fsdp_train.watch.health import (
    HealthConfig,
    Location,
    Monitor,
    _Classifier,
    _within,
    collective_name,
    flight_for,
    locate,
    stack_text,
    stop_monitors,
)

SITE = os.sep.join(["", "venv", "lib", "python3.11", "site-packages"])
C10D = os.sep.join([SITE, "torch", "distributed", "distributed_c10d.py"])
FSDP = os.sep.join([SITE, "torch", "distributed", "fsdp", "_fully_shard", "_fsdp_param_group.py"])
MODULE = os.sep.join([SITE, "torch", "nn", "modules", "module.py"])
RAY_CONTEXT = os.sep.join([SITE, "ray", "train", "v2", "_internal", "execution", "context.py"])
RAY_COLLECTIVES = os.sep.join([SITE, "ray", "train", "collective", "collectives.py"])
USER = os.sep.join(["", "home", "me", "train.py"])
READER = os.sep.join(["", "home", "me", "reader.py"])
STEPS = os.sep.join(["", "app", "fsdp_train", "run", "steps.py"])
USER_FUNCTION = os.sep.join(["", "app", "fsdp_train", "run", "user_function.py"])
FROZEN = "<frozen importlib._bootstrap>"


def _calls(then: Callable[[], Any]) -> Any:
    return then()


LINE = _calls.__code__.co_firstlineno + 1
"""The line every made-up frame stands on (the call in :func:`_calls`)."""


def _code_of(filename: str, name: str) -> types.CodeType:
    return _calls.__code__.replace(co_filename=filename, co_name=name, co_qualname=name)


def _chain(layers: list[tuple[str, str]], innermost: Callable[[], Any]) -> Callable[[], Any]:
    """A call through one frame per `(file, function)` of `layers` (outermost first), the last calling `innermost`."""
    call = innermost
    for filename, name in reversed(layers):
        call = functools.partial(types.FunctionType(_code_of(filename, name), globals()), call)
    return call


def _at(filename: str, name: str) -> str:
    return f"{os.path.basename(filename)}:{LINE} in {name}"


def _here(*layers: tuple[str, str]) -> Location:
    """Where a thread stands inside `layers`, called from this test (its frames under them)."""
    return _chain(list(layers), lambda: locate(sys._getframe(1)))()  # type: ignore[no-any-return]


def _in_a_bare_thread(*layers: tuple[str, str]) -> Location:
    """Where a thread stands inside `layers` on a thread of its own: only ``threading.py`` under them."""
    found: list[Location] = []
    thread = threading.Thread(target=_chain(list(layers), lambda: found.append(locate(sys._getframe(1)))))
    thread.start()
    thread.join(10)
    return found[0]


# --- where a thread is ---------------------------------------------------------------------------------------


def test_a_thread_in_a_torch_collective_is_located_at_the_user_code_that_called_it() -> None:
    """The collective is named by its innermost frame; ``at`` is the caller a person can act on, not torch."""
    here = _here((USER, "train_step"), (STEPS, "run_step"), (C10D, "all_reduce"), (C10D, "_wait"))
    assert here == Location("collective", _at(USER, "train_step"), "_wait")


def test_a_decorators_wrapper_is_not_the_collective_the_call_it_wraps_is() -> None:
    """torch wraps its collectives in a logging ``wrapper``: the name a user knows is the inner call's."""
    here = _here((USER, "train_step"), (C10D, "all_reduce"), (C10D, "wrapper"), (MODULE, "forward"))
    assert here == Location("collective", _at(USER, "train_step"), "all_reduce")


def test_a_ray_train_barrier_is_a_collective_by_its_public_name() -> None:
    here = _here((USER, "train_fn"), (RAY_CONTEXT, "_sync_checkpoint_dir_name_across_ranks"))
    assert here == Location("collective", _at(USER, "train_fn"), "ray.train.report")


def test_a_collective_with_no_code_frame_under_it_is_located_at_the_collective_itself() -> None:
    """A thread of torch's own (only ``threading.py`` below): ``at`` falls back to the collective's frame."""
    here = _in_a_bare_thread((MODULE, "forward"), (FSDP, "wait_for_unshard"), (MODULE, "_call_impl"))
    assert here == Location("collective", _at(FSDP, "wait_for_unshard"), "wait_for_unshard")


def test_a_thread_outside_any_collective_is_in_its_innermost_code_frame_past_library_and_plumbing() -> None:
    """torch's non-distributed code, the project's plumbing files and frozen modules are never where a rank is."""
    here = _here(
        (USER, "train_step"), (USER_FUNCTION, "call"), (STEPS, "run_step"), (MODULE, "forward"), (FROZEN, "_x")
    )
    assert here == Location("code", _at(USER, "train_step"))


def test_a_thread_with_only_library_frames_is_unknown_at_its_innermost_frame() -> None:
    here = _in_a_bare_thread((MODULE, "forward"), (FROZEN, "_load"))
    assert here == Location("unknown", _at(FROZEN, "_load"))


def test_no_frame_at_all_is_unknown_and_nowhere() -> None:
    """The training thread has ended: nothing to name."""
    assert locate(None) == Location("unknown", "", "")


@pytest.mark.parametrize(
    ("filename", "name", "collective"),
    [
        (C10D, "all_reduce", "all_reduce"),
        (FSDP, "wait_for_unshard", "wait_for_unshard"),
        (C10D, "wrapper", None),
        (C10D, "_call_impl", None),
        (RAY_CONTEXT, "_sync_checkpoint_dir_name_across_ranks", "ray.train.report"),
        (RAY_COLLECTIVES, "barrier", "ray.train.collective.barrier"),
        (RAY_COLLECTIVES, "broadcast_from_rank_zero", "ray.train.collective.broadcast_from_rank_zero"),
        (RAY_CONTEXT, "_wait_then_report", None),
        (MODULE, "all_reduce", None),
        (USER, "barrier", None),
    ],
)
def test_a_code_object_is_a_collective_by_its_directory_and_name(filename: str, name: str, collective: str) -> None:
    """torch.distributed's functions (not its wrappers) by name; only Ray Train's barriers, by their public name."""
    assert collective_name(_code_of(filename, name)) == collective


# --- the sampler's classifier ------------------------------------------------------------------------------


def test_the_classifier_sees_a_collective_anywhere_on_the_stack() -> None:
    classifier = _Classifier()
    assert _chain([(C10D, "all_reduce"), (USER, "a_hook")], lambda: classifier.in_collective(sys._getframe(1)))()
    assert _chain([(USER, "train_step")], lambda: classifier.in_collective(sys._getframe(1)))() is False
    assert classifier.in_collective(None) is False


def test_the_classifier_asks_once_per_code_object(monkeypatch: pytest.MonkeyPatch) -> None:
    """The sampler runs 20 times a second: a code object seen before is answered from the cache."""
    classifier = _Classifier()
    probe = _chain([(USER, "train_step"), (C10D, "all_reduce")], lambda: sys._getframe(1))
    frame = probe()
    assert classifier.in_collective(frame)
    asked: list[types.CodeType] = []
    monkeypatch.setattr(health, "collective_name", lambda code: asked.append(code))
    assert classifier.in_collective(frame)
    assert asked == []


def test_the_classifiers_cache_is_cleared_once_past_65536_code_objects() -> None:
    """Code made at run time (compiled graphs) must not grow the cache without bound."""
    classifier = _Classifier()
    classifier._seen.update(dict.fromkeys(range(65536), False))  # type: ignore[arg-type]
    assert classifier.in_collective(_chain([(C10D, "all_reduce")], lambda: sys._getframe(1))()) is True
    assert len(classifier._seen) == 65537  # at the bound: kept
    frame = _chain([(USER, "step")], lambda: sys._getframe(1))()
    assert classifier.in_collective(frame) is False
    assert 0 not in classifier._seen and frame.f_code in classifier._seen  # past it: cleared before the next one


# --- the stack text ----------------------------------------------------------------------------------------


def test_the_stack_text_is_the_training_threads_innermost_frames_innermost_last_then_the_other_threads() -> None:
    lib = os.sep.join([SITE, "lib.py"])
    other = _chain([(READER, "read_batch")], lambda: sys._getframe(1))()
    layers = [(lib, f"l{i}") for i in range(15)]
    text = _chain(layers, lambda: stack_text({9: other, 7: sys._getframe(1)}, 7))()
    own = [_at(lib, f"l{i}") for i in range(3, 15)]  # the innermost 12
    assert text == " | ".join([*own, f"thread 9: {_at(READER, 'read_batch')}"])
    cut = _chain(layers, lambda: stack_text({9: other, 7: sys._getframe(1)}, 7, limit=20))()
    assert cut == text[:20]
    assert stack_text({9: other}, 7) == f"thread 9: {_at(READER, 'read_batch')}"  # the training thread ended


# --- the config --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ([], "health must be a mapping."),
        ({"window": 1, "other": 2}, "health.other is not a known field."),
        ({"enabled": "yes"}, "health.enabled must be true or false, got 'yes'."),
        ({"enabled": 1}, "health.enabled must be true or false, got 1."),
        ({"hang_timeout_seconds": 0}, "health.hang_timeout_seconds must be a number above 0, got 0."),
        ({"hang_timeout_seconds": -1.5}, "health.hang_timeout_seconds must be a number above 0, got -1.5."),
        ({"hang_timeout_seconds": True}, "health.hang_timeout_seconds must be a number above 0, got True."),
        ({"hang_timeout_seconds": "30"}, "health.hang_timeout_seconds must be a number above 0, got '30'."),
        ({"window_steps": 0}, "health.window_steps must be an integer of 1 or more, got 0."),
        ({"window_steps": True}, "health.window_steps must be an integer of 1 or more, got True."),
        ({"window_steps": "3"}, "health.window_steps must be an integer of 1 or more, got '3'."),
        ({"window_steps": 2.0}, "health.window_steps must be an integer of 1 or more, got 2.0."),
    ],
)
def test_the_health_config_refuses_what_it_cannot_use_naming_the_field(given: Any, message: str) -> None:
    with pytest.raises(ValueError) as refused:
        HealthConfig.from_dict(given)
    assert str(refused.value) == message


def test_the_health_config_defaults_to_enabled_derived_timeout_and_20_step_windows() -> None:
    assert HealthConfig.from_dict({}) == HealthConfig.from_dict(None) == HealthConfig(True, None, 20)


def test_the_health_config_keeps_each_field_it_is_given() -> None:
    """The smallest values allowed are allowed: half a second, a window of one step."""
    config = HealthConfig.from_dict({"enabled": False, "hang_timeout_seconds": 0.5, "window_steps": 1})
    assert config == HealthConfig(enabled=False, hang_timeout_seconds=0.5, window_steps=1)
    whole = HealthConfig.from_dict({"hang_timeout_seconds": 30})
    assert whole.hang_timeout_seconds == 30.0 and isinstance(whole.hang_timeout_seconds, float)
    sent = HealthConfig(enabled=False, hang_timeout_seconds=45.0, window_steps=7)
    assert sent.to_dict() == {"enabled": False, "hang_timeout_seconds": 45.0, "window_steps": 7}
    assert HealthConfig.from_dict(sent.to_dict()) == sent


# --- the monitor's figures -----------------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _monitor(
    config: HealthConfig, rank: int = 0, flight: Callable[[], str] | None = None
) -> tuple[Monitor, Clock, list[Any]]:
    clock, sent = Clock(), []
    return Monitor(rank, config, clock=clock, send=sent.append, flight=flight), clock, sent


def _tick_in_a_collective(monitor: Monitor) -> None:
    _chain([(USER, "train_step"), (C10D, "all_reduce")], monitor._tick)()


def test_a_report_holds_the_windows_step_time_data_wait_and_share_of_samples_in_a_collective() -> None:
    monitor, clock, sent = _monitor(HealthConfig(window_steps=2), rank=4)
    monitor._tick()
    _tick_in_a_collective(monitor)  # before the first step: not counted
    monitor.step(1)
    _tick_in_a_collective(monitor)
    _tick_in_a_collective(monitor)
    monitor._tick()
    with monitor.data():
        clock.now += 1.0
    clock.now += 3.0
    monitor.step(2)
    with monitor.data():
        clock.now += 3.0
    clock.now += 3.0
    monitor.step(3)
    (report,) = sent
    assert report == RankHealth(
        rank=4,
        step=3,
        steps=2,
        step_seconds=5.0,
        data_seconds=2.0,
        collective_fraction=2 / 3,
        samples=3,
        hang_timeout_seconds=300.0,
        time=report.time,
    )
    for step in range(4, 7):
        clock.now += 5.0
        monitor.step(step)
    assert [r.step for r in sent] == [3, 5]
    assert (sent[1].samples, sent[1].collective_fraction, sent[1].data_seconds) == (0, 0.0, 0.0)  # a fresh window


def test_a_report_needs_both_a_full_window_and_the_interval_exactly() -> None:
    monitor, clock, sent = _monitor(HealthConfig(window_steps=3))
    monitor.step(1)
    for step in (2, 3):
        clock.now += 5.0
        monitor.step(step)
    assert sent == []  # 10 s passed, but 2 of 3 steps
    clock.now += 5.0
    monitor.step(4)
    assert [(r.step, r.steps) for r in sent] == [(4, 3)]

    monitor, clock, sent = _monitor(HealthConfig(window_steps=1))
    monitor.step(1)
    clock.now = 1009.5
    monitor.step(2)
    assert sent == []  # a full window, 9.5 s after the last report
    clock.now = 1010.0
    monitor.step(3)
    assert [(r.step, r.steps) for r in sent] == [(3, 2)]


def test_a_configured_timeout_is_used_as_is_and_a_long_section_raises_it_to_600_seconds() -> None:
    monitor, _, _ = _monitor(HealthConfig(hang_timeout_seconds=45.0))
    assert monitor.timeout() == 45.0
    monitor.begin_long()
    assert monitor.timeout() == 600.0
    monitor, _, _ = _monitor(HealthConfig(hang_timeout_seconds=900.0))
    monitor.begin_long()
    assert monitor.timeout() == 900.0


def test_a_derived_timeout_is_ten_times_the_median_step_and_never_under_300_seconds() -> None:
    monitor, clock, _ = _monitor(HealthConfig())
    assert monitor.timeout() == 300.0  # no step timed yet
    monitor.step(1)
    for step, seconds in enumerate((40.0, 20.0, 60.0), start=2):
        clock.now += seconds
        monitor.step(step)
    assert monitor.timeout() == 400.0
    monitor.begin_long()
    assert monitor.timeout() == 600.0


def test_the_derived_timeout_follows_the_last_33_to_64_steps() -> None:
    """Steps 1-32 of 10 s, then one of 60 s, 16 of 40 s, 16 of 60 s: the 64 kept, then the oldest 32 dropped."""
    monitor, clock, _ = _monitor(HealthConfig())
    monitor.step(0)
    seconds = [10.0] * 32 + [60.0] + [40.0] * 16 + [60.0] * 16
    for step, s in enumerate(seconds[:64], start=1):
        clock.now += s
        monitor.step(step)
    assert monitor.timeout() == 300.0  # 64 steps: median (10 + 40) / 2
    clock.now += seconds[64]
    monitor.step(65)
    assert monitor.timeout() == 600.0  # steps 33-65: median 60


def test_long_sections_nest_and_only_the_last_end_leaves_the_long_timeout() -> None:
    monitor, _, _ = _monitor(HealthConfig(hang_timeout_seconds=30.0))
    monitor.begin_long()
    monitor.begin_long()
    monitor.end_long()
    assert monitor.timeout() == 600.0  # still inside the outer one
    monitor.end_long()
    assert monitor.timeout() == 30.0
    monitor.end_long()  # one end too many is no debt
    monitor.begin_long()
    assert monitor.timeout() == 600.0
    monitor.end_long()
    assert monitor.timeout() == 30.0


# --- the watchdog ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("timeout", "again"), [(5.0, 35.0), (40.0, 80.0)], ids=["under-30-s", "over-30-s"])
def test_a_stall_is_reported_at_exactly_the_timeout_and_said_again_after_max_of_it_and_30_seconds(
    timeout: float, again: float
) -> None:
    """A 5 s timeout is no reason to say a stall every 5 s; a 40 s one says it again after another 40 s."""
    monitor, clock, sent = _monitor(HealthConfig(hang_timeout_seconds=timeout), rank=2)
    monitor.step(1)
    clock.now = 1000.0 + timeout - 0.5
    monitor._tick()
    assert sent == []
    clock.now = 1000.0 + timeout
    monitor._tick()
    assert [(type(e), e.rank, e.step, e.seconds) for e in sent] == [(Stall, 2, 1, timeout)]
    clock.now = 1000.0 + again - 0.5
    monitor._tick()
    assert len(sent) == 1  # reported already
    clock.now = 1000.0 + again
    monitor._tick()
    assert [e.seconds for e in sent] == [timeout, again]


def test_a_step_after_a_stall_arms_a_fresh_one() -> None:
    monitor, clock, sent = _monitor(HealthConfig(hang_timeout_seconds=5.0))
    monitor.step(1)
    clock.now = 1005.0
    monitor._tick()
    monitor.step(2)
    clock.now = 1010.0
    monitor._tick()  # 5 s after the step, though only 5 s after the last report
    assert [(e.step, e.seconds) for e in sent] == [(1, 5.0), (2, 5.0)]


def test_no_stall_before_the_first_step_even_after_a_long_section() -> None:
    """Start-up and compilation are not judged; ending a checkpoint before any step does not arm the watchdog."""
    monitor, clock, sent = _monitor(HealthConfig(hang_timeout_seconds=5.0))
    monitor.begin_long()
    monitor.end_long()
    clock.now += 10_000.0
    monitor._tick()
    assert sent == []


def test_ending_a_long_section_is_progress() -> None:
    monitor, clock, sent = _monitor(HealthConfig(hang_timeout_seconds=30.0))
    monitor.step(1)
    monitor.begin_long()
    clock.now = 1500.0
    monitor._tick()
    assert sent == []  # within the long section's 600 s
    monitor.end_long()
    clock.now = 1529.0
    monitor._tick()
    assert sent == []
    clock.now = 1530.0
    monitor._tick()
    assert [(e.step, e.seconds) for e in sent] == [(1, 30.0)]


def test_a_stall_in_a_collective_names_it_the_calling_code_and_every_thread() -> None:
    monitor, clock, sent = _monitor(HealthConfig(hang_timeout_seconds=30.0), rank=3)
    monitor.step(6)
    clock.now = 1031.0
    release = threading.Event()
    helper = threading.Thread(target=release.wait, args=(10,))
    helper.start()
    try:
        _tick_in_a_collective(monitor)
    finally:
        release.set()
        helper.join(10)
    (stall,) = sent
    assert (stall.rank, stall.step, stall.seconds) == (3, 6, 31.0)
    assert (stall.where, stall.at, stall.collective) == ("collective", _at(USER, "train_step"), "all_reduce")
    own = stall.stack.split(" | thread ")[0].split(" | ")
    called = own.index(_at(USER, "train_step"))
    assert own[called + 1] == _at(C10D, "all_reduce")
    assert own[-1].startswith("health.py:")  # innermost, the watchdog's own frame that sampled it
    assert f" | thread {helper.ident}: " in stall.stack
    assert stall.threads >= 2


def test_a_rank_that_stalls_before_its_first_step_says_step_0_and_where_it_is() -> None:
    monitor, _, _ = _monitor(HealthConfig())
    stall = _chain([(USER, "load_model")], functools.partial(monitor.stall, 12.0))()
    assert (stall.step, stall.seconds, stall.where, stall.at, stall.collective) == (
        0,
        12.0,
        "code",
        _at(USER, "load_model"),
        "",
    )


def _stall_in(monitor: Monitor, *layers: tuple[str, str]) -> Stall:
    return _chain(list(layers), functools.partial(monitor.stall, 31.0))()  # type: ignore[no-any-return]


def test_the_flight_recorder_names_a_torch_collective_it_recorded() -> None:
    asked: list[str] = []
    monitor, _, _ = _monitor(HealthConfig(), flight=lambda: asked.append("x") or "all_reduce #3 entered, #2 completed")
    stall = _stall_in(monitor, (USER, "train_step"), (C10D, "all_reduce"))
    assert (stall.where, stall.collective) == ("collective", "all_reduce #3 entered, #2 completed")
    assert asked == ["x"]


def test_a_flight_recorder_with_nothing_recorded_leaves_the_collectives_name() -> None:
    monitor, _, _ = _monitor(HealthConfig(), flight=lambda: "")
    assert _stall_in(monitor, (USER, "train_step"), (C10D, "all_reduce")).collective == "all_reduce"


def test_the_flight_recorder_is_not_asked_for_ray_trains_barriers_or_code() -> None:
    """It records torch's collectives only: a rank in ``ray.train.report`` or in its own code has none to name."""
    asked: list[str] = []
    monitor, _, _ = _monitor(HealthConfig(), flight=lambda: asked.append("x") or "all_reduce #3 entered")
    barrier = _stall_in(monitor, (USER, "train_fn"), (RAY_CONTEXT, "_sync_checkpoint_dir_name_across_ranks"))
    assert (barrier.where, barrier.collective) == ("collective", "ray.train.report")
    code = _stall_in(monitor, (USER, "read_batch"))
    assert (code.where, code.collective) == ("code", "")
    assert asked == []


def test_without_a_flight_recorder_no_reader_thread_is_started(monkeypatch: pytest.MonkeyPatch) -> None:
    monitor, _, _ = _monitor(HealthConfig())
    monkeypatch.setattr(health, "_within", lambda *_: pytest.fail("read a flight recorder that is not there"))
    assert _stall_in(monitor, (USER, "train_step"), (C10D, "all_reduce")).collective == "all_reduce"


def test_a_flight_recorder_that_does_not_answer_in_time_is_left_behind(monkeypatch: pytest.MonkeyPatch) -> None:
    never = threading.Event()

    def hangs() -> str:
        never.wait(3)
        return "late"

    monkeypatch.setattr(health, "FLIGHT_SECONDS", 0.05)
    monitor, _, _ = _monitor(HealthConfig(), flight=hangs)
    try:
        assert _stall_in(monitor, (USER, "train_step"), (C10D, "all_reduce")).collective == "all_reduce"
    finally:
        never.set()


def test_a_stall_says_so_on_stderr_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    """(capsys's stderr has no file descriptor: the thread dump fails there, and the stall is reported anyway.)"""
    monitor, _, _ = _monitor(HealthConfig(), rank=2)
    stall = _stall_in(monitor, (USER, "read_batch"))
    assert stall.where == "code"
    out, err = capsys.readouterr()
    assert err == "fsdp_train: rank 2 made no progress for 31s; its threads:\n" and out == ""


def test_a_stall_dumps_every_threads_stack_to_stderr(capfd: pytest.CaptureFixture[str]) -> None:
    monitor, _, _ = _monitor(HealthConfig(), rank=2)
    _stall_in(monitor, (USER, "read_batch"))
    _, err = capfd.readouterr()
    assert "Current thread 0x" in err and "Stack (most recent call first)" not in err


# --- the watchdog thread -----------------------------------------------------------------------------------


def test_a_started_monitor_watches_on_a_daemon_thread_of_its_own_until_stopped() -> None:
    monitor = Monitor(0, HealthConfig(), send=lambda _: None)
    assert monitor.start() is monitor
    thread = monitor._thread
    try:
        assert thread is not None and thread.is_alive()
        assert (thread.name, thread.daemon) == ("fsdp-health", True)
        assert monitor in health._ACTIVE
        monitor.start()
        assert monitor._thread is thread  # started once
    finally:
        monitor.stop()
    assert not thread.is_alive() and monitor._thread is None and monitor not in health._ACTIVE


def test_a_disabled_monitor_starts_nothing_and_times_nothing() -> None:
    monitor, clock, sent = _monitor(HealthConfig(enabled=False, window_steps=1))
    monitor.start()
    assert monitor._thread is None and monitor not in health._ACTIVE
    for step in range(1, 5):
        with monitor.data():
            clock.now += 20.0
        monitor.step(step)
    assert sent == [] and monitor._last_progress is None
    monitor.stop()  # stopping what never started is fine


def test_stop_monitors_stops_every_running_monitor() -> None:
    monitors = [Monitor(rank, HealthConfig(), send=lambda _: None).start() for rank in range(2)]
    threads = [m._thread for m in monitors]
    stop_monitors()
    assert all(t is not None and not t.is_alive() for t in threads)
    assert not any(m in health._ACTIVE for m in monitors)


def test_the_watchdog_thread_reports_a_stall_by_itself() -> None:
    clock, sent = Clock(), queue.Queue[Any]()
    monitor = Monitor(1, HealthConfig(hang_timeout_seconds=30.0), clock=clock, send=sent.put)
    monitor.step(1)
    clock.now = 1031.0
    monitor.start()
    try:
        stall = sent.get(timeout=10)
    finally:
        monitor.stop()
    assert isinstance(stall, Stall) and (stall.rank, stall.step, stall.seconds) == (1, 1, 31.0)


class _Stream:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def write(self, text: str) -> int:
        self.calls.append(("write", text))
        return len(text)

    def flush(self) -> None:
        self.calls.append(("flush", ""))


def test_a_watchdog_that_fails_says_why_once_on_stderr_and_stops(monkeypatch: pytest.MonkeyPatch) -> None:
    """It must never take the rank down."""

    def broken(frame: Any) -> bool:
        raise RuntimeError("no frames")

    stderr = _Stream()
    monkeypatch.setattr(sys, "stderr", stderr)
    monitor = Monitor(0, HealthConfig(), send=lambda _: None)
    monitor._classifier = types.SimpleNamespace(in_collective=broken)  # type: ignore[assignment]
    monitor.start()
    thread = monitor._thread
    assert thread is not None
    thread.join(10)
    assert not thread.is_alive()
    written = "".join(text for call, text in stderr.calls if call == "write")
    assert written == "fsdp_train: health watchdog stopped: RuntimeError: no frames\n"
    assert stderr.calls[-1] == ("flush", "")  # flushed: the process may be killed next
    monitor.stop()


# --- reading the flight recorder ---------------------------------------------------------------------------


def test_a_flight_recorder_is_read_on_a_daemon_thread_of_its_own() -> None:
    """A recorder that never returns must not keep the rank's process alive."""
    seen: list[tuple[str, bool]] = []

    def read() -> str:
        here = threading.current_thread()
        seen.append((here.name, here.daemon))
        return "all_reduce #3 entered"

    assert _within(5.0, read) == "all_reduce #3 entered"
    assert seen == [("fsdp-health-flight", True)]


def test_a_flight_recorder_that_raises_gives_nothing_and_no_stray_error(monkeypatch: pytest.MonkeyPatch) -> None:
    errors: list[Any] = []
    monkeypatch.setattr(threading, "excepthook", errors.append)

    def raises() -> str:
        raise RuntimeError("no recorder")

    assert _within(5.0, raises) == ""
    assert errors == []


def test_a_flight_recorder_past_its_time_gives_nothing() -> None:
    never = threading.Event()

    def hangs() -> str:
        never.wait(10)
        return "late"

    try:
        assert _within(0.05, hangs) == ""
    finally:
        never.set()


@pytest.mark.parametrize("recording", [True, False])
def test_the_flight_recorder_is_read_only_where_it_records(monkeypatch: pytest.MonkeyPatch, recording: bool) -> None:
    monkeypatch.setattr(flight, "recording", lambda: recording)
    assert flight_for() is (flight.summary if recording else None)
