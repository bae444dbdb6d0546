"""A job deleted and created again at once (what GitOps tools do on an immutable change) ends with its own
Secret, NetworkPolicy and RayCluster.

The real garbage collector deletes what the old job owned in the background, some time after the old job is gone
(https://kubernetes.io/docs/concepts/architecture/garbage-collection/#background-deletion); the emulated API
server collects at once. So the test puts the old job's objects back, as they are while the collector has not
reached them, and either leaves them there or deletes them itself, as the collector would, while the new job's
operator is at work: in both cases the new job must not take them for its own.
"""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest
from fsdp_operator.api import render, schema
from fsdp_operator.local import ThreadedApiServer
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


def _get(w: World, collection: str) -> dict[str, Any] | None:
    response = w.http.get(f"{w.api.url}{collection}/{NAMES[collection]}", timeout=10)
    return response.json() if response.status_code == 200 else None


def _owner_uid(obj: dict[str, Any]) -> str:
    (owner,) = obj["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"]) == (schema.KIND, "qwen")
    return str(owner["uid"])


def _as_left_behind(obj: dict[str, Any]) -> dict[str, Any]:
    """The object as the API server would still hold it: same owner, fresh identity."""
    left = copy.deepcopy(obj)
    for key in ("uid", "resourceVersion", "creationTimestamp", "managedFields", "deletionTimestamp", "finalizers"):
        left["metadata"].pop(key, None)
    left.pop("status", None)
    return left


@pytest.mark.parametrize("collected", [False, True], ids=["left-there", "collected-meanwhile"])
def test_a_job_deleted_and_created_again_ends_with_its_own_objects(
    apiserver: ThreadedApiServer, collected: bool
) -> None:
    w = World(apiserver)
    messages: list[str] = []

    async def main() -> None:
        async with w.kuberay.running(), w.operator():
            w.apply(manifest(runPolicy={"cleanup": "Keep"}))
            await w.phase("Succeeded", timeout=60)
            old_uid = w.job()["metadata"]["uid"]  # type: ignore[index]
            old = {collection: _get(w, collection) for collection in NAMES}
            assert all(obj is not None and _owner_uid(obj) == old_uid for obj in old.values()), old

            w.delete(f"{JOBS}/qwen")
            await eventually(lambda: w.job() is None, timeout=60, message="the old job was never deleted")
            for collection, obj in old.items():
                assert obj is not None
                if _get(w, collection) is None:  # collected at once here; a real collector takes its time
                    w.call("POST", collection, _as_left_behind(obj))
            w.apply(manifest(runPolicy={"cleanup": "Keep"}))
            new_uid = w.job()["metadata"]["uid"]  # type: ignore[index]
            assert new_uid != old_uid

            async def watch_status() -> None:
                while True:
                    message = str(w.status().get("message") or "")
                    if message not in messages[-1:]:
                        messages.append(message)
                    if collected and w.status().get("phase") == "Provisioning":
                        for collection in NAMES:  # the collector gets to the old job's objects now
                            obj = _get(w, collection)
                            if obj is not None and _owner_uid(obj) == old_uid and "deletionTimestamp" not in obj:
                                w.call("DELETE", f"{collection}/{NAMES[collection]}")
                    await asyncio.sleep(0.01)

            watcher = asyncio.create_task(watch_status())
            try:
                status = await w.phase("Succeeded", timeout=60)
            finally:
                watcher.cancel()
            assert status.get("attempts") == 1, status
            for collection in NAMES:
                obj = _get(w, collection)
                assert obj is not None and _owner_uid(obj) == new_uid, (collection, obj)

    asyncio.run(main())
    assert not any("ClusterNameTaken" in m or "not created for this job" in m for m in messages), messages
    if not collected:
        assert any(m.startswith("replacing ") and "left by a deleted FSDPTrainingJob" in m for m in messages), messages
