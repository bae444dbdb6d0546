"""Prometheus metrics of the real operator, scraped over HTTP from its metrics port while jobs run."""

from __future__ import annotations

import pytest
import requests
from fsdp_operator.local.server import ThreadedApiServer
from prometheus_client.parser import text_string_to_metric_families
from test_operator import Script, World, manifest, scenario

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = requests.get(url, timeout=5).text
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_metrics_of_a_succeeded_and_a_failed_job(apiserver: ThreadedApiServer) -> None:
    seen: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}

    async def body(w: World) -> None:
        async with w.operator() as runtime:
            server = runtime.metrics.serve(0, "127.0.0.1")
            try:
                w.apply(manifest("good"))
                await w.phase("Succeeded", name="good")
                w.script.fail_attempts = {1}
                w.apply(manifest("bad", runPolicy={"backoffLimit": 0}))
                await w.phase("Failed", name="bad")
                seen.update(scrape(f"http://127.0.0.1:{server.server_port}/metrics"))
            finally:
                server.shutdown()

    scenario(apiserver, body, Script())

    def value(name: str, **labels: str) -> float:
        return seen.get((name, tuple(sorted(labels.items()))), 0.0)

    assert value("fsdp_jobs", phase="Succeeded") == 1
    assert value("fsdp_jobs", phase="Failed") == 1
    assert value("fsdp_jobs", phase="Running") == 0
    assert value("fsdp_job_failures_total", reason="RayJobFailed") == 1
    assert value("fsdp_submissions_total", result="created") == 2
    assert value("fsdp_time_to_workers_ready_seconds_count") == 2
    assert value("fsdp_time_to_first_step_seconds_count") == 2
    assert value("fsdp_transport_verdicts_total", status="True", reason="Verified") == 2
    assert value("fsdp_transport_fallbacks_total") == 0
    assert value("fsdp_status_writes_total", result="written") >= 10
    assert value("fsdp_reconcile_passes_total", outcome="ok") >= 10
    assert value("fsdp_reconcile_duration_seconds_count") == value("fsdp_reconcile_passes_total", outcome="ok")
