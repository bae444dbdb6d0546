"""spec.tracking end to end: `fsdpctl run-local` jobs logging to a real MLflow tracking server on loopback.

What the run holds is read back through MLflow's own client and compared with the status the operator wrote. The
fullest case, a tracked data job (settings, every step's loss, the evaluations, the export registered, one run across
a drained attempt and its resumption), is `test_run_local.py`'s data job; it and the cases here are `slow`. The
default run's case is tests/integration/test_tracking_server.py: the trainer's tracker against a real MLflow server,
one run across two attempts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.mlflow_server import Server, mlflow_server
from support.ray_cluster import RAY_TESTS
from test_run_local import EXAMPLE, assert_nothing_left, run_local

pytestmark = [pytest.mark.e2e, RAY_TESTS]


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    with mlflow_server(tmp_path / "mlflow") as running:
        yield running


def client(server: Server) -> Any:
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=server.uri, registry_uri=server.uri)


def tracked_job(tmp_path: Path, name: str, server: Server, **tracking: str) -> dict[str, Any]:
    manifest = yaml.safe_load(EXAMPLE.read_text())
    manifest["metadata"]["name"] = name
    manifest["spec"]["tracking"] = {"mlflow": {"trackingUri": server.uri, "experiment": "tests", **tracking}}
    manifest["spec"]["sharedVolume"] = {"claimName": "shared", "mountPath": str(tmp_path)}  # one machine
    return manifest


def write(manifest: dict[str, Any], tmp_path: Path) -> Path:
    path = tmp_path / f"{manifest['metadata']['name']}.yaml"
    path.write_text(yaml.safe_dump(manifest))
    return path


def conditions(status: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}


def history(mlflow: Any, run_id: str, key: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in mlflow.get_metric_history(run_id, key))


def assert_same_series(logged: list[tuple[int, float]], points: list[list[float]]) -> None:
    """MLflow's series and status's lossHistory point by point (status keeps 4 digits)."""
    assert [step for step, _ in logged] == [step for step, _ in points], (logged, points)
    for (step, loss), (_, kept) in zip(logged, points, strict=True):
        assert abs(loss - kept) <= 1e-4, (step, loss, kept)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_retried_attempt_continues_the_same_run(server: Server, tmp_path: Path) -> None:
    """Attempt 1 checkpoints at step 12 and fails right after it; attempt 2 resumes there, in the same run."""
    manifest = tracked_job(tmp_path, "tiny-retried", server)
    spec = manifest["spec"]
    spec["training"].update(steps=20, checkpoint={"storage": str(tmp_path / "ckpt"), "intervalSteps": 4})
    spec["runtimeEnv"] = {"envVars": {"FSDP_TRAIN_FAIL_AT_STEP": "12"}}
    spec["runPolicy"] = {"maxWorkerRestarts": 0, "backoffLimit": 1}
    proc, job = run_local(write(manifest, tmp_path), tmp_path, timeout=800)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    status = job["status"]
    assert status["phase"] == "Succeeded" and status["attempts"] == 2 and status["result"]["resumedFromStep"] == 12
    mlflow = client(server)
    (experiment,) = [e for e in mlflow.search_experiments() if e.name == "tests"]
    (run,) = mlflow.search_runs([experiment.experiment_id])  # one run for both attempts
    assert run.info.run_id == status["tracking"]["runId"] and run.info.status == "FINISHED"
    assert run.data.tags["fsdp.dev/attempt"] == "2"
    steps = [step for step, _ in history(mlflow, run.info.run_id, "loss")]
    # Attempt 1 logged 1..12 (step 12's loss may be its last record), attempt 2 went on from 13: no restart at 1.
    assert steps[0] == 1 and steps[-1] == 20 and set(steps) == set(range(1, 21)) and steps.count(1) == 1


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_tracker_stopped_mid_run_leaves_the_job_succeeded_with_a_warning(server: Server, tmp_path: Path) -> None:
    manifest = tracked_job(tmp_path, "tiny-untracked", server)
    manifest["spec"]["training"].update(steps=400)
    status_file = tmp_path / "job.json"
    fsdpctl = Path(sys.executable).with_name("fsdpctl")
    command = [str(fsdpctl), "run-local", "-f", str(write(manifest, tmp_path)), "--status-out", str(status_file)]
    started = time.monotonic()
    with subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    ) as proc:
        mlflow = client(server)
        logged: list[Any] = []
        while proc.poll() is None and not logged and time.monotonic() - started < 600:
            runs = [
                r
                for e in mlflow.search_experiments()
                if e.name == "tests"
                for r in mlflow.search_runs([e.experiment_id])
            ]
            logged = [r for r in runs if mlflow.get_metric_history(r.info.run_id, "loss")]
            time.sleep(0.5)
        assert logged, "no step reached the tracker"
        server.stop()  # mid-run: the job goes on
        output, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, output[-4000:]
    assert_nothing_left(output)
    status = json.loads(status_file.read_text())["status"]
    assert status["phase"] == "Succeeded" and status["progress"]["step"] == 400
    assert conditions(status)["TrackingHealthy"] == ("False", "TrackerUnreachable")
    assert status["tracking"]["runId"] == logged[0].info.run_id and status["tracking"]["problem"]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_every_report_of_a_user_function_reaches_its_run_the_last_included(server: Server, tmp_path: Path) -> None:
    """The example function, tracked: MLflow holds the loss of every report, point by point as status's lossHistory,
    the last one included (the controller's tracker once went with the controller before sending it), and the run
    is marked finished."""
    example_dir = Path(__file__).resolve().parents[2] / "examples" / "byo-function"
    manifest = yaml.safe_load((example_dir / "job.yaml").read_text())
    manifest["metadata"]["name"] = "byo-tracked"
    spec = manifest["spec"]
    spec["trainFunction"]["code"] = str(example_dir)
    spec["training"]["checkpoint"]["storage"] = str(tmp_path / "checkpoints")
    spec["sharedVolume"]["mountPath"] = str(tmp_path)
    spec["tracking"] = {"mlflow": {"trackingUri": server.uri, "experiment": "tests"}}
    proc, job = run_local(write(manifest, tmp_path), tmp_path, timeout=800)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    status = job["status"]
    steps = spec["trainFunction"]["config"]["steps"]
    assert status["phase"] == "Succeeded" and status["progress"]["step"] == steps
    mlflow = client(server)
    run = mlflow.get_run(status["tracking"]["runId"])
    assert run.info.status == "FINISHED"
    logged = history(mlflow, run.info.run_id, "loss")
    assert [step for step, _ in logged] == list(range(1, steps + 1)), logged
    points = status["progress"]["lossHistory"]
    assert [step for step, _ in points] == list(range(1, steps + 1))
    assert_same_series(logged, points)


@pytest.mark.slow
@pytest.mark.timeout(1200)  # two attempts, each with its own group of Ray Train workers
def test_a_user_functions_series_matches_status_across_a_restart(server: Server, tmp_path: Path) -> None:
    """A user function whose rank 1 dies after the step-4 checkpoint in attempt 1 (no worker restart allowed, one
    retry): attempt 2 resumes from step 4 in the same MLflow run. MLflow's loss series over both attempts equals
    status's lossHistory point by point, and each step is logged once (the resumed attempt trains none again)."""
    checks = Path(__file__).resolve().parents[1] / "data" / "byo"
    steps, every = 10, 4
    config = {"steps": steps, "checkpoint_every": every, "kill_rank": 1, "kill_at_step": every}
    manifest = yaml.safe_load(
        (Path(__file__).resolve().parents[2] / "examples" / "byo-function" / "job.yaml").read_text()
    )
    manifest["metadata"]["name"] = "byo-restarted"
    spec = manifest["spec"]
    spec["trainFunction"] = {"callable": "byo_checks.functions:train", "code": str(checks), "config": config}
    spec["training"]["checkpoint"]["storage"] = str(tmp_path / "checkpoints")
    spec["sharedVolume"]["mountPath"] = str(tmp_path)
    spec["runPolicy"] = {"maxWorkerRestarts": 0, "backoffLimit": 1}  # the kill costs the attempt
    spec["tracking"] = {"mlflow": {"trackingUri": server.uri, "experiment": "tests"}}
    proc, job = run_local(write(manifest, tmp_path), tmp_path, timeout=1100)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    status = job["status"]
    assert status["phase"] == "Succeeded" and status["attempts"] == 2, status.get("message")
    assert status["progress"]["metrics"] == {"resumed_from": float(every)}  # attempt 2 went on from the checkpoint
    mlflow = client(server)
    (experiment,) = [e for e in mlflow.search_experiments() if e.name == "tests"]
    (run,) = mlflow.search_runs([experiment.experiment_id])  # one run for both attempts
    assert run.info.run_id == status["tracking"]["runId"] and run.info.status == "FINISHED"
    assert run.data.tags["fsdp.dev/attempt"] == "2"
    logged = history(mlflow, run.info.run_id, "loss")
    assert [step for step, _ in logged] == list(range(1, steps + 1)), logged  # attempt 1's 1..4, attempt 2's 5..10
    assert_same_series(logged, status["progress"]["lossHistory"])
