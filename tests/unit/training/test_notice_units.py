"""A node's termination notice in one process (`fsdp_train.watch.notice`): the notice file as the hook writes it,
the time budget a save needs, the four numbers the ranks agree on, the report and `done`, and a user function's
poll. A fake clock stands in for `time.time()`, a two-rank stand-in for `torch.distributed` for the other rank, and
stand-ins for Ray Train's modules: no process is started and Ray is never imported."""

from __future__ import annotations

import dataclasses
import math
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from fsdp_train.contract import events
from fsdp_train.contract.events import Interruption
from fsdp_train.watch import notice
from fsdp_train.watch.notice import (
    DEFAULT_GRACE_SECONDS,
    DONE_FILE,
    NOTICE_DIR_ENV,
    NOTICE_FILE,
    SAVE_SECONDS_ENV,
    Agreed,
    Notice,
    Watch,
    read_notice,
)

NOW = 1_700_000_000.5
"""A realistic Unix time: a float32 cannot hold it to the second, so the agreed numbers must travel as float64."""


class Clock:
    """`notice.time` in these tests: `time()` answers `now`, which a test moves."""

    def __init__(self) -> None:
        self.now = NOW

    def time(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(notice, "time", fake)
    return fake


@pytest.fixture
def reports(monkeypatch: pytest.MonkeyPatch) -> list[Interruption]:
    """The events this process emits, as the tracking listener receives them."""
    seen: list[Any] = []
    monkeypatch.setattr(events, "LISTENERS", [seen.append])
    return seen


def write(directory: Path, text: str | bytes) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / NOTICE_FILE
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    return directory


def without_time(event: Any) -> Any:
    return dataclasses.replace(event, time=0.0)


# --- read_notice ---------------------------------------------------------------------------------------------


def test_no_file_no_notice(tmp_path: Path) -> None:
    assert read_notice(tmp_path) is None


def test_a_well_formed_notice_gives_its_time_its_deadline_and_its_reason(tmp_path: Path, clock: Clock) -> None:
    write(tmp_path, f"{NOW - 20} 45 spot-interruption\n")
    assert read_notice(tmp_path) == Notice(NOW - 20, NOW + 25, "spot-interruption")


def test_a_reason_of_several_words_is_kept_whole(tmp_path: Path, clock: Clock) -> None:
    write(tmp_path, f"{NOW} 5 node drained by kubectl\n")
    notice_ = read_notice(tmp_path)
    assert notice_ is not None and notice_.reason == "node drained by kubectl"


def test_a_notice_without_a_reason_has_an_empty_one(tmp_path: Path, clock: Clock) -> None:
    write(tmp_path, f"{NOW} 5\n")
    assert read_notice(tmp_path) == Notice(NOW, NOW + 5, "")


def test_an_empty_notice_counts_from_now_with_the_default_grace(tmp_path: Path, clock: Clock) -> None:
    write(tmp_path, "")
    assert read_notice(tmp_path) == Notice(NOW, NOW + DEFAULT_GRACE_SECONDS, "")
    assert DEFAULT_GRACE_SECONDS == 30.0


def test_a_long_reason_is_cut_to_64_characters(tmp_path: Path, clock: Clock) -> None:
    write(tmp_path, f"{NOW} 5 {'r' * 100}\n")
    notice_ = read_notice(tmp_path)
    assert notice_ is not None and notice_.reason == "r" * 64


def test_only_the_first_512_characters_are_read(tmp_path: Path, clock: Clock) -> None:
    """A runaway writer cannot make a rank read megabytes at a step boundary: the 513th character is never seen."""
    write(tmp_path, f"{NOW}" + " " * (511 - len(f"{NOW}")) + "5" + "9")
    notice_ = read_notice(tmp_path)
    assert notice_ is not None and notice_.deadline - notice_.time == 5.0


def test_bytes_that_are_not_utf8_still_make_a_notice(tmp_path: Path, clock: Clock) -> None:
    write(tmp_path, f"{NOW} 12 spot".encode() + b"\xff\n")
    assert read_notice(tmp_path) == Notice(NOW, NOW + 12, "spot\ufffd")


@pytest.mark.parametrize(
    ("written", "read"),
    [
        (NOW - 2, NOW - 2),  # just before now: as written
        (NOW - 3600, NOW - 3600),  # an hour old: as written
        (NOW + 5, NOW + 5),  # a clock up to 5 s ahead of this node's: as written
        (NOW + 5.5, NOW),  # further ahead: from now
        (-math.inf, NOW),
        (math.inf, NOW),
    ],
)
def test_the_notice_time_is_kept_unless_it_is_not_finite_or_more_than_5_s_ahead(
    tmp_path: Path, clock: Clock, written: float, read: float
) -> None:
    write(tmp_path, f"{written!r} 10 r\n")
    assert read_notice(tmp_path) == Notice(read, read + 10, "r")


@pytest.mark.parametrize(
    ("written", "grace"), [("0", 0.0), ("0.5", 0.5), ("-1", 30.0), ("nan", 30.0), ("inf", 30.0), ("x", 30.0)]
)
def test_a_grace_of_zero_or_more_is_kept_and_any_other_is_the_default(
    tmp_path: Path, clock: Clock, written: str, grace: float
) -> None:
    write(tmp_path, f"{NOW} {written} r\n")
    assert read_notice(tmp_path) == Notice(NOW, NOW + grace, "r")


# --- Watch.from_env, measured, local -------------------------------------------------------------------------


def test_from_env_takes_the_directory_pod_node_ranks_and_resumed_step(tmp_path: Path) -> None:
    env = {NOTICE_DIR_ENV: str(tmp_path / "a" / "b"), "POD_NAME": "w-3", "NODE_NAME": "n-7"}
    watch = Watch.from_env(env, 5, 2, resumed_from=40)
    assert (watch.directory, watch.pod, watch.node) == (str(tmp_path / "a" / "b"), "w-3", "n-7")
    assert (watch.rank, watch.local_rank, watch.last_checkpoint) == (5, 2, 40)


def test_from_env_makes_a_nested_directory_and_leaves_this_ranks_pid_there(tmp_path: Path) -> None:
    """The hook waits for `done` only while a `rank.<local rank>` process lives: the file must be there."""
    directory = tmp_path / "not" / "yet" / "there"
    Watch.from_env({NOTICE_DIR_ENV: str(directory)}, 0, 3)
    assert [p.name for p in directory.iterdir()] == ["rank.3"]
    assert int((directory / "rank.3").read_text()) > 0


def test_from_env_without_variables_watches_nothing_and_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    watch = Watch.from_env({}, 0, 0)
    assert (watch.directory, watch.pod, watch.node, watch.last_checkpoint) == ("", "", "", 0)
    assert (watch.longest_save, watch.incomplete) == (0.0, 0)
    assert watch.local() is None and list(tmp_path.iterdir()) == []


def test_a_watch_without_a_directory_ignores_a_notice_in_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(write(tmp_path, "1 30 stray\n"))
    assert Watch().local() is None


def test_an_unwritable_directory_still_gives_a_watch(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    watch = Watch.from_env({NOTICE_DIR_ENV: str(tmp_path / "file" / "sub")}, 0, 0)
    assert watch.directory == str(tmp_path / "file" / "sub") and watch.local() is None


def test_the_longest_save_only_grows_and_the_first_incomplete_step_is_kept() -> None:
    watch = Watch()
    watch.measured(5.0)
    assert (watch.longest_save, watch.incomplete) == (5.0, 0)
    watch.measured(3.0, incomplete=7)
    assert (watch.longest_save, watch.incomplete) == (5.0, 7)
    watch.measured(math.nan, incomplete=9)
    watch.measured(8.0)
    assert (watch.longest_save, watch.incomplete) == (8.0, 7)


# --- Watch.check on one process ------------------------------------------------------------------------------


def test_without_a_notice_check_agrees_nothing(tmp_path: Path, clock: Clock) -> None:
    watch = Watch(directory=str(tmp_path), longest_save=3.0)
    assert watch.check() is None and watch.agreed is None and watch.deadline is None


def test_check_carries_the_notice_as_read(tmp_path: Path, clock: Clock) -> None:
    write(tmp_path, f"{NOW - 4} 60 spot\n")
    agreed = Watch(directory=str(tmp_path), longest_save=2.0).check()
    assert agreed == Agreed(Notice(NOW - 4, NOW + 56, "spot"), True, 2.0, "")


@pytest.mark.parametrize(
    ("grace", "saves"),
    [(10.0, False), (15.0, False), (15.999, False), (16.0, True), (20.0, True)],
)  # a 10 s save: 1x, 1.5x, one below and exactly 1.5x + 1 s, 2x
def test_a_save_starts_only_when_its_time_x_1_5_plus_1_s_is_left(
    tmp_path: Path, clock: Clock, grace: float, saves: bool
) -> None:
    write(tmp_path, f"{NOW} {grace} spot\n")
    agreed = Watch(directory=str(tmp_path), longest_save=10.0).check()
    assert agreed is not None and agreed.save is saves


def test_a_notice_too_short_says_what_was_left_and_what_a_save_needs(tmp_path: Path, clock: Clock) -> None:
    write(tmp_path, f"{NOW} 12 spot\n")
    agreed = Watch(directory=str(tmp_path), longest_save=8.25).check()
    assert agreed is not None and agreed.save is False
    assert (
        agreed.why
        == "the notice left 12.0 s; a save needs about 8.2 s (the longest save of this run) x 1.5 + 1 s to exit"
    )


def test_time_left_under_a_second_is_said_as_it_is(tmp_path: Path, clock: Clock) -> None:
    write(tmp_path, f"{NOW} 0.5 spot\n")
    agreed = Watch(directory=str(tmp_path), longest_save=1.0).check()
    assert agreed is not None and agreed.why.startswith("the notice left 0.5 s; ")


def test_a_deadline_already_past_is_said_as_none_left(tmp_path: Path, clock: Clock) -> None:
    write(tmp_path, f"{NOW - 100} 30 spot\n")
    agreed = Watch(directory=str(tmp_path)).check()
    assert agreed is not None and agreed.why.startswith("the notice left 0.0 s; a save needs about 0.0 s ")


def test_once_agreed_the_notice_stays_though_the_file_goes(tmp_path: Path, clock: Clock) -> None:
    watch = Watch(directory=str(write(tmp_path, f"{NOW} 60 spot\n")))
    first = watch.check()
    (tmp_path / NOTICE_FILE).unlink()
    assert first is not None and watch.check() is first and watch.deadline == NOW + 60 - 1.0


# --- Watch.check across ranks --------------------------------------------------------------------------------


def vector(notice_: Notice | None, longest_save: float) -> list[float]:
    """What a rank contributes to the agreement: [noticed, -deadline, -notice time, longest save]."""
    if notice_ is None:
        return [0.0, -math.inf, -math.inf, longest_save]
    return [1.0, -notice_.deadline, -notice_.time, longest_save]


class TwoRanks:
    """`torch.distributed` with one other rank: `all_reduce` applies its op to this rank's tensor and the other's."""

    def __init__(self, other: list[float], rank: int = 0) -> None:
        self.other = other
        self.rank = rank
        self.made: list[tuple[str | None, object]] = []
        self.reduced_on: list[object] = []

    def new_group(self, backend: str | None = None, **_: Any) -> object:
        group = object()
        self.made.append((backend, group))
        return group

    def all_reduce(self, tensor: torch.Tensor, op: Any = dist.ReduceOp.SUM, group: Any = None, **_: Any) -> None:
        other = torch.tensor(self.other, dtype=tensor.dtype)
        if op == dist.ReduceOp.MAX:
            tensor.copy_(torch.maximum(tensor, other))
        elif op == dist.ReduceOp.SUM:
            tensor.copy_(tensor + other)
        else:
            raise ValueError(f"unsupported op {op!r}")
        self.reduced_on.append(group)

    def get_rank(self, group: Any = None) -> int:
        return self.rank


@pytest.fixture
def two_ranks(monkeypatch: pytest.MonkeyPatch) -> Iterator[TwoRanks]:
    ranks = TwoRanks(vector(None, 0.0))
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "new_group", ranks.new_group)
    monkeypatch.setattr(dist, "all_reduce", ranks.all_reduce)
    monkeypatch.setattr(dist, "get_rank", ranks.get_rank)
    yield ranks


def test_across_ranks_no_notice_anywhere_agrees_nothing(tmp_path: Path, clock: Clock, two_ranks: TwoRanks) -> None:
    assert Watch(directory=str(tmp_path)).check() is None


def test_this_ranks_notice_is_agreed_by_both_with_the_longer_save(
    tmp_path: Path, clock: Clock, two_ranks: TwoRanks
) -> None:
    two_ranks.other = vector(None, 4.0)
    write(tmp_path, f"{NOW - 3} 60 spot\n")
    agreed = Watch(directory=str(tmp_path), longest_save=2.0).check()
    assert agreed == Agreed(Notice(NOW - 3, NOW + 57, "spot"), True, 4.0, "")


def test_another_ranks_notice_is_agreed_here_without_a_reason(
    tmp_path: Path, clock: Clock, two_ranks: TwoRanks
) -> None:
    """The reason stays on the node that read it (its report names it); the other ranks only stop."""
    two_ranks.other = vector(Notice(NOW - 3, NOW + 57, "spot"), 1.0)
    agreed = Watch(directory=str(tmp_path), longest_save=2.0).check()
    assert agreed == Agreed(Notice(NOW - 3, NOW + 57, ""), True, 2.0, "")


@pytest.mark.parametrize("earlier", ["mine", "other"])
def test_ranks_agree_on_the_earliest_notice_time_and_deadline(
    tmp_path: Path, clock: Clock, two_ranks: TwoRanks, earlier: str
) -> None:
    early, late = Notice(NOW - 9, NOW + 21, "spot"), Notice(NOW - 1, NOW + 59, "spot")
    mine, other = (early, late) if earlier == "mine" else (late, early)
    two_ranks.other = vector(other, 0.0)
    write(tmp_path, f"{mine.time!r} {mine.deadline - mine.time!r} drain\n")
    agreed = Watch(directory=str(tmp_path)).check()
    assert agreed is not None and (agreed.notice.time, agreed.notice.deadline) == (early.time, early.deadline)
    assert agreed.notice.reason == "drain"


def test_the_ranks_agree_on_a_gloo_group_of_their_own_made_once(
    tmp_path: Path, clock: Clock, two_ranks: TwoRanks
) -> None:
    """A CPU collective whatever the training group's backend, and `new_group` is itself collective: once a run."""
    watch = Watch(directory=str(tmp_path))
    for _ in range(3):
        assert watch.check() is None
    ((backend, group),) = two_ranks.made
    assert backend == "gloo" and two_ranks.reduced_on == [group, group, group]


# --- Watch.finish ----------------------------------------------------------------------------------------------


def agreed_watch(directory: Path, clock: Clock, grace: float = 60.0, **fields: Any) -> Watch:
    write(directory, f"{NOW} {grace} spot-itn\n")
    watch = Watch(directory=str(directory), rank=3, pod="w-1", node="n-2", **fields)
    assert watch.check() is not None
    return watch


def test_a_saved_notice_is_reported_once_then_done_and_returned(
    tmp_path: Path, clock: Clock, reports: list[Any]
) -> None:
    watch = agreed_watch(tmp_path, clock)
    clock.now = NOW + 2.359375  # exact in binary: the report carries it whole
    result = watch.finish(step=7, saved=True)
    assert result == {"interrupted": {"step": 7, "saved": True, "checkpoint_step": 7, "seconds": 2.359}}
    assert [without_time(e) for e in reports] == [
        Interruption(rank=3, time=0.0, step=7, saved=True, checkpoint_step=7, seconds=2.359375, notice_time=NOW,
                     pod="w-1", node="n-2", reason="spot-itn", message="")
    ]  # fmt: skip
    assert (tmp_path / DONE_FILE).read_text().split()[1:] == ["7", "1"]


def test_a_notice_dated_ahead_of_this_clock_counts_zero_seconds(
    tmp_path: Path, clock: Clock, reports: list[Any]
) -> None:
    watch = agreed_watch(tmp_path, clock)
    clock.now = NOW - 0.25
    assert watch.finish(step=1, saved=True)["interrupted"]["seconds"] == 0.0
    clock.now = NOW + 0.25
    assert watch.finish(step=1, saved=True)["interrupted"]["seconds"] == 0.25


def test_an_unsaved_notice_keeps_the_last_checkpoint_and_says_there_is_no_storage(
    tmp_path: Path, clock: Clock, reports: list[Any]
) -> None:
    watch = agreed_watch(tmp_path, clock, last_checkpoint=4)
    result = watch.finish(step=9, saved=False)
    assert result["interrupted"] == {"step": 9, "saved": False, "checkpoint_step": 4, "seconds": 0.0}
    (report,) = reports
    assert (report.checkpoint_step, report.message) == (4, "the job has no checkpoint storage: nothing to save")
    assert (tmp_path / DONE_FILE).read_text().split()[1:] == ["9", "0"]


def test_a_save_the_store_did_not_complete_is_named_with_its_step(
    tmp_path: Path, clock: Clock, reports: list[Any]
) -> None:
    watch = agreed_watch(tmp_path, clock)
    watch.measured(2.0, incomplete=6)
    watch.finish(step=6, saved=False)
    assert reports[0].message == (
        "the checkpoint of step 6 was not complete by the notice's deadline (the store had not recorded it): "
        "the next attempt resumes from the one before"
    )


def test_the_callers_reason_is_said_when_the_save_did_not_happen(
    tmp_path: Path, clock: Clock, reports: list[Any]
) -> None:
    agreed_watch(tmp_path, clock).finish(step=2, saved=False, why="the store refused")
    assert reports[0].message == "the store refused"


def test_a_notice_too_short_says_so_before_the_callers_reason(tmp_path: Path, clock: Clock, reports: list[Any]) -> None:
    watch = agreed_watch(tmp_path, clock, grace=2.0, longest_save=10.0)
    assert watch.agreed is not None and watch.agreed.save is False
    watch.finish(step=2, saved=False, why="the store refused")
    assert reports[0].message == watch.agreed.why and reports[0].message.startswith("the notice left 2.0 s")


def test_only_local_rank_0_reports_but_every_rank_of_the_node_writes_done(
    tmp_path: Path, clock: Clock, reports: list[Any]
) -> None:
    watch = agreed_watch(tmp_path, clock, local_rank=1)
    watch.finish(step=3, saved=True)
    assert reports == [] and (tmp_path / DONE_FILE).read_text().split()[1:] == ["3", "1"]


def test_a_node_without_the_notice_neither_reports_nor_writes_done(
    tmp_path: Path, clock: Clock, reports: list[Any], two_ranks: TwoRanks
) -> None:
    two_ranks.other = vector(Notice(NOW, NOW + 60, "spot"), 0.0)
    watch = Watch(directory=str(tmp_path))
    assert watch.check() is not None
    assert watch.finish(step=3, saved=True)["interrupted"]["checkpoint_step"] == 3
    assert reports == [] and not (tmp_path / DONE_FILE).exists()


# --- a user's function -----------------------------------------------------------------------------------------


@pytest.fixture
def user(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clock: Clock) -> Path:
    """A user function's process outside Ray Train (Ray cannot be imported), notices in `tmp_path`."""
    monkeypatch.setattr(notice, "_USER_WATCH", None)
    monkeypatch.setitem(sys.modules, "ray", None)
    monkeypatch.setitem(sys.modules, "ray.train", None)
    monkeypatch.setenv(NOTICE_DIR_ENV, str(tmp_path))
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    monkeypatch.delenv(SAVE_SECONDS_ENV, raising=False)
    return tmp_path


def ray_train_worker(monkeypatch: pytest.MonkeyPatch, local_rank: int) -> None:
    """Stand-ins for `ray` and `ray.train` whose context is a Ray Train worker's."""
    context = types.SimpleNamespace(get_local_rank=lambda: local_rank)
    train = types.SimpleNamespace(get_context=lambda: context)
    monkeypatch.setitem(sys.modules, "ray", types.SimpleNamespace(train=train))
    monkeypatch.setitem(sys.modules, "ray.train", train)


@pytest.mark.parametrize(("value", "local_rank"), [(None, 0), ("", 0), ("3", 3)])
def test_outside_ray_train_the_local_rank_is_torchruns(
    user: Path, monkeypatch: pytest.MonkeyPatch, value: str | None, local_rank: int
) -> None:
    if value is not None:
        monkeypatch.setenv("LOCAL_RANK", value)
    assert notice.interrupted() is False
    assert [p.name for p in user.iterdir()] == [f"rank.{local_rank}"]
    assert notice._USER_WATCH is not None and notice._USER_WATCH.ray_train is False
    assert notice._USER_WATCH.rank == 0


def test_under_ray_train_the_local_rank_is_ray_trains(user: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCAL_RANK", "5")
    ray_train_worker(monkeypatch, 2)
    assert notice.interrupted() is False
    assert [p.name for p in user.iterdir()] == ["rank.2"]
    assert notice._USER_WATCH is not None and notice._USER_WATCH.ray_train is True


def test_in_a_process_group_the_report_names_this_processs_rank(
    user: Path, two_ranks: TwoRanks, reports: list[Any]
) -> None:
    two_ranks.rank = 5
    write(user, f"{NOW} 60 spot\n")
    assert notice.interrupted() is True
    notice.finish_user_function(None)
    assert [e.rank for e in reports] == [5]


def test_a_function_not_interrupted_keeps_its_own_return_value(user: Path) -> None:
    mine = {"loss": 1.0}
    assert notice.finish_user_function(mine) is mine
    assert notice.interrupted() is False and notice.finish_user_function(mine) is mine


def test_an_interrupted_function_outside_ray_train_is_reported_saved(user: Path, reports: list[Any]) -> None:
    write(user, f"{NOW} 60 spot\n")
    assert notice.interrupted() is True
    assert notice.finish_user_function({"loss": 1.0}) == {
        "interrupted": {"step": 0, "saved": True, "checkpoint_step": 0, "seconds": 0.0}
    }
    assert [(e.saved, e.message) for e in reports] == [(True, "")]


@pytest.mark.parametrize("recorded", [True, False])
def test_under_ray_train_saved_means_the_controller_recorded_it_by_the_deadline(
    user: Path, monkeypatch: pytest.MonkeyPatch, reports: list[Any], recorded: bool
) -> None:
    from fsdp_train.state import ray_commit

    asked: list[tuple[Any, ...]] = []

    def committed_by_ray(name: str | None, deadline: float | None = None) -> bool:
        asked.append((name, deadline))
        return recorded

    monkeypatch.setattr(ray_commit, "committed_by_ray", committed_by_ray)
    ray_train_worker(monkeypatch, 0)
    write(user, f"{NOW} 60 spot\n")
    assert notice.interrupted() is True
    result = notice.finish_user_function(None)
    assert asked == [(None, NOW + 60 - 1.0)]  # this rank's latest report, until the deadline less the exit
    assert result["interrupted"]["saved"] is recorded
    message = "" if recorded else (
        "Ray Train's controller had recorded no checkpoint of this rank by the notice's deadline"
    )  # fmt: skip
    assert [(e.saved, e.message) for e in reports] == [(recorded, message)]


def test_from_env_takes_the_last_measured_save_and_ignores_one_that_is_no_number() -> None:
    assert Watch.from_env({SAVE_SECONDS_ENV: "12.5"}, 0, 0).longest_save == 12.5
    assert Watch.from_env({SAVE_SECONDS_ENV: "soon"}, 0, 0).longest_save == 0.0
