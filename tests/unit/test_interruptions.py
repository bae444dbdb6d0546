"""A worker's node going away, in the state machine: the ranks' Interruption reports folded into
`status.interruptions`, and an attempt that ended for one resumed as the next attempt without counting against
`backoffLimit` (decide/interruptions.py)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from fsdp_operator.decide.interruptions import KEPT, folded
from fsdp_operator.decide.observed import RAY_FAILED, RAY_RUNNING, DeletePod, NodeNotice, RayJobInfo
from fsdp_operator.decide.status import JobStatus, Phase, Reason
from fsdp_operator.runtime.nodes import termination_taint
from fsdp_train.contract.events import Interruption, Step
from test_reconcile import CREATE, NOW, at, cluster, events, kinds, manifest, run

NOTICED = NOW.timestamp() - 20
STEP = Step(rank=0, step=37, total_steps=100, loss=2.0, tokens_per_second=1.0, tokens_per_second_per_device=0.5)


def report(**fields: Any) -> Interruption:
    values: dict[str, Any] = dict(rank=2, step=37, saved=True, checkpoint_step=37, seconds=4.5,
                                  notice_time=NOTICED, pod="qwen-ray-gpu-workers-worker-abcde", node="ip-10-0-0-7",
                                  reason="preStop")  # fmt: skip
    return Interruption(**{**values, **fields})


def running(**fields: Any) -> JobStatus:
    return at(Phase.RUNNING, reason=Reason.JOB_RUNNING, **fields)


def test_a_report_becomes_an_entry_and_the_failed_ray_job_resumes_as_an_uncounted_attempt() -> None:
    m = manifest(backoffLimit=0)  # no retry allowed at all: an interruption is no failure
    seen = run(m, running(), cluster=cluster(), ray_job=RayJobInfo("x", RAY_RUNNING),
               events=(STEP, report()), log_offset=100)  # fmt: skip
    (entry,) = seen.status.interruptions
    assert entry == {
        "attempt": 1, "pod": "qwen-ray-gpu-workers-worker-abcde", "node": "ip-10-0-0-7", "reason": "preStop",
        "noticeTime": "2026-11-29T11:59:40Z", "step": 37, "saved": True, "checkpointStep": 37, "stepsLost": 0,
        "secondsToSaved": 4.5,
    }  # fmt: skip
    assert seen.status.phase == Phase.RUNNING  # the Ray job still runs: nothing decided yet

    ended = run(m, seen.status, cluster=cluster(), ray_job=RayJobInfo("x", RAY_FAILED, "exit 3"), log_offset=100)
    new = ended.status
    assert (new.phase, new.reason) == (Phase.PROVISIONING, Reason.INTERRUPTED)
    assert (new.attempts, new.failed_attempts) == (2, 0)
    assert new.interruptions == seen.status.interruptions  # kept across attempts
    assert "checkpoint of step 37 saved 4.5 s after the notice" in new.message
    assert "attempt 2 resumes (not counted against backoffLimit)" in new.message
    assert kinds(ended) == CREATE  # the cluster is reused when there (409), its workers waited for again
    assert events(ended) == [("Normal", "Interrupted")]


def test_without_a_report_a_failed_ray_job_still_counts() -> None:
    m = manifest(backoffLimit=0)
    earlier = running(interruptions=[{"attempt": 0, "pod": "p", "saved": True}])  # another attempt's report
    ended = run(m, earlier, cluster=cluster(), ray_job=RayJobInfo("x", RAY_FAILED, "boom"), log_offset=0)
    assert (ended.status.phase, ended.status.reason) == (Phase.FAILED, Reason.RAY_JOB_FAILED)


def test_a_notice_too_short_says_so_and_resumes_from_the_periodic_checkpoint() -> None:
    short = report(saved=False, checkpoint_step=20, seconds=0.3, message="the notice left 0.2 s; a save needs 3 s")
    seen = run(manifest(), running(), cluster=cluster(), ray_job=RayJobInfo("x", RAY_RUNNING), events=(short,),
               log_offset=10)  # fmt: skip
    (entry,) = seen.status.interruptions
    assert (entry["saved"], entry["checkpointStep"], entry["stepsLost"]) == (False, 20, 17)
    assert entry["secondsToDecision"] == 0.3 and "secondsToSaved" not in entry
    ended = run(manifest(), seen.status, cluster=cluster(), ray_job=RayJobInfo("x", RAY_FAILED), log_offset=10)
    assert ended.status.reason == Reason.INTERRUPTED and ended.status.failed_attempts == 0
    assert "no checkpoint in time (the notice left 0.2 s" in ended.status.message
    assert "resuming from step 20" in ended.status.message


def test_one_entry_per_pod_and_attempt_and_a_user_functions_report_takes_its_checkpoint_step() -> None:
    twice = (report(), report(seconds=5.0), report(pod="other", rank=3))
    seen = run(manifest(), running(), cluster=cluster(), ray_job=RayJobInfo("x", RAY_RUNNING), events=twice,
               log_offset=10)  # fmt: skip
    assert [(e["pod"], e["secondsToSaved"]) for e in seen.status.interruptions] == [
        ("qwen-ray-gpu-workers-worker-abcde", 5.0), ("other", 4.5)]  # fmt: skip

    user = report(step=0, checkpoint_step=0)  # the wrapper does not know the step: the function's report does
    seen = run(manifest(), running(checkpoint={"step": 12, "path": "s3://b/x"}), cluster=cluster(),
               ray_job=RayJobInfo("x", RAY_RUNNING), events=(user,), log_offset=10)  # fmt: skip
    ended = run(manifest(), seen.status, cluster=cluster(), ray_job=RayJobInfo("x", RAY_FAILED), log_offset=10)
    (entry,) = ended.status.interruptions
    assert (entry["step"], entry["checkpointStep"], entry["stepsLost"]) == (12, 12, 0)


@pytest.mark.parametrize(
    "bad",
    [dict(step=10**9), dict(checkpoint_step=40), dict(seconds=-1.0), dict(seconds=float("nan")),
     dict(notice_time=1e300), dict(pod="x" * 10_000)],
)  # fmt: skip
def test_impossible_reports_are_not_entries_and_long_text_is_cut(bad: dict[str, Any]) -> None:
    seen = run(manifest(), running(), cluster=cluster(), ray_job=RayJobInfo("x", RAY_RUNNING),
               events=(report(**bad),), log_offset=10)  # fmt: skip
    entries = seen.status.interruptions
    if "pod" in bad or "notice_time" in bad:
        (entry,) = entries
        assert len(entry["pod"]) <= 253 and ("noticeTime" not in entry) == ("notice_time" in bad)
    else:
        assert entries == []
    assert replace(seen.status, interruptions=[]).phase == Phase.RUNNING


def test_a_worker_on_a_tainted_node_is_deleted_once_and_the_ranks_report_completes_its_entry() -> None:
    notice = NodeNotice(
        "qwen-ray-gpu-workers-worker-abcde", "uid-1", "ip-10-0-0-7", "aws-node-termination-handler/spot-itn"
    )
    first = run(manifest(), running(), cluster=cluster(), ray_job=RayJobInfo("x", RAY_RUNNING), node_notices=(notice,))
    assert [a for a in first.actions if isinstance(a, DeletePod)] == [DeletePod("ml", notice.pod, "uid-1")]
    assert ("Normal", "NodeNotice") in events(first)
    (entry,) = first.status.interruptions
    assert (entry["reason"], entry["by"], entry["noticeTime"]) == (notice.taint, "operator", "2026-11-29T12:00:00Z")
    # The next pass (the pod not deleted yet as far as it saw) deletes nothing again.
    again = run(
        manifest(), first.status, cluster=cluster(), ray_job=RayJobInfo("x", RAY_RUNNING), node_notices=(notice,)
    )
    assert not [a for a in again.actions if isinstance(a, DeletePod)]
    # The ranks' report fills the entry; the taint stays its reason, the operator's time its notice.
    seen = run(manifest(), again.status, cluster=cluster(), ray_job=RayJobInfo("x", RAY_RUNNING), events=(report(),),
               log_offset=10)  # fmt: skip
    (entry,) = seen.status.interruptions
    assert (entry["reason"], entry["noticeTime"], entry["saved"], entry["stepsLost"]) == (
        notice.taint, "2026-11-29T12:00:00Z", True, 0)  # fmt: skip


@pytest.mark.parametrize(
    ("taints", "found"),
    [([{"key": "karpenter.sh/disrupted", "effect": "NoSchedule"}], "karpenter.sh/disrupted"),
     ([{"key": "x"}, {"key": "aws-node-termination-handler/spot-itn", "value": "1"}],
      "aws-node-termination-handler/spot-itn"),
     ([{"key": "aws-node-termination-handler/rebalance-recommendation"}], ""),
     ([{"key": "node.kubernetes.io/unschedulable"}], ""), ([], ""), (None, ""), (["junk", 3], "")],
)  # fmt: skip
def test_which_taints_say_a_node_goes_away(taints: Any, found: str) -> None:
    assert termination_taint({"spec": {"taints": taints}}) == found


def test_a_worker_pod_seen_deleted_ends_the_attempt_uncounted_even_when_its_ranks_never_reported() -> None:
    """A drain's pod, its ranks killed before they could report (a grace period shorter than a step): the attempt
    still ends uncounted, resuming from the newest checkpoint it reported, and says so."""
    deleted = NodeNotice("qwen-ray-gpu-workers-worker-abcde", "uid-1", "ip-10-0-0-7", "", deleting=True)
    seen = run(manifest(backoffLimit=0), running(checkpoint={"step": 20, "path": "/c"}), cluster=cluster(),
               ray_job=RayJobInfo("x", RAY_RUNNING), node_notices=(deleted,))  # fmt: skip
    assert not [a for a in seen.actions if isinstance(a, DeletePod)] and "NodeNotice" not in {
        r for _, r in events(seen)
    }
    ended = run(manifest(backoffLimit=0), seen.status, cluster=cluster(), ray_job=RayJobInfo("x", RAY_FAILED))
    assert (ended.status.phase, ended.status.reason, ended.status.failed_attempts) == (
        Phase.PROVISIONING, Reason.INTERRUPTED, 0)  # fmt: skip
    (entry,) = ended.status.interruptions
    assert (entry["reason"], entry["saved"], entry["checkpointStep"]) == ("PodDeleted", False, 20)
    assert "resuming from step 20" in ended.status.message

    # When they do report, their report (the hook's time, reason preStop) is the entry.
    seen = run(manifest(), running(), cluster=cluster(), ray_job=RayJobInfo("x", RAY_RUNNING), node_notices=(deleted,))
    reported = run(manifest(), seen.status, cluster=cluster(), ray_job=RayJobInfo("x", RAY_RUNNING),
                   events=(report(),), log_offset=10)  # fmt: skip
    (entry,) = reported.status.interruptions
    assert (entry["reason"], entry["saved"], entry["noticeTime"]) == ("preStop", True, "2026-11-29T11:59:40Z")


@pytest.mark.parametrize("before", [KEPT - 1, KEPT, KEPT + 1])
def test_the_interruptions_kept_are_capped_newest_last(before: int) -> None:
    """A Spot-heavy job's `status.interruptions` stays within KEPT entries (the newest), each path: a rank's report
    and a node's notice; without the cap it grew toward etcd's object limit."""
    entries = [{"attempt": a, "pod": f"p{a}", "saved": True} for a in range(1, before + 1)]
    after = folded(entries, report(pod="new"), attempt=before + 1, total_steps=100)
    assert len(after) == min(before + 1, KEPT) and after[-1]["pod"] == "new"
    assert [e["pod"] for e in after[:-1]] == [e["pod"] for e in entries][-(KEPT - 1) :]
    job = manifest()
    status = running(interruptions=entries, attempts=before + 1)
    notice = NodeNotice(pod="w", node="n", uid="u", taint="aws-node-termination-handler/spot-itn", deleting=False)
    noticed = run(job, status, cluster=cluster(), ray_job=RayJobInfo("x", RAY_RUNNING), node_notices=(notice,))
    assert len(noticed.status.interruptions) == min(before + 1, KEPT)
    assert noticed.status.interruptions[-1]["pod"] == "w"


def test_a_pods_report_becomes_one_bounded_entry_and_the_operators_word_on_its_notice_stands() -> None:
    saved = Interruption(rank=0, step=40, saved=True, checkpoint_step=40, seconds=12.345, notice_time=1_796_000_000.0,
                         pod="p" * 300, node="n" * 300, reason="r" * 100, message="m" * 600)  # fmt: skip
    (entry,) = folded([], saved, attempt=2, total_steps=100)
    assert entry == {
        "attempt": 2, "pod": "p" * 252 + "…", "node": "n" * 252 + "…", "reason": "r" * 63 + "…",
        "noticeTime": "2026-11-30T00:53:20Z", "step": 40, "saved": True, "checkpointStep": 40, "stepsLost": 0,
        "secondsToSaved": 12.35, "message": "m" * 511 + "…",
    }  # fmt: skip
    # Not saved, no time of notice known, no reason given: the ranks' own preStop hook, the seconds to the decision.
    late = Interruption(rank=0, step=41, saved=False, checkpoint_step=30, seconds=3.0, pod="w-1")
    (entry,) = folded([], late, attempt=2, total_steps=100)
    assert entry == {"attempt": 2, "pod": "w-1", "reason": "preStop", "step": 41, "saved": False,
                     "checkpointStep": 30, "stepsLost": 11, "secondsToDecision": 3.0}  # fmt: skip
    # The operator saw the node's taint first: its reason, time and word stand over the ranks'.
    seen = {"attempt": 2, "pod": "w-1", "node": "ip-1", "by": "operator", "reason": "aws-node-termination-handler/spot",
            "noticeTime": "2026-12-01T00:00:00Z"}  # fmt: skip
    (entry,) = folded([seen], late, attempt=2, total_steps=100)
    assert {k: entry[k] for k in ("by", "reason", "noticeTime")} == {k: seen[k] for k in ("by", "reason", "noticeTime")}


def test_the_interrupted_attempts_message_names_each_pod_and_the_checkpoint_word_for_word() -> None:
    m = manifest()
    reports = (report(saved=False, checkpoint_step=30, message=""), report(pod="", node="", saved=False, step=36,
               checkpoint_step=30))  # fmt: skip
    seen = run(m, running(), cluster=cluster(), ray_job=RayJobInfo("x", RAY_RUNNING), events=reports, log_offset=10)
    ended = run(m, seen.status, cluster=cluster(), ray_job=RayJobInfo("x", RAY_FAILED), log_offset=10)
    message = (
        "attempt 1 interrupted: qwen-ray-gpu-workers-worker-abcde on ip-10-0-0-7, a worker on its node going away; "
        "no checkpoint in time (not saved); resuming from step 30; attempt 2 resumes (not counted against backoffLimit)"
    )
    assert ended.status.message == message and ended.status.provisioning_since == NOW
    submitted = next(c for c in ended.status.conditions if c["type"] == "JobSubmitted")
    assert (submitted["status"], submitted["reason"], submitted["message"]) == ("False", Reason.INTERRUPTED, message)
    assert submitted["observedGeneration"] == m["metadata"]["generation"]


def test_only_this_attempts_entries_take_the_reported_checkpoint_or_are_marked_unreported() -> None:
    from fsdp_operator.decide.interruptions import with_checkpoint_step, with_unreported

    entries = [
        {"attempt": 0, "pod": "old", "saved": True},  # an earlier attempt's: never rewritten
        {"attempt": 1, "pod": "saved-by-function", "saved": True},  # saved, its step unknown to the wrapper
        {"attempt": 1, "pod": "not-saved", "saved": False, "step": 0},
        {"attempt": 1, "pod": "known", "saved": True, "step": 9, "checkpointStep": 9, "stepsLost": 0},
        {"attempt": 1, "pod": "silent", "by": "operator"},  # deleted, its ranks never reported
        {"attempt": 0, "pod": "old-silent", "by": "operator"},
    ]
    status = running(interruptions=entries, checkpoint={"step": 12, "path": "s3://b/x"})
    assert with_checkpoint_step(status).interruptions == [
        entries[0],
        {**entries[1], "step": 12, "checkpointStep": 12, "stepsLost": 0},
        *entries[2:],
    ]
    message = "the ranks did not report: stopped before they could save"
    assert with_unreported(status).interruptions == [
        *entries[:4],
        {**entries[4], "saved": False, "checkpointStep": 12, "message": message},
        entries[5],
    ]
    for odd in ({}, {"step": True}, {"step": "12"}):  # no checkpoint reported, or no step number in it
        unknown = running(interruptions=entries, checkpoint=odd)
        assert with_checkpoint_step(unknown).interruptions == entries
        assert with_unreported(unknown).interruptions[4]["checkpointStep"] == 0
