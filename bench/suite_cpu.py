"""Where a command's CPU goes, every process counted: `sudo python bench/suite_cpu.py -- make test`.

`time` counts only the processes its command waits for; the suite's Ray nodes detach from the test that starts
them (`ray start` exits, its raylet and workers live on) and are missed: for one clean-clone `make test`, `time`
said 1,095 CPU-s where process accounting counted 2,283. Linux's process accounting (acct(5), version 3 records;
`accton` from Debian's `acct` package, run as root) writes one record per process as it exits, with its CPU
(all threads), pid and start time. A thread here scans /proc meanwhile and notes each new process's command line
and the test that was running when it started (pytest's `PYTEST_CURRENT_TEST`, which every child inherits); the
report joins both by pid and start time.

Written here, not taken from a library: acct(5) records are a fixed 64-byte struct (read with `struct`), and the
/proc scan reads three files a process.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import struct
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

ACCT_V3 = struct.Struct("<cBHIIIIIIf8H16s")  # struct acct_v3, linux/acct.h
TICKS = os.sysconf("SC_CLK_TCK")
AHZ = 100  # acct's comp_t times are in 1/AHZ s
CURRENT_TEST = b"PYTEST_CURRENT_TEST="
NO_TEST = "(no test: pytest and its workers, processes forked from their forkservers, setup)"


@dataclass(frozen=True)
class Exited:
    pid: int
    started: float  # seconds since the epoch
    cpu: float
    comm: str


@dataclass(frozen=True)
class Seen:
    started: float
    command: str
    test: str


def comp_t(value: int) -> int:
    """acct's 16-bit float: a 13-bit mantissa and a 3-bit base-8 exponent."""
    return (value & 0x1FFF) << (3 * (value >> 13))


def read_accounting(path: Path) -> list[Exited]:
    data = path.read_bytes()
    records = []
    for offset in range(0, len(data) - ACCT_V3.size + 1, ACCT_V3.size):
        fields = ACCT_V3.unpack_from(data, offset)
        pid, started, utime, stime, comm = fields[6], fields[8], fields[10], fields[11], fields[18]
        cpu = (comp_t(utime) + comp_t(stime)) / AHZ
        records.append(Exited(pid, float(started), cpu, comm.rstrip(b"\0").decode(errors="replace")))
    return records


def boot_time() -> float:
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith("btime "):
            return float(line.split()[1])
    raise RuntimeError("no btime in /proc/stat")


def note_processes(seen: dict[int, list[Seen]], stop: threading.Event, boot: float) -> None:
    """Each new process once: its start time, command line and the test running when it started."""
    known: set[tuple[int, int]] = set()
    while not stop.wait(0.3):
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            pid = int(entry.name)
            try:
                stat = Path(f"/proc/{pid}/stat").read_text()
                start_ticks = int(stat.rsplit(")", 1)[1].split()[19])
                if (pid, start_ticks) in known:
                    continue
                known.add((pid, start_ticks))
                command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            except (OSError, IndexError, ValueError):
                continue  # gone meanwhile, or not ours to read
            test = next((e[len(CURRENT_TEST) :] for e in environ if e.startswith(CURRENT_TEST)), b"")
            started = boot + start_ticks / TICKS
            seen[pid].append(Seen(started, command.strip(), test.decode(errors="replace")))


def kind(command: str, comm: str) -> str:
    """A name for what a process was: Ray's own process titles first (`ray::RayTrainWorker`, `ray::IDLE`)."""
    if comm.startswith("ray::"):
        return comm
    if "ray/_private/workers/" in command:
        return "ray worker"
    if "multiprocessing.spawn" in command:
        return "multiprocessing child"
    words = command.split()
    if not words:
        return comm
    program = words[0].rsplit("/", 1)[-1]
    if program.startswith("python") and len(words) > 1:
        rest = words[2] if words[1] in ("-m", "-u") and len(words) > 2 else words[1]
        return f"python {rest.rsplit('/', 1)[-1]}"[:60]
    return program[:60]


def largest(cpu: dict[str, float], n: int) -> list[tuple[str, float]]:
    return sorted(cpu.items(), key=lambda item: -item[1])[:n]


def report(records: list[Exited], seen: dict[int, list[Seen]], top: int) -> str:
    by_test: dict[str, float] = collections.defaultdict(float)  # CPU-s
    by_kind: dict[str, float] = collections.defaultdict(float)
    count: collections.Counter[str] = collections.Counter()  # processes
    kinds_of_test: dict[str, dict[str, float]] = collections.defaultdict(lambda: collections.defaultdict(float))
    for record in records:
        near = [s for s in seen.get(record.pid, []) if abs(s.started - record.started) <= 2]
        note = min(near, key=lambda s: abs(s.started - record.started)) if near else None
        test = re.sub(r" \((setup|call|teardown)\)$", r" [\1]", note.test) if note and note.test else NO_TEST
        what = kind(note.command if note else "", record.comm)
        by_test[test] += record.cpu
        by_kind[what] += record.cpu
        count[what] += 1
        kinds_of_test[test][what] += record.cpu
    total = sum(r.cpu for r in records)
    lines = [f"{total:,.0f} CPU-s in {len(records):,} processes", "", "by kind of process (CPU-s, processes):"]
    lines += [f"{cpu:9.1f} {count[what]:6d}  {what}" for what, cpu in largest(by_kind, top)]
    lines += ["", "by the test running when the process started (CPU-s; its largest kinds):"]
    for test, cpu in largest(by_test, top):
        kinds = ", ".join(f"{k} {v:.0f}" for k, v in largest(kinds_of_test[test], 3))
        lines += [f"{cpu:9.1f}  {test}", f"{'':11}{kinds}"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--top", type=int, default=25, help="lines in each table")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to measure after --")
    if os.geteuid() != 0:
        parser.error("process accounting needs root (accton)")
    seen: dict[int, list[Seen]] = collections.defaultdict(list)
    stop = threading.Event()
    with tempfile.TemporaryDirectory() as directory:
        accounting = Path(directory) / "pacct"
        accounting.touch()
        subprocess.run(["accton", str(accounting)], check=True, capture_output=True)
        noter = threading.Thread(target=note_processes, args=(seen, stop, boot_time()), daemon=True)
        noter.start()
        started = time.monotonic()
        try:
            code = subprocess.call(command)
        finally:
            subprocess.run(["accton", "off"], check=False, capture_output=True)
            stop.set()
            noter.join()
        wall = time.monotonic() - started
        records = read_accounting(accounting)
    print(f"\n{' '.join(command)}: exit {code} after {wall:,.0f} s; {report(records, seen, args.top)}")
    return code


if __name__ == "__main__":
    sys.exit(main())
