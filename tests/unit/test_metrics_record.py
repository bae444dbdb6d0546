"""metrics.record_pass: what each transition counts (the integration test scrapes the real endpoint)."""

from __future__ import annotations

from datetime import timedelta

from fsdp_operator.decide.status import JobStatus, Phase, Reason
from fsdp_operator.runtime.metrics import Metrics
from support.running_job import NOW

KEY = ("ml", "qwen")
OBJ = {"metadata": {"creationTimestamp": "2026-11-29T11:59:00Z"}}


def value(m: Metrics, name: str, **labels: str) -> float:
    found = m.registry.get_sample_value(name, labels)
    return found or 0.0


def verified(status: str, reason: str) -> list[dict[str, object]]:
    return [{"type": "TransportVerified", "status": status, "reason": reason, "message": ""}]


def test_a_socket_fallback_is_counted_once_and_the_failure_by_reason() -> None:
    m = Metrics()
    running = JobStatus(phase=Phase.RUNNING, start_time=NOW - timedelta(seconds=90))
    fallback = JobStatus(phase=Phase.RUNNING, conditions=verified("False", "SocketFallback"))
    m.record_pass(KEY, OBJ, running, fallback, NOW)
    m.record_pass(KEY, OBJ, fallback, fallback, NOW)  # the same verdict again: not a new one
    failed = JobStatus(phase=Phase.FAILED, reason=Reason.TRANSPORT_FALLBACK, conditions=fallback.conditions)
    m.record_pass(KEY, OBJ, fallback, failed, NOW)
    m.record_pass(KEY, OBJ, failed, failed, NOW)
    assert value(m, "fsdp_transport_fallbacks_total") == 1
    assert value(m, "fsdp_transport_verdicts_total", status="False", reason="SocketFallback") == 1
    assert value(m, "fsdp_job_failures_total", reason="TransportFallback") == 1
    assert value(m, "fsdp_jobs", phase="Failed") == 1 and value(m, "fsdp_jobs", phase="Running") == 0
    m.forget(KEY)
    assert value(m, "fsdp_jobs", phase="Failed") == 0


def test_waits_are_timed_from_the_start() -> None:
    m = Metrics()
    start = NOW - timedelta(seconds=42)
    provisioning = JobStatus(phase=Phase.PROVISIONING, start_time=start)
    m.record_pass(KEY, OBJ, provisioning, JobStatus(phase=Phase.SUBMITTING, start_time=start), NOW)
    assert value(m, "fsdp_time_to_workers_ready_seconds_sum") == 42
    stepped = JobStatus(phase=Phase.RUNNING, start_time=start, progress={"step": 1})
    m.record_pass(KEY, OBJ, JobStatus(phase=Phase.RUNNING, start_time=start), stepped, NOW + timedelta(seconds=8))
    assert value(m, "fsdp_time_to_first_step_seconds_sum") == 50
    m.record_pass(KEY, OBJ, stepped, stepped, NOW + timedelta(seconds=9))
    assert value(m, "fsdp_time_to_first_step_seconds_count") == 1
