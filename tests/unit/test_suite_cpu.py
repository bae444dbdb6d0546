"""`bench/suite_cpu.py`: acct(5) records read as the kernel writes them, and each joined to the process noted."""

from __future__ import annotations

import functools
import importlib.util
import struct
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


@functools.cache
def suite_cpu() -> ModuleType:
    """The script, imported by path (bench/ is no package); registered first, as its dataclasses need."""
    spec = importlib.util.spec_from_file_location("suite_cpu", ROOT / "bench" / "suite_cpu.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["suite_cpu"] = module
    spec.loader.exec_module(module)
    return module


def record(pid: int, started: int, utime: int, stime: int, comm: bytes) -> bytes:
    """One `struct acct_v3` (linux/acct.h): flag, version 3, tty, exit code, uid, gid, pid, ppid, btime, etime,
    utime, stime, mem, io, rw, minflt, majflt, swaps (comp_t each), comm."""
    return struct.pack(
        "<cBHIIIIIIf8H16s", b"\0", 3, 0, 0, 0, 0, pid, 1, started, 1.0, utime, stime, 0, 0, 0, 0, 0, 0, comm
    )


def test_comp_t_is_a_13_bit_mantissa_with_a_base_8_exponent() -> None:
    comp_t = suite_cpu().comp_t
    assert comp_t(0) == 0 and comp_t(8191) == 8191
    assert comp_t((1 << 13) | 5) == 40 and comp_t((2 << 13) | 5) == 320


def test_each_exited_process_is_counted_once_under_the_test_that_started_it(tmp_path: Path) -> None:
    module = suite_cpu()
    pacct = tmp_path / "pacct"
    pacct.write_bytes(
        record(41, 1000, 250, 50, b"ray::IDLE")  # 3.0 CPU-s
        + record(42, 1000, (1 << 13) | 1000, 0, b"python")  # 80.0 CPU-s
        + record(41, 1500, 100, 0, b"bash")  # the same pid again, later: another process
    )
    exited = module.read_accounting(pacct)
    assert [(e.pid, e.started, e.cpu, e.comm) for e in exited] == [
        (41, 1000.0, 3.0, "ray::IDLE"),
        (42, 1000.0, 80.0, "python"),
        (41, 1500.0, 1.0, "bash"),
    ]
    seen = {
        41: [
            module.Seen(1000.4, "python setup_worker.py ...", "tests/e2e/test_a.py::test_one (call)"),
            module.Seen(1500.2, "bash -c true", ""),
        ],
        42: [
            module.Seen(999.1, "/venv/bin/python -m fsdp_train.run.ray_entry --config-json {}", "tests/b.py::t (setup)")
        ],
    }
    text = module.report(exited, seen, top=10)
    assert text.startswith("84 CPU-s in 3 processes")
    assert "     80.0  tests/b.py::t [setup]" in text and "python fsdp_train.run.ray_entry 80" in text
    assert "      3.0  tests/e2e/test_a.py::test_one [call]" in text and "ray::IDLE 3" in text
    assert "      1.0  (no test" in text
