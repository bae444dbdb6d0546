"""Prometheus metrics of the operator (prometheus-client), served on the metrics port.

`controller.py` calls `record_pass` once per reconcile pass with the status before and after, and the
small `count_*` helpers where it writes status, submits and talks to Ray; everything a dashboard
wants is derived here from those transitions, so the state machine stays free of metrics code.
Each `Runtime` has its own registry (tests run several operators in one process).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from fsdp_operator.decide.status import ConditionType, JobStatus, Phase, get_condition, parse_time

# From seconds (a warm cluster) to an hour (nodes scaled up from zero, large images pulled).
_WAIT_BUCKETS = (5, 10, 20, 30, 60, 120, 300, 600, 1200, 1800, 3600, float("inf"))


class Metrics:
    """The operator's metrics, in their own registry."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.jobs = Gauge("fsdp_jobs", "FSDPTrainingJobs this operator reconciles, by phase", ["phase"], registry=r)
        self.reconcile_passes = Counter(
            "fsdp_reconcile_passes_total", "Reconcile passes, by outcome (ok, error)", ["outcome"], registry=r
        )
        self.reconcile_seconds = Histogram(
            "fsdp_reconcile_duration_seconds", "Time of one observe-decide-write-act pass", registry=r
        )
        self.workers_ready_seconds = Histogram(
            "fsdp_time_to_workers_ready_seconds",
            "From the job's creation (or resume) to every worker joined Ray",
            buckets=_WAIT_BUCKETS,
            registry=r,
        )
        self.first_step_seconds = Histogram(
            "fsdp_time_to_first_step_seconds",
            "From the job's creation (or resume) to its first reported training step",
            buckets=_WAIT_BUCKETS,
            registry=r,
        )
        self.transport_verdicts = Counter(
            "fsdp_transport_verdicts_total",
            "TransportVerified verdicts reached (status and reason of the condition)",
            ["status", "reason"],
            registry=r,
        )
        self.transport_fallbacks = Counter(
            "fsdp_transport_fallbacks_total", "Jobs whose NCCL fell back from the requested transport", registry=r
        )
        self.submissions = Counter(
            "fsdp_submissions_total",
            "Submissions to Ray's job API, by result (created, exists, rejected, unavailable)",
            ["result"],
            registry=r,
        )
        self.status_writes = Counter(
            "fsdp_status_writes_total", "Status patches, by result (written, deferred, failed)", ["result"], registry=r
        )
        self.failures = Counter("fsdp_job_failures_total", "Jobs that ended Failed, by reason", ["reason"], registry=r)
        self.ray_api_errors = Counter(
            "fsdp_ray_api_errors_total",
            "Calls to Ray's job API or dashboard that failed, by call",
            ["call"],
            registry=r,
        )
        self.health_verdicts = Counter(
            "fsdp_rank_health_verdicts_total",
            "Stalls acted on (RankStalled) and stragglers named (SlowRank, Straggler True), by reason",
            ["reason"],
            registry=r,
        )
        self._phases: dict[tuple[str, str], str] = {}

    def serve(self, port: int, address: str = "0.0.0.0") -> WSGIServer:
        """Serve `/metrics` over HTTP in a background thread (port 0: a free one, see `.server_port`)."""
        server, _ = start_http_server(port, addr=address, registry=self.registry)
        return server

    # --- what the controller reports ---
    def record_pass(
        self, key: tuple[str, str], obj: Mapping[str, Any], before: JobStatus, after: JobStatus, now: datetime
    ) -> None:
        """One decided pass of job `key`: phase gauge, and the transitions worth counting or timing."""
        self._set_phase(key, after.phase.value if after.phase else "")
        started = after.start_time or parse_time(str((obj.get("metadata") or {}).get("creationTimestamp") or ""))
        if started is not None:
            waited = max((now - started).total_seconds(), 0.0)
            if before.phase == Phase.PROVISIONING and after.phase == Phase.SUBMITTING:
                self.workers_ready_seconds.observe(waited)
            if "step" not in before.progress and "step" in after.progress:
                self.first_step_seconds.observe(waited)
        old = get_condition(before.conditions, ConditionType.TRANSPORT_VERIFIED) or {}
        new = get_condition(after.conditions, ConditionType.TRANSPORT_VERIFIED) or {}
        if new and (old.get("status"), old.get("reason")) != (new.get("status"), new.get("reason")):
            self.transport_verdicts.labels(str(new.get("status")), str(new.get("reason"))).inc()
            if new.get("status") == "False":
                self.transport_fallbacks.inc()
        # A stall acted on leaves its evidence (a Restart clears the attempt's conditions in the same pass).
        if _last_stall(after) and _last_stall(after) != _last_stall(before):
            self.health_verdicts.labels("RankStalled").inc()
        was = get_condition(before.conditions, ConditionType.STRAGGLER) or {}
        slow = get_condition(after.conditions, ConditionType.STRAGGLER) or {}
        if slow.get("status") == "True" and was.get("status") != "True":
            self.health_verdicts.labels(str(slow.get("reason"))).inc()
        if after.phase == Phase.FAILED and before.phase != Phase.FAILED and after.reason is not None:
            self.failures.labels(after.reason.value).inc()

    def forget(self, key: tuple[str, str]) -> None:
        """The job is gone (deleted, or its loop ended for good)."""
        self._set_phase(key, "")

    def _set_phase(self, key: tuple[str, str], phase: str) -> None:
        previous = self._phases.pop(key, "")
        if previous:
            self.jobs.labels(previous).dec()
        if phase:
            self._phases[key] = phase
            self.jobs.labels(phase).inc()


def _last_stall(status: JobStatus) -> Any:
    last = status.health.get("lastStall")
    return last.get("time") if isinstance(last, Mapping) else None
