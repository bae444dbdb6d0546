"""The status rules the state machine leans on, each written out: lifecycle conditions, the loss curve's
thinning, the size budget and what it cuts first."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

import pytest
from fsdp_operator.decide.budget import status_budget, within_budget
from fsdp_operator.decide.folding import LOSS_HISTORY_POINTS, _with_loss_point
from fsdp_operator.decide.lifecycle import with_lifecycle_conditions
from fsdp_operator.decide.status import Condition, JobStatus, Phase, Reason, get_condition
from support.running_job import NOW

AT = "2026-11-29T12:00:00Z"


GITOPS = {"Reconciling", "Stalled", "Ready"}


def lifecycle(old: JobStatus, new: JobStatus) -> JobStatus:
    return with_lifecycle_conditions(old, new, now=NOW, generation=5)


def batch_job_like(conditions: list[Condition]) -> list[Condition]:
    """The conditions batch/v1 Job also has (the GitOps ones are tested on their own)."""
    return [c for c in conditions if c["type"] not in GITOPS]


def test_running_turns_true_on_entry_and_false_with_the_next_phases_reason() -> None:
    running = lifecycle(JobStatus(phase=Phase.SUBMITTING), JobStatus(phase=Phase.RUNNING, reason=Reason.JOB_RUNNING))
    assert batch_job_like(running.conditions) == [
        {"type": "Running", "status": "True", "reason": "JobRunning", "message": "the Ray job runs",
         "lastTransitionTime": AT, "observedGeneration": 5},
    ]  # fmt: skip
    done = lifecycle(running, JobStatus(phase=Phase.SUCCEEDED, reason=Reason.COMPLETED, message="m" * 1100,
                                        conditions=running.conditions))  # fmt: skip
    assert get_condition(done.conditions, "Running") == {
        "type": "Running", "status": "False", "reason": "Completed", "message": "m" * 1024,
        "lastTransitionTime": AT, "observedGeneration": 5,
    }  # fmt: skip
    assert get_condition(done.conditions, "Complete") == {
        "type": "Complete", "status": "True", "reason": "Completed", "message": "m" * 1024,
        "lastTransitionTime": AT, "observedGeneration": 5,
    }  # fmt: skip


def test_a_job_that_never_ran_gets_no_running_condition_and_failed_once() -> None:
    failed = lifecycle(JobStatus(phase=Phase.PROVISIONING), JobStatus(phase=Phase.FAILED, message="no workers"))
    # No reason: the phase's name stands in.
    assert batch_job_like(failed.conditions) == [
        {"type": "Failed", "status": "True", "reason": "Failed", "message": "no workers",
         "lastTransitionTime": AT, "observedGeneration": 5},
    ]  # fmt: skip
    # Set once: a later phase change never rewrites it; no phase change touches nothing.
    again = with_lifecycle_conditions(
        JobStatus(phase=Phase.PENDING), JobStatus(phase=Phase.FAILED, message="other", conditions=failed.conditions),
        now=datetime(2026, 11, 30, tzinfo=UTC), generation=9,
    )  # fmt: skip
    assert batch_job_like(again.conditions) == batch_job_like(failed.conditions)
    same = lifecycle(JobStatus(), JobStatus(phase=Phase.RUNNING, reason=Reason.JOB_RUNNING))
    assert lifecycle(same, same) is same


@pytest.mark.parametrize("phase", list(Phase))
def test_the_gitops_conditions_follow_the_phase_and_never_contradict_complete_or_failed(phase: Phase) -> None:
    """kstatus reads Reconciling=True as InProgress and Stalled=True as Failed (then Current); Flux's Ready is True
    for a Succeeded job only. A Failed job once read as Current."""
    status = lifecycle(JobStatus(), JobStatus(phase=phase, reason=Reason.QUEUED, message="why"))
    got = {c["type"]: (c["status"], c["reason"]) for c in status.conditions if c["type"] in GITOPS}
    on_its_way = phase not in (Phase.SUCCEEDED, Phase.FAILED)
    assert got == {
        "Reconciling": (str(on_its_way), "Queued"),
        "Stalled": (str(phase == Phase.FAILED), "Queued"),
        "Ready": (str(phase == Phase.SUCCEEDED), "Queued"),
    }
    if phase == Phase.FAILED:
        assert get_condition(status.conditions, "Stalled")["message"] == "why"  # type: ignore[index]
    if on_its_way:
        assert get_condition(status.conditions, "Reconciling")["message"] == "why"  # type: ignore[index]
    # The phase's message moves within the phase: the condition follows, its transition time does not.
    later = with_lifecycle_conditions(
        status, replace(status, message="other"), now=datetime(2026, 11, 30, tzinfo=UTC), generation=6
    )
    moved = get_condition(later.conditions, "Reconciling" if on_its_way else "Stalled")
    assert moved is not None and moved["lastTransitionTime"] == AT
    assert moved["message"] == ("other" if on_its_way or phase == Phase.FAILED else moved["message"])


def test_the_loss_curve_halves_when_full_and_keeps_both_ends() -> None:
    history: list[list[float]] = []
    for step in range(1, LOSS_HISTORY_POINTS + 1):
        history = _with_loss_point(history, step, float(step))
    assert [p[0] for p in history] == list(range(1, LOSS_HISTORY_POINTS + 1))  # 64 points: not thinned yet
    history = _with_loss_point(history, 65, 65.0)
    assert [p[0] for p in history] == [*range(1, 64, 2), 65]
    # Malformed stored points are dropped, a re-read step replaces itself, a non-finite loss adds nothing.
    assert _with_loss_point([[1, 2.0], [3], "x", [2, 1.0]], 2, 0.5) == [[1, 2.0], [2, 0.5]]
    assert _with_loss_point([[1, 2.0]], 2, None) == [[1, 2.0]]
    assert _with_loss_point("junk", 1, 1.0) == [[1, 1.0]]


def test_the_budget_is_a_base_plus_two_kib_per_rank_up_to_one_mib() -> None:
    assert [status_budget(n) for n in (-3, 0, 1, 8)] == [16384, 16384, 18432, 32768]
    assert status_budget(10**6) == 1024 * 1024


def test_messages_are_always_cut_and_an_old_truncation_note_goes() -> None:
    long = "x" * 3000
    out = within_budget({"message": long, "truncated": "old", "conditions": [{"type": "A", "message": long},
                                                                             {"type": "B"}]})  # fmt: skip
    assert len(out["message"]) == 2048 and out["message"].endswith("…")
    assert len(out["conditions"][0]["message"]) == 2048 and out["conditions"][1] == {"type": "B"}
    assert "truncated" not in out
    exact = "y" * 2048  # at the limit: kept whole
    assert within_budget({"message": exact})["message"] == exact
    assert "conditions" not in within_budget({"conditions": []})


def test_past_the_budget_per_rank_evidence_and_host_details_go_and_the_verdicts_stay() -> None:
    ranks = [{"rank": r, "hostname": f"h{r}", "pod": f"p{r}", "deviceUUID": f"GPU-{r}"} for r in range(4)]
    transport = {"summary": "efa", "evidence": "kept", "ranks": [{"rank": r, "evidence": "e" * 8000} for r in range(4)]}
    out = within_budget({"ranks": ranks, "transport": transport})
    assert out["transport"] == {"summary": "efa", "evidence": "kept", "ranks": [{"rank": r} for r in range(4)]}
    assert out["ranks"] == [{"rank": r} for r in range(4)]  # every entry stays, without its detail
    assert out["truncated"] == (
        "left out to stay within the 24576-byte status budget: per-rank NCCL evidence (transport.evidence kept); "
        "ranks[].hostname, pod and deviceUUID"
    )
    big_hosts = [{"rank": r, "hostname": "h" * 9000, "pod": "p", "deviceUUID": "u"} for r in range(4)]
    out = within_budget({"ranks": big_hosts})
    assert out["ranks"] == [{"rank": r} for r in range(4)]
    assert (
        out["truncated"] == "left out to stay within the 24576-byte status budget: ranks[].hostname, pod and deviceUUID"
    )
