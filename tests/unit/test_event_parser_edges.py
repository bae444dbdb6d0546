"""The event line's edges (fsdp_train/contract/events.py): which of several ``FSDP_EVENT`` on one line is read, the
over-long line read from its end, bytes, the refusal counts, a signed-looking line read without a verifier, and the
line `emit` writes past the text layer."""

from __future__ import annotations

import io
import sys

import pytest
from fsdp_train.contract import events
from fsdp_train.contract.event_base import PREFIX
from fsdp_train.contract.events import FORGED, MALFORMED, MAX_CANDIDATES, Step, parse_event, parse_log
from fsdp_train.contract.signing import MAC_HEX, Signer, Verifier, attempt_key
from fsdp_train.contract.wire import MAX_LINE_CHARS, MAX_RANK

KEY = attempt_key(b"edge" * 8, "qwen-1a2b3c4d-2")
STEP = Step(rank=0, step=3, total_steps=10, loss=2.0, tokens_per_second=1.0, tokens_per_second_per_device=1.0, time=1e9)
GOOD = STEP.to_line()
BAD = f'{PREFIX} {{"kind":"step","v":1}} '  # an event line the schema refuses: fields missing


@pytest.fixture
def no_signer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(events, "_signer", None)


@pytest.mark.parametrize(("bad_before", "found"), [(MAX_CANDIDATES - 1, True), (MAX_CANDIDATES, False)])
def test_at_most_max_candidates_event_prefixes_of_a_line_are_tried(bad_before: int, found: bool) -> None:
    line = BAD * bad_before + GOOD
    assert parse_event(line) == (STEP if found else MALFORMED)


def test_the_first_event_of_a_line_that_parses_is_read_wherever_it_stands() -> None:
    assert parse_event(BAD + GOOD + " " + BAD) == STEP
    assert parse_event(BAD + BAD) is MALFORMED


def test_an_over_long_line_is_read_from_its_end_where_the_event_is() -> None:
    head = BAD * (MAX_CANDIDATES + 4)  # in the part that is not read: its refusals do not crowd the event out
    line = head + "x" * (MAX_LINE_CHARS - len(GOOD)) + GOOD
    assert len(line) > MAX_LINE_CHARS and parse_event(line) == STEP
    # The event starts in the first MAX_LINE_CHARS characters and ends in the last ones: read from the end.
    straddling = "x" * 20 + GOOD + "y" * (MAX_LINE_CHARS - len(GOOD) - 10)
    assert len(straddling) == MAX_LINE_CHARS + 10 and parse_event(straddling) == STEP


def test_a_prefix_only_in_the_unread_head_of_an_over_long_line_is_malformed_and_no_prefix_is_no_event() -> None:
    assert parse_event(GOOD + "x" * MAX_LINE_CHARS) is MALFORMED
    assert parse_event("x" * (MAX_LINE_CHARS + 1)) is None
    exactly = (PREFIX + "X").ljust(MAX_LINE_CHARS, "x")  # not over long, and no event prefix (no space after it)
    assert len(exactly) == MAX_LINE_CHARS and parse_event(exactly) is None


def test_bytes_are_read_as_utf8_with_bad_bytes_replaced() -> None:
    assert parse_event(b"\xff\xfe " + GOOD.encode()) == STEP
    assert parse_event(b"\xff no event") is None


def test_the_log_counts_every_refused_line() -> None:
    verifier = Verifier(KEY)
    signed = STEP.to_line(Signer(KEY))
    bad_signed = f"{PREFIX} {'0' * MAC_HEX} {{nonsense"
    parsed = parse_log([signed, GOOD, GOOD.replace("step", "stop", 1), "FSDP_EVENT nothex {", bad_signed], verifier)
    assert (parsed.events, parsed.malformed, parsed.forged) == ((STEP,), 0, 4)
    unsigned = parse_log([GOOD, BAD, BAD, f"{PREFIX} nonsense", "plain"])
    assert (unsigned.events, unsigned.malformed, unsigned.forged) == ((STEP,), 3, 0)


def test_a_signed_line_whose_json_does_not_parse_is_forged_under_a_verifier_and_malformed_without() -> None:
    line = f"{PREFIX} {'a' * MAC_HEX} {{nonsense"
    assert parse_event(line, Verifier(KEY)) is FORGED
    assert parse_event(line) is MALFORMED


def test_without_a_verifier_a_signed_looking_line_is_read_unchecked_whatever_its_mac() -> None:
    payload = GOOD.removeprefix(PREFIX + " ")
    assert parse_event(f"{PREFIX} {'z' * MAC_HEX} {payload}") == STEP
    assert parse_event(f"{PREFIX} {'z' * MAC_HEX} {payload}", Verifier(KEY)) is FORGED


def test_a_rank_beyond_the_largest_world_is_refused() -> None:
    assert parse_event(GOOD.replace('"rank":0', f'"rank":{MAX_RANK - 1}')) is not MALFORMED
    assert parse_event(GOOD.replace('"rank":0', f'"rank":{MAX_RANK}')) is MALFORMED


def test_emit_hands_each_listener_the_event_and_writes_ascii_bytes_past_the_text_layer(
    monkeypatch: pytest.MonkeyPatch, no_signer: None
) -> None:
    heard: list[object] = []
    monkeypatch.setattr(events, "LISTENERS", [heard.append])
    raw = io.BytesIO()
    # A text layer that would garble the line (PYTHONIOENCODING=utf-16): the line goes to the bytes beneath it.
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(raw, encoding="utf-16"))
    events.emit(STEP)
    assert heard == [STEP]
    assert raw.getvalue() == ("\n" + GOOD + "\n").encode("ascii")


def test_a_process_without_a_key_hands_none_on_and_a_16_byte_key_is_the_shortest_taken(no_signer: None) -> None:
    assert events.signing_key() == ""
    assert not events.use_key("00" * 15)
    assert events.signing_key() == ""
    assert events.use_key("01" * 16)
    assert events.signing_key() == "01" * 16
