"""A user's function behind the wrapper, in this process (no Ray): the reports before it, its failures, and
what its ``ray.train.report`` metrics become (``fsdp_train.run.user_function``).

The functions are a package of their own, tests/data/byo/byo_checks, found through ``code`` as a job finds its.
The same functions under Ray and the operator run in tests/e2e/test_byo_function.py.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fsdp_train.contract import events
from fsdp_train.contract.events import (
    FORGED,
    KEY_ENV,
    MAX_EXTRA,
    TEXT_LIMITS,
    Checkpoint,
    Evaluation,
    Event,
    Failure,
    Placement,
    Probe,
    Step,
    Transport,
    Verifier,
    parse_event,
    parse_log,
)
from fsdp_train.models.parallelize import Topology
from fsdp_train.run.user_function import (
    FunctionConfig,
    checkpoint_uri,
    events_from_report,
    failure,
    load_callable,
    run_user_function,
)
from fsdp_train.watch import report

CODE = str(Path(__file__).resolve().parents[2] / "data" / "byo")
KEY = bytes(range(32))


@pytest.fixture
def signed() -> Iterator[Verifier]:
    """This process signs as a rank of an attempt does; the verifier of that attempt."""
    assert events.take_key({KEY_ENV: KEY.hex()})
    try:
        yield Verifier(KEY)
    finally:
        events._signer = None


def run(target: str, topo: Topology, config: dict[str, Any] | None = None) -> Any:
    function = FunctionConfig(callable=target, code=CODE, config=config or {}, probe_size_bytes=4096)

    def verify() -> object:
        env = {"POD_NAME": "pod-0"}
        return report.verify_link(
            topo, node_ip="10.0.0.1", device=report.rank_device(topo), env=env, probe_size_bytes=4096
        )

    return run_user_function(function, topo.rank, verify)


def read(out: str, verifier: Verifier) -> tuple[list[Event], int]:
    parsed = parse_log(out.splitlines(), verifier)
    return list(parsed.events), parsed.forged


def test_the_ranks_report_first_then_the_function_runs_on_its_own_copy_of_config(
    one_rank: Topology, signed: Verifier, capsys: pytest.CaptureFixture[str]
) -> None:
    config = {"lr": 0.1}
    assert run("byo_checks.plain:echo", one_rank, config) == {"lr": 0.1, "seen": True}
    assert config == {"lr": 0.1}
    seen, forged = read(capsys.readouterr().out, signed)
    assert forged == 0
    assert [type(e) for e in seen] == [Placement, Transport]  # one rank: no probe to make
    placement, transport = seen
    assert isinstance(placement, Placement) and (placement.pod, placement.node_ip, placement.device) == (
        "pod-0",
        "10.0.0.1",
        "cpu",
    )
    assert isinstance(transport, Transport) and transport.transport == "socket"


def test_a_raising_function_is_this_ranks_failure_with_its_type_message_and_frames(
    one_rank: Topology, signed: Verifier, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(ValueError, match="gave up: because"):
        run("byo_checks.plain:raises", one_rank, {"why": "because"})
    seen, _ = read(capsys.readouterr().out, signed)
    (fail,) = [e for e in seen if isinstance(e, Failure)]
    assert fail.rank == 0
    assert fail.message.startswith("ValueError: the user's code gave up: because | at plain.py:")
    assert "in raises: _deeper(" in fail.message and "in _deeper: raise ValueError" in fail.message
    assert "user_function.py" not in fail.message  # the wrapper's own frames are not the story


def test_lines_the_function_prints_are_refused_and_its_own_reports_still_verify(
    one_rank: Topology, signed: Verifier, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run("byo_checks.plain:forges", one_rank) == "printed"
    out = capsys.readouterr().out
    seen, forged = read(out, signed)
    assert forged == 3  # each forged line, and nothing it claims
    assert [type(e) for e in seen] == [Placement, Transport]
    assert not any(isinstance(e, Failure | Step) for e in seen)
    # The function's three printed lines are the ones that do not verify (not a text match: the genuine lines' own
    # timestamps and MACs may hold "999" or a run of zeros).
    event_lines = [line for line in out.splitlines() if line.startswith("FSDP_EVENT ")]
    forged_lines = [line for line in event_lines if parse_event(line, Verifier(KEY)) is FORGED]
    assert len(forged_lines) == 3 and len(event_lines) == 3 + len(seen)
    assert [
        "forged: data is gone" in forged_lines[0],
        "0" * 64 in forged_lines[1],
        '"step":999' in forged_lines[2],
    ] == [True] * 3


def test_a_callable_that_does_not_import_is_the_ranks_failure(
    one_rank: Topology, signed: Verifier, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(ModuleNotFoundError):
        run("byo_checks.missing:train", one_rank)
    seen, _ = read(capsys.readouterr().out, signed)
    (fail,) = [e for e in seen if isinstance(e, Failure)]
    assert fail.message.startswith("ModuleNotFoundError: No module named 'byo_checks.missing'")
    # The link was verified before the user's code was imported.
    assert [type(e) for e in seen] == [Placement, Transport, Failure]


def test_load_callable_finds_methods_and_refuses_what_cannot_be_called(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "path", list(sys.path))
    assert load_callable("byo_checks.plain:Trainer.run", CODE)({"a": 1}) == 1
    assert sys.path[0] == CODE
    load_callable("byo_checks.plain:echo", CODE)
    assert sys.path.count(CODE) == 1
    with pytest.raises(TypeError, match=r"byo_checks\.plain:NOT_A_FUNCTION is a int, not a function"):
        load_callable("byo_checks.plain:NOT_A_FUNCTION", CODE)
    with pytest.raises(AttributeError):
        load_callable("byo_checks.plain:nothing", CODE)
    before = list(sys.path)
    load_callable("byo_checks.plain:echo", "s3://bucket/code.zip")  # Ray unpacked it into the working directory
    assert sys.path == before


def test_the_failure_message_is_bounded_and_one_line() -> None:
    try:
        raise RuntimeError("x" * 5000 + "\n\x1b[31mred\x1b[0m")
    except RuntimeError as e:
        fail = failure(3, e)
    assert fail.rank == 3 and len(fail.message) <= TEXT_LIMITS["message"]
    assert fail.message.startswith("RuntimeError: xxx") and "| at test_user_function.py:" in fail.message
    assert "\x1b" not in fail.message and "\n" not in fail.message
    line = fail.to_line()
    parsed = parse_event(line)
    assert isinstance(parsed, Failure) and parsed.message == fail.message


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ([], "function must be a mapping."),
        ({"callable": "a.b:c", "extra": 1}, "function.extra is not a known field"),
        ({"callable": "a.b"}, "function.callable must be 'package.module:function'"),
        ({"callable": "a:b", "code": 3}, "function.code must be a string"),
        ({"callable": "a:b", "config": [1]}, "function.config must be a mapping."),
        ({"callable": "a:b", "probe_size_bytes": -1}, "function.probe_size_bytes must be an integer of 0 or more"),
    ],
)
def test_function_config_names_each_bad_field(config: Any, message: str) -> None:
    with pytest.raises(ValueError) as raised:
        FunctionConfig.from_dict(config)
    assert str(raised.value).startswith(message)


# --- what the controller makes of ray.train.report's metrics --------------------------------------------


def test_the_standard_metrics_fill_the_step_and_the_rest_are_extra() -> None:
    got = events_from_report(
        {
            "step": 7,
            "total_steps": 10,
            "loss": 2.5,
            "tokens": 7000,
            "tokens_per_second": 4000.0,
            "eval_loss": 2.75,
            "lr": 1e-3,
            "note": "not a number",
            "flag": True,
        },
        reports=3,
        world_size=4,
        checkpoint_path="/ckpt/run/checkpoint_1",
    )
    step, evaluation, checkpoint = got
    assert isinstance(step, Step) and (step.step, step.total_steps, step.loss, step.tokens_seen) == (7, 10, 2.5, 7000)
    assert (step.tokens_per_second, step.tokens_per_second_per_device) == (4000.0, 1000.0)
    assert step.extra == {"lr": 1e-3}  # strings and booleans are no metrics
    assert isinstance(evaluation, Evaluation) and (evaluation.step, evaluation.loss) == (7, 2.75)
    assert isinstance(checkpoint, Checkpoint) and (checkpoint.step, checkpoint.path) == (7, "/ckpt/run/checkpoint_1")


@pytest.mark.parametrize(
    ("metrics", "step", "total"),
    [
        ({"iteration": 4.0}, 4, 0),  # an integral float counts
        ({"step": 0, "iteration": 2}, 2, 0),  # step 0 is no step: the next key
        ({"step": -1}, 5, 0),  # else the count of reports
        ({"step": 2.5}, 5, 0),
        ({"step": 10**30}, 5, 0),
        ({"step": float("nan")}, 5, 0),
        ({"step": 3, "total_steps": 2}, 3, 0),  # a total below the step is no total
        ({"step": 3, "total_steps": "10"}, 3, 0),
    ],
)
def test_the_step_comes_from_step_or_iteration_else_the_count_of_reports(
    metrics: dict[str, Any], step: int, total: int
) -> None:
    (event,) = events_from_report(metrics, reports=5, world_size=1, checkpoint_path=None)
    assert isinstance(event, Step) and (event.step, event.total_steps) == (step, total)
    assert event.loss is None and event.tokens_per_second is None  # not reported: absent from the status


def test_extra_metrics_are_bounded_and_survive_the_wire() -> None:
    metrics: dict[Any, Any] = {f"m{i:03d}": float(i) for i in range(100)}
    metrics["x" * 500] = 1.0
    metrics["\x1b[31mred"] = 2.0
    metrics[7] = 3.0  # not a name
    (event,) = events_from_report(metrics, reports=1, world_size=1, checkpoint_path=None)
    assert isinstance(event, Step) and len(event.extra) == MAX_EXTRA
    # In the order of the names as reported, each cleaned of control sequences and cut to its bound.
    assert list(event.extra) == ["red", *(f"m{i:03d}" for i in range(MAX_EXTRA - 1))]
    (long,) = events_from_report({"x" * 500: 1.0}, reports=1, world_size=1, checkpoint_path=None)
    assert isinstance(long, Step) and [len(k) for k in long.extra] == [events.MAX_EXTRA_KEY]
    parsed = parse_event(event.to_line())
    assert isinstance(parsed, Step) and parsed.extra == event.extra


def test_a_non_finite_figure_of_a_report_is_left_out_never_nan_on_the_wire() -> None:
    """A grad norm of NaN (clipping off) or an infinite figure once reached the wire as `"grad_norm":NaN`."""
    metrics = {"loss": 1.5, "grad_norm": float("nan"), "big": float("inf"), "small": float("-inf"), "ok": 2.0}
    (event,) = events_from_report(metrics, reports=1, world_size=2, checkpoint_path=None)
    assert isinstance(event, Step) and event.extra == {"ok": 2.0}
    line = event.to_line()
    assert "NaN" not in line and "Infinity" not in line
    parsed = parse_event(line)
    assert isinstance(parsed, Step) and parsed.extra == {"ok": 2.0}


@pytest.mark.parametrize(
    "extra",
    [{f"k{i}": 1.0 for i in range(MAX_EXTRA + 1)}, {"a": "1"}, {"a": True}, {"": 1.0}, ["a"], {"a": {"b": 1}}],
)
def test_the_parser_refuses_an_extra_field_out_of_its_bounds(extra: Any) -> None:
    step = Step(rank=0, step=1, total_steps=1, loss=1.0, tokens_per_second=1.0, tokens_per_second_per_device=1.0)
    line = step.to_line().replace('"extra":{}', f'"extra":{__import__("json").dumps(extra)}')
    assert parse_event(line) is events.MALFORMED


def test_checkpoint_uri_puts_back_the_storage_scheme() -> None:
    assert checkpoint_uri("s3://bucket/runs", "bucket/runs/job/checkpoint_1") == "s3://bucket/runs/job/checkpoint_1"
    assert checkpoint_uri("/shared/ckpt", "/shared/ckpt/job/checkpoint_1") == "/shared/ckpt/job/checkpoint_1"
    assert checkpoint_uri(None, "/home/ray/ray_results/job/c") == "/home/ray/ray_results/job/c"


def test_the_controllers_lines_rise_on_their_own() -> None:
    """The controller's lines and rank 0's reach the log by different paths: an earlier seq of one after a later
    of the other is no replay. A replay within one emitter still is."""
    rank_signer = events.Signer(KEY, clock_ns=lambda: 2_000_000_000)
    controller = events.Signer(KEY, clock_ns=lambda: 3_000_000_000, emitter=events.CONTROLLER)
    step = Step(rank=0, step=1, total_steps=0, loss=1.0, tokens_per_second=0.0, tokens_per_second_per_device=0.0)
    probe = Probe(rank=0, scope="all", ranks=2, size_bytes=8, allreduce_busbw_gbps=1.0, allgather_busbw_gbps=1.0)
    late_step, early_probe = step.to_line(controller), probe.to_line(rank_signer)
    verifier = Verifier(KEY)
    assert isinstance(parse_event(late_step, verifier), Step)
    assert isinstance(parse_event(early_probe, verifier), Probe)
    assert parse_event(late_step, verifier) is FORGED and parse_event(early_probe, verifier) is FORGED
    bogus = events.Signer(KEY, emitter="someone-else")
    assert parse_event(probe.to_line(bogus), Verifier(KEY)) is FORGED
