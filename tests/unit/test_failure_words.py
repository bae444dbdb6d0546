"""The one-line failure at its edges: where the user's frame still fits beside the cause, which line is the cause
when nothing better is printed, and where Ray's appended logs are looked for (decide/failure.py)."""

from __future__ import annotations

from fsdp_operator.decide.failure import clip, headline, log_tail, split_ray_message

TRACEBACK = 'Traceback (most recent call last):\n  File "/work/app/train.py", line 7, in main\n    step()\n'
WHERE = "at train.py:7 in main"  # 21 characters, and " (" + ")" beside the cause
MARK = ", last available logs (truncated to 20,000 chars):"


def test_the_frame_is_kept_only_where_more_than_20_characters_of_the_cause_fit_beside_it() -> None:
    cause = "ValueError: " + "x" * 100
    assert headline(TRACEBACK + cause, 44) == clip(cause, 44)  # room for 20: the cause alone
    assert headline(TRACEBACK + cause, 45) == f"{clip(cause, 22)} ({WHERE})"[:45]  # 21: at least half the limit
    assert headline(TRACEBACK + cause, 80) == f"{clip(cause, 56)} ({WHERE})"


def test_a_cause_that_names_its_frame_already_is_not_given_it_twice() -> None:
    assert headline(TRACEBACK + f"RuntimeError: failed {WHERE}") == f"RuntimeError: failed {WHERE}"


def test_a_one_character_exception_line_is_the_cause() -> None:
    assert headline(TRACEBACK + "E\n") == f"E ({WHERE})"


def test_a_limit_holds_without_a_frame() -> None:
    cause = "ValueError: " + "y" * 100
    assert headline(cause, 30) == clip(cause, 30) and len(headline(cause, 30)) == 30


def test_without_a_traceback_the_last_exception_line_is_the_cause_not_the_third_line() -> None:
    assert headline("a\nb\nplain words\nValueError: real\n") == "ValueError: real"


def test_rays_sentence_is_the_cause_when_its_logs_say_nothing_better() -> None:
    text = f"Job entrypoint command failed with exit code 3{MARK}\nstarting\n  indented detail\n"
    assert headline(text) == "Job entrypoint command failed with exit code 3"


def test_rays_appended_logs_are_looked_for_in_its_messages_first_2000_characters() -> None:
    within = "s" * (2000 - len(MARK))
    sentence, logs = split_ray_message(within + MARK + "\nlog")
    assert (sentence, logs.strip()) == (within, "log")
    beyond = "s" * (2001 - len(MARK)) + MARK + "\nlog"
    assert split_ray_message(beyond) == (beyond, "")


def test_the_log_tail_keeps_the_characters_at_its_ends() -> None:
    assert log_tail("XFAILX\n") == "XFAILX"
    assert log_tail("\n\nfirst\n  second X\n\n") == "first\n  second X"
