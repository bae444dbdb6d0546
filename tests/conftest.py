"""Shared fixtures: an emulated API server per test, and the `support` helpers on the import path.

Under pytest-xdist (`make test` runs `-n`, `--dist loadgroup`; docs/testing.md), tests are spread one by one
over the workers, except those that must stay together, which are kept on one worker by an `xdist_group`:
- the tests that start real Ray clusters, in the lanes `support.ray_cluster` marks (`RAY_TESTS`, `SECOND_RAY_LANE`):
  one cluster at a time per lane;
- the tests of a module that share a module- or class-scoped fixture (a Ray cluster, a reference run, an
  installed chart): grouped here by module, so that the fixture is built once, not once per worker.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings

sys.path.insert(0, str(Path(__file__).parent))  # `import support.<module>` from any test

from fsdp_operator.local.server import ThreadedApiServer
from support.ray_cluster import LONGEST_LANES, RAY_LANES

# No per-example deadline: on a loaded 2-core machine (CI, parallel workers) one example can take seconds, and
# hypothesis would report that as a failure of the property. Each test's own timeout still bounds a hang.
settings.register_profile("suite", deadline=None)
settings.load_profile("suite")

_SHARED_SCOPES = {"class", "module", "package"}


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups (its own hook has no order)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("xdist_group") is not None:
            continue
        definitions = getattr(item, "_fixtureinfo", None)
        if definitions is None:
            continue
        shared = any(
            fixture.scope in _SHARED_SCOPES
            for fixtures in definitions.name2fixturedefs.values()
            for fixture in fixtures
            if fixture.baseid  # the project's own fixtures; pytest's and plugins' have no base id
        )
        if shared:
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::", 1)[0]))
    # The longest units first: xdist hands out units in this order (`make test` turns its reordering by unit size
    # off), and a unit started last sets the run's end: the run-local lanes, the other Ray lanes (so that none reaches a
    # worker that lowered its priority), then the other groups, then single tests.
    items.sort(key=_unit_rank)


def _group(item: pytest.Item) -> str | None:
    """The name of the xdist group the test is kept in, or None."""
    marker = item.get_closest_marker("xdist_group")
    return str(marker.args[0]) if marker is not None and marker.args else None


def _unit_rank(item: pytest.Item) -> int:
    group = _group(item)
    if group is None:
        return 3
    return 0 if group in LONGEST_LANES else 1 if group in RAY_LANES else 2


BESIDE_THE_LANES_NICENESS = 5
"""The niceness of an xdist worker once it runs a test outside the Ray lanes (and of what it starts)."""


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Under xdist, the Ray lanes (the run's longest cases; Ray nodes that must start within Ray's fixed 30 s) get
    the CPU first: a worker that runs anything else lowers its own priority, for good (a process may always raise
    its niceness; the lanes are handed out first, so none runs on a worker after it). On 2 cores, the data job took
    150 s alone and 600 s beside the rest of the suite at equal priority."""
    in_a_lane = _group(item) in RAY_LANES
    if "PYTEST_XDIST_WORKER" in os.environ and not in_a_lane and os.nice(0) < BESIDE_THE_LANES_NICENESS:
        os.nice(BESIDE_THE_LANES_NICENESS - os.nice(0))


@pytest.fixture
def apiserver() -> Iterator[ThreadedApiServer]:
    """A fresh emulated Kubernetes API server on a free loopback port, in a background thread."""
    with ThreadedApiServer() as server:
        yield server


@pytest.fixture
def kubeconfig(apiserver: ThreadedApiServer, tmp_path: Path) -> Path:
    """A kubeconfig file pointing at the `apiserver` fixture."""
    return apiserver.write_kubeconfig(tmp_path / "kubeconfig")


if os.environ.get("MUTANT_UNDER_TEST"):  # a mutmut worker (`make mutation`, docs/testing.md)

    @pytest.fixture(autouse=True)
    def _parse_anew() -> None:
        """Each mutant's worker is forked from the process that ran every test once: its memo of parsed specs
        would answer from the unmutated parser, and no mutant of the spec's rules could be seen."""
        from fsdp_operator.api import spec

        spec._parsed_spec.clear()


if "mutmut" in sys.modules:  # run by mutmut: its clean run and each mutant's worker

    @pytest.fixture(autouse=True)
    def _trampolines_are_a_library(monkeypatch: pytest.MonkeyPatch) -> None:
        """mutmut calls each function of a mutated module through its trampoline (a frame of mutmut's, between
        the caller's and the function's): to the watchdog that is a library's frame, as a decorator of torch's is,
        never where a rank is stuck."""
        from fsdp_train.watch import health

        monkeypatch.setattr(health, "_LIBRARY_DIRS", (*health._LIBRARY_DIRS, f"{os.sep}mutmut{os.sep}"))
