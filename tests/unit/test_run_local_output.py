"""run-local tells the truth: GPU jobs refused up front, every status message shown, a short summary."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import yaml
from fsdp_operator.cli.main import main
from fsdp_operator.decide.summary import loss_curve, summary_lines
from fsdp_operator.local.run import Progress

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_a_gpu_job_is_refused_before_anything_starts(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run-local", "-f", str(EXAMPLES / "qwen2.5-1.5b-efa.yaml")]) == 2
    captured = capsys.readouterr()
    assert "cannot run on this machine: spec.workers.gpusPerWorker is 4" in captured.err
    assert "examples/tiny-cpu.yaml" in captured.err
    assert captured.out == ""  # no API server, no Ray: nothing was started


def test_a_queued_job_is_refused_before_anything_starts(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """run-local has no Kueue: a queued RayCluster would stay suspended for ever."""
    manifest = yaml.safe_load((EXAMPLES / "tiny-cpu.yaml").read_text())
    manifest["spec"]["queueName"] = "team-a"
    path = tmp_path / "queued.yaml"
    path.write_text(yaml.safe_dump(manifest))
    assert main(["run-local", "-f", str(path)]) == 2
    captured = capsys.readouterr()
    assert "cannot run on this machine: spec.queueName" in captured.err and "has no Kueue" in captured.err
    assert captured.out == ""


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


def test_without_a_terminal_step_lines_come_although_no_exact_tenth_is_seen(monkeypatch: pytest.MonkeyPatch) -> None:
    """Status is read twice a second and holds the latest step only: step 10, 20, ... may never be seen."""
    clock = [0.0]
    monkeypatch.setattr("fsdp_operator.local.run.time.monotonic", lambda: clock[0])
    out = io.StringIO()  # not a terminal
    progress = Progress(out, started=0.0)
    running = {"phase": "Running", "reason": "JobRunning", "message": "training is running"}
    for step in (3, 7, 13, 17, 27, 33, 41, 43, 44, 99, 100):
        clock[0] += 1.0
        progress.show({**running, "progress": {"step": step, "totalSteps": 100, "loss": 5.0, "tokensPerSecond": 9}})
    steps = [line.split("] ", 1)[1].split()[1] for line in out.getvalue().splitlines() if "] step " in line]
    assert steps == ["3/100", "13/100", "27/100", "33/100", "41/100", "99/100", "100/100"]
    # A slow run: no new tenth for minutes, still a line every STEP_LINE_SECONDS while it advances.
    clock[0] += 31.0
    progress.show({**running, "progress": {"step": 100, "totalSteps": 100, "loss": 5.0, "tokensPerSecond": 9}})
    slow = Progress(out := io.StringIO(), started=clock[0])
    for step in (1, 2, 3, 4):
        clock[0] += 31.0
        slow.show({**running, "progress": {"step": step, "totalSteps": 1000, "loss": 5.0, "tokensPerSecond": 9}})
    assert [line.split("] ", 1)[1].split()[1] for line in out.getvalue().splitlines() if "] step " in line] == [
        "1/1000", "2/1000", "3/1000", "4/1000"
    ]  # fmt: skip


def test_the_timeout_is_in_the_help_and_never_cuts_a_run_the_job_allows(capsys: pytest.CaptureFixture[str]) -> None:
    from fsdp_operator.api.spec import parse_job
    from fsdp_operator.cli.main import build_parser
    from fsdp_operator.local.run import DEADLINE_ALLOWANCE_SECONDS, default_timeout

    with pytest.raises(SystemExit):
        main(["run-local", "--help"])
    assert "--timeout SECONDS" in capsys.readouterr().out
    assert build_parser().parse_args(["run-local", "-f", "job.yaml"]).timeout is None
    manifest = yaml.safe_load((EXAMPLES / "tiny-cpu.yaml").read_text())
    assert default_timeout(parse_job(manifest)) is None  # no deadline in the spec: no limit either
    manifest["spec"]["runPolicy"] = {"activeDeadlineSeconds": 7200}
    assert default_timeout(parse_job(manifest)) == 7200 + DEADLINE_ALLOWANCE_SECONDS
    for bad in ("0", "-5", "soon", "inf", "nan"):
        with pytest.raises(SystemExit):
            main(["run-local", "-f", "job.yaml", "--timeout", bad])
        assert "--timeout" in capsys.readouterr().err


def test_keep_applies_the_job_with_cleanup_keep_and_leaves_the_file_alone() -> None:
    from fsdp_operator.local.run import manifest_to_apply

    manifest = yaml.safe_load((EXAMPLES / "tiny-cpu.yaml").read_text())
    kept = manifest_to_apply(manifest, keep=True)
    assert kept["spec"]["runPolicy"]["cleanup"] == "Keep"
    assert "runPolicy" not in manifest["spec"]
    assert manifest_to_apply(manifest, keep=False) == manifest


def test_a_rerun_that_resumed_from_a_checkpoint_says_so_once() -> None:
    out = io.StringIO()
    progress = Progress(out, started=0.0)
    done = {"phase": "Succeeded", "reason": "Completed", "message": "training finished after 40 steps",
            "progress": {"step": 40, "totalSteps": 40}, "result": {"steps": 40, "resumedFromStep": 20}}  # fmt: skip
    progress.show(done)
    progress.show(done)
    lines = [line.split("] ", 1)[1] for line in out.getvalue().splitlines()]
    assert lines.count("resumed from the checkpoint of step 20, not from the start") == 1
    # A condition that names the resume (with its reason) is what is printed when the status has one.
    out = io.StringIO()
    resumed = {"type": "Resumed", "status": "True", "reason": "SameFingerprint", "message": "from step 20 of ckpt"}
    Progress(out, started=0.0).show({**done, "conditions": [resumed]})
    assert "resumed: from step 20 of ckpt" in out.getvalue()
    out = io.StringIO()
    Progress(out, started=0.0).show({**done, "result": {"steps": 40}})
    assert "resumed" not in out.getvalue()


def test_an_endpoint_in_network_env_is_refused_before_anything_starts_and_points_to_spec_env(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """network.env reaches the workers only, while the job's driver on the head reads the data."""
    manifest = yaml.safe_load((EXAMPLES / "tiny-cpu.yaml").read_text())
    manifest["spec"]["network"]["env"] = [{"name": "AWS_ENDPOINT_URL", "value": "http://minio:9000"}]
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(manifest))
    assert main(["run-local", "-f", str(path)]) == 2
    captured = capsys.readouterr()
    assert "spec.network.env[0].name: AWS_ENDPOINT_URL is not a transport variable" in captured.err
    assert "use spec.env, which reaches every Ray process" in captured.err
    assert captured.out == ""


def test_the_silence_before_the_first_rank_is_broken_by_a_line_while_running() -> None:
    """A data job's driver reads, tokenizes and packs for a minute before any rank reports: say so."""
    import time

    out = io.StringIO()
    progress = Progress(out, started=time.monotonic() - 100, data=True)  # nothing said for 100 s
    running = {"phase": "Running", "reason": "JobRunning", "message": "training is running"}
    progress.show(running)  # the message line itself
    progress.said_at -= 100  # as if that line was said 100 s ago
    progress.show(running)
    progress.show(running)  # at most one line per QUIET_SECONDS
    lines = [line.split("] ", 1)[1] for line in out.getvalue().splitlines()]
    assert lines == [
        "Running (JobRunning): training is running",
        "still starting: reading, tokenizing and packing the data, then starting the training workers "
        "(no rank has reported yet)",
    ]
    progress.said_at -= 100
    progress.show({**running, "ranks": [{"rank": 0}]})  # a rank reported: no more waiting lines
    assert "still starting" not in out.getvalue().splitlines()[-1]


def test_a_failed_phase_line_leaves_the_message_to_the_end() -> None:
    out = io.StringIO()
    Progress(out, started=0.0).show({"phase": "Failed", "reason": "RayJobFailed", "message": "rank 0: X: y"})
    assert out.getvalue().split("] ", 1)[1] == "Failed (RayJobFailed)\n"
    assert summary_lines({"phase": "Failed", "reason": "RayJobFailed", "message": "m"}, message=False)[0] == (
        "phase      Failed (RayJobFailed)"
    )


def test_the_work_dir_goes_where_rays_socket_paths_fit_whatever_tmpdir_is() -> None:
    """A TMPDIR longer than a few characters over /tmp (macOS's /var/folders/.../T/ is 49) once left the Ray head
    unstarted and run-local waiting 300 s: every path a node's socket takes must fit AF_UNIX's 107 bytes."""
    from fsdp_operator.local.run import RAY_SOCKET_UNDER_WORK_DIR, UNIX_SOCKET_PATH_MAX, work_dir_parent

    assert work_dir_parent("/tmp") == ("/tmp", "")
    mac = "/var/folders/zz/zyxvpxvq6csfxvn_n0000000000000/T/"
    parent, why = work_dir_parent(mac)
    assert parent == "/tmp" and "AF_UNIX" in why and mac in why
    work_dir = f"{parent}/fsdp-local-abcdefgh"
    assert len(work_dir) + RAY_SOCKET_UNDER_WORK_DIR <= UNIX_SOCKET_PATH_MAX
    # The longest TMPDIR kept fits exactly; one character more moves the work dir.
    longest = UNIX_SOCKET_PATH_MAX - RAY_SOCKET_UNDER_WORK_DIR - len("/fsdp-local-abcdefgh")
    assert work_dir_parent("/" + "t" * (longest - 1))[1] == ""
    assert work_dir_parent("/" + "t" * longest)[0] == "/tmp"
    with pytest.raises(RuntimeError, match=r"TMPDIR .* is 49 characters.* /nowhere is not writable.* at most 13 "):
        work_dir_parent(mac, fallback="/nowhere")


def test_the_summary_says_what_the_run_went_through_a_line_each() -> None:
    """A job that succeeded after a stall and a drain: its attempts, the stall and the interruption each get a line
    (only `-o json` and `kubectl describe` showed them)."""
    status = {
        "phase": "Succeeded", "attempts": 3, "failedAttempts": 1,
        "health": {"lastStall": {"attempt": 1, "message": "rank 1 (pod w-1) made no progress for 30 s in train()"}},
        "interruptions": [
            {"attempt": 2, "pod": "w-0", "reason": "PodDeleted", "step": 13, "saved": True, "checkpointStep": 13,
             "stepsLost": 0},
            {"attempt": 3, "pod": "w-1", "reason": "preStop"},
        ],
    }  # fmt: skip
    lines = summary_lines(status)
    assert "attempts   3 (1 failed, 2 interrupted)" in lines
    assert "stalled    attempt 1: rank 1 (pod w-1) made no progress for 30 s in train()" in lines
    assert "interrupted attempt 2 at step 13: w-0 (PodDeleted), saved step 13, 0 steps lost" in lines
    assert "interrupted attempt 3: w-1 (preStop), noticed; the ranks had not reported yet" in lines
    assert not [line for line in summary_lines({"phase": "Succeeded", "attempts": 1}) if "attempt" in line]


def test_run_local_shows_every_status_the_job_had_even_one_shorter_than_a_poll(tmp_path: Path) -> None:
    """A drained worker's `Interrupted` lasts one pass: polled every 0.5 s it was never printed. run-local reads the
    API server's change history of its job (the store is in its own process), in order."""
    from fsdp_operator.api import generate
    from fsdp_operator.local.run import LocalRun

    manifest = yaml.safe_load((EXAMPLES / "tiny-cpu.yaml").read_text())
    run = LocalRun(manifest, tmp_path, io.StringIO())
    store = run.api.store
    store.create(store.resource("customresourcedefinitions", "apiextensions.k8s.io"), generate.crd())
    jobs = store.resource("fsdptrainingjobs", "fsdp.dev")
    store.create(jobs, manifest, "default")
    for phase, reason in [
        ("Running", "JobRunning"),
        ("Provisioning", "Interrupted"),
        ("Provisioning", "WorkersNotReady"),
    ]:
        job = store.get(jobs, manifest["metadata"]["name"], "default")
        store.update(jobs, job["metadata"]["name"], {**job, "status": {"phase": phase, "reason": reason}}, "default",
                     subresource="status")  # fmt: skip
    out = io.StringIO()
    progress = Progress(out, 0.0)
    for change in run._changes_since(0):
        progress.show(change.object.get("status") or {})
    lines = out.getvalue()
    assert (
        lines.index("Running (JobRunning)")
        < lines.index("Provisioning (Interrupted)")
        < lines.index("Provisioning (WorkersNotReady)")
    ), lines
