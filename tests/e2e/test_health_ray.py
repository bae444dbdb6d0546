"""spec.health end to end: `fsdpctl run-local`, CPU ranks on gloo, real Ray processes.

The default case is the whole story in one run of the bundled function on two ranks: rank 0 is slower than the
other by a fixed time per step (named a straggler), rank 1 blocks in code before a step while rank 0 waits in FSDP's
collectives (with `hangTimeoutSeconds: 30` the status names rank 1, its `file:line` and the other's collective), and
`onHang: Restart` resumes from the checkpoint and finishes (about 8 minutes of wall time on the loaded 2-core
machine, most of it two Ray starts). The same for a user function, `onHang: Fail`, and a
clean 200-step run that must raise neither verdict run with `make test-all` (`slow`).

The faults come from the bundled loop's test hook (`fsdp_train.run.fault_hooks`, an environment variable set through
`runtimeEnv.envVars`) and from the test's own user function (tests/data/byo/byo_checks/functions.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from support.ray_cluster import RAY_TESTS
from test_byo_function import CHECKS, function_job
from test_run_local import EXAMPLE, run_local

pytestmark = [pytest.mark.e2e, RAY_TESTS, pytest.mark.timeout(900)]

HANG_TIMEOUT = 30
STALL_RANK, SLOW_RANK = 1, 2
RUN_TIMEOUT = 850  # the whole run-local, two attempts, on a loaded shared machine (pytest's limit is 900)


def bundled_job(
    tmp_path: Path, name: str, *, steps: int, hook: str, health: dict[str, Any], ranks: int = 4, **policy: Any
) -> Path:
    manifest = yaml.safe_load(EXAMPLE.read_text())
    manifest["metadata"]["name"] = name
    spec = manifest["spec"]
    if ranks == 2:  # one rank on each of the two workers: half the processes on a loaded machine
        spec["workers"].update(ranksPerWorker=1, cpu="1")
        spec["training"]["sharding"] = "full"
    spec["training"].update(steps=steps, checkpoint={"storage": str(tmp_path / "checkpoints"), "intervalSteps": 5})
    spec["sharedVolume"] = {"claimName": "shared", "mountPath": str(tmp_path)}
    spec["health"] = health
    # TORCH_FR_BUFFER_SIZE: gloo records its collectives too (torch 2.13), so the stall names their numbers.
    spec["runtimeEnv"] = {"envVars": {"FSDP_TRAIN_TEST_HEALTH": hook, "TORCH_FR_BUFFER_SIZE": "200"}}
    spec["runPolicy"] = {"maxWorkerRestarts": 0, **policy}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(manifest))
    return path


def assert_the_stall_is_named(last: dict[str, Any], code_at: str) -> None:
    """`lastStall`: rank STALL_RANK in code at `code_at`, the others waiting in a collective; node, pod named."""
    assert [s["rank"] for s in last["suspects"]] == [STALL_RANK], last
    suspect = last["suspects"][0]
    assert suspect["reason"] == "RankStalled" and suspect["node"] and suspect["pod"], suspect
    by_rank = {r["rank"]: r for r in last["ranks"]}
    assert by_rank[STALL_RANK]["where"] == "code" and code_at in by_rank[STALL_RANK]["at"], by_rank
    assert HANG_TIMEOUT <= by_rank[STALL_RANK]["stalledSeconds"] < HANG_TIMEOUT + 15, by_rank
    others = [r for rank, r in by_rank.items() if rank != STALL_RANK]
    assert others and all(r["where"] == "collective" and r["collective"] for r in others), by_rank
    assert f"rank {STALL_RANK} (" in last["message"] and code_at in last["message"], last["message"]
    assert "wait in" in last["message"], last["message"]


# behind `slow` for now: minutes of Ray start-ups, over `make test`'s budget (docs/testing.md)
@pytest.mark.slow
def test_a_stalled_rank_is_named_and_restart_resumes_and_a_slow_rank_is_a_straggler(tmp_path: Path) -> None:
    health = {"hangTimeoutSeconds": HANG_TIMEOUT, "onHang": "Restart", "stragglerWindowSteps": 5}
    slow_rank = 0  # two ranks: rank 1 stalls, rank 0 is the slow one
    hook = f"stall={STALL_RANK}:12,slow={slow_rank}:0.4"
    # 45 steps: the second attempt's 35, each at least 0.4 s on rank 0, outlast REPORT_EVERY_SECONDS however fast the
    # machine (with 30, a quiet machine finished the attempt before its ranks' first health report was due).
    job = bundled_job(tmp_path, "tiny-stall", steps=45, hook=hook, health=health, ranks=2, backoffLimit=1)
    proc, obj = run_local(job, tmp_path, timeout=RUN_TIMEOUT)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    status = obj["status"]
    assert status["phase"] == "Succeeded", status.get("message")
    # The first attempt stalled before step 12; the second resumed from the step-10 checkpoint and finished.
    assert status["attempts"] == 2 and status["failedAttempts"] == 1
    assert status["result"]["resumedFromStep"] == 10 and status["progress"]["step"] == 45
    health_status = status["health"]
    assert_the_stall_is_named(health_status["lastStall"], "fault_hooks.py:")
    assert health_status["lastStall"]["attempt"] == 1
    # The others wait in FSDP's collectives; gloo's flight recorder numbers the one they entered.
    assert "entered" in health_status["lastStall"]["message"], health_status["lastStall"]["message"]
    # Rank 0, 0.4 s slower per step, is named a straggler in the second attempt; rank 1 is not.
    straggler = next(c for c in status["conditions"] if c["type"] == "Straggler")
    assert (straggler["status"], straggler["reason"]) == ("True", "SlowRank"), straggler
    assert f"rank {slow_rank} (" in straggler["message"], straggler["message"]
    slow = [s for s in health_status["suspects"] if s["reason"] == "SlowRank"]
    assert [s["rank"] for s in slow] == [slow_rank] and slow[0]["ratio"] >= 1.5, health_status
    progressing = next(c for c in status["conditions"] if c["type"] == "Progressing")
    assert progressing["status"] == "True", progressing


@pytest.mark.slow
def test_a_stalled_rank_with_on_hang_fail_ends_failed_with_the_evidence(tmp_path: Path) -> None:
    health = {"hangTimeoutSeconds": HANG_TIMEOUT, "onHang": "Fail"}
    job = bundled_job(tmp_path, "tiny-stall-fail", steps=20, hook=f"stall={STALL_RANK}:8", health=health)
    _, obj = run_local(job, tmp_path, timeout=RUN_TIMEOUT)
    status = obj["status"]
    assert status["phase"] == "Failed" and status["reason"] == "RankStalled", status.get("message")
    assert f"rank {STALL_RANK} (" in status["message"]
    assert_the_stall_is_named(status["health"]["lastStall"], "fault_hooks.py:")
    progressing = next(c for c in status["conditions"] if c["type"] == "Progressing")
    assert (progressing["status"], progressing["reason"]) == ("False", "RankStalled")
    assert status["attempts"] == 1


@pytest.mark.slow
def test_a_user_function_stalled_in_its_code_is_named_and_restart_finishes(tmp_path: Path) -> None:
    config = {"steps": 12, "checkpoint_every": 3, "stall_rank": STALL_RANK, "stall_at_step": 5}
    function = {"callable": "byo_checks.functions:train", "code": str(CHECKS), "config": config}
    path = function_job(tmp_path, "byo-stall", function)
    manifest = yaml.safe_load(path.read_text())
    manifest["spec"]["health"] = {"hangTimeoutSeconds": HANG_TIMEOUT, "onHang": "Restart"}
    manifest["spec"]["runPolicy"] = {"maxWorkerRestarts": 0, "backoffLimit": 1}
    path.write_text(yaml.safe_dump(manifest))
    proc, obj = run_local(path, tmp_path, timeout=RUN_TIMEOUT)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    status = obj["status"]
    assert status["phase"] == "Succeeded", status.get("message")
    assert status["attempts"] == 2
    assert_the_stall_is_named(status["health"]["lastStall"], "functions.py:")
    assert "wait_for_a_lock_nobody_releases" in status["health"]["lastStall"]["message"]
    by_rank = {r["rank"]: r for r in status["health"]["lastStall"]["ranks"]}
    assert all("all_reduce" in r["collective"] for rank, r in by_rank.items() if rank != STALL_RANK), by_rank


@pytest.mark.slow
def test_a_user_function_slowed_on_one_rank_names_it_a_straggler(tmp_path: Path) -> None:
    config = {"steps": 120, "slow_rank": SLOW_RANK, "slow_seconds": 0.15}
    function = {"callable": "byo_checks.functions:train", "code": str(CHECKS), "config": config}
    path = function_job(tmp_path, "byo-slow", function)
    manifest = yaml.safe_load(path.read_text())
    manifest["spec"]["health"] = {"stragglerWindowSteps": 20}
    path.write_text(yaml.safe_dump(manifest))
    _, obj = run_local(path, tmp_path, timeout=RUN_TIMEOUT)
    status = obj["status"]
    assert status["phase"] == "Succeeded", status.get("message")
    straggler = next(c for c in status["conditions"] if c["type"] == "Straggler")
    assert (straggler["status"], straggler["reason"]) == ("True", "SlowRank"), straggler
    assert f"rank {SLOW_RANK} (" in straggler["message"]


@pytest.mark.slow
def test_a_clean_200_step_run_raises_no_straggler_and_no_stall(tmp_path: Path) -> None:
    job = bundled_job(tmp_path, "tiny-clean", steps=200, hook="", health={"stragglerWindowSteps": 20})
    proc, obj = run_local(job, tmp_path, timeout=RUN_TIMEOUT)
    assert "status" in obj, f"run-local wrote no status (exit {proc.returncode}):\n{proc.stdout[-4000:]}"
    status = obj["status"]
    assert status["phase"] == "Succeeded", status.get("message")
    conditions = {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}
    assert conditions["Progressing"] == ("True", "RanksProgressing")
    assert conditions["Straggler"] == ("False", "NoStraggler")
    assert "lastStall" not in status["health"] and "suspects" not in status["health"]
    assert len(status["health"]["ranks"]) == 4
