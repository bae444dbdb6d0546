"""`fsdpctl run-local` runs its operator as a ServiceAccount with the roles of the call table (the chart's own,
which test_rbac.py holds equal to it): each call of the table is allowed where it is made, and nothing else."""

from __future__ import annotations

import pytest
from fsdp_operator.local.run import OPERATOR_ACCOUNT, operator_rbac
from fsdp_operator.local.server import rbac
from fsdp_operator.local.server.store import Store
from fsdp_operator.runtime import calls

pytestmark = pytest.mark.integration

NAMESPACE = "team-a"


def store_with_roles() -> Store:
    store = Store()
    for rtype in rbac.rbac_types():
        store._register(rtype)
    store.create(store.resource("namespaces"), {"metadata": {"name": NAMESPACE}})
    for doc in operator_rbac(NAMESPACE):
        store.create(store.resource(doc["kind"].lower(), doc["apiVersion"].split("/")[0]), doc)
    return store


def attributes(verb: str, group: str, resource: str, namespace: str) -> rbac.Attributes:
    plural, _, subresource = resource.partition("/")
    return rbac.Attributes(verb, group, plural, subresource, namespace, "x" if verb not in ("list", "watch") else "")


def test_run_locals_operator_may_make_exactly_the_calls_of_the_table() -> None:
    store = store_with_roles()
    user = rbac.service_account(NAMESPACE, OPERATOR_ACCOUNT)
    # run-local turns node notices on (a taint on a local node drains its worker with a save): the pod delete too.
    cluster, namespaced = calls.required(watch_all=False, peering=False, node_notices=True)
    for verb, group, resource in cluster:
        assert rbac.allowed(store, user, attributes(verb, group, resource, "")), (verb, group, resource)
    for verb, group, resource in namespaced:
        assert rbac.allowed(store, user, attributes(verb, group, resource, NAMESPACE)), (verb, group, resource)
        assert not rbac.allowed(store, user, attributes(verb, group, resource, "default")), (verb, resource)
    for verb, group, resource in [("list", "", "secrets"), ("update", "", "secrets"), ("create", "", "pods"),
                                  ("patch", "", "pods"), ("patch", "ray.io", "rayclusters")]:  # fmt: skip
        assert not rbac.allowed(store, user, attributes(verb, group, resource, NAMESPACE)), (verb, resource)
