"""The conditions table: Complete/Failed set once (batch/v1 Job), Running, resets, warnings, dashboardURL."""

from __future__ import annotations

import ast
from dataclasses import replace
from pathlib import Path

from fsdp_operator.decide.observed import RayJobInfo
from fsdp_operator.decide.status import (
    CONDITIONS,
    ConditionType,
    JobStatus,
    Phase,
    Reason,
    cleared_run_data,
    get_condition,
)
from test_reconcile import ALL_NODES, NOW, at, cluster, events, manifest, run, sid

ROOT = Path(__file__).resolve().parents[2]


def cond(status: JobStatus, type_: str) -> dict[str, object]:
    found = get_condition(status.conditions, type_)
    assert found is not None, f"no {type_} condition in {status.conditions}"
    return found


# The conditions that say how one attempt went: a new attempt starts without them.
OF_AN_ATTEMPT = {
    "TransportVerified",
    "InterconnectHealthy",
    "EventsAuthentic",
    "Progressing",
    "Straggler",
    "TrackingHealthy",
}


def test_every_condition_type_has_a_rule() -> None:
    assert set(CONDITIONS) == set(ConditionType)
    assert [t for t, rule in CONDITIONS.items() if rule.set_once] == ["Complete", "Failed"]
    assert {t for t, rule in CONDITIONS.items() if rule.warning_when_false} == {
        "TransportVerified",
        "InterconnectHealthy",
        "EventsAuthentic",
        "Progressing",
        "TrackingHealthy",
    }
    assert {t for t, rule in CONDITIONS.items() if rule.warning_when_true} == {"Straggler"}
    assert {t for t, rule in CONDITIONS.items() if rule.resets_on_new_attempt} == OF_AN_ATTEMPT


def test_a_succeeded_job_is_complete_and_not_running() -> None:
    running = run(manifest(), at(Phase.SUBMITTING), cluster=cluster(), ray_job=RayJobInfo(sid(1), "RUNNING"))
    assert running.status.phase == Phase.RUNNING
    assert cond(running.status, "Running")["status"] == "True"
    assert get_condition(running.status.conditions, "Complete") is None
    done = run(manifest(), running.status, cluster=cluster(), ray_job=RayJobInfo(sid(1), "SUCCEEDED"))
    assert done.status.phase == Phase.SUCCEEDED
    complete = cond(done.status, "Complete")
    assert (complete["status"], complete["reason"]) == ("True", "Completed")
    assert (cond(done.status, "Running")["status"], cond(done.status, "Running")["reason"]) == ("False", "Completed")
    assert get_condition(done.status.conditions, "Failed") is None


def test_a_failed_job_has_failed_true_with_the_reason_and_it_never_changes() -> None:
    status = at(Phase.RUNNING, conditions=[])
    d = run(manifest(), status, cluster=cluster(), ray_job=RayJobInfo(sid(1), "STOPPED", "stopped by hand"))
    failed = cond(d.status, "Failed")
    assert (failed["status"], failed["reason"]) == ("True", "RayJobStopped")
    assert "stopped by hand" in str(failed["message"])
    # Set once: later passes (and a later, different message) leave it exactly as it was.
    changed = replace(d.status, message="something else")
    again = run(manifest(), changed, cluster=cluster(), ray_job=RayJobInfo(sid(1), "STOPPED"))
    assert cond(again.status, "Failed") == failed


def test_validation_failure_is_failed() -> None:
    m = manifest()
    m["spec"]["workers"]["replicas"] = -1
    d = run(m, JobStatus())
    assert cond(d.status, "Failed")["reason"] == "ValidationFailed"


def test_a_retry_is_not_failed_and_not_running() -> None:
    m = manifest(backoffLimit=1)
    running = run(m, at(Phase.SUBMITTING), cluster=cluster(), ray_job=RayJobInfo(sid(1), "RUNNING"))
    d = run(m, running.status, cluster=cluster(), ray_job=RayJobInfo(sid(1), "FAILED", "boom"))
    assert d.status.phase == Phase.PROVISIONING and d.status.reason == Reason.RETRYING
    assert get_condition(d.status.conditions, "Failed") is None
    assert (cond(d.status, "Running")["status"], cond(d.status, "Running")["reason"]) == ("False", "Retrying")


def test_new_attempt_drops_exactly_the_conditions_the_table_resets() -> None:
    conditions = [
        {"type": t.value, "status": "True", "reason": "x", "message": "", "lastTransitionTime": ""}
        for t in ConditionType
    ]
    kept = {c["type"] for c in cleared_run_data(JobStatus(conditions=conditions)).conditions}
    assert kept == {t.value for t in ConditionType} - OF_AN_ATTEMPT


def test_waiting_for_workers_posts_normal_events() -> None:
    d = run(manifest(), at(Phase.PROVISIONING, reason=Reason.CLUSTER_CREATING), cluster=cluster(ready=1, state=""))
    assert d.status.reason == Reason.WORKERS_NOT_READY
    assert events(d) == [("Normal", "WorkersNotReady")]


def test_dashboard_url_comes_from_the_raycluster() -> None:
    d = run(manifest(), at(Phase.PROVISIONING), cluster=cluster(), ray_nodes=ALL_NODES)
    assert d.status.dashboard_url == "http://10.0.0.1:8265"
    assert d.status.to_dict()["dashboardURL"] == "http://10.0.0.1:8265"
    assert JobStatus.from_dict(d.status.to_dict()).dashboard_url == "http://10.0.0.1:8265"


def test_every_reason_written_with_a_condition_is_in_the_table() -> None:
    """Each `set_condition(..., ConditionType.X, status, "Reason", ...)` literal in the operator is declared."""
    written: list[tuple[str, str]] = []
    for path in (ROOT / "operator" / "fsdp_operator").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "set_condition" and len(node.args) >= 4:
                type_arg, reason_arg = node.args[1], node.args[3]
                if (
                    isinstance(type_arg, ast.Attribute)
                    and isinstance(reason_arg, ast.Constant)
                    and isinstance(reason_arg.value, str)
                ):
                    written.append((type_arg.attr, reason_arg.value))
    assert written, "no set_condition call found"
    for attr, reason in written:
        assert reason in CONDITIONS[ConditionType[attr]].reasons, (attr, reason)


def test_the_loss_history_is_bounded_and_spans_the_whole_run() -> None:
    from fsdp_operator.api.spec import parse_job
    from fsdp_operator.decide.folding import LOSS_HISTORY_POINTS, fold_events
    from fsdp_train.contract.events import Step

    job = parse_job(manifest())
    status = JobStatus()
    for step in range(1, 1001):
        event = Step(rank=0, step=step, total_steps=1000, loss=10.0 / step, tokens_per_second=1.0,
                     tokens_per_second_per_device=1.0)  # fmt: skip
        status = fold_events(job, status, [event], now=NOW).status
    history = status.progress["lossHistory"]
    assert len(history) <= LOSS_HISTORY_POINTS
    assert history[0] == [1, 10.0] and history[-1] == [1000, 0.01]
    steps = [p[0] for p in history]
    assert steps == sorted(steps) and len(set(steps)) == len(steps)
    # Re-reading the last line (a restart) does not add a point.
    again = fold_events(job, status, [Step(rank=0, step=1000, total_steps=1000, loss=0.01, tokens_per_second=1.0,
                                           tokens_per_second_per_device=1.0)], now=NOW).status  # fmt: skip
    assert again.progress["lossHistory"] == history


def test_every_reason_a_job_can_fail_with_is_a_reason_of_the_failed_condition() -> None:
    """`_finish(..., Phase.FAILED, Reason.X, ...)` and `_attempt_failed(..., Reason.X, ...)` in reconcile.py."""
    failing: set[str] = {"VALIDATION_FAILED"}
    decide = ROOT / "operator" / "fsdp_operator" / "decide"
    modules = [ast.parse((decide / name).read_text()) for name in ("reconcile.py", "guards.py")]
    tree = ast.Module([statement for module in modules for statement in module.body], [])
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
            continue
        args = node.args
        # A plain name there is a reason handed through (`_attempt_failed` -> `_finish`): counted at its source.
        finish = node.func.id == "_finish" and len(args) >= 5 and getattr(args[3], "attr", "") == "FAILED"
        if finish and isinstance(args[4], ast.Attribute):
            failing.add(args[4].attr)
        if node.func.id == "_attempt_failed" and len(args) >= 4 and isinstance(args[3], ast.Attribute):
            failing.add(args[3].attr)
    assert len(failing) > 5, failing
    assert {Reason[name] for name in failing} == CONDITIONS[ConditionType.FAILED].reasons
