"""Signed event lines: only the key holder of this attempt writes lines the operator folds (docs/reliability.md)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
from fsdp_operator.api import schema
from fsdp_operator.api.spec import parse_job
from fsdp_operator.decide.folding import fold_events
from fsdp_operator.decide.status import RANK_FAILURES_KEPT, JobStatus
from fsdp_train.contract import events
from fsdp_train.contract.events import (
    FORGED,
    KEY_ENV,
    MALFORMED,
    Failure,
    Signer,
    Step,
    Verifier,
    attempt_key,
    parse_event,
    parse_log,
    take_key,
)

KEY = attempt_key(b"k" * 32, "qwen-1a2b3c4d-1")
TRAINING = Path(__file__).resolve().parents[2] / "training"


def step(n: int = 1) -> Step:
    return Step(rank=0, step=n, total_steps=10, loss=2.0, tokens_per_second=1.0, tokens_per_second_per_device=1.0,
                time=1e9)  # fmt: skip


def test_a_signed_line_verifies_and_anything_else_is_forged() -> None:
    line = step().to_line(Signer(KEY))
    assert parse_event(line, Verifier(KEY)) == parse_event(line)
    assert parse_event(step().to_line(), Verifier(KEY)) is FORGED  # unsigned: any print() writes these
    assert parse_event(line.replace('"loss":2.0', '"loss":0.5'), Verifier(KEY)) is FORGED  # a field changed
    other_attempt = attempt_key(b"k" * 32, "qwen-1a2b3c4d-2")
    assert parse_event(step().to_line(Signer(other_attempt)), Verifier(KEY)) is FORGED
    assert parse_event("FSDP_EVENT " + "0" * 64 + " {}", Verifier(KEY)) is FORGED
    assert parse_event("FSDP_EVENT nothex {", Verifier(KEY)) is FORGED
    assert parse_event("plain output", Verifier(KEY)) is None
    # Without a verifier (local tools reading their own logs) both forms are read.
    assert parse_event(line) == parse_event(step().to_line())


def test_a_replayed_line_is_refused_and_a_restarted_emitter_goes_on() -> None:
    verifier = Verifier(KEY)
    first = Signer(KEY)
    a, b = step(1).to_line(first), step(2).to_line(first)
    assert parse_event(a, verifier) != FORGED and parse_event(b, verifier) != FORGED
    assert parse_event(a, verifier) is FORGED and parse_event(b, verifier) is FORGED
    # Ray Train restarted the group: a new process, a new signer, its numbers above the old ones (clock-based).
    time.sleep(0.001)
    assert parse_event(step(3).to_line(Signer(KEY)), verifier) != FORGED


def test_a_signed_line_that_does_not_parse_is_malformed_not_forged() -> None:
    text = '{"kind":"step","rank":0,"seq":5}'
    line = f"FSDP_EVENT {events.line_mac(KEY, text)} {text}"
    assert parse_event(line, Verifier(KEY)) is MALFORMED
    parsed = parse_log([line, step().to_line(), step().to_line(Signer(KEY))], Verifier(KEY))
    assert (len(parsed.events), parsed.malformed, parsed.forged) == (1, 1, 1)


def test_take_key_removes_the_key_from_the_environment() -> None:
    env = {KEY_ENV: KEY.hex(), "OTHER": "1"}
    try:
        assert take_key(env) and env == {"OTHER": "1"}
        assert parse_event(events._signer.line({"v": 1, **events.as_dict(step())}), Verifier(KEY)) != FORGED  # type: ignore[union-attr]
    finally:
        events._signer = None
    assert not take_key({KEY_ENV: "zz"}) and not take_key({KEY_ENV: "00"})


@pytest.mark.parametrize("encoding", ["utf-16", "cp037", "utf-8"])
def test_emit_survives_any_stdout_encoding(encoding: str) -> None:
    """PYTHONIOENCODING=utf-16 garbled every event line: the emitter writes ASCII bytes past the text layer."""
    code = (
        "from fsdp_train.contract import events\n"
        "events.take_key()\n"
        "print('before')\n"
        "events.emit(events.Step(rank=0, step=1, total_steps=10, loss=2.0, tokens_per_second=1.0,"
        " tokens_per_second_per_device=1.0))\n"
        "import os, sys; sys.exit(3 if 'FSDP_EVENT_KEY' in os.environ else 0)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(TRAINING), "PYTHONIOENCODING": encoding, KEY_ENV: KEY.hex()}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, check=True).stdout
    lines = [line.decode("latin-1") for line in out.split(b"\n")]
    parsed = parse_log(lines, Verifier(KEY))
    assert len(parsed.events) == 1 and parsed.forged == 0, out


def test_folding_many_distinct_failures_is_linear_and_bounded() -> None:
    """De-duplicating failures with a list made 20,000 failure events take 66 s; a dict makes it linear."""
    job = parse_job({"apiVersion": schema.API_VERSION, "kind": schema.KIND, "metadata": {"name": "q"},
                     "spec": {"workers": {"replicas": 2}}})  # fmt: skip
    failures = [Failure(rank=i % 8, message=f"worker {i} lost") for i in range(20_000)]
    # CPU time, not wall time: the bound is about the algorithm (66 s of it before), and a loaded machine stretches
    # wall time without saying anything about it.
    started = time.process_time()
    status = fold_events(job, JobStatus(), failures, now=datetime.now(UTC)).status
    assert time.process_time() - started < 5.0
    assert len(status.rank_failures) == RANK_FAILURES_KEPT
    assert status.rank_failures[-1]["message"] == "worker 19999 lost"
