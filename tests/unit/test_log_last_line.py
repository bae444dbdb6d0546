"""The last line of a finished job's log, without a trailing newline, is read like every other line."""

from __future__ import annotations

from fsdp_operator.runtime import log_lines
from fsdp_train.contract.events import Summary, parse_log

SUMMARY = Summary(rank=0, steps=4, final_loss=1.5, first_loss=5.0, tokens_per_second=100.0).to_line()


def complete_lines(chunk: str, *, full: bool = False, final: bool) -> tuple[str, int, int]:
    return log_lines.complete_lines({}, chunk, full=full, final=final)


def test_a_finished_jobs_last_line_without_newline_is_parsed() -> None:
    chunk = f"training done\n{SUMMARY}"  # the job ended before its last write had a newline
    text, consumed, skipped = complete_lines(chunk, final=True)
    assert (consumed, skipped) == (len(chunk), 0)
    (summary,) = parse_log(text.splitlines()).events
    assert isinstance(summary, Summary) and summary.steps == 4


def test_a_running_jobs_half_written_last_line_waits_for_the_next_pass() -> None:
    chunk = f"training done\n{SUMMARY}"
    text, consumed, _ = complete_lines(chunk, final=False)
    assert (text, consumed) == ("training done\n", len("training done\n"))
    assert parse_log(text.splitlines()).events == ()
