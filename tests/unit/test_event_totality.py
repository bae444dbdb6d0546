"""Event lines can neither freeze nor fake a job: the parser, the verifier and the fold are total; every signer has
a sequence of its own; a Failure line always gets out; status only moves forward (docs/reliability.md)."""

from __future__ import annotations

import io
import json
import socket
import sys
from datetime import timedelta
from types import SimpleNamespace
from typing import Any
from urllib.error import URLError

import pytest
from fsdp_operator.decide.folding import fold_events
from fsdp_operator.decide.observed import RayJobInfo
from fsdp_operator.decide.status import TRANSPORT_DEADLINE_SECONDS, ConditionType, JobStatus, Phase, Reason
from fsdp_operator.runtime.log_lines import complete_lines
from fsdp_train.contract import events, failures
from fsdp_train.contract.events import (
    CONTROLLER,
    DRIVER,
    FORGED,
    MALFORMED,
    MAX_LINE_CHARS,
    Checkpoint,
    Event,
    Export,
    Failure,
    Signer,
    Step,
    Transport,
    Verifier,
    attempt_key,
    parse_event,
    parse_log,
)
from fsdp_train.contract.failures import failure_of
from fsdp_train.state.storage import DataUnavailable
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import event_mutations
from test_reconcile import NOW, at, condition, manifest, run, running, sid, with_network

KEY = attempt_key(b"k" * 32, "job-1a2b3c4d-1")
ANY_CHAR = st.characters(exclude_categories=())  # every code point, lone surrogates included
ANY_TEXT = st.text(ANY_CHAR, max_size=300)
OUTCOMES = (FORGED, MALFORMED, None)


def step(n: int = 1, rank: int = 0) -> Step:
    return Step(rank=rank, step=n, total_steps=10, loss=2.0, tokens_per_second=1.0, tokens_per_second_per_device=1.0,
                time=1e9)  # fmt: skip


def accepted(result: object) -> bool:
    return isinstance(result, Event)


# --- the parser and the verifier are total ----------------------------------------------------------------------

HOSTILE = [
    "FSDP_EVENT " + "é" * 64 + ' {"kind":"step"}',  # the key-less line: compare_digest raised TypeError
    "FSDP_EVENT " + "\ud800" * 64 + ' {"kind":"step"}',
    "FSDP_EVENT " + "0" * 63 + "\ud800" + ' {"kind":"step","rank":0}',
    "FSDP_EVENT " + "A" * 64 + ' {"kind":"step"}',  # upper case hex: not what hexdigest writes
    "FSDP_EVENT " + "0" * 64 + ' {"kind":"step","x":"\ud800"}',  # a lone surrogate reached line_mac
    "FSDP_EVENT " + "0" * 64 + ' {"kind":"\\ud800"}',
    "FSDP_EVENT " + "\x00" * 64 + " {\x00}",
    "FSDP_EVENT " + "0" * 64 + " " + "{" * 100_000,
    "FSDP_EVENT " + "0" * 64 + ' {"kind":"step","rank":' + "9" * 5000 + "}",  # past int's digit limit
    "x" * 10_000_000 + "FSDP_EVENT " + "é" * 64 + " {}",  # 10 MB
    "FSDP_EVENT " * 1_000_000,
    "\udcff\udcfe FSDP_EVENT \udc80",
    "",
    "\n",
]


@pytest.mark.parametrize("line", HOSTILE, ids=range(len(HOSTILE)))
def test_the_hostile_lines_raise_nothing_and_are_refused(line: str) -> None:
    assert parse_event(line, Verifier(KEY)) in OUTCOMES
    assert parse_event(line) in OUTCOMES
    assert parse_event(line.encode("utf-8", "surrogatepass"), Verifier(KEY)) in OUTCOMES  # bytes, as a log API may
    raw = line.encode("utf-8", "surrogateescape") if line.isascii() else b"\xff\xfe"
    parsed = parse_log([line, raw], Verifier(KEY))
    assert parsed.events == ()


def test_the_key_less_non_ascii_line_is_counted_forged() -> None:
    line = "FSDP_EVENT " + "é" * 64 + ' {"kind":"step"}'
    parsed = parse_log([line, step().to_line(Signer(KEY))], Verifier(KEY))
    assert (len(parsed.events), parsed.forged, parsed.malformed) == (1, 1, 0)
    folded = fold_events(job(), JobStatus(), parsed.events, now=NOW, forged=parsed.forged).status
    assert folded.forged_events == 1 and condition(folded, ConditionType.EVENTS_AUTHENTIC) == "False"


def test_a_mac_must_be_64_lowercase_hex_before_any_comparison() -> None:
    verifier = Verifier(KEY)
    text = '{"kind":"step"}'
    good = events.line_mac(KEY, text)
    assert verifier.authentic(good, text)
    for mac in (good.upper(), good[:-1], good + "0", good[:-1] + "g", good[:-1] + "é", good[:-1] + "\ud800", ""):
        assert not verifier.authentic(mac, text), mac
    assert not verifier.authentic(good, text + "\ud800") and not verifier.authentic(good, "é")
    assert len(events.line_mac(KEY, "\ud800")) == 64  # the MAC itself is total too
    assert not verifier.authentic(None, text) and not verifier.authentic(good, b"{}")  # not even text


@settings(max_examples=400, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(ANY_TEXT, st.binary(max_size=300)))
def test_any_text_or_bytes_is_read_without_raising(line: str | bytes) -> None:
    assert parse_event(line, Verifier(KEY)) in OUTCOMES  # nothing unsigned ever verifies
    loose = parse_event(line)
    assert loose in OUTCOMES or isinstance(loose, Event)


@settings(max_examples=400, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    mac=st.one_of(st.text(ANY_CHAR, min_size=64, max_size=64), st.text("0123456789abcdefABCDEF", min_size=64,
                                                                        max_size=64)),
    body=st.one_of(ANY_TEXT, st.recursive(st.none() | st.booleans() | st.floats() | st.integers() | ANY_TEXT,
                                          lambda inner: st.lists(inner) | st.dictionaries(ANY_TEXT, inner),
                                          max_leaves=20).map(json.dumps)),
    before=ANY_TEXT,
)  # fmt: skip
def test_any_event_shaped_line_is_read_without_raising(mac: str, body: str, before: str) -> None:
    line = f"{before}FSDP_EVENT {mac} {body}"
    assert parse_event(line, Verifier(KEY)) in OUTCOMES
    parsed = parse_log(line.splitlines())  # unverified: whatever parses goes into a fold, which must not raise
    fold_events(job(), JobStatus(), parsed.events, now=NOW, forged=parsed.forged)


SIGNED = [e.to_line(Signer(KEY, emitter=who)) for e in event_mutations.genuine_events() for who in ("", DRIVER)]


@settings(max_examples=600, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(line=st.sampled_from(SIGNED), seed=st.integers(0, 2**32), char=ANY_CHAR, at=st.integers(0, 10_000))
def test_a_mutated_signed_line_never_verifies(line: str, seed: int, char: str, at: int) -> None:
    import random

    mutated = event_mutations.mutate(line, random.Random(seed))
    first = line.index("FSDP_EVENT ") + len("FSDP_EVENT ")
    place = first + at % (len(line) - 1 - first)
    for candidate in (mutated, line[:place] + char + line[place + 1 :]):
        if candidate == line:
            continue
        assert not accepted(parse_event(candidate, Verifier(KEY))), candidate
    assert accepted(parse_event(line, Verifier(KEY)))  # the line itself does


def test_a_sample_of_random_mutations_raises_nothing_and_none_verifies() -> None:
    figures = event_mutations.run(3_000, seed=1)
    assert (figures.raised, figures.verified, figures.folded, figures.fold_raised) == (0, 0, 0, 0), figures.errors
    assert figures.forged + figures.unread == figures.tried == 3_000


@pytest.mark.slow
def test_fifty_thousand_random_mutations_raise_nothing_and_none_verifies() -> None:
    figures = event_mutations.run(50_000, seed=0)
    assert (figures.raised, figures.verified, figures.folded, figures.fold_raised) == (0, 0, 0, 0), figures.errors
    assert figures.forged == 50_000


# --- the emitter owns its line ---------------------------------------------------------------------------------


@pytest.mark.parametrize("before", ["FSDP_EVENT ", "loss=", "FSDP_EVENT " + "0" * 64 + " {", "é\ud800\x00" * 10])
def test_a_genuine_line_after_an_unterminated_user_line_verifies(before: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """User code printed text without a newline just before the emitter's line: both arrive in one stream."""
    out = io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(events, "_signer", Signer(KEY))
    print(before, end="")
    events.emit(step())
    lines = [f"(RayTrainWorker pid=1, ip=10.0.0.1) {line}" for line in out.getvalue().splitlines()]
    assert parse_log(lines, Verifier(KEY)).events == (step(),)
    # And when the two do share one line (a reader that lost the newline, another writer): the event is found after
    # the text before it.
    joined = before + step(2).to_line(Signer(KEY))
    assert parse_event(joined, Verifier(KEY)) == step(2)


@pytest.mark.parametrize("length", [MAX_LINE_CHARS, MAX_LINE_CHARS * 4, 3_000_000])
def test_a_long_unfinished_line_never_hides_the_next_event(length: int) -> None:
    line = "x" * length + "FSDP_EVENT " + step().to_line(Signer(KEY))
    assert parse_event(line, Verifier(KEY)) == step()
    # Longer than a whole chunk of log: the operator skips it over several reads, counts it, and reads its end.
    loop = SimpleNamespace(long_lines={})
    log = "before\n" + line + "\n" + step(2).to_line(Signer(KEY)) + "\n"
    verifier, offset, found, skipped, chunk_size = Verifier(KEY), 0, [], 0, 256 * 1024
    while offset < len(log):
        chunk = log[offset : offset + chunk_size]
        text, consumed, over = complete_lines(loop.long_lines, chunk, full=len(chunk) >= chunk_size, final=True,  # type: ignore[arg-type]
                                                       offset=offset)  # fmt: skip
        parsed = parse_log(text.splitlines(), verifier)
        found += parsed.events
        skipped += over + parsed.malformed
        assert parsed.forged == 0
        offset += consumed
    assert found == [step(), step(2)]
    assert skipped == (1 if length + 200 > chunk_size else 0)


def test_a_repeated_read_of_a_long_line_reads_alike() -> None:
    """A pass whose status write failed reads the same offset again: the long line's end is found the same way."""
    loop = SimpleNamespace(long_lines={})
    chunk = "y" * 1000
    assert complete_lines(loop.long_lines, chunk, full=True, final=False, offset=0) == ("", 1000, 1)
    end = "tail FSDP_EVENT x\nnext\n"
    first = complete_lines(loop.long_lines, end, full=False, final=False, offset=1000)
    again = complete_lines(loop.long_lines, end, full=False, final=False, offset=1000)
    assert first == again and first[0].endswith("yyyytail FSDP_EVENT x\nnext\n")


# --- a Failure line always gets out; only the project's own errors carry one of the project's reasons -------------


class Borrowed(RuntimeError):
    """A model repository's exception that happens to have a `reason`."""

    reason = "DataUnavailable"


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no")


def test_only_the_projects_own_exceptions_carry_a_reason_of_the_projects() -> None:
    assert failure_of(0, DataUnavailable("gone")).reason == "DataUnavailable"
    assert failure_of(0, Borrowed("not ours")).reason == "Borrowed"  # its type, never its attribute
    look_alike = type("DataUnavailable", (RuntimeError,), {"reason": "DataUnavailable"})
    assert failure_of(0, look_alike()).reason == failures.OTHER_ERROR  # nor a class named like a reason
    assert failure_of(0, ValueError("x")).reason == "ValueError"  # every failure has a reason
    # Ray re-raises a task's error as a class derived from both (RayTaskError(DataUnavailable)): still the project's.
    dual = type("RayTaskError(DataUnavailable)", (DataUnavailable, RuntimeError), {"__module__": "ray.exceptions"})
    assert failure_of(0, dual("gone")).reason == "DataUnavailable"


@pytest.mark.parametrize(
    "error",
    [URLError(socket.gaierror(-2, "Name or service not known")), Unprintable(), ValueError("x" * 100_000),
     OSError(b"\xff bytes", object()), KeyError(("é", "\ud800"))],
    ids=["URLError(gaierror)", "unprintable", "huge", "odd args", "surrogate"],
)  # fmt: skip
def test_any_exception_gives_a_failure_line_that_verifies(error: BaseException) -> None:
    line = failure_of(3, error).to_line(Signer(KEY))
    event = parse_event(line, Verifier(KEY))
    assert isinstance(event, Failure) and event.rank == 3 and event.reason == type(error).__name__
    assert event.message.startswith(type(error).__name__)
    if isinstance(error, URLError):
        assert "Name or service not known" in event.message


def test_a_field_json_cannot_carry_goes_out_as_its_text() -> None:
    """URLError's `reason` is an exception object: the emitter printed nothing and raised TypeError."""
    gai = socket.gaierror(-2, "Name or service not known")
    line = Failure(rank=1, message="m", reason=gai, time=1e9).to_line(Signer(KEY))  # type: ignore[arg-type]
    event = parse_event(line, Verifier(KEY))
    assert isinstance(event, Failure) and "Name or service not known" in event.reason


def test_a_field_longer_than_its_bound_is_cut_by_the_emitter() -> None:
    """A line past MAX_LINE_CHARS would be skipped: the emitter cuts every string to the bound the parser keeps."""
    line = Failure(rank=1, message="x" * 100_000, time=1e9).to_line(Signer(KEY))
    event = parse_event(line, Verifier(KEY))
    assert len(line) < MAX_LINE_CHARS and isinstance(event, Failure) and event.message.endswith(events.TRUNCATED)


def test_a_urlerror_in_a_rank_fails_the_job_with_a_message_naming_it() -> None:
    error = URLError(socket.gaierror(-2, "Name or service not known"))
    line = failure_of(1, error).to_line(Signer(KEY))
    parsed = parse_log([line], Verifier(KEY))
    info = RayJobInfo(sid(1), "FAILED", "Job entrypoint command failed with exit code 1")
    d = run(manifest(), at(Phase.RUNNING), **running(ray_job=info, events=parsed.events))
    assert (d.status.phase, d.status.reason) == (Phase.FAILED, Reason.RAY_JOB_FAILED)
    assert "rank 1: URLError" in d.status.message and "Name or service not known" in d.status.message
    borrowed = parse_log([failure_of(1, Borrowed("x")).to_line(Signer(KEY))], Verifier(KEY)).events
    d = run(manifest(), at(Phase.RUNNING), **running(events=borrowed))
    assert d.status.reason != Reason.DATA_UNAVAILABLE and d.status.phase == Phase.RUNNING


# --- every signer has its own sequence ----------------------------------------------------------------------------


def test_interleaved_signers_in_any_order_are_all_accepted_and_a_replay_is_not() -> None:
    """Rank 0, rank 1, the driver (rank 0 too) and the controller (rank 0 too) each sign with their own clock; their
    lines reach the log by different paths, so any order between signers is possible."""
    clocks = {"rank0": 5_000, "rank1": 1_000, "driver": 9_000, "controller": 3_000}
    signers = {
        "rank0": (Signer(KEY, clock_ns=lambda: clocks["rank0"] * 1000), 0),
        "rank1": (Signer(KEY, clock_ns=lambda: clocks["rank1"] * 1000), 1),
        "driver": (Signer(KEY, clock_ns=lambda: clocks["driver"] * 1000, emitter=DRIVER), 0),
        "controller": (Signer(KEY, clock_ns=lambda: clocks["controller"] * 1000, emitter=CONTROLLER), 0),
    }
    per_signer = {name: [step(n, rank).to_line(s) for n in range(1, 4)] for name, (s, rank) in signers.items()}
    import itertools
    import random

    rng = random.Random(7)
    for _ in range(200):
        # Any interleaving that keeps each signer's own order (one process's output is in order).
        queues = {name: list(lines) for name, lines in per_signer.items()}
        order = []
        while any(queues.values()):
            name = rng.choice([n for n, q in queues.items() if q])
            order.append(queues[name].pop(0))
        parsed = parse_log(order, Verifier(KEY))
        assert (len(parsed.events), parsed.forged) == (12, 0)
    for name, lines in per_signer.items():
        verifier = Verifier(KEY)
        parse_log(list(itertools.chain.from_iterable(per_signer.values())), verifier)
        assert parse_event(lines[1], verifier) is FORGED, name  # a true replay, within its signer


def test_the_driver_signs_in_a_sequence_of_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """The driver's DataUnavailable says rank 0, as rank 0's own lines do: it must not share rank 0's sequence."""
    from fsdp_train.run import ray_entry

    def fails(job: Any) -> dict[str, Any]:
        raise DataUnavailable("data source s3://b/d does not exist")

    monkeypatch.setenv(events.KEY_ENV, KEY.hex())
    monkeypatch.setattr(ray_entry, "run", fails)
    monkeypatch.setattr(events, "_signer", None)
    for name in ray_entry.RAY_LOG_ENV:
        monkeypatch.delenv(name, raising=False)  # main sets them; the monkeypatch puts them back
    out = io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    assert ray_entry.main(["--config-json", "{}"]) == 1
    (line,) = [line for line in out.getvalue().splitlines() if line]
    assert json.loads(line.split(" ", 2)[2])["emitter"] == DRIVER
    rank0 = Signer(KEY, clock_ns=lambda: 8 * 10**18)  # rank 0 printed later numbers before the driver's line arrived
    verifier = Verifier(KEY)
    assert isinstance(parse_event(step().to_line(rank0), verifier), Step)
    failure = parse_event(line, verifier)
    assert isinstance(failure, Failure) and failure.reason == "DataUnavailable"


def test_the_controller_callback_signs_as_the_controller(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("ray.train")
    from fsdp_train.run.ray_entry import reported_metrics_callback

    monkeypatch.delenv(events.KEY_ENV, raising=False)
    out = io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(events, "_signer", None)
    callback = reported_metrics_callback(None, KEY.hex())  # the key comes with the callback, not the environment
    callback.after_report(None, [{"step": 1, "loss": 1.5}], None)
    lines = [line for line in out.getvalue().splitlines() if line]
    assert lines and all('"emitter":"controller"' in line for line in lines)
    assert all(isinstance(parse_event(line, Verifier(KEY)), Step) for line in lines)


def test_take_key_leaves_no_copy_in_the_job_config_ray_hands_every_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    job_config = {"runtime_env": {"env_vars": {events.KEY_ENV: KEY.hex(), "OTHER": "1"}, "pip": ["x"]}, "metadata": {}}
    env = {events.KEY_ENV: KEY.hex(), events.RAY_JOB_CONFIG_ENV: json.dumps(job_config)}
    monkeypatch.setattr(events, "_signer", None)
    assert events.take_key(env, emitter=DRIVER)
    assert events.KEY_ENV not in env and KEY.hex() not in json.dumps(env)
    rest = json.loads(env[events.RAY_JOB_CONFIG_ENV])
    assert rest == {"runtime_env": {"env_vars": {"OTHER": "1"}, "pip": ["x"]}, "metadata": {}}
    assert events.signing_key() == KEY.hex()
    for odd in ("not json", "[]", '{"runtime_env": 3}', '{"runtime_env": {"env_vars": []}}'):
        same = {events.RAY_JOB_CONFIG_ENV: odd}
        events.take_key(same)
        assert same == {events.RAY_JOB_CONFIG_ENV: odd}


def test_with_key_signs_in_the_worker_with_the_key_it_carries(monkeypatch: pytest.MonkeyPatch) -> None:
    from fsdp_train.run.ray_entry import with_key

    monkeypatch.setattr(events, "_signer", None)
    monkeypatch.setenv(events.KEY_ENV, "leftover")

    def rank(config: dict[str, Any]) -> str:
        return Step(rank=config["rank"], step=1, total_steps=2, loss=1.0, tokens_per_second=1.0,
                    tokens_per_second_per_device=1.0).to_line(events._signer)  # fmt: skip

    line = with_key(rank, KEY.hex())({"rank": 1})
    assert isinstance(parse_event(line, Verifier(KEY)), Step)
    import os

    assert events.KEY_ENV not in os.environ


# --- status only moves forward ----------------------------------------------------------------------------------


def job() -> Any:
    from fsdp_operator.api.spec import parse_job

    return parse_job(manifest())


def test_an_older_checkpoint_or_export_never_replaces_a_newer_one() -> None:
    newer = (Checkpoint(rank=0, step=8, path="s3://b/step_8"), Export(rank=0, step=8, path="s3://b/hf-8"))
    older = (Checkpoint(rank=0, step=1, path="s3://b/step_1"), Export(rank=0, step=1, path="s3://b/hf-1"))
    status = fold_events(job(), JobStatus(), newer, now=NOW).status
    # After an operator restart the status is read back from the API server, and older genuine lines replayed.
    restarted = JobStatus.from_dict(status.to_dict())
    again = fold_events(job(), restarted, older, now=NOW).status
    assert (again.checkpoint["step"], again.output["step"]) == (8, 8)
    assert (again.checkpoint["path"], again.output["path"]) == ("s3://b/step_8", "s3://b/hf-8")
    resumed = fold_events(job(), again, (Checkpoint(rank=0, step=8, path="s3://b/step_8", resumed=True),), now=NOW)
    assert resumed.status.checkpoint.get("resumed") is True  # the same step, read again, still lands


# --- tests that notice the changes the last round's tests did not ---------------------------------------------------


def test_a_new_attempt_starts_without_the_previous_attempts_forged_lines() -> None:
    m = manifest(backoffLimit=1)
    forged = run(m, at(Phase.RUNNING, reason=Reason.JOB_RUNNING), **running(forged_lines=3))
    assert forged.status.forged_events == 3
    assert condition(forged.status, ConditionType.EVENTS_AUTHENTIC) == "False"
    retry = run(m, forged.status, **running(ray_job=RayJobInfo(sid(1), "FAILED", "boom")))
    assert retry.status.reason == Reason.RETRYING
    assert retry.status.forged_events == 0 and condition(retry.status, ConditionType.EVENTS_AUTHENTIC) == ""


def efa_job(replicas: int) -> dict[str, Any]:
    m = with_network(manifest(), transport="efa", requireEFA=True)
    m["spec"]["workers"]["replicas"] = replicas
    return m


def first_step_seconds_ago(seconds: float) -> JobStatus:
    first = (NOW - timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")
    return at(Phase.RUNNING, reason=Reason.JOB_RUNNING, progress={"step": 1, "firstStepTime": first})


def test_require_efa_fails_exactly_at_its_deadline() -> None:
    m = efa_job(2)
    on_time = run(m, first_step_seconds_ago(TRANSPORT_DEADLINE_SECONDS), **running())
    assert (on_time.status.phase, on_time.status.reason) == (Phase.FAILED, Reason.TRANSPORT_UNVERIFIED)
    early = run(m, first_step_seconds_ago(TRANSPORT_DEADLINE_SECONDS - 1), **running())
    assert early.status.phase == Phase.RUNNING


def test_none_is_no_verdict_on_a_multi_node_job() -> None:
    for replicas, phase in ((2, Phase.FAILED), (1, Phase.RUNNING)):
        m = efa_job(replicas)
        from fsdp_operator.api.spec import parse_job

        world = parse_job(m).spec.workers.world_size
        intra = tuple(Transport(rank=r, transport="none") for r in range(world))
        d = run(m, first_step_seconds_ago(TRANSPORT_DEADLINE_SECONDS), **running(events=intra))
        assert d.status.phase == phase, (replicas, d.status.message)
        if phase == Phase.FAILED:
            assert d.status.reason == Reason.TRANSPORT_UNVERIFIED


def test_a_line_nested_past_the_interpreters_stack_is_malformed_never_an_exception() -> None:
    """The JSON decoder raises RecursionError on nesting deeper than Python's stack: the parser's promise that no
    line raises rests on catching it, for a signed-looking line and an unsigned one alike."""
    deep = "FSDP_EVENT " + '{"kind":' + "[" * 30_000
    assert isinstance(events.parse_event(deep), events.Malformed)
    assert events.parse_line(deep) is None
    verifier = events.Verifier(KEY)
    assert isinstance(events.parse_event(deep, verifier), events.Forged)


def test_a_foreign_reason_on_a_project_error_is_never_signed_as_its_own() -> None:
    """`DataUnavailable` carrying `reason = "Completed"` (any text a caller set) fails as DataUnavailable: only the
    project's own reasons may come from an instance's attribute."""
    error = DataUnavailable("no documents")
    error.reason = "Completed"  # type: ignore[misc]
    assert failures.own_reason(error) == "DataUnavailable"
    assert failure_of(0, error).reason == "DataUnavailable"
    error.reason = "PreflightFailed"  # type: ignore[misc]  # one of the project's own reasons: the code gave it
    assert failures.own_reason(error) == "PreflightFailed"
