"""The tracker's sender side (`fsdp_train.watch.tracking.Tracker`, `resolve_run`, `finish_run`) against an in-memory
MLflow client (`support.fake_mlflow`): which run an attempt logs to, what reaches it, what a failing tracker says.

The same against a real server is `tests/integration/test_tracking_server.py` (seconds a case; these are
milliseconds, so every branch of the sender gets one).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import mlflow.tracking
import pytest
from fsdp_train.contract import events
from fsdp_train.contract.config import MERGED_DIR
from fsdp_train.contract.events import Tracking, parse_lines
from fsdp_train.watch import tracking
from support.fake_mlflow import FakeMlflow, HangingMlflow

SERVER = {"uri": "http://mlflow:5000/", "experiment": "exp", "run_name": "tiny-1", "job": "default/tiny"}
JOB = {**SERVER, "uid": "u-1", "generation": 1, "attempt": 1}


@pytest.fixture(autouse=True)
def quick_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    """The sender waits this long for more records before it sends a batch; no test here judges batching by time."""
    monkeypatch.setattr(tracking, "FLUSH_SECONDS", 0.01)


def step(n: int, **extra: float) -> events.Step:
    return events.Step(
        rank=0, step=n, total_steps=9, loss=1.0 / n, tokens_per_second=10.0 * n, tokens_per_second_per_device=None,
        extra=extra,
    )  # fmt: skip


def attempt(
    client: FakeMlflow,
    settings: dict[str, Any],
    emitted: list[events.Event],
    *,
    params: dict[str, str] | None = None,
    status: str = "FINISHED",
) -> tracking.Tracker:
    """One process's tracker: started, handed `emitted` as the loop emits them, closed with `status`."""
    tracker = tracking.Tracker(
        tracking.Settings.from_dict(settings), params=lambda: params if params is not None else {"p": "1"},
        client=client,
    ).start()  # fmt: skip
    for event in emitted:
        events.emit(event)
    tracker.close(status, timeout=30)
    return tracker


def said(capsys: pytest.CaptureFixture[str]) -> list[Tracking]:
    """The `Tracking` events printed since the last call."""
    return [e for e in parse_lines(capsys.readouterr().out.splitlines()) if isinstance(e, Tracking)]


def test_a_jobs_first_attempt_makes_its_run_with_its_tags_params_and_every_figure(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tracking, "FLUSH_SECONDS", 60.0)  # one batch: what was queued before close
    client = FakeMlflow()
    params = {f"train.p{i:03}": str(i) for i in range(250)}  # more than one batch of MLflow's 100
    emitted: list[events.Event] = [
        events.Resolved(rank=0, sharding="full", precision="bf16"),
        *[step(n, grad_norm=0.5) for n in range(1, 1201)],  # more than one batch of MLflow's 1000 metrics
        events.Transport(rank=1, transport="efa"),
        events.Checkpoint(rank=0, step=1200, path="s3://b/ckpt/1200"),
        events.Summary(rank=0, steps=1200, final_loss=0.5, first_loss=1.0, tokens_per_second=10.0, seconds=9.0),
        events.Failure(rank=2, message="boom"),
    ]
    tracker = attempt(client, JOB, emitted, params=params, status="FAILED")
    (run,) = client.runs.values()
    assert client.experiments["exp"].tags == {tracking.EXPERIMENT_KIND_TAG: tracking.MODEL_TRAINING}
    assert (run.name, run.status) == ("tiny-1", "FAILED")
    assert run.tags == {
        tracking.JOB_TAG: "default/tiny", tracking.ATTEMPT_TAG: "1", tracking.UID_TAG: "u-1",
        tracking.GENERATION_TAG: "1", "nccl.transport.rank1": "efa", "checkpoint.path": "s3://b/ckpt/1200",
        "failure": "rank 2: boom",
    }  # fmt: skip
    assert run.params == {**params, "train.precision": "bf16", "train.sharding": "full"}
    assert run.metrics["loss"] == [(n, 1.0 / n) for n in range(1, 1201)]
    assert run.times["loss"][:2] == [int(e.time * 1000) for e in emitted[1:3]]
    assert len(run.metrics["grad_norm"]) == 1200 and run.metrics["checkpoint_step"] == [(1200, 1200.0)]
    assert run.metrics["final_loss"] == [(0, 0.5)] and run.documents["summary.json"]["steps"] == 1200
    assert tracker.sent == sum(map(len, run.metrics.values())) + 3 and tracker.lost == 0  # and three tags
    (announced,) = said(capsys)
    assert (announced.rank, announced.run_id, announced.problem) == (0, run.run_id, "")
    assert announced.url == f"http://mlflow:5000/#/experiments/1/runs/{run.run_id}"
    assert tracker.on_event not in events.LISTENERS


def test_a_later_attempt_continues_its_generations_run_and_a_new_generation_starts_another(
    capsys: pytest.CaptureFixture[str],
) -> None:
    client = FakeMlflow()
    first = attempt(client, JOB, [step(1)], status="KILLED")
    again = attempt(client, {**JOB, "attempt": 2}, [step(2)], params={"p": "changed"})
    assert again.run_id == first.run_id and len(client.runs) == 1
    run = client.runs[first.run_id]
    assert run.status == "FINISHED" and run.tags[tracking.ATTEMPT_TAG] == "2"
    assert run.params == {"p": "1"}  # a continued run's parameters are the first attempt's
    assert run.metrics["loss"] == [(1, 1.0), (2, 0.5)]
    assert f"tracking continues MLflow run {first.run_id}" in capsys.readouterr().out
    changed = attempt(client, {**JOB, "generation": 2}, [step(1)])
    assert changed.run_id != first.run_id and client.runs[changed.run_id].tags[tracking.GENERATION_TAG] == "2"
    assert client.runs[changed.run_id].params == {"p": "1"}
    # Without a uid (torchrun) nothing says which run is the job's: every start is a new run, without job tags.
    alone = attempt(client, {**SERVER}, [step(1)])
    assert alone.run_id not in (first.run_id, changed.run_id)
    assert client.runs[alone.run_id].tags == {tracking.JOB_TAG: "default/tiny", tracking.ATTEMPT_TAG: "0"}
    assert "continues" not in capsys.readouterr().out


def test_an_existing_experiment_is_marked_for_training_only_where_it_has_no_kind() -> None:
    client = FakeMlflow()
    client.create_experiment("exp")
    client.create_experiment("genai", tags={tracking.EXPERIMENT_KIND_TAG: "genai_development"})
    attempt(client, JOB, [])
    attempt(client, {**JOB, "experiment": "genai"}, [])
    assert client.experiments["exp"].tags == {tracking.EXPERIMENT_KIND_TAG: tracking.MODEL_TRAINING}
    assert client.experiments["genai"].tags == {tracking.EXPERIMENT_KIND_TAG: "genai_development"}
    assert [r.experiment_id for r in client.runs.values()] == ["1", "2"]


def test_a_file_store_run_has_no_url() -> None:
    client = FakeMlflow()
    tracker = attempt(client, {**JOB, "uri": "file:///shared/mlruns"}, [step(1)])
    assert tracker.run_id and tracker.url == ""


def test_a_tracker_that_is_down_says_so_counts_what_it_lost_and_says_when_it_is_back(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(tracking, "RETRY_SECONDS", 0.0)
    client = FakeMlflow(down=3)  # the first connection and the first two batches' are refused
    tracker = tracking.Tracker(tracking.Settings.from_dict(JOB), params=lambda: {}, client=client).start()
    for n, lost in ((1, 2), (2, 4)):
        events.emit(step(n))
        deadline = time.monotonic() + 30
        while tracker.lost < lost and time.monotonic() < deadline:  # the sender took the step and lost it
            time.sleep(0.01)
    events.emit(step(3))
    tracker.close(timeout=30)
    told = said(capsys)
    down = "ConnectionError: the tracking server is not there"
    assert [t.problem for t in told[:3]] == [
        down,
        f"{down} (2 records not logged so far)",
        f"{down} (4 records not logged so far)",  # a step's loss and rate
    ]
    assert told[-1].problem == "" and told[-1].run_id == tracker.run_id
    (run,) = client.runs.values()
    assert run.status == "FINISHED"
    assert run.metrics["loss"] == [(3, 1.0 / 3)] and tracker.lost == 4


def test_a_resolved_value_a_continued_run_has_otherwise_stays_and_is_said(capsys: pytest.CaptureFixture[str]) -> None:
    client = FakeMlflow()
    first = attempt(client, JOB, [events.Resolved(rank=0, sharding="full", precision="bf16")])
    capsys.readouterr()
    attempt(client, {**JOB, "attempt": 2}, [events.Resolved(rank=0, sharding="full", precision="fp32")])
    assert client.runs[first.run_id].params["train.precision"] == "bf16"
    problems = [t.problem for t in said(capsys) if t.problem]
    assert problems and problems[0].startswith(
        "parameter train.precision stays as the first attempt logged it (MlflowException: param train.precision was"
    )


def export(path: str, step_: int = 9) -> events.Export:
    return events.Export(rank=0, step=step_, path=path)


def test_the_final_export_is_uploaded_and_becomes_a_model_version_an_intermediate_one_is_linked_only(
    tmp_path: Path,
) -> None:
    client = FakeMlflow()
    final, merged = tmp_path / "final", tmp_path / "lora"
    final.mkdir()
    (final / "model.safetensors").write_bytes(b"x" * 10)
    (merged / MERGED_DIR).mkdir(parents=True)
    (merged / MERGED_DIR / "model.safetensors").write_bytes(b"y")
    model = {**JOB, "registered_model": "tiny"}
    tracker = attempt(client, model, [export(f"{tmp_path}/step_3/", 3), export(str(final)), export(f"file://{merged}")])
    run = client.runs[tracker.run_id]
    assert run.artifacts == [(str(final), "export"), (str(merged), "export")]
    artifacts = f"mlflow-artifacts:/1/{tracker.run_id}/export"
    assert [v["source"] for v in client.models["tiny"]] == [artifacts, f"{artifacts}/{MERGED_DIR}"]
    assert client.models["tiny"][1]["tags"] == {"export.uri": f"file://{merged}"}
    assert {v["run_id"] for v in client.models["tiny"]} == {tracker.run_id}
    assert (run.tags["export.uri"], run.tags["export.step"]) == (f"file://{merged}", "9")
    # An export in object storage, or larger than an upload, is linked where it is.
    far = "s3://b/" + "p" * 6000
    linked = attempt(client, {**model, "generation": 2}, [export(far)])
    assert client.models["tiny"][-1]["source"] == far
    assert (
        client.models["tiny"][-1]["tags"]["export.uri"] == client.runs[linked.run_id].tags["export.uri"] == far[:5000]
    )
    unregistered = attempt(FakeMlflow(), JOB, [export(str(final))])
    assert unregistered.run_id  # no registered model: uploaded, no version asked for


def test_an_export_over_the_upload_limit_is_linked_not_uploaded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tracking, "UPLOAD_LIMIT_BYTES", 10)
    (tmp_path / "a").write_bytes(b"x" * 5)
    (tmp_path / "b").write_bytes(b"x" * 6)
    client = FakeMlflow()
    tracker = attempt(client, {**JOB, "registered_model": "tiny"}, [export(str(tmp_path))])
    assert client.runs[tracker.run_id].artifacts == []
    assert client.models["tiny"][0]["source"] == str(tmp_path)
    (tmp_path / "b").write_bytes(b"x" * 5)  # 10 bytes: at the limit, uploaded
    again = FakeMlflow()
    attempt(again, {**JOB, "registered_model": "tiny"}, [export(str(tmp_path))])
    assert again.models["tiny"][0]["source"].endswith("/export")


def test_the_driver_ends_its_generations_run_and_touches_no_other(monkeypatch: pytest.MonkeyPatch) -> None:
    client = FakeMlflow()
    monkeypatch.setattr(mlflow.tracking, "MlflowClient", lambda tracking_uri: client)
    mine = attempt(client, JOB, [], status="RUNNING")
    other = attempt(client, {**JOB, "generation": 2}, [], status="RUNNING")
    for name in tracking.CLIENT_ENV:  # the driver's process never started a tracker
        monkeypatch.delenv(name, raising=False)
    tracking.finish_run(tracking.Settings.from_dict(JOB), "FAILED")
    assert (client.runs[mine.run_id].status, client.runs[other.run_id].status) == ("FAILED", "RUNNING")
    tracking.finish_run(tracking.Settings.from_dict({**SERVER}), "FAILED")  # no uid: no run is known to be its
    tracking.finish_run(tracking.Settings.from_dict({**JOB, "experiment": "none"}), "FAILED")
    assert client.runs[other.run_id].status == "RUNNING" and "none" not in client.experiments
    assert all(os.environ[k] == v for k, v in tracking.CLIENT_ENV.items())


def test_a_driver_whose_tracker_never_answers_goes_on_after_its_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    client = HangingMlflow()
    monkeypatch.setattr(mlflow.tracking, "MlflowClient", lambda tracking_uri: client)
    started = time.monotonic()
    tracking.finish_run(tracking.Settings.from_dict(JOB), "FINISHED", timeout=0.2)
    assert time.monotonic() - started < 10
    client.answer.set()


def test_a_tracker_that_falls_behind_drops_records_and_counts_them_never_blocking(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(tracking, "QUEUE_RECORDS", 3)
    tracker = tracking.Tracker(tracking.Settings.from_dict(JOB), params=lambda: {})  # not started: nothing drains
    for n in range(1, 4):  # two records a step: the second step fits half, the third none
        tracker.on_event(step(n))
    assert tracker.lost == 2 and tracker._queue.qsize() == 3


def test_a_learning_rate_that_raises_costs_its_records_and_is_said_and_cleared_once_records_flow(
    capsys: pytest.CaptureFixture[str],
) -> None:
    def learning_rate(n: int) -> float:
        if n == 1:
            raise ValueError("no schedule for step 1 " + "x" * 500)
        return 0.5

    client = FakeMlflow()
    tracker = tracking.Tracker(tracking.Settings.from_dict(JOB), params=lambda: {}, learning_rate=learning_rate,
                               client=client).start()  # fmt: skip
    events.emit(step(1))
    events.emit(step(2))
    tracker.close(timeout=30)
    problems = [t.problem for t in said(capsys)]
    failed = [i for i, p in enumerate(problems) if p.startswith("could not record a step event: ValueError: no sch")]
    assert failed and problems[-1] == "" and failed[0] < len(problems) - 1
    (run,) = client.runs.values()
    assert run.metrics["learning_rate"] == [(2, 0.5)] and tracker.lost == 0


def test_a_closing_tracker_that_cannot_send_its_last_batch_does_not_wait_to_retry(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(tracking, "RETRY_SECONDS", 60.0)
    tracker = tracking.Tracker(tracking.Settings.from_dict(JOB), params=lambda: {}, client=FakeMlflow(down=10**6))
    tracker.start()
    started = time.monotonic()
    tracker.close(timeout=20)
    assert time.monotonic() - started < 15 and not tracker._thread.is_alive()


def test_a_driver_that_cannot_reach_the_tracker_only_says_so(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(mlflow.tracking, "MlflowClient", lambda tracking_uri: FakeMlflow(down=1))
    tracking.finish_run(tracking.Settings.from_dict(JOB), "FINISHED")
    assert "could not mark the MLflow run FINISHED: ConnectionError:" in capsys.readouterr().out


def test_a_tracker_that_cannot_start_is_said_and_the_clients_waits_are_bounded_unless_the_user_set_them(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert tracking.start({"uri": "http://m"}, {}, world_size=1, rank=0) is None
    (told,) = said(capsys)
    assert told.problem.startswith("tracking could not start: ValueError: tracking.experiment")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "99")
    for name in tracking.CLIENT_ENV:
        if name != "MLFLOW_HTTP_REQUEST_TIMEOUT":
            monkeypatch.delenv(name, raising=False)
    tracker = tracking.Tracker(tracking.Settings.from_dict(JOB), params=lambda: {}, client=FakeMlflow()).start()
    tracker.close(timeout=30)
    assert os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] == "99"
    assert all(os.environ[k] == v for k, v in tracking.CLIENT_ENV.items() if k != "MLFLOW_HTTP_REQUEST_TIMEOUT")


def figures(event: events.Event, learning_rate: Any = None) -> dict[str, tuple[float, int, int]]:
    """The metrics `event` becomes: name -> (value, step, timestamp in ms)."""
    return {
        r.key: (r.value, r.step, r.timestamp_ms)
        for r in tracking.records_of(event, learning_rate)
        if isinstance(r, tracking._Metric)
    }


def test_every_figure_of_every_event_kind_is_named_stepped_and_timed_as_the_event() -> None:
    full = events.Step(rank=0, step=4, total_steps=9, loss=2.0, tokens_per_second=100.0,
                       tokens_per_second_per_device=25.0, mfu=0.4, step_seconds=0.5, peak_memory_bytes=1024, epoch=2,
                       samples_seen=64, time=1000.25)  # fmt: skip
    assert figures(full, lambda s: s / 10) == {
        "loss": (2.0, 4, 1000250), "learning_rate": (0.4, 4, 1000250), "tokens_per_second": (100.0, 4, 1000250),
        "tokens_per_second_per_device": (25.0, 4, 1000250), "mfu": (0.4, 4, 1000250),
        "step_seconds": (0.5, 4, 1000250), "peak_memory_bytes": (1024.0, 4, 1000250), "epoch": (2.0, 4, 1000250),
    }  # fmt: skip
    # Random data (no samples seen): no epoch; an unmeasured step time or memory is no figure, never 0.
    bare = events.Step(rank=0, step=1, total_steps=9, loss=1.0, tokens_per_second=None,
                       tokens_per_second_per_device=None, epoch=3, time=1.0)  # fmt: skip
    assert figures(bare) == {"loss": (1.0, 1, 1000)}
    assert figures(events.Evaluation(rank=0, step=6, loss=1.5, time=2.0)) == {"eval_loss": (1.5, 6, 2000)}
    timings = events.Timings(rank=0, to_first_step_seconds=9.0, startup_seconds=1.0, probe_seconds=2.0,
                             build_seconds=3.0, first_step_seconds=4.0, time=3.0)  # fmt: skip
    assert figures(timings) == {
        "time_to_first_step_seconds": (9.0, 0, 3000), "startup.startup_seconds": (1.0, 0, 3000),
        "startup.probe_seconds": (2.0, 0, 3000), "startup.build_seconds": (3.0, 0, 3000),
        "startup.first_step_seconds": (4.0, 0, 3000),
    }  # fmt: skip
    probe = events.Probe(rank=0, scope="cross-node", ranks=2, size_bytes=8, allreduce_busbw_gbps=10.0,
                         allgather_busbw_gbps=5.0, time=4.0)  # fmt: skip
    assert figures(probe) == {
        "probe.cross-node.allreduce_busbw_gbps": (10.0, 0, 4000),
        "probe.cross-node.allgather_busbw_gbps": (5.0, 0, 4000),
    }
    saved = tracking.records_of(events.Checkpoint(rank=0, step=8, path="s3://b/" + "c" * 6000, time=5.0))
    assert saved == [tracking._Tag("checkpoint.path", ("s3://b/" + "c" * 6000)[:5000]),
                     tracking._Metric("checkpoint_step", 8.0, 8, 5000)]  # fmt: skip
    assert tracking.records_of(events.Export(rank=0, step=9, path="s3://b/out")) == [tracking._Export("s3://b/out", 9)]
    summary = events.Summary(rank=0, steps=9, final_loss=0.5, first_loss=2.0, tokens_per_second=50.0, mfu=0.3,
                             seconds=12.0, time=6.0)  # fmt: skip
    records = tracking.records_of(summary)
    (document,) = [r for r in records if isinstance(r, tracking._Document)]
    assert document.name == "summary.json" and document.content["steps"] == 9 and "time" not in document.content
    assert figures(summary) == {
        "final_loss": (0.5, 0, 6000), "mean_tokens_per_second": (50.0, 0, 6000), "mean_mfu": (0.3, 0, 6000),
        "run_seconds": (12.0, 0, 6000),
    }  # fmt: skip
    # Another rank's summary or resolved values are not the run's: rank 0 speaks for the job.
    assert (
        tracking.records_of(events.Summary(rank=1, steps=9, final_loss=0.5, first_loss=2.0, tokens_per_second=1.0))
        == []
    )
    assert tracking.records_of(events.Resolved(rank=1, sharding="full", precision="bf16")) == []
    assert tracking.records_of(events.Resolved(rank=0, sharding="", precision="fp32")) == [
        tracking._Param("precision", "fp32")
    ]
    failed = tracking.records_of(events.Failure(rank=3, message="x" * 6000))
    assert failed == [tracking._Tag("failure", ("rank 3: " + "x" * 6000)[:5000])]


def test_metric_and_parameter_names_are_what_mlflow_takes() -> None:
    assert tracking.metric_name("grad norm/é:x") == "grad norm/__x"
    assert tracking.metric_name("m" * 300) == "m" * 250 and tracking.metric_name("") == "_"
    values = {"seq_len": 8, "data": {"path": "s3://b", "mix": [1, 2]}, "empty": {}, "name": "tiny",
              "long": "v" * 7000, "where": Path("/x"), "list": [{"b": 1, "a": 2}]}  # fmt: skip
    assert tracking.flat_params("train.", values) == {
        "train.seq_len": "8", "train.data.path": "s3://b", "train.data.mix": "[1, 2]", "train.empty": "{}",
        "train.name": "tiny", "train.long": "v" * 6000, "train.where": '"/x"', "train.list": '[{"a": 2, "b": 1}]',
    }  # fmt: skip


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        ({"experiment": "e", "run_name": "r"}, "tracking.uri must be a non-empty string."),
        ({"uri": "http://m", "run_name": "r"}, "tracking.experiment must be a non-empty string."),
        ({"uri": "http://m", "experiment": "e", "run_name": ""}, "tracking.run_name must be a non-empty string."),
        ({**SERVER, "token": "t"}, "tracking.token is not a known field (known: uri, experiment, run_name,"),
        ({**SERVER, "generation": "1"}, "tracking.generation must be an integer."),
        ({**SERVER, "attempt": True}, "tracking.attempt must be an integer."),
        ({**SERVER, "job": 3}, "tracking.job must be a string."),
        ({**SERVER, "param_names": {"seq_len": 1}}, "tracking.param_names must map strings to strings."),
        ({**SERVER, "param_names": ["seq_len"]}, "tracking.param_names must map strings to strings."),
        ({**SERVER, "uid": "u 1"}, "tracking.uid must be a Kubernetes uid (letters, digits, '-')."),
        ([], "tracking must be a mapping."),
    ],
)
def test_a_tracking_config_the_entrypoint_cannot_use_is_refused_naming_the_field(raw: Any, says: str) -> None:
    with pytest.raises(ValueError) as refused:
        tracking.Settings.from_dict(raw)
    assert str(refused.value).startswith(says)


def test_a_tracking_config_round_trips_and_names_each_parameter() -> None:
    settings = tracking.Settings.from_dict({**JOB, "uid": "", "param_names": {"seq_len": "training.seqLen"}})
    assert tracking.Settings.from_dict(settings.to_dict()) == settings
    assert settings.param_name("seq_len") == "training.seqLen" and settings.param_name("lr") == "train.lr"
    assert settings.is_server and tracking.Settings.from_dict({**JOB, "uri": "https://m"}).is_server
    assert not tracking.Settings.from_dict({**JOB, "uri": "/shared/mlruns"}).is_server


def test_rank_0_starts_the_tracker_with_the_runs_parameters_and_its_learning_rate(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    client = FakeMlflow()
    monkeypatch.setattr(mlflow.tracking, "MlflowClient", lambda tracking_uri, registry_uri: client)
    raw = {**JOB, "instance_type": "p5.48xlarge", "operator_version": "1.2.3"}
    train = {"model": "Qwen/Qwen2.5-0.5B", "data": "s3://b/data", "seq_len": 64}
    assert tracking.start(raw, train, world_size=4, rank=1) is None  # rank 0 only
    assert (
        tracking.start(None, train, world_size=4, rank=0) is None
        and tracking.start({}, train, world_size=4, rank=0) is None
    )
    tracker = tracking.start(
        raw, train, world_size=4, rank=0, learning_rate=lambda s: s / 100, fingerprint=lambda: "f1"
    )
    assert tracker is not None and tracker.rank == 0
    events.emit(step(3))
    tracker.close(timeout=30)
    (run,) = client.runs.values()
    assert run.params == {
        "train.model": "Qwen/Qwen2.5-0.5B", "train.data": "s3://b/data", "train.seq_len": "64",
        "model": "Qwen/Qwen2.5-0.5B", "data.source": "s3://b/data", "world_size": "4", "instance_type": "p5.48xlarge",
        "operator_version": "1.2.3", "job": "default/tiny", "fingerprint": "f1",
    }  # fmt: skip
    assert run.metrics["learning_rate"] == [(3, 0.03)]
    # What is not known is left out, never logged as "" or "None".
    bare = tracking.job_params(tracking.Settings.from_dict({**SERVER, "job": ""}), {}, world_size=1)
    assert bare == {"world_size": "1"}


def test_the_data_fingerprint_follows_what_decides_the_trajectory() -> None:
    base = tracking.data_fingerprint({"seq_len": 64, "seed": 1}, 2)
    assert len(base) == 16 and int(base, 16) >= 0
    assert tracking.data_fingerprint({"seed": 1, "seq_len": 64}, 2) == base
    assert tracking.data_fingerprint({"seq_len": 64, "seed": 1}, 4) != base
    assert tracking.data_fingerprint({"seq_len": 64, "seed": 2}, 2) != base
