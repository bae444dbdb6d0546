"""kopf runs end to end on the emulated API server: finalizer, create handler, status patch, delete."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import kopf
import pytest
import requests
from fsdp_operator.local.server import ThreadedApiServer
from support.crds import GROUP, PLURAL, VERSION, widget, widget_crd
from support.kopf_runner import DEFAULT_FINALIZER, eventually, kopf_operator

MERGE = "application/merge-patch+json"

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


def _registry(calls: list[str]) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()

    @kopf.on.create(GROUP, VERSION, PLURAL, registry=registry)
    def created(name: str, spec: Any, body: kopf.Body, patch: kopf.Patch, **_: Any) -> None:
        calls.append(f"create {name}")
        kopf.info(body, reason="Created", message=f"{spec['replicas']} replicas")
        patch.status["phase"] = "Ready"
        patch.status["replicas"] = spec["replicas"]

    @kopf.on.delete(GROUP, VERSION, PLURAL, registry=registry)
    def deleted(name: str, **_: Any) -> None:
        calls.append(f"delete {name}")

    return registry


def test_kopf_operator_lifecycle(apiserver: ThreadedApiServer) -> None:
    url = f"{apiserver.url}/apis/{GROUP}/{VERSION}/namespaces/default/{PLURAL}"
    requests.post(f"{apiserver.url}/apis/apiextensions.k8s.io/v1/customresourcedefinitions", json=widget_crd())
    calls: list[str] = []
    store = apiserver.store
    widgets = store.resource(PLURAL, GROUP)

    def current() -> dict[str, Any] | None:
        found = [w for w in store.find(PLURAL, GROUP) if w["metadata"]["name"] == "w1"]
        return found[0] if found else None

    async def scenario() -> float:
        started = time.monotonic()
        async with kopf_operator(_registry(calls), apiserver.url):
            assert requests.post(url, json=widget("w1", replicas=3)).status_code == 201
            obj = await eventually(lambda: (w := current()) and w.get("status", {}).get("phase") == "Ready" and w)
            assert obj["status"]["replicas"] == 3
            assert DEFAULT_FINALIZER in obj["metadata"]["finalizers"]
            assert obj["metadata"]["generation"] == 1  # the finalizer and status patches are not spec changes

            response = requests.delete(f"{url}/w1")
            assert response.status_code == 200 and response.json()["metadata"]["deletionTimestamp"]
            await eventually(lambda: current() is None, message="the finalizer was never removed")
            # kopf posts events through the core events API, in the background.
            events = await eventually(lambda: store.find("events"), message="kopf posted no events")
            assert events[0]["reason"] == "Created" and events[0]["involvedObject"]["name"] == "w1"
        assert calls == ["create w1", "delete w1"], calls
        return time.monotonic() - started

    elapsed = asyncio.run(scenario())
    assert elapsed < 10, f"the operator took {elapsed:.1f} s"
    # One create of the widget, no duplicate handler runs, no stale-version conflicts.
    assert apiserver.count("create", PLURAL, GROUP) == 1
    assert widgets.status_subresource


def test_kopf_operator_restart_does_not_repeat_handlers(apiserver: ThreadedApiServer) -> None:
    """A stopped and restarted operator resumes from what it stored: no second create, one update."""
    url = f"{apiserver.url}/apis/{GROUP}/{VERSION}/namespaces/default/{PLURAL}"
    requests.post(f"{apiserver.url}/apis/apiextensions.k8s.io/v1/customresourcedefinitions", json=widget_crd())
    calls: list[str] = []
    registry = _registry(calls)

    @kopf.on.update(GROUP, VERSION, PLURAL, field="spec.replicas", registry=registry)
    def updated(name: str, new: Any, **_: Any) -> None:
        calls.append(f"update {name} {new}")

    def phase() -> str | None:
        found = apiserver.store.find(PLURAL, GROUP)
        return found[0].get("status", {}).get("phase") if found else None

    async def scenario() -> None:
        async with kopf_operator(registry, apiserver.url):
            requests.post(url, json=widget("w1", replicas=1))
            await eventually(lambda: phase() == "Ready")
        requests.patch(f"{url}/w1", json={"spec": {"replicas": 2}}, headers={"Content-Type": MERGE})
        async with kopf_operator(registry, apiserver.url):  # the same registry, started again
            await eventually(lambda: len(calls) == 2, message=f"no update after the restart: {calls}")
            await asyncio.sleep(0.3)  # room for a duplicate, were there one

    asyncio.run(scenario())
    assert calls == ["create w1", "update w1 2"], calls
