"""The stored status, key by key: what `JobStatus` reads from and writes to the API server, written out in full.

A renamed key would lose a field across an operator restart (the status is the operator's only memory),
so every key is spelled here once, with a value of its own, and read back through the typed view.
"""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from typing import Any

from fsdp_operator.api import schema
from fsdp_operator.api.spec import parse_job
from fsdp_operator.decide.budget import merge_patch
from fsdp_operator.decide.folding import fold_events
from fsdp_operator.decide.status import JobStatus, Phase, Reason, cleared_run_data, parse_time

CONDITION = {"type": "Validated", "status": "True", "reason": "Valid", "message": "spec is valid",
             "lastTransitionTime": "2026-11-29T12:00:00Z", "observedGeneration": 3}  # fmt: skip

STORED: dict[str, Any] = {
    "phase": "Running",
    "reason": "JobRunning",
    "message": "training is running",
    "workers": "2/2",
    "rayClusterName": "qwen-ray",
    "submissionId": "qwen-5d41402a-2",
    "attempts": 2,
    "failedAttempts": 1,
    "observedGeneration": 3,
    "startTime": "2026-11-29T12:00:00Z",
    "endTime": "2026-11-29T13:00:00Z",
    "provisioningSince": "2026-11-29T12:01:00Z",
    "rayUnreachableSince": "2026-11-29T12:02:00Z",
    "rayJobStatus": "RUNNING",
    "logOffset": 4096,
    "skippedEvents": 3,
    "dashboardURL": "http://10.96.0.2:8265",
    "placement": {"availabilityZone": "us-east-1b"},
    "conditions": [CONDITION],
    "ranks": [{"rank": 0, "pod": "w0"}],
    "progress": {"step": 7, "stepOfTotal": "7/40"},
    "transport": {"summary": "efa"},
    "interconnect": {"floorGBps": 5.0},
    "probes": [{"scope": "all", "ranks": 8}],
    "result": {"steps": 40},
    "checkpoint": {"step": 5, "path": "s3://b/step_00000005"},
    "output": {"storage": "s3://b/model"},
    "timings": {"toFirstStepSeconds": 12.5},
    "rankFailures": [{"rank": 3, "message": "boom"}],
    "workerRestarts": 2,
    "workerGroupStartTime": "2026-11-29T12:03:00Z",
}


def test_every_stored_key_is_read_into_its_field() -> None:
    s = JobStatus.from_dict(STORED)
    assert (s.phase, s.reason, s.message, s.workers) == (
        Phase.RUNNING,
        Reason.JOB_RUNNING,
        "training is running",
        "2/2",
    )
    assert (s.ray_cluster_name, s.submission_id, s.attempts, s.failed_attempts) == ("qwen-ray", "qwen-5d41402a-2", 2, 1)
    assert (s.observed_generation, s.ray_job_status, s.log_offset) == (3, "RUNNING", 4096)
    assert s.start_time == datetime(2026, 11, 29, 12, 0, 0, tzinfo=UTC)
    assert s.end_time == datetime(2026, 11, 29, 13, 0, 0, tzinfo=UTC)
    assert s.provisioning_since == datetime(2026, 11, 29, 12, 1, 0, tzinfo=UTC)
    assert (s.dashboard_url, s.placement) == ("http://10.96.0.2:8265", {"availabilityZone": "us-east-1b"})
    assert s.conditions == [CONDITION] and s.ranks == [{"rank": 0, "pod": "w0"}]
    assert s.progress == {"step": 7, "stepOfTotal": "7/40"} and s.transport == {"summary": "efa"}
    assert s.interconnect == {"floorGBps": 5.0} and s.probes == [{"scope": "all", "ranks": 8}]
    assert s.result == {"steps": 40} and s.checkpoint == {"step": 5, "path": "s3://b/step_00000005"}
    assert s.rank_failures == [{"rank": 3, "message": "boom"}]
    assert s.ray_unreachable_since == datetime(2026, 11, 29, 12, 2, 0, tzinfo=UTC)
    assert s.worker_group_start == datetime(2026, 11, 29, 12, 3, 0, tzinfo=UTC)
    assert (s.skipped_events, s.worker_restarts) == (3, 2)
    assert s.output == {"storage": "s3://b/model"} and s.timings == {"toFirstStepSeconds": 12.5}


def test_every_field_is_written_under_its_key() -> None:
    assert JobStatus.from_dict(STORED).to_dict() == STORED


def test_the_stored_status_and_the_typed_view_share_nothing() -> None:
    """Lists and dicts are copied both ways: a later change to one never shows in the other."""
    raw = copy.deepcopy(STORED)
    s = JobStatus.from_dict(raw)
    raw["conditions"][0]["status"] = "False"
    raw["progress"]["step"] = 8
    raw["ranks"][0]["pod"] = "changed"
    assert s.conditions == [CONDITION] and s.progress["step"] == 7 and s.ranks[0]["pod"] == "w0"
    out = s.to_dict()
    out["conditions"][0]["status"] = "False"
    out["transport"]["summary"] = "socket"
    out["rankFailures"][0]["message"] = "changed"
    assert s.conditions == [CONDITION] and s.transport == {"summary": "efa"} and s.rank_failures[0]["message"] == "boom"


def test_unreadable_values_read_as_absent() -> None:
    s = JobStatus.from_dict({"phase": "", "reason": None, "attempts": True, "logOffset": "12", "startTime": "soon",
                             "progress": [1], "ranks": {"rank": 0}, "conditions": [CONDITION, "Ready"]})  # fmt: skip
    assert (s.phase, s.reason, s.attempts, s.log_offset, s.start_time) == (None, None, 0, 0, None)
    assert (s.progress, s.ranks, s.conditions) == ({}, [], [CONDITION])
    assert JobStatus.from_dict(None) == JobStatus()


def test_times_in_both_spellings_of_utc() -> None:
    want = datetime(2026, 11, 29, 12, 0, 0, tzinfo=UTC)
    assert parse_time("2026-11-29T12:00:00Z") == want == parse_time("2026-11-29T12:00:00+00:00")
    assert parse_time("") is None and parse_time(None) is None and parse_time("yesterday") is None


def test_a_new_attempt_keeps_only_what_outlives_it() -> None:
    kept_types = ["Validated", "WorkersReady", "JobSubmitted", "Running", "Complete", "Failed", "ZonePlaced"]
    dropped_types = ["TransportVerified", "InterconnectHealthy", "SomethingElse"]
    conditions = [{**CONDITION, "type": t} for t in kept_types + dropped_types]
    s = cleared_run_data(JobStatus.from_dict({**STORED, "conditions": conditions}))
    assert [c["type"] for c in s.conditions] == kept_types
    assert (s.ray_job_status, s.log_offset, s.ranks, s.progress, s.transport) == ("", 0, [], {}, {})
    assert (s.interconnect, s.probes, s.result, s.checkpoint, s.rank_failures) == ({}, [], {}, {}, [])
    assert (s.skipped_events, s.worker_restarts, s.output) == (0, 0, {})
    assert (s.ray_unreachable_since, s.worker_group_start) == (None, None)
    # What identifies the job and the attempt stays.
    assert (s.phase, s.submission_id, s.attempts, s.failed_attempts) == (Phase.RUNNING, "qwen-5d41402a-2", 2, 1)
    assert s.placement == {"availabilityZone": "us-east-1b"} and s.dashboard_url == "http://10.96.0.2:8265"


def test_merge_patch_word_for_word() -> None:
    old = {"phase": "Running", "progress": {"step": 1, "loss": 5.0}, "ranks": [{"rank": 0}], "gone": 1, "same": "x"}
    new = {"phase": "Running", "progress": {"step": 2, "loss": 5.0}, "ranks": [{"rank": 0}, {"rank": 1}],
           "same": "x", "added": {"a": [1]}}  # fmt: skip
    patch = merge_patch(old, new)
    assert patch == {"progress": {"step": 2}, "ranks": [{"rank": 0}, {"rank": 1}], "gone": None, "added": {"a": [1]}}
    patch["added"]["a"].append(2)
    patch["ranks"][1]["rank"] = 9
    assert new["added"] == {"a": [1]} and new["ranks"][1] == {"rank": 1}  # the patch is a copy
    # A mapping replaced by a scalar (or the other way) is replaced whole.
    assert merge_patch({"transport": {"summary": "efa"}}, {"transport": "none"}) == {"transport": "none"}
    assert merge_patch({"transport": "none"}, {"transport": {"summary": "efa"}}) == {"transport": {"summary": "efa"}}
    assert merge_patch(new, new) == {}


def test_a_malformed_stored_probe_does_not_hide_the_ones_after_it() -> None:
    job = parse_job(
        {
            "apiVersion": schema.API_VERSION,
            "kind": schema.KIND,
            "metadata": {"name": "qwen", "namespace": "ml", "uid": "u1", "generation": 1},
            "spec": {"workers": {"replicas": 2}},
        }
    )
    good = {"rank": 0, "scope": "cross-node", "ranks": 2, "sizeBytes": 1024, "allreduceBusbwGBps": 7.5,
            "allgatherBusbwGBps": 6.0}  # fmt: skip
    status = JobStatus(interconnect={"floorGBps": 5.0}, probes=[{"scope": "all"}, good])
    folded = fold_events(job, status, [], now=datetime(2026, 11, 29, tzinfo=UTC)).status
    assert folded.interconnect["crossNode"] == {"ranks": 2, "sizeBytes": 1024, "allreduceBusbwGBps": 7.5,
                                                "allgatherBusbwGBps": 6.0}  # fmt: skip
