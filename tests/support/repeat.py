"""Call one plain test function many times in one process and count its failures (the flaky-test loops).

    python tests/support/repeat.py tests/unit/test_health_decisions.py::test_name 1000

For tests without fixtures (a hypothesis test draws fresh examples each call). Prints `failures/N`, and the first
three tracebacks; exits 1 on any failure.
"""

from __future__ import annotations

import importlib
import sys
import time
import traceback
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def main(argv: list[str]) -> int:
    node, count = argv[0], int(argv[1])
    path, name = node.split("::")
    sys.path[:0] = [str(TESTS.parent), str(TESTS)]  # `tests.unit.x` and `support.x`, as conftest.py sets
    module = importlib.import_module(path.removesuffix(".py").replace("/", "."))
    test = getattr(module, name)
    failures = 0
    started = time.monotonic()
    for _ in range(count):
        try:
            test()
        except Exception:  # an assertion or any error is one failure of the loop; the loop goes on
            failures += 1
            if failures <= 3:
                traceback.print_exc()
    print(f"{node}: {failures}/{count} failed in {time.monotonic() - started:.0f} s")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
