"""spec.trainFunction end to end: `fsdpctl run-local` runs a user's Ray Train function on real Ray processes.

The default case is the whole contract in one run (docs/byo-function.md): the ranks' placement, transport and
probe, the step and loss the function reported with `ray.train.report`, and its checkpoint surviving a worker
SIGKILLed mid-run (the restarted group resumes from `ray.train.get_checkpoint()`), while every rank prints
forged event lines that change nothing. The raising function and the example package run with `make test-all`;
their ground is covered fast by tests/unit/training/test_user_function.py and tests/unit/test_train_function.py.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.ray_cluster import RAY_TESTS
from test_run_local import run_local

pytestmark = [pytest.mark.e2e, RAY_TESTS]

ROOT = Path(__file__).resolve().parents[2]
CHECKS = ROOT / "tests" / "data" / "byo"
EXAMPLE = ROOT / "examples" / "byo-function"
STEPS, CHECKPOINT_EVERY, KILL_RANK, KILL_AT_STEP = 8, 3, 1, 4


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


def test_a_user_function_is_verified_reports_progress_and_resumes_from_its_checkpoint(tmp_path: Path) -> None:
    config = {"steps": STEPS, "checkpoint_every": CHECKPOINT_EVERY, "kill_rank": KILL_RANK,
              "kill_at_step": KILL_AT_STEP, "forge": True}  # fmt: skip
    function = {"callable": "byo_checks.functions:train", "code": str(CHECKS), "config": config}
    proc, job = run_local(function_job(tmp_path, "byo-train", function), tmp_path)
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

    # What the function reported with ray.train.report.
    progress = status["progress"]
    assert (progress["step"], progress["totalSteps"], progress["stepOfTotal"]) == (STEPS, STEPS, f"{STEPS}/{STEPS}")
    assert progress["tokensSeen"] == STEPS * 64 * 4
    history = progress["lossHistory"]
    assert [step for step, _ in history] == list(range(1, STEPS + 1))
    assert all(math.isfinite(loss) for _, loss in history) and history[-1][1] < history[0][1]
    assert progress["loss"] == history[-1][1]

    # The kill after step 4 restarted the group once; it resumed from the step-3 checkpoint.
    assert status["workerRestarts"] == 1
    assert progress["metrics"] == {"resumed_from": float(CHECKPOINT_EVERY)}
    checkpoint = status["checkpoint"]
    assert checkpoint["step"] == 6
    assert Path(checkpoint["path"]).parent == tmp_path / "checkpoints" / "byo-train"
    assert Path(checkpoint["path"], "state.pt").is_file()

    # Every rank printed forged lines, in both groups: counted and refused, nothing of them in the status.
    assert status["forgedEvents"] == 3 * 4 * 2
    authentic = next(c for c in status["conditions"] if c["type"] == "EventsAuthentic")
    assert (authentic["status"], authentic["reason"]) == ("False", "UnsignedLines")
    assert all("forged" not in f["message"] and f.get("reason") != "DataUnavailable" for f in status["rankFailures"])
    assert all(r["transport"] == "socket" for r in status["transport"]["ranks"])


@pytest.mark.slow  # fast: the wrapper's Failure (test_user_function) and the status it makes (test_train_function)
def test_a_user_function_that_raises_fails_the_job_with_its_exception(tmp_path: Path) -> None:
    function = {"callable": "byo_checks.functions:fail", "code": str(CHECKS), "config": {"why": "out of ideas"}}
    path = function_job(tmp_path, "byo-fail", function)
    proc, job = run_local(path, tmp_path)
    assert proc.returncode != 0 and "status" in job, proc.stdout[-4000:] + proc.stderr[-4000:]
    status = job["status"]
    assert status["phase"] == "Failed" and status["reason"] == "RayJobFailed"
    assert "ValueError: the user's code gave up: out of ideas | at functions.py:" in status["message"]
    assert {f["rank"] for f in status["rankFailures"]} == {0, 1, 2, 3}
    assert status["progress"]["step"] == 1


@pytest.mark.slow  # the example's YAML is parsed in tests/unit/test_train_function.py
def test_the_example_trains_a_tiny_gpt2_with_fsdp2(tmp_path: Path) -> None:
    example = yaml.safe_load((EXAMPLE / "job.yaml").read_text())
    spec = example["spec"]
    spec["trainFunction"]["code"] = str(EXAMPLE)
    spec["training"]["checkpoint"]["storage"] = str(tmp_path / "checkpoints")
    spec["sharedVolume"]["mountPath"] = str(tmp_path)
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(example))
    proc, job = run_local(path, tmp_path)
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
    proc, job = run_local(path, tmp_path)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    status = job["status"]
    assert status["phase"] == "Succeeded" and status["progress"]["stepOfTotal"] == f"{steps + 4}/{steps + 4}"
    resumed = status["progress"]["lossHistory"]
    assert resumed[0][0] == steps + 1, resumed  # no step before the checkpoint ran again
    assert resumed[0][1] < history[0][1], (resumed, history)  # a trained model, not a fresh one
