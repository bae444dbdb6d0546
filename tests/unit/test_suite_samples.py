"""`make test` keeps a sample of every suite it leaves out in full (faults, load): a suite outside the default run
rots unseen, as the 300-job load test and two slow e2e cases did."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LEFT_OUT = ("slow", "faults", "load")

# Collects the integration tests with every marker and prints each test's markers, one JSON per line.
COLLECT = """
import json, sys, pytest

class Marks:
    def pytest_collection_finish(self, session):
        for item in session.items:
            print("MARKS " + json.dumps([item.nodeid, sorted({m.name for m in item.iter_markers()})]))

sys.exit(pytest.main(sys.argv[1:], plugins=[Marks()]))
"""


def test_the_makefile_leaves_out_exactly_the_slow_faults_and_load_marks() -> None:
    found = re.search(r"^PYTEST_MARKS \?= (.+)$", (REPO / "Makefile").read_text(), re.MULTILINE)
    assert found is not None, "PYTEST_MARKS is not set in the Makefile"
    assert found.group(1).strip() == " and ".join(f"not {mark}" for mark in LEFT_OUT)


def test_every_module_with_a_faults_or_load_test_keeps_one_in_the_default_run() -> None:
    done = subprocess.run(
        [sys.executable, "-c", COLLECT, "--collect-only", "-q", "-p", "no:cacheprovider", "-m", "slow or not slow",
         "tests/integration"],
        cwd=REPO, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    marks = dict(json.loads(line[len("MARKS ") :]) for line in done.stdout.splitlines() if line.startswith("MARKS "))
    assert marks, done.stdout[-3000:]
    by_module: dict[str, list[set[str]]] = {}
    for nodeid, names in marks.items():
        by_module.setdefault(nodeid.split("::", 1)[0], []).append(set(names))
    suites = {
        suite: sorted(module for module, tests in by_module.items() if any(suite in t for t in tests))
        for suite in ("faults", "load")
    }
    assert "tests/integration/test_load.py" in suites["load"] and "tests/integration/test_faults.py" in suites["faults"]
    # (tests/e2e/test_faults_ray.py, real Ray, is not checked: its sample in the default run is its in-process
    # counterpart, tests/integration/test_restarts.py.)
    for suite, modules in suites.items():
        for module in modules:
            kept = [t for t in by_module[module] if not t & set(LEFT_OUT)]
            assert kept, f"{module} has {suite} tests and none in the default run"
