"""spec.trainFunction end to end: a user's Ray Train function on real Ray processes.

The default run's case is test_one_node_ray.py's: the function submitted as the operator does (`render.submission`,
its Ray client) to a one-node Ray, the ranks' placement, transport and probe, the step and loss the function reported
with `ray.train.report`, its checkpoint surviving a worker SIGKILLed mid-run (the restarted group resumes from
`ray.train.get_checkpoint()`), forged event lines that change nothing, and the status the operator folds from the
whole log. The cases here (`slow`, `make test-all`) run it through `fsdpctl run-local`: the whole contract in one
run, with `spec.health`
(docs/health.md: a rank blocked in the user's code named with its `file:line` while the others wait in the
all-reduce, `onHang: Restart`, a straggler), the raising function and the example package; their ground is covered
fast by that case, tests/unit/training/test_health.py, tests/unit/test_health_decisions.py,
tests/unit/training/test_user_function.py and tests/unit/test_train_function.py.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.ray_cluster import SECOND_RAY_LANE
from test_run_local import run_local

pytestmark = [pytest.mark.e2e, SECOND_RAY_LANE]

ROOT = Path(__file__).resolve().parents[2]
CHECKS = ROOT / "tests" / "data" / "byo"
EXAMPLE = ROOT / "examples" / "byo-function"
STEPS, CHECKPOINT_EVERY, KILL_RANK, KILL_AT_STEP = 16, 3, 1, 4
# The slow rank's extra second per step stays well over what the other ranks' own work per step grows to when the
# machine is loaded (0.5 s once went unnoticed beside the whole default run, at a load average of 18).
STALL_RANK, STALL_AT_STEP, SLOW_RANK, SLOW_SECONDS = 1, 7, 2, 1.0
HANG_TIMEOUT = 30


def function_job(tmp_path: Path, name: str, function: dict[str, Any]) -> Path:
    spec = {
        "image": "rayproject/ray:2.58.0-py311-cpu",
        "head": {"cpu": "1", "memory": "2Gi"},
        "workers": {"replicas": 2, "instanceType": "", "gpusPerWorker": 0, "efaPerWorker": 0, "ranksPerWorker": 2,
                    "cpu": "2", "memory": "4Gi", "sharedMemory": "1Gi"},
        "network": {"transport": "socket", "minCrossNodeBandwidthGBps": 0},
        "training": {"probeSizeBytes": 1048576, "checkpoint": {"storage": str(tmp_path / "checkpoints")}},
        "sharedVolume": {"claimName": "shared", "mountPath": str(tmp_path)},  # the Ray nodes share this machine
        "runPolicy": {"maxWorkerRestarts": 1},
        "trainFunction": function,
    }  # fmt: skip
    job = {"apiVersion": "fsdp.dev/v1alpha1", "kind": "FSDPTrainingJob", "metadata": {"name": name}, "spec": spec}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


# Covered fast: a user function's placement, transport, probe and reports, a killed rank's restart and resume,
# forged lines and the status they fold to (test_one_node_ray.py, through the operator's Ray client); a stall named
# where it is, Restart, a straggler (tests/unit/training/test_health.py, tests/unit/test_health_decisions.py);
# run-local's own start and end (test_run_local.py's default cases). 260-370 s in the default run: `slow` since
# issue 54.
@pytest.mark.slow
@pytest.mark.timeout(1200)  # three groups of Ray Train workers and a stall to wait out, on a loaded machine
def test_a_user_function_is_verified_reports_progress_resumes_and_a_stalled_or_slow_rank_is_named(
    tmp_path: Path,
) -> None:
    """Group 1 checkpoints at step 3 and loses rank 1 (SIGKILL) after step 4; group 2 resumes from step 3,
    checkpoints at 6 and rank 1 blocks before step 7; the stall Restarts the attempt, whose group resumes from step
    6 and finishes. Rank 2 is SLOW_SECONDS slower per step throughout."""
    config = {"steps": STEPS, "checkpoint_every": CHECKPOINT_EVERY, "kill_rank": KILL_RANK,
              "kill_at_step": KILL_AT_STEP, "forge": True, "stall_rank": STALL_RANK, "stall_at_step": STALL_AT_STEP,
              "stall_when_resumed_from": CHECKPOINT_EVERY, "slow_rank": SLOW_RANK,
              "slow_seconds": SLOW_SECONDS}  # fmt: skip
    function = {"callable": "byo_checks.functions:train", "code": str(CHECKS), "config": config}
    path = function_job(tmp_path, "byo-train", function)
    manifest = yaml.safe_load(path.read_text())
    manifest["spec"]["health"] = {"hangTimeoutSeconds": HANG_TIMEOUT, "onHang": "Restart", "stragglerWindowSteps": 5}
    manifest["spec"]["runPolicy"] = {"maxWorkerRestarts": 1, "backoffLimit": 1}
    path.write_text(yaml.safe_dump(manifest))
    proc, job = run_local(path, tmp_path, timeout=1100)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    status = job["status"]
    assert status["phase"] == "Succeeded", status.get("message")

    # Placement: four ranks, two per node, as the bundled function reports them.
    ranks = sorted(status["ranks"], key=lambda r: r["rank"])
    assert [r["rank"] for r in ranks] == [0, 1, 2, 3]
    assert len({r["nodeIP"] for r in ranks}) == 2
    assert sorted((r["nodeRank"], r["localRank"]) for r in ranks) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert all(r["pod"].startswith("byo-train-ray-cpu-workers-worker") for r in ranks)
    # Transport and probe, before the function ran.
    assert status["transport"]["summary"] == "socket"
    assert sorted(r["rank"] for r in status["transport"]["ranks"]) == [0, 1, 2, 3]
    assert status["interconnect"]["allRanks"]["ranks"] == 4 and status["interconnect"]["crossNode"]["ranks"] == 2
    assert status["interconnect"]["crossNode"]["allreduceBusbwGBps"] > 0

    # What the function reported with ray.train.report. The loss curve spans every attempt: steps 1..6 of the first
    # (its restarted group's 4..6 replacing the killed one's), 7..16 of the second, which resumed from step 6.
    progress = status["progress"]
    assert (progress["step"], progress["totalSteps"], progress["stepOfTotal"]) == (STEPS, STEPS, f"{STEPS}/{STEPS}")
    assert progress["tokensSeen"] == STEPS * 64 * 4
    history = progress["lossHistory"]
    assert [step for step, _ in history] == list(range(1, STEPS + 1))
    assert all(math.isfinite(loss) for _, loss in history) and history[-1][1] < history[0][1]
    assert progress["loss"] == history[-1][1]

    # The kill after step 4 restarted the group, from the step-3 checkpoint (only such a group stalls, below); the
    # stall before step 7 cost the attempt, and the next one resumed from the step-6 checkpoint. The status's
    # per-attempt figures (workerRestarts, forgedEvents) are the last attempt's.
    assert status["attempts"] == 2 and status["failedAttempts"] == 1 and "workerRestarts" not in status
    assert progress["metrics"] == {"resumed_from": float(2 * CHECKPOINT_EVERY)}
    checkpoint = status["checkpoint"]
    assert checkpoint["step"] == STEPS // CHECKPOINT_EVERY * CHECKPOINT_EVERY
    assert Path(checkpoint["path"]).parent == tmp_path / "checkpoints" / "byo-train"
    assert Path(checkpoint["path"], "state.pt").is_file()

    # The stall, named: rank 1 in the user's code at file:line, the others waiting in the all-reduce.
    last = status["health"]["lastStall"]
    assert last["attempt"] == 1 and [s["rank"] for s in last["suspects"]] == [STALL_RANK], last
    assert {r["stalledAtStep"] for r in last["ranks"]} == {STALL_AT_STEP - 1}, last  # the step it reported, not a count
    suspect = last["suspects"][0]
    assert suspect["reason"] == "RankStalled" and suspect["node"] and suspect["pod"], suspect
    by_rank = {r["rank"]: r for r in last["ranks"]}
    assert by_rank[STALL_RANK]["where"] == "code" and "functions.py:" in by_rank[STALL_RANK]["at"], by_rank
    assert HANG_TIMEOUT <= by_rank[STALL_RANK]["stalledSeconds"] < HANG_TIMEOUT + 30, by_rank
    assert all("all_reduce" in r["collective"] for rank, r in by_rank.items() if rank != STALL_RANK), by_rank
    assert f"rank {STALL_RANK} (" in last["message"] and "wait_for_a_lock_nobody_releases" in last["message"]
    # The slow rank, named a straggler; nobody stalled at the end.
    conditions = {c["type"]: c for c in status["conditions"]}
    straggler = conditions["Straggler"]
    # A string, which pytest shows whole: every rank's window (a repr is cut in the middle).
    windows = [{k: v for k, v in r.items() if k != "stack"} for r in status["health"]["ranks"]]
    evidence = json.dumps({"straggler": straggler, "ranks": windows})
    assert (straggler["status"], straggler["reason"]) == ("True", "SlowRank"), evidence
    assert f"rank {SLOW_RANK} (" in straggler["message"], straggler["message"]
    slow = [s for s in status["health"]["suspects"] if s["reason"] == "SlowRank"]
    assert [s["rank"] for s in slow] == [SLOW_RANK] and slow[0]["ratio"] >= 1.5, status["health"]
    assert conditions["Progressing"]["status"] == "True", conditions["Progressing"]

    # Every rank printed forged lines: counted (this attempt's one group) and refused, nothing of them in the status.
    assert status["forgedEvents"] == 3 * 4
    authentic = next(c for c in status["conditions"] if c["type"] == "EventsAuthentic")
    assert (authentic["status"], authentic["reason"]) == ("False", "UnsignedLines")
    failures = status.get("rankFailures", [])
    assert all("forged" not in f["message"] and f.get("reason") != "DataUnavailable" for f in failures)
    assert all(r["transport"] == "socket" for r in status["transport"]["ranks"])


@pytest.mark.slow  # fast: the wrapper's Failure (test_user_function) and the status it makes (test_train_function)
@pytest.mark.timeout(900)  # a Ray cluster's start and a run: past 300 s beside a whole `make test` (2026-12-04)
def test_a_user_function_that_raises_fails_the_job_with_its_exception(tmp_path: Path) -> None:
    function = {"callable": "byo_checks.functions:fail", "code": str(CHECKS), "config": {"why": "out of ideas"}}
    path = function_job(tmp_path, "byo-fail", function)
    proc, job = run_local(path, tmp_path, timeout=800)
    assert proc.returncode != 0 and "status" in job, proc.stdout[-4000:] + proc.stderr[-4000:]
    status = job["status"]
    assert status["phase"] == "Failed" and status["reason"] == "RayJobFailed"
    assert "ValueError: the user's code gave up: out of ideas | at functions.py:" in status["message"]
    assert {f["rank"] for f in status["rankFailures"]} == {0, 1, 2, 3}
    assert status["progress"]["step"] == 1


@pytest.mark.slow  # the example's YAML is parsed in tests/unit/test_train_function.py
@pytest.mark.timeout(1800)  # two clusters' starts and two whole runs: each past 300 s beside other work (2026-12-05)
def test_the_example_trains_a_tiny_gpt2_with_fsdp2(tmp_path: Path) -> None:
    example = yaml.safe_load((EXAMPLE / "job.yaml").read_text())
    spec = example["spec"]
    spec["trainFunction"]["code"] = str(EXAMPLE)
    spec["training"]["checkpoint"]["storage"] = str(tmp_path / "checkpoints")
    spec["sharedVolume"]["mountPath"] = str(tmp_path)
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(example))
    proc, job = run_local(path, tmp_path, timeout=800)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    status = job["status"]
    steps = spec["trainFunction"]["config"]["steps"]
    assert status["phase"] == "Succeeded" and status["progress"]["stepOfTotal"] == f"{steps}/{steps}"
    assert len(status["ranks"]) == 4 and status["transport"]["summary"] == "socket"
    assert status["checkpoint"]["step"] == steps
    history = status["progress"]["lossHistory"]
    assert history[-1][1] < history[0][1]

    # A new submission of the same job (another attempt, or the job applied again with more steps) is handed the
    # latest checkpoint by Ray Train: the example continues from its weights and optimizer state.
    spec["trainFunction"]["config"]["steps"] = steps + 4
    path.write_text(yaml.safe_dump(example))
    proc, job = run_local(path, tmp_path, timeout=800)  # its cluster starts again: as long as the first
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    status = job["status"]
    assert status["phase"] == "Succeeded" and status["progress"]["stepOfTotal"] == f"{steps + 4}/{steps + 4}"
    resumed = status["progress"]["lossHistory"]
    assert resumed[0][0] == steps + 1, resumed  # no step before the checkpoint ran again
    assert resumed[0][1] < history[0][1], (resumed, history)  # a trained model, not a fresh one
