"""End to end on CPU: ``python -m fsdp_train.run.ray_entry`` on a local Ray cluster of two "nodes".

A head (no CPUs) and two worker nodes on 127.0.0.2 and 127.0.0.3 (Ray groups ranks into nodes by IP),
each with its own temp dir. Every worker process has ``FSDP_TRAIN_FAIL_AT_STEP=10``, so a first attempt
fails after its step-10 checkpoint: with ``max_failures: 1`` Ray restarts the worker group, which
resumes from that checkpoint; with ``max_failures: 0`` the entrypoint exits 1 with a one-line error.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from fsdp_train.contract.events import Checkpoint, Event, Failure, Placement, Step, Summary, Transport, parse_line
from support.ray_cluster import RAY_TESTS, local_cluster, ray_available, run_ray_entry
from support.tiny_hf import TINY_OVERRIDES as TINY

pytestmark = [pytest.mark.e2e, RAY_TESTS]

BIN = Path(sys.executable).parent
TRAIN = {
    "model_overrides": TINY,
    "steps": 14,
    "seq_len": 32,
    "batch_size_per_rank": 2,
    "learning_rate": 1e-3,
    "mixed_precision": "fp32",
    "probe_size_bytes": 256 * 1024,
    "sharding": "hybrid",
}


@pytest.fixture(scope="module")
def cluster() -> Iterator[str]:
    if not ray_available():
        pytest.skip("the ray command is not installed next to this Python")
    with local_cluster(FSDP_TRAIN_FAIL_AT_STEP="10") as address:
        yield address


def is_actor_line(line: str) -> bool:
    """A line Ray forwarded from an actor: ``(Name pid=...)``, possibly behind a colour code."""
    return line.lstrip("\x1b[0123456789m").startswith("(")


def events_of(output: str) -> list[Event]:
    return [e for e in map(parse_line, output.splitlines()) if e is not None]


# Covered fast: restart and resume under Ray, the bundled loop under Ray Train (test_one_node_ray.py); placement and
# hybrid sharding on two nodes (tests/unit/training/test_loop_cpu.py).
@pytest.mark.slow
@pytest.mark.timeout(900)  # its cluster's start (2 min on a loaded machine), two groups of four ranks
def test_ray_entry_restarts_and_resumes_from_checkpoint(cluster: str, tmp_path: Path) -> None:
    job = {
        "train": {**TRAIN, "checkpoint_path": str(tmp_path / "ckpt"), "checkpoint_interval": 5},
        "scaling": {"num_workers": 4, "use_gpu": False, "resources_per_worker": {"CPU": 1}},
        "max_failures": 1,
        "storage_path": str(tmp_path / "storage"),
        "name": "resume-test",
    }
    proc = run_ray_entry(cluster, job)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "fsdp_train: training finished" in proc.stdout
    lines = [line for line in proc.stdout.splitlines() if "FSDP_EVENT" in line]
    others = [line for line in lines if "(RayTrainWorker pid=" not in line]
    assert not others, others[:3]  # worker lines, each on its own (not dedup'd)
    events = events_of(proc.stdout)

    placements = sorted((e for e in events if isinstance(e, Placement)), key=lambda e: e.time)
    assert len(placements) == 8, lines[:12]  # two attempts of four ranks
    for p in placements:
        assert p.node_ip in ("127.0.0.2", "127.0.0.3")
        assert (p.world_size, p.local_world_size) == (4, 2)
        assert p.node_rank == p.rank // 2 and p.local_rank == p.rank % 2
    for attempt in (placements[:4], placements[4:]):  # Ray may number the nodes anew on restart
        assert {(p.node_ip, p.node_rank) for p in attempt} in (
            {("127.0.0.2", 0), ("127.0.0.3", 1)},
            {("127.0.0.2", 1), ("127.0.0.3", 0)},
        )
    assert {t.transport for t in events if isinstance(t, Transport)} == {"socket"}

    failures = [e for e in events if isinstance(e, Failure)]
    assert failures and all("injected failure after step 10" in f.message for f in failures)
    summaries = [e for e in events if isinstance(e, Summary)]
    assert len(summaries) == 4 and {s.resumed_from_step for s in summaries} == {10}
    assert {s.sharding for s in summaries} == {"hybrid"}
    saved = [e.path for e in events if isinstance(e, Checkpoint) and not e.resumed]
    assert [Path(p).relative_to(tmp_path).as_posix() for p in saved] == [
        f"storage/resume-test/step_{step:08d}" for step in (5, 10, 14)
    ]
    # The restarted group says once (rank 0) which step it resumed from: not a checkpoint written.
    assert [(e.step, e.resumed) for e in events if isinstance(e, Checkpoint) and e.resumed] == [(10, True)]
    steps = [e.step for e in events if isinstance(e, Step)]
    assert steps == list(range(1, 11)) + list(range(11, 15))
    assert sorted(p.name for p in (tmp_path / "storage" / "resume-test").glob("step_*")) == [
        "step_00000010",
        "step_00000014",
    ]


@pytest.mark.slow  # one_line() and main()'s exit codes have unit tests (tests/unit/training/test_ray_entry.py)
def test_ray_entry_fails_with_one_line(cluster: str, tmp_path: Path) -> None:
    job = {
        "train": TRAIN,
        "scaling": {"num_workers": 2, "use_gpu": False, "resources_per_worker": {"CPU": 1}},
        "max_failures": 0,
        "storage_path": str(tmp_path / "storage"),
        "name": "failing",
    }
    proc = run_ray_entry(cluster, job)
    assert proc.returncode == 1
    # Ray's actors may still print (prefixed "(ActorName pid=...)"); the entrypoint's own last line names the cause.
    own = [line for line in proc.stderr.splitlines() if line.strip() and not is_actor_line(line)]
    assert own[-1] == (
        "fsdp_train: training failed: RuntimeError: FSDP_TRAIN_FAIL_AT_STEP=10: injected failure after step 10"
    )
    assert any(isinstance(e, Failure) for e in events_of(proc.stdout))


def test_ray_entry_rejects_bad_config() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "fsdp_train.run.ray_entry", "--config-json", json.dumps({"train": {"seq_len": 0}})],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip() == "fsdp_train: invalid config: training.seq_len must be greater than 0."
