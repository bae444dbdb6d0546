"""spec.health's decisions, pass by pass: the ranks' RankHealth and Stall events through the real wire and one
reconcile pass of a Running job each (decide/health.py, decide/reconcile.py)."""

from __future__ import annotations

import json
import math
from datetime import datetime, timedelta
from typing import Any

import pytest
from fsdp_operator.api import schema
from fsdp_operator.decide import health
from fsdp_operator.decide.observed import RAY_RUNNING, ClusterView, Decision, Observed, PostEvent, RayJobInfo, StopJob
from fsdp_operator.decide.reconcile import reconcile
from fsdp_operator.decide.status import JobStatus, Phase, Reason, get_condition
from fsdp_train.contract.events import Event, parse_lines
from fsdp_train.contract.health_events import RankHealth, Stall
from hypothesis import given, settings
from hypothesis import strategies as st
from support.running_job import NOW, first_attempt_running, placement

SID1 = "qwen-f92e6afb-1"
WORLD = 4


def manifest(**health_spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": schema.API_VERSION,
        "kind": schema.KIND,
        "metadata": {"name": "qwen", "namespace": "ml", "uid": "0b8a2b5e-1111-2222-3333-444455556666", "generation": 1},
        "spec": {
            "workers": {"replicas": 2, "gpusPerWorker": 2},
            "training": {"steps": 100},
            "health": health_spec,
            "runPolicy": {"backoffLimit": 1},
        },
    }


def running(**fields: Any) -> JobStatus:
    return first_attempt_running("qwen-ray", SID1, NOW - timedelta(minutes=5), **fields)


def placements() -> list[Event]:
    return [
        placement(r, WORLD, 2, pod="qwen-worker-{node}", device="NVIDIA H200", device_uuid=f"GPU-{r}")
        for r in range(WORLD)
    ]


def one_pass(status: JobStatus, events: list[Event], *, now: datetime = NOW, **health_spec: Any) -> Decision:
    lines = [f"(RayTrainWorker pid={4000 + e.rank}, ip=10.0.0.1) {e.to_line()}" for e in events]
    observed = Observed(
        now=now,
        cluster=ClusterView(
            name="qwen-ray",
            state="ready",
            ready_workers=2,
            desired_workers=2,
            owner_uid="0b8a2b5e-1111-2222-3333-444455556666",
        ),
        ray_job=RayJobInfo(SID1, RAY_RUNNING),
        events=tuple(parse_lines(lines)),
        log_offset=status.log_offset + sum(len(line) + 1 for line in lines),
    )
    return reconcile(manifest(**health_spec), status, observed, training_package="/opt/fsdp_train")


def stall(rank: int, where: str, at: str, collective: str = "") -> Stall:
    return Stall(rank=rank, step=11, seconds=31.2, where=where, at=at, collective=collective, stack=f"{at} | x")  # type: ignore[arg-type]


def the_hang() -> list[Event]:
    """Rank 1 blocked in its data reader; ranks 0, 2, 3 wait in FSDP's all-gather."""
    waiting = "all_gather_into_tensor #40 entered, #39 completed (group 0 default_pg)"
    return [
        *placements(),
        stall(1, "code", "reader.py:12 in next_batch"),
        *(stall(r, "collective", "loop.py:90 in step", waiting) for r in (0, 2, 3)),
    ]


def cond(status: JobStatus, type_: str) -> dict[str, Any]:
    found = get_condition(status.conditions, type_)
    assert found is not None, status.conditions
    return dict(found)


def test_every_rank_stalled_restarts_at_once_naming_the_rank_in_code_and_the_others_collective() -> None:
    d = one_pass(running(), the_hang(), hangTimeoutSeconds=30, onHang="Restart")
    assert d.status.phase == Phase.PROVISIONING and d.status.reason == Reason.RETRYING
    assert d.status.attempts == 2 and d.status.failed_attempts == 1
    assert d.actions[0] == StopJob(SID1)  # the hung ranks of attempt 1 are stopped
    last = d.status.health["lastStall"]
    assert last["attempt"] == 1
    assert last["suspects"] == [
        {"rank": 1, "reason": "RankStalled", "node": "10.0.0.1", "pod": "qwen-worker-0",
         "gpu": "NVIDIA H200 (local rank 1) GPU-1"}
    ]  # fmt: skip
    message = last["message"]
    assert message.startswith("rank 1 (node 10.0.0.1, pod qwen-worker-0, gpu NVIDIA H200 (local rank 1) GPU-1) made")
    assert "in code at reader.py:12 in next_batch" in message
    assert "ranks 0, 2, 3 wait in all_gather_into_tensor #40 entered, #39 completed" in message
    assert "RankStalled" in d.status.message and "retry 1/1" in d.status.message
    # The new attempt starts clean: only the evidence stays.
    assert get_condition(d.status.conditions, "Progressing") is None
    assert health.fold(d.status.health, [], attempt=2, world_size=WORLD) == {
        "attempt": 2,
        "lastStall": last,
        "ranks": [],
    }


def test_on_hang_fail_ends_failed_with_the_evidence() -> None:
    d = one_pass(running(), the_hang(), hangTimeoutSeconds=30, onHang="Fail")
    assert d.status.phase == Phase.FAILED and d.status.reason == Reason.RANK_STALLED
    assert StopJob(SID1) in d.actions
    assert d.status.message.startswith("rank 1 (")
    assert (cond(d.status, "Progressing")["status"], cond(d.status, "Progressing")["reason"]) == (
        "False",
        "RankStalled",
    )
    assert (cond(d.status, "Failed")["status"], cond(d.status, "Failed")["reason"]) == ("True", "RankStalled")
    assert d.status.health["lastStall"]["ranks"][1]["where"] == "code"
    assert ("Warning", "RankStalled") in [(e.type, e.reason) for e in d.actions if isinstance(e, PostEvent)]


def test_one_stall_report_names_the_rank_then_waits_for_the_others_or_the_grace() -> None:
    first = one_pass(running(), [*placements(), stall(1, "code", "reader.py:12 in next_batch")], onHang="Fail")
    assert first.status.phase == Phase.RUNNING
    progressing = cond(first.status, "Progressing")
    assert (progressing["status"], progressing["reason"]) == ("False", "RankStalled")
    assert "rank 1 (" in progressing["message"] and "reader.py:12" in progressing["message"]
    assert ("Warning", "RankStalled") in [(e.type, e.reason) for e in first.actions if isinstance(e, PostEvent)]
    assert not any(isinstance(a, StopJob) for a in first.actions)
    within = one_pass(first.status, [], now=NOW + timedelta(seconds=health.STALL_GRACE_SECONDS - 1), onHang="Fail")
    assert within.status.phase == Phase.RUNNING
    after = one_pass(within.status, [], now=NOW + timedelta(seconds=health.STALL_GRACE_SECONDS), onHang="Fail")
    assert after.status.phase == Phase.FAILED and after.status.reason == Reason.RANK_STALLED


def test_a_rank_that_reports_nothing_while_the_others_wait_is_the_suspect() -> None:
    waiting = [stall(r, "collective", "loop.py:90 in step", "all_reduce") for r in (0, 1, 3)]
    d = one_pass(running(), [*placements(), *waiting], now=NOW, onHang="Fail")
    assert [s["rank"] for s in d.status.health["suspects"]] == [2]
    assert "rank 2 (node 10.0.0.2" in cond(d.status, "Progressing")["message"]


def test_a_stalled_rank_that_progresses_again_is_no_longer_stalled() -> None:
    first = one_pass(running(), [*placements(), stall(1, "code", "reader.py:12 in next_batch")], onHang="Fail")
    later = RankHealth(rank=1, step=12, steps=20, step_seconds=0.5, collective_fraction=0.1, samples=100)
    d = one_pass(first.status, [later], onHang="Fail")
    assert cond(d.status, "Progressing")["status"] == "True"
    assert "suspects" not in d.status.health and d.status.phase == Phase.RUNNING


def reports(own: list[float], step: int = 40) -> list[Event]:
    """One RankHealth per rank whose own work per step is `own[rank]` (1 s steps)."""
    return [
        RankHealth(rank=r, step=step, steps=20, step_seconds=1.0, collective_fraction=1.0 - o, samples=400)
        for r, o in enumerate(own)
    ]


def test_a_slow_rank_is_named_a_straggler_once_with_a_warning() -> None:
    d = one_pass(running(), [*placements(), *reports([0.3, 0.31, 0.62, 0.29])])
    straggler = cond(d.status, "Straggler")
    assert (straggler["status"], straggler["reason"]) == ("True", "SlowRank")
    assert straggler["message"].startswith("rank 2 (node 10.0.0.2, pod qwen-worker-1, gpu NVIDIA H200 (local rank 0)")
    assert "2.07x the other ranks' median 0.300s (stragglerRatio 1.5)" in straggler["message"]
    assert [(e.type, e.reason) for e in d.actions if isinstance(e, PostEvent)] == [("Warning", "SlowRank")]
    assert [(s["rank"], s["ratio"]) for s in d.status.health["suspects"]] == [(2, 2.07)]
    again = one_pass(d.status, reports([0.3, 0.31, 0.63, 0.29], step=60))
    assert not [e for e in again.actions if isinstance(e, PostEvent)]  # still slow: said once
    recovered = one_pass(again.status, reports([0.3, 0.31, 0.33, 0.29], step=80))
    assert (cond(recovered.status, "Straggler")["status"], cond(recovered.status, "Straggler")["reason"]) == (
        "False",
        "NoStraggler",
    )


def test_the_ratio_is_configurable_and_tiny_steps_are_never_stragglers() -> None:
    d = one_pass(running(), [*placements(), *reports([0.3, 0.3, 0.5, 0.3])], stragglerRatio=2.0)
    assert cond(d.status, "Straggler")["status"] == "False"
    # 3x the others, but 0.04 s more: noise at this step time.
    tiny = one_pass(running(), [*placements(), *reports([0.02, 0.02, 0.06, 0.02])])
    assert cond(tiny.status, "Straggler")["status"] == "False"


@pytest.mark.parametrize("others", [0.0, 0.01])
def test_a_slow_rank_is_named_where_the_others_waited_their_whole_step(others: float) -> None:
    """Every other rank's samples all inside the collective (own work 0, or under what 50 ms samples resolve): the
    ratio is over the sampling resolution, never a division by 0 that names nobody."""
    d = one_pass(running(), [*placements(), *reports([others, others, 1.0, others])])
    straggler = cond(d.status, "Straggler")
    assert (straggler["status"], straggler["reason"]) == ("True", "SlowRank"), straggler
    median = f"20.00x the other ranks' median {others:.3f}s (counted as 0.05s, what the samples resolve)"
    assert median in straggler["message"], straggler["message"]
    assert [(s["rank"], s["ratio"]) for s in d.status.health["suspects"]] == [(2, 20.0)]
    # Under the resolution a rank is named by the excess only: 0.04 s more than nothing is not a straggler.
    close = one_pass(running(), [*placements(), *reports([0.0, 0.0, 0.04, 0.0])])
    assert cond(close.status, "Straggler")["status"] == "False"


_floats = st.floats(allow_nan=True, allow_infinity=True, width=64)


@st.composite
def health_events(draw: st.DrawFn) -> list[Event]:
    out: list[Event] = []
    for _ in range(draw(st.integers(0, 12))):
        rank = draw(st.integers(0, WORLD + 2))
        step = draw(st.integers(0, 10**6))
        if draw(st.booleans()):
            out.append(
                RankHealth(
                    rank=rank,
                    step=step,
                    steps=draw(st.integers(0, 10**4)),
                    step_seconds=draw(_floats),
                    data_seconds=draw(_floats),
                    collective_fraction=draw(_floats),
                    samples=draw(st.integers(0, 10**6)),
                    hang_timeout_seconds=draw(_floats),
                )
            )
        else:
            out.append(
                Stall(
                    rank=rank,
                    step=step,
                    seconds=draw(_floats),
                    where=draw(st.sampled_from(["collective", "code", "unknown"])),
                    at=draw(st.text(max_size=40)),
                    collective=draw(st.text(max_size=40)),
                    stack=draw(st.text(max_size=80)),
                )
            )
    return out


@settings(max_examples=150, deadline=None)
@given(batches=st.lists(health_events(), min_size=1, max_size=3), on_hang=st.sampled_from(["Restart", "Fail"]))
def test_any_health_reports_fold_into_a_writable_status_and_a_decision(
    batches: list[list[Event]], on_hang: str
) -> None:
    status = running()
    for i, batch in enumerate(batches):
        d = one_pass(status, [*placements(), *batch], now=NOW + timedelta(seconds=30 * i), onHang=on_hang)
        written = d.status.to_dict()
        json.dumps(written, allow_nan=False)  # the API server takes no NaN
        for entry in written.get("health", {}).get("ranks", []):
            assert 0 <= entry["rank"] < WORLD
        if d.status.phase != Phase.RUNNING:
            assert d.status.reason in (Reason.RETRYING, Reason.RANK_STALLED)
            assert written["health"]["lastStall"]["message"]
            break
        status = d.status


@settings(max_examples=200, deadline=None)
@given(
    own=st.lists(st.floats(0.1, 10.0), min_size=2, max_size=WORLD),
    ratio=st.floats(1.1, 4.0),
)
def test_a_straggler_is_named_exactly_when_its_work_is_ratio_times_the_others_median(
    own: list[float], ratio: float
) -> None:
    status = running(health={"attempt": 1, "ranks": [{"rank": r, "ownSeconds": o} for r, o in enumerate(own)]})
    job_status = health.judge(_job(ratio), status, now=NOW)
    named = {s["rank"] for s in job_status.health.get("suspects", [])}
    for rank, mine in enumerate(own):
        others = sorted(o for r, o in enumerate(own) if r != rank)
        median = (
            others[len(others) // 2]
            if len(others) % 2
            else (others[len(others) // 2 - 1] + others[len(others) // 2]) / 2
        )
        expected = mine / median >= ratio and mine - median >= health.MIN_EXCESS_SECONDS
        assert (rank in named) == expected, (rank, mine, median, ratio)
        assert not math.isnan(mine)


def _job(ratio: float) -> Any:
    from fsdp_operator.api.spec import parse_job

    return parse_job(manifest(stragglerRatio=ratio))


def test_lines_are_ordered_by_the_ranks_clock_a_restarted_group_counts_a_re_read_line_does_not() -> None:
    old_stall = Stall(rank=1, time=100.0, step=30, seconds=31.0, where="code", at="reader.py:12 in next_batch")
    later = RankHealth(rank=1, time=200.0, step=31, steps=20, step_seconds=0.5)
    folded = health.fold({}, [old_stall, later, old_stall], attempt=1, world_size=WORLD)  # the stall re-read
    assert "state" not in folded["ranks"][0] and folded["ranks"][0]["reportedAt"] == 200.0
    # Ray Train restarted the group from the step-10 checkpoint: its stall at step 12 is new, though below 31.
    restarted = Stall(rank=1, time=300.0, step=12, seconds=31.0, where="code", at="reader.py:12 in next_batch")
    again = health.fold(folded, [restarted], attempt=1, world_size=WORLD)
    assert (again["ranks"][0]["state"], again["ranks"][0]["stalledAtStep"]) == ("Stalled", 12)


def test_a_report_a_fraction_of_a_millisecond_after_the_last_is_not_taken_for_an_older_one() -> None:
    """The fold orders a rank's lines by their exact times: a time rounded to the millisecond (200.0006 -> 200.001)
    once made a report 0.3 ms later (200.0009) look older, and it was dropped."""
    first = RankHealth(rank=0, step=5, steps=5, step_seconds=1.0, collective_fraction=0.1, time=200.0006)
    later = RankHealth(rank=0, step=6, steps=5, step_seconds=1.0, collective_fraction=0.1, time=200.0009)
    folded = health.fold({}, [first, later], attempt=1, world_size=1)
    assert folded["ranks"][0]["step"] == 6 and folded["ranks"][0]["reportedAt"] == 200.0009
    older = RankHealth(rank=0, step=4, steps=5, step_seconds=1.0, collective_fraction=0.1, time=200.0003)
    assert health.fold(folded, [older], attempt=1, world_size=1)["ranks"][0]["step"] == 6  # a re-read older line
