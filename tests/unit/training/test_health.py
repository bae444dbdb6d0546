"""The rank side of spec.health: where a stalled rank is (real gloo processes), the timing reports, the flight
recorder's dumps (real files recorded by torch's gloo group, tests/fixtures/flight/)."""

from __future__ import annotations

import os
import pickle
import socket
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from fsdp_train.contract.events import parse_line
from fsdp_train.contract.health_events import RankHealth, Stall
from fsdp_train.watch import flight
from fsdp_train.watch.health import DERIVED_TIMEOUT_FLOOR, HealthConfig, Monitor
from hypothesis import given, settings
from hypothesis import strategies as st
from support.rank_processes import rank_context

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "flight"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def a_user_reader_that_blocks(seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(0.05)


def _rank(rank: int, port: int, out: Any) -> None:
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), TORCH_FR_BUFFER_SIZE="64")
    dist.init_process_group("gloo", rank=rank, world_size=2)
    from fsdp_train.watch.health import flight_for

    monitor = Monitor(rank, HealthConfig(hang_timeout_seconds=3.0), send=lambda e: out.put(e.to_line()))
    monitor._flight = flight_for()
    monitor.start()
    t = torch.ones(8)
    for step in range(1, 4):
        dist.all_reduce(t)
        monitor.step(step)
    if rank == 1:
        a_user_reader_that_blocks(8.0)
    dist.all_reduce(t)
    monitor.stop()
    dist.barrier()
    dist.destroy_process_group()


def test_a_rank_blocked_in_code_and_its_peer_waiting_in_all_reduce_each_say_where() -> None:
    ctx = rank_context()
    out = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_rank, args=(r, port, out)) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
    stalls: dict[int, Stall] = {}
    while not out.empty():
        event = parse_line(out.get())  # through the wire, as the operator reads it
        if isinstance(event, Stall):
            stalls.setdefault(event.rank, event)
    assert sorted(stalls) == [0, 1], stalls
    stuck, waiting = stalls[1], stalls[0]
    assert (stuck.where, stuck.step) == ("code", 3)
    assert stuck.at.startswith("test_health.py:") and stuck.at.endswith("in a_user_reader_that_blocks"), stuck.at
    assert 3.0 <= stuck.seconds < 6.0
    assert waiting.where == "collective" and waiting.at.startswith("test_health.py:") and "in _rank" in waiting.at
    # gloo's flight recorder: the 4th all-reduce entered, the 3rd the last completed.
    assert waiting.collective == "all_reduce #4 ([8] Float) entered, #3 completed (group 0 default_pg)"
    assert "distributed_c10d.py" in waiting.stack and "in all_reduce" in waiting.stack
    assert stuck.threads >= 2


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def quiet_for(seconds: float, clock: Clock, monitor: Monitor) -> None:
    """`seconds` pass without a step, then the watchdog looks."""
    clock.now += seconds
    monitor._tick()


def test_timings_are_reported_per_window_and_not_more_often_than_the_interval() -> None:
    clock, sent = Clock(), []
    monitor = Monitor(0, HealthConfig(window_steps=5), clock=clock, send=sent.append)
    monitor.step(1)  # the first step arms the monitor; its time (compilation) is no step's
    for step in range(2, 40):
        with monitor.data():
            clock.now += 0.1
        clock.now += 0.4
        monitor.step(step)
    reports = [e for e in sent if isinstance(e, RankHealth)]
    # 0.5 s steps: a report every 10 s (20 steps), though a window is 5 steps.
    assert [r.step for r in reports] == [21]
    assert reports[0].steps == 20 and reports[0].step_seconds == pytest.approx(0.5)
    assert reports[0].data_seconds == pytest.approx(0.1)
    assert reports[0].hang_timeout_seconds == DERIVED_TIMEOUT_FLOOR


def test_the_watchdog_reports_a_stall_once_per_timeout_and_never_before_the_first_step() -> None:
    clock, sent = Clock(), []
    monitor = Monitor(3, HealthConfig(hang_timeout_seconds=30.0), clock=clock, send=sent.append)
    quiet_for(1000, clock, monitor)
    assert sent == []  # not armed: start-up and compilation are not judged
    monitor.step(1)
    quiet_for(29.9, clock, monitor)
    assert sent == []
    quiet_for(0.2, clock, monitor)
    monitor._tick()
    assert [type(e) for e in sent] == [Stall] and sent[0].step == 1 and sent[0].rank == 3
    quiet_for(30.0, clock, monitor)
    assert len(sent) == 2  # said again after another timeout (a lost line is not the end of it)
    monitor.begin_long()
    assert monitor.timeout() == 600.0
    monitor.end_long()


def test_health_config_refuses_what_it_cannot_use() -> None:
    assert HealthConfig.from_dict(None) == HealthConfig()
    assert HealthConfig.from_dict(HealthConfig(hang_timeout_seconds=30.0).to_dict()).hang_timeout_seconds == 30.0
    for bad in ({"hang_timeout_seconds": -1}, {"window_steps": 0}, {"enabled": "yes"}, {"other": 1}, []):
        with pytest.raises(ValueError, match="health"):
            HealthConfig.from_dict(bad)


# --- the flight recorder ----------------------------------------------------------------------------------


def test_the_recorded_dumps_say_which_collective_each_rank_entered_and_completed() -> None:
    waiting = flight.summarize(flight.load((FIXTURES / "gloo-rank0-waiting-in-all_reduce.pkl").read_bytes()))
    late = flight.summarize(flight.load((FIXTURES / "gloo-rank1-late.pkl").read_bytes()))
    assert [g.text() for g in waiting] == ["all_reduce #5 ([1000] Float) entered, #4 completed (group 0 default_pg)"]
    assert [g.text() for g in late] == ["all_gather #4 ([1000] Float) entered, #4 completed (group 0 default_pg)"]
    # Rank 0 waits in #5, which rank 1 has not entered: rank 1 is the one to look at.
    assert flight.stuck(waiting) == waiting[0] and waiting[0].entered and waiting[0].entered.seq == 5
    assert flight.main([str(FIXTURES / "gloo-rank1-late.pkl")]) == 0
    # NCCL on an H200: every collective finished, then an all-reduce dumped before it ran.
    done = flight.summarize(flight.load((FIXTURES / "nccl-h200-completed.pkl").read_bytes()))
    in_flight = flight.summarize(flight.load((FIXTURES / "nccl-h200-in-flight.pkl").read_bytes()))
    assert [g.text() for g in done] == ["broadcast #10 ([1048576] Float) entered, #10 completed (group 0 default_pg)"]
    assert [g.text() for g in in_flight] == [
        "all_reduce #11 ([1048576] Float) entered, #10 completed (group 0 default_pg)"
    ]


def test_a_dump_naming_any_global_is_refused_and_nothing_of_it_runs(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    evil = b"cos\nsystem\n(S'touch " + str(marker).encode() + b"'\ntR."
    with pytest.raises(flight.NotADump, match=r"os\.system"):
        flight.load(evil)
    assert not marker.exists()
    with pytest.raises(flight.NotADump):
        flight.load(pickle.dumps({"entries": [], "when": datetime.now(UTC)}))  # any class, even a harmless one
    with pytest.raises(flight.NotADump):
        flight.load((FIXTURES / "gloo-rank1-late.pkl").read_bytes()[:100])  # cut short
    assert flight.main([str(tmp_path / "absent.pkl")]) == 1


@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=512))
def test_any_bytes_are_a_dump_or_refused_never_an_error(data: bytes) -> None:
    try:
        dump = flight.load(data)
    except flight.NotADump:
        return
    flight.summarize(dump)


_plain = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=20), inner, max_size=4),
    max_leaves=30,
)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.fixed_dictionaries(
            {},
            optional={
                "profiling_name": _plain | st.sampled_from(["nccl:all_reduce", "gloo:broadcast"]),
                "collective_seq_id": _plain | st.integers(0, 100),
                "input_sizes": _plain,
                "input_dtypes": _plain,
                "state": _plain | st.sampled_from(["scheduled", "started", "completed"]),
                "retired": _plain,
                "process_group": _plain | st.tuples(st.text(max_size=5), st.text(max_size=5)),
                "is_p2p": _plain,
            },
        )
        | _plain,
        max_size=8,
    )
)
def test_any_entries_summarize_without_error(entries: list[Any]) -> None:
    dump = flight.load(pickle.dumps({"version": "2.10", "entries": entries}, protocol=2))
    for group in flight.summarize(dump):
        assert group.text()


def test_a_user_function_progresses_by_its_ray_train_report_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    import ray.train
    from fsdp_train.run.user_function import reported_step
    from fsdp_train.watch.health import watching_reports

    seen: list[dict[str, Any]] = []
    monkeypatch.setattr(ray.train, "report", lambda metrics, **_: seen.append(metrics))
    original = ray.train.report
    with watching_reports(5, HealthConfig(hang_timeout_seconds=60.0)) as monitor:
        from ray.train import report  # as a user's module imports it, inside the function

        assert monitor._last_progress is None  # not armed before the first report
        report({"loss": 1.0})
        ray.train.report({"loss": 0.5})
        assert monitor._step == 2 and monitor._last_progress is not None
        assert monitor._thread is not None and monitor._thread.is_alive()
    assert seen == [{"loss": 1.0}, {"loss": 0.5}]
    assert ray.train.report is original and monitor._thread is None
    # A group resumed from step 6: its reports name steps 7, 8; a stall after them is "after step 8", not 2.
    with watching_reports(5, HealthConfig(hang_timeout_seconds=60.0), reported_step) as monitor:
        ray.train.report({"step": 7, "loss": 1.0})
        ray.train.report(metrics={"step": 8.0})
        assert monitor._step == 8
        ray.train.report({"loss": 0.5})  # no step: the count of reports
        assert monitor._step == 3
    assert ray.train.report is original and monitor._thread is None


def test_ray_trains_own_barriers_are_collectives_named_as_users_know_them() -> None:
    """Ray Train's barriers (in every `ray.train.report`, and `ray.train.collective`'s) by their real code objects:
    a rank waiting there waits for its peers. Its other code (the upload, the wait for the controller) does not."""
    import inspect

    import torch.distributed as dist
    from fsdp_train.watch.health import collective_name
    from ray.train.collective import collectives
    from ray.train.v2._internal.execution.context import TrainContext

    assert collective_name(TrainContext._sync_checkpoint_dir_name_across_ranks.__code__) == "ray.train.report"
    assert collective_name(inspect.unwrap(collectives.barrier).__code__) == "ray.train.collective.barrier"
    broadcast = inspect.unwrap(collectives.broadcast_from_rank_zero).__code__
    assert collective_name(broadcast) == "ray.train.collective.broadcast_from_rank_zero"
    assert collective_name(inspect.unwrap(dist.all_reduce).__code__) == "all_reduce"
    assert collective_name(dist.all_reduce.__code__) is None  # torch's logging wrapper: the name is the inner call's
    assert collective_name(TrainContext._wait_then_report.__code__) is None
    assert collective_name(inspect.unwrap(TrainContext._upload_checkpoint).__code__) is None
    assert collective_name(a_user_reader_that_blocks.__code__) is None


def _sync_checkpoint_dir_name_across_ranks(release: Any) -> None:
    release.wait(60)


def a_user_step(wait: Any, release: Any) -> None:
    wait(release)


def test_a_rank_waiting_in_ray_train_reports_barrier_is_sampled_and_located_in_a_collective() -> None:
    """The report barrier's frame (a stand-in with Ray's file and name: a real one needs a Ray Train run, which
    tests/e2e/test_byo_function.py has) counts as waiting for peers, and a stall there names `ray.train.report`, not
    the flight recorder's last torch collective."""
    import sys
    import threading
    import types

    from fsdp_train.watch import health
    from fsdp_train.watch.health import _Classifier, locate
    from ray.train.v2._internal.execution import context

    code = _sync_checkpoint_dir_name_across_ranks.__code__.replace(co_filename=context.__file__)
    in_rays_file = types.FunctionType(code, globals())
    release, entered = threading.Event(), threading.Event()
    thread = threading.Thread(target=lambda: (entered.set(), a_user_step(in_rays_file, release)))
    thread.start()
    try:
        entered.wait(30)
        frame = None
        while frame is None or not any(f.f_code is code for f in health._stack(frame)):  # inside the stand-in
            assert thread.ident is not None and thread.is_alive()
            frame = sys._current_frames().get(thread.ident)
        here = locate(frame)
        assert (here.where, here.collective) == ("collective", "ray.train.report")
        assert here.at.startswith("test_health.py:") and here.at.endswith("in a_user_step"), here.at
        assert _Classifier().in_collective(frame)
        monitor = Monitor(2, HealthConfig(hang_timeout_seconds=30.0), flight=lambda: "all_reduce #3 entered")
        monitor._training = thread.ident
        stall = monitor.stall(31.0)
        assert (stall.where, stall.collective) == ("collective", "ray.train.report")
    finally:
        release.set()
        thread.join(30)


def test_a_flight_recorder_that_hangs_or_raises_never_keeps_the_stall_from_being_reported() -> None:
    import threading

    from fsdp_train.watch import health

    never = threading.Event()

    def hangs() -> str:
        never.wait(30)
        return "late"

    def raises() -> str:
        raise RuntimeError("no recorder")

    started = time.monotonic()
    assert health._within(0.2, hangs) == "" and time.monotonic() - started < 5
    assert health._within(1.0, raises) == ""
    assert health._within(5.0, lambda: "all_reduce #3 entered") == "all_reduce #3 entered"
    never.set()


@pytest.mark.parametrize("dump", sorted(p.name for p in FIXTURES.glob("*.pkl")))
def test_every_recorded_dump_parses_into_numbered_collectives(dump: str) -> None:
    """Each fixture, NCCL's (recorded on an H200) and gloo's: groups with a named, numbered last collective."""
    groups = flight.summarize(flight.load((FIXTURES / dump).read_bytes()))
    assert groups, dump
    for group in groups:
        assert group.entered is not None and group.entered.seq >= 1 and group.entered.name.isidentifier(), group
        assert group.completed is None or group.completed.seq <= group.entered.seq


def test_a_step_after_a_stall_resets_the_rank_s_clock_and_the_next_stall_is_timed_from_it() -> None:
    """A rank that stalled once and then progressed is not stalled: the step resets its clock (without that, it was
    reported stalled again at every tick for ever)."""
    clock, sent = Clock(), []
    monitor = Monitor(1, HealthConfig(hang_timeout_seconds=30.0), clock=clock, send=sent.append)
    monitor.step(1)
    quiet_for(31.0, clock, monitor)
    assert [type(e) for e in sent] == [Stall]
    monitor.step(2)  # it progressed
    quiet_for(29.0, clock, monitor)
    assert [type(e) for e in sent] == [Stall], "a rank that progressed was reported stalled again"
    quiet_for(2.0, clock, monitor)
    assert [type(e) for e in sent] == [Stall, Stall] and sent[-1].step == 2


def test_the_specs_hang_timeout_reaches_every_ranks_watchdog() -> None:
    """spec.health.hangTimeoutSeconds, through the entrypoint, is each rank's watchdog timeout (left out, every job
    silently used the derived one)."""
    from fsdp_operator.api import render
    from fsdp_operator.api.spec import parse_job

    job = parse_job({"apiVersion": "fsdp.dev/v1alpha1", "kind": "FSDPTrainingJob",
                     "metadata": {"name": "q", "namespace": "ml", "uid": "u-1", "generation": 1},
                     "spec": {"workers": {"replicas": 2}, "health": {"hangTimeoutSeconds": 123}}})  # fmt: skip
    config = HealthConfig.from_dict(render.submission(job, "q-1", "/pkg").config["health"])
    assert config.hang_timeout_seconds == 123.0
    clock, sent = Clock(), []
    monitor = Monitor(0, config, clock=clock, send=sent.append)
    monitor.step(1)
    quiet_for(122.0, clock, monitor)
    assert sent == []
    quiet_for(2.0, clock, monitor)
    assert [type(e) for e in sent] == [Stall]


def test_a_report_comes_once_the_window_is_full_not_a_step_later() -> None:
    """5-step windows of 3 s steps (past the 10 s interval): the report comes with the 5th timed step."""
    clock, sent = Clock(), []
    monitor = Monitor(0, HealthConfig(window_steps=5), clock=clock, send=sent.append)
    monitor.step(1)  # arms
    for step in range(2, 6):
        clock.now += 3.0
        monitor.step(step)
    assert [e for e in sent if isinstance(e, RankHealth)] == []  # 4 timed steps: not yet
    clock.now += 3.0
    monitor.step(6)
    (report,) = [e for e in sent if isinstance(e, RankHealth)]
    assert (report.step, report.steps, report.step_seconds) == (6, 5, 3.0)
