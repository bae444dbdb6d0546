"""The stall message word for word (decide/health.py `stall_message`): who holds the others up and where, the
ranks that wait for them, in the words `kubectl describe` and the Stalled event show."""

from __future__ import annotations

from typing import Any

import pytest
from fsdp_operator.decide.health import stall_message


def stalled(
    rank: int, where: str, at: str, collective: str = "", seconds: float = 30.0, step: int = 7
) -> dict[str, Any]:
    entry = {
        "rank": rank,
        "state": "Stalled",
        "where": where,
        "at": at,
        "stalledSeconds": seconds,
        "stalledAtStep": step,
    }
    return {**entry, "collective": collective} if collective else entry


def test_a_silent_rank_is_the_suspect_and_the_many_that_wait_are_counted() -> None:
    ranks = [stalled(r, "collective", "train.py:10 in step", "all_reduce") for r in range(11)]
    assert stall_message({"ranks": ranks}, {}, 12) == (
        "rank 11 reported nothing (alive but silent, or gone); "
        "ranks 0, 1, 2, 3, 4, 5, 6, 7 and 3 more wait in all_reduce"
    )


def test_a_rank_in_code_is_named_with_its_place_and_one_waiting_rank_is_a_rank() -> None:
    ranks = [stalled(0, "collective", "train.py:10 in step"), stalled(1, "code", "data.py:12 in load", seconds=41.5)]
    placed = {1: {"pod": "w-1", "nodeIP": "10.0.0.2", "device": "cuda:1", "localRank": 1}}
    assert stall_message({"ranks": ranks}, placed, 2) == (
        "rank 1 (node 10.0.0.2, pod w-1, gpu cuda:1 (local rank 1)) made no progress for 41.5s after step 7: "
        "in code at data.py:12 in load; rank 0 wait in a collective"
    )


def test_when_every_rank_waits_in_a_collective_each_is_named_where_it_waits_four_at_most() -> None:
    ranks = [stalled(r, "collective", f"train.py:{r} in step", "all_gather" if r else "") for r in range(6)]
    assert stall_message({"ranks": ranks}, {}, 6) == "; ".join(
        ["rank 0 made no progress for 30.0s after step 7: waiting in a collective at train.py:0 in step"]
        + [f"rank {r} made no progress for 30.0s after step 7: waiting in all_gather at train.py:{r} in step"
           for r in range(1, 4)]
    )  # fmt: skip


def test_exactly_eight_waiting_ranks_are_all_shown() -> None:
    ranks = [stalled(r, "collective", "t.py:1 in f", "barrier") for r in range(8)] + [stalled(8, "code", "u.py:2 in g")]
    assert stall_message({"ranks": ranks}, {}, 9).endswith("; ranks 0, 1, 2, 3, 4, 5, 6, 7 wait in barrier")


def test_every_silent_rank_is_named() -> None:
    ranks = [stalled(0, "collective", "t.py:1 in f", "all_reduce")]
    assert stall_message({"ranks": ranks}, {}, 3) == (
        "rank 1 reported nothing (alive but silent, or gone); rank 2 reported nothing (alive but silent, or gone); "
        "rank 0 wait in all_reduce"
    )


@pytest.mark.parametrize(
    ("waiting", "words"),
    [(2, "ranks 0, 1 wait in barrier"), (9, "ranks 0, 1, 2, 3, 4, 5, 6, 7 and 1 more wait in barrier")],
)
def test_two_waiting_ranks_are_ranks_and_a_ninth_is_counted(waiting: int, words: str) -> None:
    ranks = [stalled(r, "collective", "t.py:1 in f", "barrier") for r in range(waiting)]
    ranks.append(stalled(waiting, "code", "u.py:2 in g"))
    assert stall_message({"ranks": ranks}, {}, waiting + 1).endswith("; " + words)


def test_ranks_waiting_in_more_than_three_collectives_name_the_first_three() -> None:
    ranks = [stalled(0, "code", "u.py:2 in g")]
    ranks += [stalled(r, "collective", "t.py:1 in f", f"all_reduce #{r}") for r in range(1, 5)]
    message = stall_message({"ranks": ranks}, {}, 5)
    assert message.endswith("; ".join(["", *(f"rank {r} wait in all_reduce #{r}" for r in (1, 2, 3))]))
