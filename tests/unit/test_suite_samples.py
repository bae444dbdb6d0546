"""`make test` keeps a sample of every suite it leaves out in full (faults, load): a suite outside the default run
rots unseen, as the 300-job load test and two slow e2e cases did."""

from __future__ import annotations

import json
import os
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


LANES = """
import os
from pathlib import Path

import pytest

OUT = Path(os.environ["LANES_OUT"])


def record(name: str) -> None:
    (OUT / name).write_text(os.environ["PYTEST_XDIST_WORKER"])


@pytest.mark.xdist_group("ray")
@pytest.mark.parametrize("n", range(4))
def test_grouped(n: int) -> None:
    record(f"grouped-{n}")


@pytest.mark.parametrize("n", range(4))
def test_free(n: int) -> None:
    record(f"free-{n}")
"""


def test_the_tests_of_one_xdist_group_run_on_one_worker(tmp_path: Path) -> None:
    """`--dist loadgroup` as `make test` runs it keeps a group on one worker. pytest 9.2 made xdist 3.8's grouping
    a silent no-op (it renames `item._nodeid`, which 9.2 no longer reads): every Ray cluster of the run started
    at once, on the same addresses, and the lanes docs/testing.md describes did not exist."""
    (tmp_path / "test_lanes.py").write_text(LANES)
    out = tmp_path / "out"
    out.mkdir()
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2", "--dist", "loadgroup",
         "-o", "addopts=", "--rootdir", str(tmp_path), str(tmp_path / "test_lanes.py")],
        cwd=tmp_path, capture_output=True, text=True, timeout=600, env={**os.environ, "LANES_OUT": str(out)},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    workers = {path.name: path.read_text() for path in out.iterdir()}
    assert len(workers) == 8
    assert len({w for name, w in workers.items() if name.startswith("grouped")}) == 1, workers
