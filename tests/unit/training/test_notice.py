"""A node's notice to the training loop (`fsdp_train.watch.notice`): two CPU ranks on two simulated nodes, the notice
written into one node's directory as the worker pod's `preStop` hook writes it. Every rank stops after the same
step, the checkpoint of that step is complete, the hook's `done` is written, and a resumed run continues from it
with the losses of an uninterrupted run; a notice too short for the save skips it."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from fsdp_train.contract.events import Interruption, Step, Summary, parse_lines
from fsdp_train.state.checkpoint import DirectoryCheckpoints
from fsdp_train.watch.notice import DONE_FILE, NOTICE_FILE, read_notice, write_done
from support.notice_ranks import run_rank_with_notices
from support.rank_processes import rank_context

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

TINY = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": 256}  # fmt: skip
STEPS = 6


def train_config(ckpt: Path) -> dict[str, Any]:
    return {"model_overrides": TINY, "steps": STEPS, "seq_len": 16, "batch_size_per_rank": 2,
            "learning_rate": 1e-3, "lr_schedule": "constant", "mixed_precision": "fp32", "loss_chunk_tokens": 8,
            "probe_size_bytes": 4096, "checkpoint_path": str(ckpt), "checkpoint_interval": 100}  # fmt: skip


def run_two_ranks(
    tmp: Path,
    name: str,
    ckpt: Path,
    notices: Path,
    ray_storage: Path | None = None,
    ray_poll_seconds: float = 1.0,
    train: dict[str, Any] | None = None,
) -> list[tuple[list[Any], dict[str, Any]]]:
    ctx = rank_context()
    store = tmp / f"{name}.store"
    outs = [tmp / f"{name}.{rank}.out" for rank in range(2)]
    ray = (str(ray_storage), ray_poll_seconds) if ray_storage is not None else ()
    procs = [
        ctx.Process(target=run_rank_with_notices,
                    args=(rank, 2, 1, str(store), train or train_config(ckpt), str(outs[rank]), str(notices), str(ckpt),
                          *ray))
        for rank in range(2)
    ]  # fmt: skip
    for p in procs:
        p.start()
    for p in procs:
        p.join(300)
        assert p.exitcode == 0, f"rank exited {p.exitcode}"
    return [(list(parse_lines(o.read_text().splitlines())), json.loads(Path(f"{o}.json").read_text())) for o in outs]


def write_notice(directory: Path, grace: float, reason: str = "preStop", future: bool = False) -> None:
    """`future`: dated an hour ahead, so that it counts from when a rank first reads it (`read_notice`), however
    long the ranks take to start on a loaded machine."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / NOTICE_FILE).write_text(f"{time.time() + (3600 if future else 0):.3f} {grace:g} {reason}\n")


def losses(events: list[Any]) -> dict[int, float]:
    return {e.step: e.loss for e in events if isinstance(e, Step) and e.loss is not None}


def test_a_notice_stops_every_rank_after_the_same_step_with_its_checkpoint_and_the_rerun_resumes_there(
    tmp_path: Path,
) -> None:
    ckpt, notices = tmp_path / "ckpt", tmp_path / "notices"
    write_notice(notices / "node1", grace=60, future=True)  # the second node is going away; the first has no notice
    (rank0, result0), (rank1, result1) = run_two_ranks(tmp_path, "a", ckpt, notices)

    stopped = result0["interrupted"]
    same = ("step", "saved", "checkpoint_step")
    assert {k: result1["interrupted"][k] for k in same} == {k: stopped[k] for k in same} and stopped["saved"] is True
    step = stopped["step"]
    assert 1 <= step < STEPS and stopped["checkpoint_step"] == step
    assert DirectoryCheckpoints(str(ckpt)).complete_steps() == [step]
    # One report, from the node that had the notice, naming its pod and node; the hook's `done` there only.
    reports = [e for e in rank0 + rank1 if isinstance(e, Interruption)]
    assert len(reports) == 1 and reports[0].rank == 1
    assert (reports[0].pod, reports[0].node, reports[0].step, reports[0].saved) == ("pod-1", "n1", step, True)
    assert reports[0].reason == "preStop" and 0 <= reports[0].seconds < 120
    assert (notices / "node1" / DONE_FILE).read_text().split()[1:] == [str(step), "1"]
    assert not (notices / "node0" / DONE_FILE).exists()

    # The next attempt (no notice now) resumes from that checkpoint and trains the rest, as an uninterrupted run.
    (notices / "node1" / NOTICE_FILE).unlink()
    (resumed, result), _ = run_two_ranks(tmp_path, "b", ckpt, notices)
    assert "interrupted" not in result and result["resumed_from_step"] == step
    (whole, _), _ = run_two_ranks(tmp_path, "c", tmp_path / "ckpt-whole", tmp_path / "none")
    assert min(losses(resumed)) == step + 1
    for s, loss in losses(resumed).items():
        assert loss == pytest.approx(losses(whole)[s], rel=1e-5), s


@pytest.mark.slow  # three two-rank runs, 25-30 s: docs/testing.md names what covers its ground fast
def test_a_data_run_resumed_from_a_notice_save_trains_the_samples_of_an_uninterrupted_run(tmp_path: Path) -> None:
    """A shuffled JSONL corpus over two epochs: the notice stops both ranks after step 1, mid-epoch; the notice's
    save holds the data position with the weights, and the next attempt trains, step by step, the samples of a run
    never interrupted (their digest), through the next epoch's new order, with its losses."""
    from support.tiny_hf import documents, train_tokenizer, write_jsonl

    tokenizer = tmp_path / "tokenizer"
    train_tokenizer(tokenizer)
    corpus = write_jsonl(tmp_path / "corpus.jsonl", [{"text": d} for d in documents(40)])

    def data_run(ckpt: Path) -> dict[str, Any]:
        return {**train_config(ckpt), "model_overrides": {**TINY, "vocab_size": 512}, "tokenizer": str(tokenizer),
                "data": str(corpus), "shuffle_seed": 3, "steps": 1000, "epochs": 2}  # fmt: skip

    ckpt, notices = tmp_path / "ckpt", tmp_path / "notices"
    write_notice(notices / "node1", grace=60, future=True)
    (first, result), _ = run_two_ranks(tmp_path, "a", ckpt, notices, train=data_run(ckpt))
    assert result["interrupted"]["saved"] is True and result["interrupted"]["step"] == 1
    (notices / "node1" / NOTICE_FILE).unlink()
    (resumed, result), _ = run_two_ranks(tmp_path, "b", ckpt, notices, train=data_run(ckpt))
    assert "interrupted" not in result and result["resumed_from_step"] == 1
    whole_ckpt = tmp_path / "ckpt-whole"
    (whole, _), _ = run_two_ranks(tmp_path, "c", whole_ckpt, tmp_path / "none", train=data_run(whole_ckpt))

    def steps(events: list[Any]) -> dict[int, Step]:
        return {e.step: e for e in events if isinstance(e, Step)}

    before, after, uninterrupted = steps(first), steps(resumed), steps(whole)
    assert sorted(before) == [1] and sorted(after) == list(range(2, max(uninterrupted) + 1))
    assert {e.epoch for e in after.values()} == {0, 1}  # mid-epoch at the notice, through the next epoch
    for step, event in {**before, **after}.items():
        same = uninterrupted[step]
        assert (event.samples_digest, event.samples_seen) == (same.samples_digest, same.samples_seen), step
        assert event.loss == pytest.approx(same.loss, rel=1e-5), step


def test_under_ray_train_the_hook_is_released_only_once_the_controller_recorded_the_notices_checkpoint(
    tmp_path: Path,
) -> None:
    """Ray Train records a checkpoint only once its controller took in every rank's report, some time after
    ``ray.train.report`` returned on the ranks; the pod of the node going away is stopped as soon as its hook reads
    ``done``, and a report not yet taken in goes with it (``support.ray_controller``). The ranks write ``done`` only
    after the controller recorded the notice's checkpoint, and the next attempt resumes from it."""
    from support.ray_controller import recorded

    ckpt, notices, storage = tmp_path / "unused", tmp_path / "notices", tmp_path / "ray-storage"
    write_notice(notices / "node1", grace=60, future=True)
    (_, result0), (_, result1) = run_two_ranks(tmp_path, "a", ckpt, notices, storage)

    stopped = result0["interrupted"]
    step = stopped["step"]
    assert stopped["saved"] is True and result1["interrupted"]["saved"] is True and 1 <= step < STEPS
    assert (notices / "node1" / DONE_FILE).read_text().split()[1:] == [str(step), "1"]
    assert recorded(storage, 2) == [f"step_{step:08d}"]  # recorded, though the node's pod was gone at `done`

    (notices / "node1" / NOTICE_FILE).unlink()
    (notices / "node1" / DONE_FILE).unlink()
    (resumed, result), _ = run_two_ranks(tmp_path, "b", ckpt, notices, storage)
    assert "interrupted" not in result and result["resumed_from_step"] == step
    assert min(losses(resumed)) == step + 1


@pytest.mark.slow  # a notice's whole grace waited out, 25-30 s: docs/testing.md names what covers its ground fast
def test_under_ray_train_a_checkpoint_the_controller_did_not_record_by_the_deadline_is_not_called_saved(
    tmp_path: Path,
) -> None:
    from support.ray_controller import recorded

    ckpt, notices, storage = tmp_path / "unused", tmp_path / "notices", tmp_path / "ray-storage"
    # The save fits (none measured yet: 1 s); the controller polls late.
    write_notice(notices / "node1", grace=6, future=True)
    (_, result0), (rank1, result1) = run_two_ranks(tmp_path, "a", ckpt, notices, storage, ray_poll_seconds=60)

    assert result0["interrupted"]["saved"] is False and result1["interrupted"]["saved"] is False
    assert result0["interrupted"]["checkpoint_step"] == 0  # the next attempt starts over: nothing recorded
    assert recorded(storage, 2) == []
    (report,) = [e for e in rank1 if isinstance(e, Interruption)]
    assert report.saved is False and "was not complete by the notice's deadline" in report.message


def test_a_notice_too_short_for_the_save_skips_it_and_says_so(tmp_path: Path) -> None:
    ckpt, notices = tmp_path / "ckpt", tmp_path / "notices"
    write_notice(notices / "node0", grace=0)
    (rank0, result0), (_, result1) = run_two_ranks(tmp_path, "a", ckpt, notices)

    assert result0["interrupted"]["saved"] is False and result1["interrupted"]["saved"] is False
    assert result0["interrupted"]["checkpoint_step"] == 0  # nothing saved before: the next attempt starts over
    assert DirectoryCheckpoints(str(ckpt)).complete_steps() == []
    (report,) = [e for e in rank0 if isinstance(e, Interruption)]
    assert report.saved is False and "a save needs" in report.message
    assert (notices / "node0" / DONE_FILE).read_text().split()[2] == "0"
    assert [e for e in rank0 if isinstance(e, Summary)]


@pytest.mark.parametrize(
    ("text", "grace"),
    [("", 30.0), ("garbage", 30.0), ("1e999 5", 5.0), ("12 nan", 30.0), ("12 -4", 30.0), ("12 7 a b c", 7.0)],
)
def test_any_notice_file_is_a_notice(tmp_path: Path, text: str, grace: float) -> None:
    (tmp_path / NOTICE_FILE).write_text(text)
    notice = read_notice(tmp_path)
    assert notice is not None and notice.deadline - notice.time == pytest.approx(grace)
    assert notice.time <= time.time() + 5


def test_no_notice_without_the_file_and_done_is_written_atomically(tmp_path: Path) -> None:
    assert read_notice(tmp_path) is None and read_notice(tmp_path / "missing") is None
    write_done(tmp_path, 7, True)
    assert (tmp_path / DONE_FILE).read_text().split()[1:] == ["7", "1"]
    assert [p.name for p in tmp_path.iterdir()] == [DONE_FILE]
    write_done(tmp_path / "missing", 7, True)  # a directory gone: no exception, the hook just waits out its bound


def test_a_user_function_polls_interrupted_and_the_wrapper_reports_and_marks_rank_0s_return_value(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from fsdp_train.watch import notice

    monkeypatch.setattr(notice, "_USER_WATCH", None)
    monkeypatch.setenv("FSDP_NOTICE_DIR", str(tmp_path))
    monkeypatch.setenv("POD_NAME", "w-1")
    assert notice.interrupted() is False and notice.finish_user_function({"mine": 1}) == {"mine": 1}
    assert (tmp_path / "rank.0").read_text().strip().isdigit()  # the hook waits while this rank lives
    write_notice(tmp_path, grace=60)
    assert notice.interrupted() is True and notice.interrupted() is True  # agreed once, stays
    marked = notice.finish_user_function({"mine": 1})
    assert marked["interrupted"]["saved"] is True
    (report,) = [e for e in parse_lines(capsys.readouterr().out.splitlines()) if isinstance(e, Interruption)]
    assert (report.pod, report.saved, report.step) == ("w-1", True, 0)  # the step: the function's own report
    assert (tmp_path / DONE_FILE).exists()


def test_a_user_function_under_ray_train_releases_the_hook_once_the_controller_recorded_its_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The wrapper writes `done` only after Ray Train's controller took in the function's report (a report still
    waiting for the controller's poll when the hook returns goes with the pod: `support.ray_controller`)."""
    import ray.train
    from fsdp_train.watch import notice
    from ray.train.v2._internal.execution.train_fn_utils import set_train_fn_utils
    from support.ray_controller import ControllerStandIn, recorded

    storage, notices, staged = tmp_path / "storage", tmp_path / "notices", tmp_path / "staged"
    monkeypatch.setattr(notice, "_USER_WATCH", None)
    monkeypatch.setenv("FSDP_NOTICE_DIR", str(notices))
    write_notice(notices, grace=60, future=True)
    staged.mkdir()
    (staged / "weights").write_text("the function's own files")
    ControllerStandIn(str(storage), 0, 0, 1, str(notices), poll_seconds=0.5).install()
    try:
        assert notice.interrupted() is True
        checkpoint = ray.train.Checkpoint.from_directory(str(staged))
        ray.train.report({"step": 7}, checkpoint=checkpoint, checkpoint_dir_name="step_00000007")
        marked = notice.finish_user_function(None)
    finally:
        set_train_fn_utils(None)
    assert marked["interrupted"]["saved"] is True and (notices / DONE_FILE).exists()
    assert recorded(storage, 1) == ["step_00000007"]


def test_a_declared_save_time_counts_until_a_longer_one_is_measured() -> None:
    from fsdp_train.watch.notice import SAVE_SECONDS_ENV, Watch

    assert Watch.from_env({SAVE_SECONDS_ENV: "45"}, 0, 0).longest_save == 45.0
    for junk in ("", "x", "nan", "-3", "inf"):
        assert Watch.from_env({SAVE_SECONDS_ENV: junk}, 0, 0).longest_save == 0.0


def test_the_report_is_printed_before_done_releases_the_hook(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The hook stops the node's Ray (and its log forwarding) once it reads `done`: the report must come first."""
    from fsdp_train.contract import events
    from fsdp_train.watch.notice import Watch

    seen: list[tuple[str, bool]] = []
    monkeypatch.setattr(
        events, "LISTENERS", [lambda e: seen.append((type(e).__name__, (tmp_path / DONE_FILE).exists()))]
    )
    write_notice(tmp_path, grace=60)
    watch = Watch(directory=str(tmp_path), pod="w-1")
    assert watch.check() is not None
    watch.finish(step=5, saved=True)
    assert seen == [("Interruption", False)] and (tmp_path / DONE_FILE).exists()


@pytest.mark.parametrize(
    ("left", "saves"),
    [(10.0, False), (15.4, False), (16.6, True), (21.0, True)],  # a 10 s save: 1x, under and over 1.5x + 1, 2x
)
def test_a_notice_saves_only_when_the_longest_save_times_the_margin_fits(
    tmp_path: Path, left: float, saves: bool
) -> None:
    """The decision boundary: a save is started only when the notice leaves the run's longest save x SAVE_MARGIN
    (1.5) + EXIT_SECONDS (1) before its deadline; without the margin a save of exactly the measured time was started
    with nothing to spare, and the kubelet killed it half written."""
    from fsdp_train.watch.notice import EXIT_SECONDS, SAVE_MARGIN, Watch

    assert (SAVE_MARGIN, EXIT_SECONDS) == (1.5, 1.0)
    (tmp_path / NOTICE_FILE).write_text(f"{time.time():.3f} {left} spot-itn\n")
    watch = Watch(directory=str(tmp_path), longest_save=10.0)
    agreed = watch.check()
    assert agreed is not None and agreed.save is saves and agreed.expected_save_seconds == 10.0
    assert (agreed.why == "") is saves and ("x 1.5 + 1 s to exit" in agreed.why) is not saves
