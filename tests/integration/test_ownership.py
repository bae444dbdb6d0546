"""A job deleted and applied again at once (what GitOps tools do on an immutable change) ends with its own
Secret, NetworkPolicy and RayCluster, under the chart's RBAC, whatever the garbage collector does.

The real garbage collector deletes what the old job owned in the background, some time after the old job is gone
(https://kubernetes.io/docs/concepts/architecture/garbage-collection/#background-deletion), and a cluster whose
controller manager is down has none. The emulated API server is run both ways: with no collector (the old job's
Secret and NetworkPolicy stay until someone deletes them) and with a delayed one (they are there when the new job
starts, and the collector deletes them while the operator is at work). The operator runs as the chart's
ServiceAccount in both `watchAllNamespaces` modes, with OwnerReferencesPermissionEnforcement on: not one request
may be refused, and the new job must not take what its namesake left for its own.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from fsdp_operator.api import render, schema
from fsdp_operator.local.server import ThreadedApiServer
from fsdp_operator.runtime import calls
from support.chart_rbac import ACCOUNT
from support.kopf_runner import eventually
from test_operator import CLUSTERS, JOBS, NAMESPACE, World, manifest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

SECRETS = f"/api/v1/namespaces/{NAMESPACE}/secrets"
POLICIES = f"/apis/networking.k8s.io/v1/namespaces/{NAMESPACE}/networkpolicies"
NAMES = {
    SECRETS: render.auth_secret_name("qwen"),
    POLICIES: render.network_policy_name("qwen"),
    CLUSTERS: render.raycluster_name("qwen"),
}
COLLECTOR_DELAY = 2.0
"""Longer than the operator takes to see a new job, so that it meets what its namesake left."""


def _get(w: World, collection: str) -> dict[str, Any] | None:
    response = w.http.get(f"{w.api.url}{collection}/{NAMES[collection]}", timeout=10)
    return response.json() if response.status_code == 200 else None


def _owner_uid(obj: dict[str, Any]) -> str:
    (owner,) = obj["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"]) == (schema.KIND, "qwen")
    return str(owner["uid"])


@pytest.mark.parametrize("watch_all", [True, False], ids=["all-namespaces", "one-namespace"])
@pytest.mark.parametrize("gc_delay", [None, COLLECTOR_DELAY], ids=["no-collector", "delayed-collector"])
def test_a_job_deleted_and_applied_again_at_once_ends_with_its_own_objects(
    gc_delay: float | None, watch_all: bool
) -> None:
    messages: list[str] = []
    with ThreadedApiServer(gc_delay=gc_delay) as api:
        w = World(api, watch_all=watch_all)

        async def main() -> None:
            async with w.kuberay.running(), w.operator():
                w.apply(manifest(runPolicy={"cleanup": "Keep"}))
                await w.phase("Succeeded", timeout=60)
                old_uid = w.job()["metadata"]["uid"]  # type: ignore[index]
                for collection in NAMES:
                    obj = _get(w, collection)
                    assert obj is not None and _owner_uid(obj) == old_uid, (collection, obj)

                w.delete(f"{JOBS}/qwen")  # its finalizer deletes the RayCluster; the rest is the collector's
                await eventually(lambda: w.job() is None, timeout=60, message="the old job was never deleted")
                w.apply(manifest(runPolicy={"cleanup": "Keep"}))
                new_uid = w.job()["metadata"]["uid"]  # type: ignore[index]
                assert new_uid != old_uid
                left = {c: obj for c in (SECRETS, POLICIES) if (obj := _get(w, c)) and _owner_uid(obj) == old_uid}
                assert set(left) == {SECRETS, POLICIES}, "nothing was left for the new job to meet"

                status = await w.phase("Succeeded", timeout=60)
                assert status.get("attempts") == 1, status
                # Every status message the new job had, from the API server's change history (what a watch
                # replays), not sampled: a message that lasted one pass is there however loaded the machine.
                with api.store.lock:
                    versions = [e.object for e in api.store.history if e.object.get("kind") == schema.KIND]
                messages.extend(
                    str((job.get("status") or {}).get("message") or "")
                    for job in versions
                    if job["metadata"].get("uid") == new_uid
                )
                for collection in NAMES:
                    obj = _get(w, collection)
                    assert obj is not None and _owner_uid(obj) == new_uid, (collection, obj)

        asyncio.run(main())
        made = {(verb, group, resource) for verb, group, resource, _ in w.access.calls_by(ACCOUNT.name)}
    assert w.forbidden() == []
    assert not any("ClusterNameTaken" in m or "not created for this job" in m for m in messages), messages
    if gc_delay is None:
        # Only the operator could delete them: it did, with the chart's RBAC.
        assert any(m.startswith("replacing ") and "left by a deleted FSDPTrainingJob" in m for m in messages), messages
        assert {calls.GET_POLICY.rule, calls.DELETE_SECRET.rule, calls.DELETE_POLICY.rule} <= made, made
