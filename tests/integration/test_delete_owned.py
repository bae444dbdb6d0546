"""`Kube.delete_owned`: a leftover is deleted only while it is still the object the pass saw (a uid
precondition), as the chart's ServiceAccount, for each kind the leftover path deletes."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from fsdp_operator.local.cluster.kuberay import RAYCLUSTER_CRD
from fsdp_operator.local.server import ThreadedApiServer
from fsdp_operator.runtime.kube import AioKube
from support import chart_rbac
from support.chart_rbac import OPERATOR_AUTH

pytestmark = pytest.mark.integration

NAMESPACE = "default"
OBJECTS: dict[str, tuple[str, dict[str, Any]]] = {
    "Secret": ("/api/v1/namespaces/default/secrets", {"apiVersion": "v1", "kind": "Secret"}),
    "NetworkPolicy": (
        "/apis/networking.k8s.io/v1/namespaces/default/networkpolicies",
        {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "spec": {"podSelector": {}}},
    ),
    "RayCluster": (
        "/apis/ray.io/v1/namespaces/default/rayclusters",
        {"apiVersion": "ray.io/v1", "kind": "RayCluster", "spec": {"headGroupSpec": {"template": {"spec": {
            "containers": [{"name": "ray-head", "image": "rayproject/ray:2.58.0"}]}}}}},
    ),
}  # fmt: skip


@pytest.mark.parametrize("kind", sorted(OBJECTS))
def test_a_leftover_is_deleted_only_while_it_is_the_object_that_was_seen(kind: str) -> None:
    with ThreadedApiServer() as api:
        chart_rbac.secure(api)
        api.store.create(api.store.resource("customresourcedefinitions", "apiextensions.k8s.io"), RAYCLUSTER_CRD)
        collection, body = OBJECTS[kind]
        group = body["apiVersion"].rpartition("/")[0]
        rtype = api.store.resource(collection.rsplit("/", 1)[1], group)

        def create() -> str:
            return str(api.store.create(rtype, {**body, "metadata": {"name": "qwen-x"}}, NAMESPACE)["metadata"]["uid"])

        def current_uid() -> str | None:
            found = [
                o for o in api.store.find(rtype.plural, rtype.group, NAMESPACE) if o["metadata"]["name"] == "qwen-x"
            ]
            return str(found[0]["metadata"]["uid"]) if found else None

        async def main() -> None:
            kube = AioKube(api.url, headers=dict(OPERATOR_AUTH), timeout=10)
            try:
                seen = create()
                # The leftover went and a new object took its name (the new job's own) before the pass deleted.
                api.store.delete(rtype, "qwen-x", NAMESPACE)
                newer = create()
                assert await kube.delete_owned(kind, NAMESPACE, "qwen-x", seen) is False
                assert current_uid() == newer, "the new object was deleted in place of the leftover"
                assert await kube.delete_owned(kind, NAMESPACE, "qwen-x", newer) is True
                assert current_uid() is None
                assert await kube.delete_owned(kind, NAMESPACE, "qwen-x", newer) is False  # gone: nothing to do
            finally:
                await kube.close()

        asyncio.run(main())
