"""The event line itself, byte for byte: what a rank prints is what the operator's reader expects."""

from __future__ import annotations

import pytest
from fsdp_train.contract.events import Checkpoint, Failure, as_dict, emit, parse_line

LINE = (
    'FSDP_EVENT {"kind":"checkpoint","path":"s3://b/step_00000005","rank":0,"resumed":false,"seconds":1.5,'
    '"step":5,"time":7.0,"v":1}'
)


def test_a_line_is_the_prefix_and_compact_sorted_json() -> None:
    event = Checkpoint(rank=0, time=7.0, step=5, path="s3://b/step_00000005", seconds=1.5)
    assert event.to_line() == LINE


def test_emit_writes_one_line_at_once_on_a_line_of_its_own(capsys: pytest.CaptureFixture[str]) -> None:
    """A leading newline ends whatever other code printed without one, so the event's line is the emitter's own."""
    emit(Failure(rank=2, time=1.0, message="boom"))
    assert capsys.readouterr().out == (
        '\nFSDP_EVENT {"kind":"failure","message":"boom","rank":2,"reason":"","time":1.0,"v":1}\n'
    )


def test_as_dict_carries_the_kind() -> None:
    assert as_dict(Failure(rank=2, time=1.0, message="boom")) == {"kind": "failure", "rank": 2, "time": 1.0,
                                                                   "message": "boom", "reason": ""}  # fmt: skip


def test_the_first_prefix_on_a_line_starts_the_event() -> None:
    """A message may itself mention the prefix: the event starts at the first one, after Ray's own prefix."""
    failure = Failure(rank=1, time=1.0, message="printed FSDP_EVENT {} by mistake")
    line = f"(RayTrainWorker pid=1, ip=10.0.0.1) {failure.to_line()}"
    assert parse_line(line) == failure


def test_unknown_fields_from_a_newer_trainer_are_ignored() -> None:
    line = LINE.replace('"v":1', '"v":2,"shard":"3/8"')
    assert parse_line(line) == Checkpoint(rank=0, time=7.0, step=5, path="s3://b/step_00000005", seconds=1.5)
