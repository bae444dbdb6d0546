"""A failure in one line: status.message names the cause; Ray's log tail goes to status.failureLog.

Real Ray job messages (the sentence Ray writes, then up to 20,000 characters of the job's output) and any
text at all (hypothesis): the headline is one line of at most HEADLINE_LIMIT characters and never raises.
"""

from __future__ import annotations

import unicodedata
from datetime import UTC, datetime

from fsdp_operator.decide.failure import HEADLINE_LIMIT, LOG_TAIL_LIMIT, clip, headline, log_tail
from hypothesis import example, given, settings
from hypothesis import strategies as st

RAY_SENTENCE = "Job entrypoint command failed with exit code 1, last available logs (truncated to 20,000 chars):\n"

TRACEBACK = """\
(RayTrainWorker pid=4242, ip=127.0.0.4) Traceback (most recent call last):
  File "/usr/lib/python3.11/site-packages/ray/train/v2/_internal/thread_runner.py", line 47, in run
    result = self._target()
  File "/opt/byo-function/tinygpt/train.py", line 88, in train_func
    loss = step(model, batch)
  File "/opt/byo-function/tinygpt/train.py", line 41, in step
    raise ValueError("batch of 4 rows, expected 8")
  File "/usr/lib/python3.11/site-packages/torch/nn/modules/module.py", line 1773, in _wrapped_call_impl
    return self._call_impl(*args, **kwargs)
ValueError: batch of 4 rows, expected 8
"""


def test_ray_message_becomes_the_exception_and_the_users_innermost_frame() -> None:
    text = RAY_SENTENCE + "some chatter\n" * 200 + TRACEBACK + "\n(raylet) shutting down\n"
    line = headline(text)
    assert line == "ValueError: batch of 4 rows, expected 8 (at train.py:41 in step)"
    assert "last available logs" not in line


def test_the_training_functions_own_failed_line_is_preferred() -> None:
    text = RAY_SENTENCE + TRACEBACK + "\nfsdp_train: training failed: ModuleNotFoundError: No module named 'tinygpt'\n"
    assert headline(text).startswith("ModuleNotFoundError: No module named 'tinygpt'")


def test_a_rank_report_stays_one_line_and_bounded() -> None:
    rank = "CheckpointMismatch: the checkpoint at /c was written by a run with other settings (" + "x" * 2000 + ")"
    line = headline(rank)
    assert line.startswith("CheckpointMismatch: the checkpoint at /c") and len(line) <= HEADLINE_LIMIT


def test_without_traceback_the_sentence_or_last_line_is_said() -> None:
    assert headline("Job was intentionally stopped.") == "Job was intentionally stopped."
    assert headline("first\n\nsecond line\n   \n") == "second line"
    assert headline("") == ""


def test_non_ascii_and_hidden_characters_are_kept_visible() -> None:
    line = headline("RuntimeError: données \u202eevil\u202c introuvables — 数据\n")
    assert line.startswith("RuntimeError: données") and "\u202e" not in line and "\\u202e" in line
    assert "数据" in line


def test_log_tail_is_the_end_of_the_logs_not_the_sentence() -> None:
    text = RAY_SENTENCE + "\n".join(f"line {i}" for i in range(5000))
    tail = log_tail(text)
    assert len(tail) <= LOG_TAIL_LIMIT and tail.endswith("line 4999") and "Job entrypoint" not in tail
    assert "\n" in tail  # still a log, line by line


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=3000), st.booleans(), st.booleans())
# What the random search once found: text printed without a line break glued to Ray's prefix of the traceback's
# first line (`AError(RayTrainWorker pid=...) Traceback ...`) hid the traceback.
@example(body="AError", ray=False, traceback=True)
@example(body="x" * 2999, ray=True, traceback=True)
def test_any_text_gives_one_bounded_line(body: str, ray: bool, traceback: bool) -> None:
    text = (RAY_SENTENCE if ray else "") + body + (TRACEBACK if traceback else "") + body
    line = headline(text)
    assert len(line) <= HEADLINE_LIMIT
    assert "\n" not in line and "\r" not in line
    # No control, surrogate or format character (a U+202E would make kubectl show the line backwards).
    assert not [c for c in line if unicodedata.category(c) in {"Cc", "Cs", "Cf", "Zl", "Zp"}]
    if traceback:
        assert "ValueError" in line or "fsdp_train: training failed" in body
    tail = log_tail(text)
    assert len(tail) <= LOG_TAIL_LIMIT


@settings(max_examples=20, deadline=None)
@given(st.sampled_from(["a", "é", "数", "\u202e", "\n", " ", "Error: x\n"]))
def test_huge_text_is_read_quickly(piece: str) -> None:
    text = RAY_SENTENCE + piece * 2_000_000
    started = datetime.now(UTC)
    assert len(headline(text)) <= HEADLINE_LIMIT
    assert len(log_tail(text)) <= LOG_TAIL_LIMIT
    assert (datetime.now(UTC) - started).total_seconds() < 30


def test_a_line_is_clipped_at_its_limit_never_before_and_without_trailing_space() -> None:
    assert clip("a" * 300) == "a" * 300
    assert clip("a" * 301) == "a" * 299 + "…"
    assert clip("a" * 298 + " " + "b" * 5) == "a" * 298 + "…"  # the cut falls after a space: no " …"


def test_the_log_tail_keeps_whole_lines_up_to_its_limit_and_their_indentation() -> None:
    assert log_tail("aaaa\nbbbb", limit=10) == "aaaa\nbbbb"  # 9 characters with the line break
    assert log_tail("aaaaa\nbbbb", limit=10) == "bbbb"  # 10 would not leave room for the break
    assert log_tail("\n  File x\n    raise E\n") == "  File x\n    raise E"


def test_the_frame_and_cause_of_a_traceback_are_read_whatever_it_lacks() -> None:
    bare = 'Traceback (most recent call last):\n  File "train.py", line 3, in main\nValueError: boom'
    assert headline(bare) == "ValueError: boom (at train.py:3 in main)"  # a file without a directory
    assert headline("Traceback (most recent call last):\nValueError: boom") == "ValueError: boom"  # no frame
    cut = 'Traceback (most recent call last):\n  File "/u/train.py", line 3, in main'  # the exception line cut off
    assert headline(cut) == 'File "/u/train.py", line 3, in main (at train.py:3 in main)'
    ray = "(RayTrainWorker pid=1, ip=10.0.0.1) ValueError: boom\n(RayTrainWorker pid=1, ip=10.0.0.1) done"
    assert headline(ray) == "ValueError: boom"
