"""The whole lines of a job log read in chunks: what the controller parses of each chunk, pure."""

from __future__ import annotations

from fsdp_train.contract.events import MAX_LINE_CHARS


def complete_lines(
    long_lines: dict[int, str], chunk: str, *, full: bool, final: bool, offset: int = 0
) -> tuple[str, int, int]:
    """(whole lines to parse, characters consumed, over-long lines skipped) of one log chunk read at `offset`;
    `long_lines` (by offset, the end of a line too long to parse whole) is kept between calls.

    A half-written last line waits for the next pass, unless the job has ended (then it is all there is).
    A line longer than a whole chunk is never parsed whole: it is skipped to its end, over as many passes as it
    takes, and counted once; its last `MAX_LINE_CHARS` characters are parsed as its line (an event printed after
    a long unfinished line of other code ends that line: it is never dropped unseen).
    """
    for stale in [o for o in long_lines if o < offset]:
        del long_lines[stale]
    start, head = 0, ""
    tail = long_lines.get(offset)
    if tail is not None:
        cut = chunk.find("\n")
        if cut < 0 and not (final and not full):
            long_lines[offset + len(chunk)] = (tail + chunk)[-MAX_LINE_CHARS:]
            return "", len(chunk), 0
        cut = len(chunk) if cut < 0 else cut
        head, start = (tail + chunk[:cut])[-MAX_LINE_CHARS:] + "\n", min(cut + 1, len(chunk))
    end = len(chunk) if final and not full else chunk.rfind("\n") + 1
    if end <= start:
        if full and start == 0:
            long_lines[offset + len(chunk)] = chunk[-MAX_LINE_CHARS:]
            return "", len(chunk), 1
        return head, start, 0
    return head + chunk[start:end], end, 0
