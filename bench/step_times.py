"""Every step's reported time and rate against the wall clock: run the training function, stamp each line it prints.

    python bench/step_times.py --log OUT.log -- torchrun --nproc-per-node 1 -m fsdp_train --config-json '...'

The rate the TOKENS/S column shows is the step event's; this holds it against what it measures. Each line of the run
is stamped with this process's monotonic clock when it arrives; from the step events it prints, per run: the median
step time, the shortest step against it (a step read back early once reported 0.0002 s), the last step's rate (the
column at the run's end) against the summary's mean, and the steps' own seconds against the wall time between the
first and the last step line with the checkpoints' time taken out: the time each blocked the loop, and the time the
loop waited for the previous asynchronous write before the next (the lines come one step late, so the two differ by
at most a step or two's time at either end).

    python bench/step_times.py --analyze OUT.log      # the same report from a stamped log written before
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "training"))

from fsdp_train.contract.events import Checkpoint, Step, Summary, parse_line


def run(command: list[str], log: Path) -> list[tuple[float, str]]:
    """The command's output lines (stdout and stderr), each with the monotonic time it arrived; also written to log."""
    stamped: list[tuple[float, str]] = []
    with (
        subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc,
        log.open("w") as out,
    ):
        assert proc.stdout is not None
        for line in proc.stdout:
            now = time.monotonic()
            stamped.append((now, line.rstrip("\n")))
            out.write(f"{now:.6f} {line}")
    print(f"# exit {proc.returncode}")
    return stamped


WAITED = re.compile(r"^fsdp_train: checkpoint of step \d+ written .* waited ([0-9.]+) s")


def report(stamped: list[tuple[float, str]]) -> list[str]:
    steps: list[tuple[float, Step]] = []
    checkpoints: list[Checkpoint] = []
    waits: list[tuple[float, float]] = []  # (when the line came, seconds the loop waited for an earlier write)
    summary: Summary | None = None
    for at, line in stamped:
        if waited := WAITED.match(line):
            waits.append((at, float(waited.group(1))))
        event = parse_line(line)
        if isinstance(event, Step):
            steps.append((at, event))
        elif isinstance(event, Checkpoint):
            checkpoints.append(event)
        elif isinstance(event, Summary) and event.rank == 0:
            summary = event
    if len(steps) < 3 or summary is None or summary.tokens_per_second is None:
        return [f"# {len(steps)} step events, summary {'seen' if summary else 'missing'}: nothing to compare"]
    timed = [e for _, e in steps[1:]]  # the first step compiles; the rates leave it out
    seconds = [e.step_seconds for e in timed]
    median = statistics.median(seconds)
    shortest = min(timed, key=lambda e: e.step_seconds)
    last = steps[-1][1]
    held = sum(c.seconds for c in checkpoints if c.step < last.step)
    held += sum(seconds for at, seconds in waits if steps[0][0] < at < steps[-1][0])
    wall = steps[-1][0] - steps[0][0] - held
    column = last.tokens_per_second or 0.0
    return [
        f"steps {timed[0].step}..{last.step}: median {median:.4f} s, shortest {shortest.step_seconds:.4f} s (step "
        f"{shortest.step}, {shortest.step_seconds / median:.2f}x the median), longest {max(seconds):.4f} s",
        f"last step's rate (the column at the end) {column:,.0f} tokens/s; "
        f"summary mean {summary.tokens_per_second:,.0f}"
        f" ({column / summary.tokens_per_second:.2f}x)",
        f"steps' own seconds {sum(seconds):.2f} s; wall from step 1's line to step {last.step}'s, the checkpoints' "
        f"{held:.2f} s out, {wall:.2f} s ({sum(seconds) / wall:.2f}x)",
        "per step (s): " + " ".join(f"{e.step}:{e.step_seconds:.3f}" for e in timed),
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--log", type=Path, help="where the stamped output goes")
    parser.add_argument("--analyze", type=Path, help="a stamped log written before: report it, run nothing")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the training run's command line")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if args.analyze:
        lines = [line.split(" ", 1) for line in args.analyze.read_text(errors="replace").splitlines()]
        stamped = [(float(at), text) for at, text in lines]
    elif args.log and command:
        stamped = run(command, args.log)
    else:
        parser.error("give --log and a command, or --analyze")
    for line in report(stamped):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
