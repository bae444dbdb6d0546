"""status.health and its conditions field for field (decide/health.py): what `fold` keeps of each report, what
`judge` writes (suspects, ratios, states, the Progressing and Straggler conditions, the caps), what `lastStall` keeps
through the next attempt. Whole dicts are compared: a key spelt otherwise, a figure rounded otherwise or a cap moved
by one is a different status in `kubectl get -o yaml`."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from fsdp_operator.api import schema
from fsdp_operator.api.spec import Job, parse_job
from fsdp_operator.decide import health
from fsdp_operator.decide.status import JobStatus, format_time
from fsdp_train.contract.health_events import RankHealth, Stall
from support.running_job import NOW, first_attempt_running

GENERATION = 7
AT = format_time(NOW)


def job(replicas: int = 2, gpus: int = 2, **health_spec: Any) -> Job:
    return parse_job(
        {
            "apiVersion": schema.API_VERSION,
            "kind": schema.KIND,
            "metadata": {"name": "qwen", "namespace": "ml", "uid": "u-1", "generation": GENERATION},
            "spec": {"workers": {"replicas": replicas, "gpusPerWorker": gpus}, "health": health_spec},
        }
    )


def placed(rank: int) -> dict[str, Any]:
    node = rank // 2
    return {"rank": rank, "nodeIP": f"10.0.0.{node + 1}", "pod": f"qwen-worker-{node}", "device": "NVIDIA L4",
            "localRank": rank % 2, "deviceUUID": f"GPU-{rank}"}  # fmt: skip


def at(rank: int) -> dict[str, str]:
    node = rank // 2
    return {
        "node": f"10.0.0.{node + 1}",
        "pod": f"qwen-worker-{node}",
        "gpu": f"NVIDIA L4 (local rank {rank % 2}) GPU-{rank}",
    }


def status(ranks: list[dict[str, Any]], world: int = 4, **health_fields: Any) -> JobStatus:
    return first_attempt_running(
        "qwen-ray", "qwen-1", NOW - timedelta(minutes=5),
        health={"attempt": 1, "ranks": ranks, **health_fields}, ranks=[placed(r) for r in range(world)],
    )  # fmt: skip


def condition(type_: str, status_: str, reason: str, message: str) -> dict[str, Any]:
    return {"type": type_, "status": status_, "reason": reason, "message": message, "lastTransitionTime": AT,
            "observedGeneration": GENERATION}  # fmt: skip


PROGRESSING = condition("Progressing", "True", "RanksProgressing", "every rank reports steps")
NO_STRAGGLER = condition("Straggler", "False", "NoStraggler", "no rank is slower than the others")


def stalled(rank: int, where: str, **more: Any) -> dict[str, Any]:
    return {"rank": rank, "state": "Stalled", "stalledAtStep": 11, "stalledSeconds": 31.2, "where": where,
            "at": f"train.py:{rank} in step", "stack": f"stack of {rank}", **more}  # fmt: skip


# --- judge: stragglers ---------------------------------------------------------------------------------------------


def test_two_stragglers_are_named_slowest_first_with_their_ratio_state_and_place_and_old_verdicts_cleared() -> None:
    ranks = [
        {"rank": 0, "ownSeconds": 0.35, "ratio": 1.9},  # named last time, not now
        {"rank": 1, "ownSeconds": 0.75},
        {"rank": 2, "ownSeconds": 0.35, "state": "Straggler"},
        {"rank": 3, "ownSeconds": 1.0},
    ]
    judged = health.judge(job(), status(ranks), now=NOW)
    assert judged.health == {
        "attempt": 1,
        "ranks": [
            {"rank": 0, "ownSeconds": 0.35},
            {"rank": 1, "ownSeconds": 0.75, "ratio": 2.14, "state": "Straggler"},
            {"rank": 2, "ownSeconds": 0.35},
            {"rank": 3, "ownSeconds": 1.0, "ratio": 2.86, "state": "Straggler"},
        ],
        "suspects": [
            {"rank": 3, "reason": "SlowRank", "ratio": 2.86, **at(3)},
            {"rank": 1, "reason": "SlowRank", "ratio": 2.14, **at(1)},
        ],
    }
    assert judged.conditions == [
        PROGRESSING,
        condition(
            "Straggler", "True", "SlowRank",
            "rank 3 (node 10.0.0.2, pod qwen-worker-1, gpu NVIDIA L4 (local rank 1) GPU-3) is a straggler: its own "
            "work per step is 1.000s, 2.86x the other ranks' median 0.350s (stragglerRatio 1.5); also rank 1",
        ),
    ]  # fmt: skip


def test_one_straggler_over_others_at_the_sampling_resolution_is_named_alone_and_the_median_is_not_counted_up() -> None:
    ranks = [{"rank": r, "ownSeconds": own} for r, own in enumerate([0.05, 0.05, 0.5, 0.05])]
    judged = health.judge(job(), status(ranks), now=NOW)
    assert judged.health["suspects"] == [{"rank": 2, "reason": "SlowRank", "ratio": 10.0, **at(2)}]
    assert judged.conditions[1]["message"] == (
        "rank 2 (node 10.0.0.2, pod qwen-worker-1, gpu NVIDIA L4 (local rank 0) GPU-2) is a straggler: its own work "
        "per step is 0.500s, 10.00x the other ranks' median 0.050s (stragglerRatio 1.5)"
    )


def test_a_rank_exactly_the_least_excess_over_the_others_is_a_straggler() -> None:
    """0.056 - 0.006 is 0.05 exactly in binary floating point: the excess is inclusive, as the ratio is."""
    assert health.MIN_EXCESS_SECONDS == 0.056 - 0.006
    ranks = [{"rank": r, "ownSeconds": own} for r, own in enumerate([0.006, 0.006, 0.056, 0.006])]
    judged = health.judge(job(stragglerRatio=1.1), status(ranks), now=NOW)
    assert [(s["rank"], s["ratio"]) for s in judged.health["suspects"]] == [(2, 1.12)]
    assert (
        "median 0.006s (counted as 0.05s, what the samples resolve) (stragglerRatio 1.1)"
        in judged.conditions[1]["message"]
    )


def test_a_ratio_met_with_too_little_excess_is_no_straggler() -> None:
    ranks = [{"rank": r, "ownSeconds": own} for r, own in enumerate([0.02, 0.02, 0.06, 0.02])]  # 1.2x, 0.04 s more
    judged = health.judge(job(stragglerRatio=1.1), status(ranks), now=NOW)
    assert "suspects" not in judged.health and judged.conditions == [PROGRESSING, NO_STRAGGLER]


def test_a_stalled_rank_is_left_out_of_the_straggler_figures() -> None:
    ranks = [*({"rank": r, "ownSeconds": 0.3} for r in range(3)), stalled(3, "code", ownSeconds=5.0)]
    judged = health.judge(job(), status(ranks), now=NOW)
    assert [s["reason"] for s in judged.health["suspects"]] == ["RankStalled"]
    assert judged.conditions[1] == NO_STRAGGLER


@pytest.mark.parametrize(("reporting", "verdict"), [(1, []), (2, [NO_STRAGGLER])])
def test_no_straggler_is_said_once_two_ranks_reported_their_work(reporting: int, verdict: list[Any]) -> None:
    ranks = [{"rank": r, **({"ownSeconds": 0.3} if r < reporting else {"step": 3})} for r in range(4)]
    assert health.judge(job(), status(ranks), now=NOW).conditions == [PROGRESSING, *verdict]


# --- judge: stalls -------------------------------------------------------------------------------------------------


def test_a_stall_names_the_rank_in_code_keeps_only_its_stack_and_records_since_when() -> None:
    ranks = [
        stalled(0, "code"),
        stalled(1, "collective", collective="all_reduce"),
        {"rank": 2, "ownSeconds": 0.3},
        {"rank": 3, "ownSeconds": 0.3},
    ]
    judged = health.judge(job(), status(ranks), now=NOW)
    without_stack = {k: v for k, v in stalled(1, "collective", collective="all_reduce").items() if k != "stack"}
    assert judged.health == {
        "attempt": 1,
        "stalledSince": AT,
        "ranks": [stalled(0, "code"), without_stack, ranks[2], ranks[3]],
        "suspects": [{"rank": 0, "reason": "RankStalled", **at(0)}],
    }
    assert judged.conditions == [
        condition(
            "Progressing", "False", "RankStalled",
            "rank 0 (node 10.0.0.1, pod qwen-worker-0, gpu NVIDIA L4 (local rank 0) GPU-0) made no progress for "
            "31.2s after step 11: in code at train.py:0 in step; rank 1 wait in all_reduce",
        ),
        NO_STRAGGLER,
    ]  # fmt: skip
    later = health.judge(job(), judged, now=NOW + timedelta(seconds=30))
    assert later.health["stalledSince"] == AT  # the first time it was seen, not the last


def test_a_stall_that_cleared_drops_its_since() -> None:
    ranks = [{"rank": r, "ownSeconds": 0.3} for r in range(4)]
    judged = health.judge(job(), status(ranks, stalledSince=AT), now=NOW)
    assert judged.health == {"attempt": 1, "ranks": ranks}


def test_conditions_are_cut_at_1024_characters() -> None:
    long_place = "x" * 2000
    ranks = [stalled(0, "code", at=long_place), {"rank": 1, "ownSeconds": 0.3}, {"rank": 2, "ownSeconds": 0.3},
             {"rank": 3, "ownSeconds": 0.9}]  # fmt: skip
    slow = status(ranks)
    slow.ranks[3]["pod"] = long_place
    judged = health.judge(job(), slow, now=NOW)
    assert [len(c["message"]) for c in judged.conditions] == [1024, 1024]
    stall_words = "rank 0 (node 10.0.0.1, pod qwen-worker-0, gpu NVIDIA L4 (local rank 0) GPU-0) made no progress for "
    assert judged.conditions[0]["message"] == (stall_words + "31.2s after step 11: in code at " + long_place)[:1024]


def test_sixteen_suspects_at_most_and_a_stack_only_for_each_of_them() -> None:
    world = 20
    ranks = [stalled(r, "code") for r in range(world)]
    judged = health.judge(job(replicas=10), status(ranks, world=world), now=NOW)
    assert [s["rank"] for s in judged.health["suspects"]] == list(range(16))
    assert [r["rank"] for r in judged.health["ranks"] if "stack" in r] == list(range(16))


def test_ranks_beyond_the_cap_keep_the_stalled_and_slow_first_then_the_lowest() -> None:
    world = 300
    ranks = [{"rank": r, "ownSeconds": 0.3} for r in reversed(range(world))]
    ranks[0] = stalled(299, "code")  # the list arrives highest rank first
    judged = health.judge(job(replicas=75, gpus=4), status(ranks, world=world), now=NOW)
    assert [r["rank"] for r in judged.health["ranks"]] == [*range(health.RANKS_KEPT - 1), 299]


# --- fold ----------------------------------------------------------------------------------------------------------


def test_a_report_is_kept_with_each_figure_rounded_as_status_shows_it() -> None:
    report = RankHealth(rank=1, time=100.25, step=40, steps=20, step_seconds=1.234567, data_seconds=0.0123456,
                        collective_fraction=0.123456, samples=400, hang_timeout_seconds=123.456)  # fmt: skip
    assert health.fold({}, [report], attempt=1, world_size=4) == {
        "attempt": 1,
        "ranks": [
            {"rank": 1, "reportedAt": 100.25, "step": 40, "steps": 20, "stepSeconds": 1.2346, "dataSeconds": 0.0123,
             "collectiveFraction": 0.123, "ownSeconds": 1.0822, "timeoutSeconds": 123.5}
        ],
    }  # fmt: skip


def test_a_collective_fraction_out_of_range_counts_as_all_or_nothing_waiting() -> None:
    over = RankHealth(rank=0, time=1.0, step=1, steps=1, step_seconds=2.0, collective_fraction=1.5)
    under = RankHealth(rank=1, time=1.0, step=1, steps=1, step_seconds=2.0, collective_fraction=-0.5)
    folded = health.fold({}, [over, under], attempt=1, world_size=2)
    assert [r["ownSeconds"] for r in folded["ranks"]] == [0.0, 2.0]


def test_a_stall_is_kept_with_its_place_and_a_bounded_stack_and_a_later_report_clears_every_stall_field() -> None:
    before = RankHealth(rank=0, time=10.0, step=10, steps=20, step_seconds=0.5, collective_fraction=0.2)
    stall = Stall(rank=0, time=20.0, step=11, seconds=31.26, where="collective", at="loop.py:90 in step",
                  collective="all_reduce #3", stack="s" * 5000)  # fmt: skip
    folded = health.fold({}, [before, stall], attempt=1, world_size=1)
    assert folded["ranks"] == [
        {"rank": 0, "reportedAt": 20.0, "step": 11, "steps": 20, "stepSeconds": 0.5, "dataSeconds": 0.0,
         "collectiveFraction": 0.2, "ownSeconds": 0.4, "timeoutSeconds": 0.0, "state": "Stalled", "stalledAtStep": 11,
         "stalledSeconds": 31.3, "where": "collective", "at": "loop.py:90 in step", "collective": "all_reduce #3",
         "stack": "s" * health.STACK_KEPT}
    ]  # fmt: skip
    after = RankHealth(rank=0, time=30.0, step=12, steps=20, step_seconds=0.5, collective_fraction=0.2)
    assert health.fold(folded, [after], attempt=1, world_size=1)["ranks"] == [
        {"rank": 0, "reportedAt": 30.0, "step": 12, "steps": 20, "stepSeconds": 0.5, "dataSeconds": 0.0,
         "collectiveFraction": 0.2, "ownSeconds": 0.4, "timeoutSeconds": 0.0}
    ]  # fmt: skip


def test_a_line_at_the_same_time_as_the_last_is_taken_and_lines_after_a_dropped_one_still_count() -> None:
    first = RankHealth(rank=0, time=5.0, step=1, steps=1, step_seconds=1.0)
    same_time = RankHealth(rank=0, time=5.0, step=2, steps=1, step_seconds=1.0)
    older = RankHealth(rank=0, time=4.0, step=0, steps=1, step_seconds=1.0)
    beyond = RankHealth(rank=2, time=5.0, step=1, steps=1, step_seconds=1.0)  # world 2: no rank 2
    no_time = RankHealth(rank=1, time=float("inf"), step=1, steps=1, step_seconds=1.0)
    other = RankHealth(rank=1, time=6.0, step=3, steps=1, step_seconds=1.0)
    folded = health.fold({}, [first, same_time, older, beyond, no_time, other], attempt=1, world_size=2)
    assert [(r["rank"], r["step"], r["reportedAt"]) for r in folded["ranks"]] == [(0, 2, 5.0), (1, 3, 6.0)]


def test_ranks_already_in_status_outside_the_world_or_not_ranks_at_all_are_dropped() -> None:
    kept = {"rank": 1, "step": 4}
    earlier = {"attempt": 1, "ranks": ["junk", {"rank": True}, {"rank": "1"}, {"rank": 2}, {"rank": -1}, kept]}
    assert health.fold(earlier, [], attempt=1, world_size=2) == {"attempt": 1, "ranks": [kept]}


# --- lastStall, where a rank runs, when to act -----------------------------------------------------------------------


def test_the_last_stall_keeps_the_message_suspects_and_each_stalled_ranks_place_within_bounds() -> None:
    world = 70
    ranks = [stalled(r, "collective", collective="all_gather") for r in range(world)]
    with_stall = health.with_last_stall(status(ranks, world=world), "m" * 1100, NOW)
    last = with_stall.health["lastStall"]
    assert last == {
        "time": AT,
        "attempt": 1,
        "message": "m" * 1024,
        "suspects": [],
        "ranks": [
            {"rank": r, "stalledAtStep": 11, "stalledSeconds": 31.2, "where": "collective",
             "at": f"train.py:{r} in step", "collective": "all_gather"}
            for r in range(64)
        ],
    }  # fmt: skip
    suspects = [{"rank": 0, "reason": "RankStalled"}]
    again = health.with_last_stall(status([stalled(0, "code")], suspects=suspects), "m", NOW)
    assert again.health["lastStall"]["suspects"] == suspects
    assert again.health["lastStall"]["ranks"] == [
        {"rank": 0, "stalledAtStep": 11, "stalledSeconds": 31.2, "where": "code", "at": "train.py:0 in step"}
    ]


@pytest.mark.parametrize(
    ("report", "expected"),
    [
        ({"hostname": "h0", "device": "cpu", "localRank": 0}, {"node": "h0", "pod": "h0", "gpu": "cpu"}),
        ({"hostname": "h0"}, {"node": "h0", "pod": "h0"}),
        ({"nodeIP": "10.0.0.9", "pod": "p", "hostname": "h0", "device": "cuda:1", "localRank": 1},
         {"node": "10.0.0.9", "pod": "p", "gpu": "cuda:1 (local rank 1)"}),
        (None, {}),
    ],
)  # fmt: skip
def test_where_a_rank_runs_says_what_its_placement_told(
    report: dict[str, Any] | None, expected: dict[str, str]
) -> None:
    assert health.where_runs(0, {0: report} if report else {}) == expected


def test_a_stall_without_a_recorded_since_waits_for_the_others() -> None:
    one = status([stalled(0, "code"), {"rank": 1, "step": 3}, {"rank": 2, "step": 3}, {"rank": 3, "step": 3}])
    assert health.stall_to_act_on(job(), one, now=NOW) is None
    garbled = status(one.health["ranks"], stalledSince=5)  # not a time: as if none was recorded
    assert health.stall_to_act_on(job(), garbled, now=NOW) is None
    every = status([stalled(r, "code") for r in range(4)])
    assert (health.stall_to_act_on(job(), every, now=NOW) or "").startswith("rank 0 (node 10.0.0.1")
