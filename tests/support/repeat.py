"""Call one plain test function many times in one process and count its failures (the flaky-test loops).

    python tests/support/repeat.py tests/unit/test_health_decisions.py::test_name 1000

For tests without fixtures (a hypothesis test draws fresh examples each call). Prints `failures/N`, and the first
three tracebacks; exits 1 on any failure. An interrupt (Ctrl-C, `kill -INT`) ends the loop with the count so far;
every 50 calls a line says how far it is.
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
    failures = done = 0
    started = time.monotonic()
    try:
        for done in range(1, count + 1):
            try:
                test()
            except Exception:  # an assertion or any error is one failure of the loop; the loop goes on
                failures += 1
                if failures <= 3:
                    traceback.print_exc()
            if done % 50 == 0:
                print(f"{node}: {failures}/{done} failed so far", flush=True)
    except KeyboardInterrupt:
        done -= 1  # the call interrupted did not finish
        print(f"{node}: interrupted after {done} calls")
    print(f"{node}: {failures}/{done} failed in {time.monotonic() - started:.0f} s")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
