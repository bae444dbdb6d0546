"""A failure in one line: the cause (exception type and message, the user's innermost frame) out of any text.

Ray's job message for a failed entrypoint is a sentence followed by the job's last available logs, up to
20,000 characters of them (`Job entrypoint command failed with exit code 1, last available logs (truncated to
20,000 chars):` and the tracebacks). `status.message` holds only `headline()` of it; the logs themselves go to
`status.failureLog` (`log_tail()`), which `fsdpctl status --logs` prints.

Pure: text in, text out, for any text (empty, huge, multi-line, without a traceback, any Unicode), never raising.
Hand-written parsing: Python's `traceback` module formats tracebacks but cannot read a printed one back.
"""

from __future__ import annotations

import re

from fsdp_operator.api import formats

HEADLINE_LIMIT = 300
"""Most characters of a one-line cause (`status.message` of a failure)."""
LOG_TAIL_LIMIT = 4000
"""Most characters of `status.failureLog`: the end of the failed job's output."""
_SCAN_LIMIT = 200_000
"""Only this much of the end of a text is read (Ray sends at most 20,000 characters; anything else is cut)."""

_RAY_LOGS = re.compile(r",?\s*last available logs \(truncated to [\d,]+ chars\):\s*", re.IGNORECASE)
_RAY_PREFIX = re.compile(r"^\((?:[A-Za-z_][\w.]*\s+)?pid=[^)]*\)\s?")
_FRAME = re.compile(r'^\s*File "(?P<file>[^"]*)", line (?P<line>\d+), in (?P<func>.+?)\s*$')
_EXCEPTION = re.compile(
    r"^(?P<name>[A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit|Mismatch|Unavailable|Warning))(?::\s?(?P<text>.*))?$"
)
_OWN_FAILED = re.compile(r"^fsdp_train: training failed: (?P<cause>.+)$")
_LIBRARY = ("site-packages", "dist-packages", "/lib/python", "<frozen ", "/fsdp_train/", "/ray/")


def _one_line(text: str) -> str:
    return " ".join(formats.visible(text).split())


def clip(text: str, limit: int = HEADLINE_LIMIT) -> str:
    """`text` on one line (whitespace runs made one space, hidden characters escaped), at most `limit` characters."""
    line = _one_line(text[: limit * 8])
    return line if len(line) <= limit else line[: limit - 1].rstrip() + "…"


def split_ray_message(text: str) -> tuple[str, str]:
    """Ray's job message as (its own sentence, the logs it appended); the logs are empty when none were."""
    match = _RAY_LOGS.search(text[:2000])
    if match is None:
        return text, ""
    return text[: match.start()], text[match.end() :]


def _lines(text: str) -> list[str]:
    """The lines of `text` (its end only), without Ray's `(RayTrainWorker pid=..., ip=...)` prefixes."""
    return [_RAY_PREFIX.sub("", line.rstrip()) for line in text[-_SCAN_LIMIT:].splitlines()]


def _user_frame(frames: list[tuple[str, str, str]]) -> str:
    """`at FILE:LINE in FUNC` of the innermost frame outside libraries (else the innermost one); '' for none."""
    if not frames:
        return ""
    ours = [f for f in frames if not any(part in f[0] for part in _LIBRARY)]
    file, line, func = (ours or frames)[-1]
    return f"at {file.rsplit('/', 1)[-1]}:{line} in {func}"


def _last_traceback(lines: list[str]) -> tuple[str, str]:
    """(cause, where) of the last Python traceback in `lines`: its exception line and the user's innermost frame."""
    # Anywhere in the line: Ray prefixes a worker's lines with `(RayTrainWorker pid=..., ip=...) `, and what the
    # worker printed before without a line break is glued in front of that (`AError(RayTrainWorker ...) Traceback`).
    start = max((i for i, line in enumerate(lines) if "Traceback (most recent call last)" in line), default=-1)
    if start < 0:
        return "", ""
    frames: list[tuple[str, str, str]] = []
    cause = ""
    for line in lines[start + 1 :]:
        if frame := _FRAME.match(line):
            frames.append((frame["file"], frame["line"], frame["func"]))
        elif line and not line[0].isspace() and not line.startswith(("During handling", "The above exception")):
            cause = line.strip()
            break
    return cause, _user_frame(frames)


def headline(text: str, limit: int = HEADLINE_LIMIT) -> str:
    """The cause of a failure described by `text`, in one line of at most `limit` characters.

    In order: the training function's own `fsdp_train: training failed: ...` line; the exception line of the
    last traceback, with the user's innermost frame; the last `SomeError: message` line; the sentence before
    Ray's appended logs; the last non-empty line. Never raises; '' only for a text with nothing printable.
    """
    sentence, logs = split_ray_message(text)
    lines = _lines(logs or text)
    cause, where = _last_traceback(lines)
    for line in reversed(lines):
        if own := _OWN_FAILED.match(line.strip()):
            cause = own["cause"]
            break
    if not cause:
        cause = next((line.strip() for line in reversed(lines) if _EXCEPTION.match(line.strip())), "")
    if not cause:
        last = next((line for line in reversed(lines) if line.strip()), "")
        cause = (_one_line(sentence) if logs else "") or last
    if where and where not in cause:
        # The frame is the part worth keeping whole: the message is cut first.
        room = limit - len(where) - 3
        return f"{clip(cause, max(room, limit // 2))} ({where})"[:limit] if room > 20 else clip(cause, limit)
    return clip(cause, limit)


def log_tail(text: str, limit: int = LOG_TAIL_LIMIT) -> str:
    """The end of the logs in a failure's `text` (Ray's appended logs, else the text), at most `limit` characters.

    Line breaks are kept (it is read as a log); other hidden characters are escaped.
    """
    _, logs = split_ray_message(text)
    body = (logs or text)[-limit * 2 :].strip("\n")
    lines = [formats.visible(line.rstrip()) for line in body.splitlines()]
    kept: list[str] = []
    size = 0
    for line in reversed(lines):
        if size + len(line) + 1 > limit:
            if not kept:
                kept.append(line[-limit:])
            break
        kept.append(line)
        size += len(line) + 1
    return "\n".join(reversed(kept))
