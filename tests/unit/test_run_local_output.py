"""run-local tells the truth: GPU jobs refused up front, every status message shown, a short summary."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from fsdp_operator.cli import main
from fsdp_operator.local.run import Progress
from fsdp_operator.summary import loss_curve, summary_lines

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_a_gpu_job_is_refused_before_anything_starts(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run-local", "-f", str(EXAMPLES / "qwen2.5-1.5b-efa.yaml")]) == 2
    captured = capsys.readouterr()
    assert "cannot run on this machine: spec.workers.gpusPerWorker is 4" in captured.err
    assert "examples/tiny-cpu.yaml" in captured.err
    assert captured.out == ""  # no API server, no Ray: nothing was started


def test_every_message_change_is_printed_once() -> None:
    out = io.StringIO()
    progress = Progress(out, started=0.0)
    waiting = {"phase": "Provisioning", "reason": "WorkersNotReady", "message": "0/2 worker pods ready"}
    for status in (
        {},
        waiting,
        waiting,
        {**waiting, "message": "1/2 worker pods ready"},
        {**waiting, "message": "Ray reports 1/2 worker nodes alive"},
        {"phase": "Running", "reason": "JobRunning", "message": "training is running",
         "progress": {"step": 1, "totalSteps": 20, "loss": 6.3, "tokensPerSecond": 800}},
        {"phase": "Running", "reason": "JobRunning", "message": "training is running",
         "progress": {"step": 20, "totalSteps": 20, "loss": 5.6, "tokensPerSecond": 8068}},
    ):  # fmt: skip
        progress.show(status)
    lines = [line.split("] ", 1)[1] for line in out.getvalue().splitlines()]
    assert lines == [
        "Provisioning (WorkersNotReady): 0/2 worker pods ready",
        "Provisioning (WorkersNotReady): 1/2 worker pods ready",
        "Provisioning (WorkersNotReady): Ray reports 1/2 worker nodes alive",
        "Running (JobRunning): training is running",
        "step 1/20  loss 6.3  tokens/s 800",
        "step 20/20  loss 5.6  tokens/s 8068",
    ]


def test_summary_of_a_failed_job_and_no_curve_without_history() -> None:
    status = {"phase": "Failed", "reason": "RayJobFailed", "message": "Ray: entrypoint exited with code 1"}
    assert summary_lines(status, saved_to="/tmp/x.json") == [
        "phase      Failed (RayJobFailed: Ray: entrypoint exited with code 1)",
        "status     /tmp/x.json",
    ]
    assert loss_curve(status) == ""
    assert loss_curve({"progress": {"lossHistory": [[1, 2.0]]}}) == ""
