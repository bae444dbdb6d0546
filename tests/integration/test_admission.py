"""What the emulated API server adds for the chart's real clients: OwnerReferencesPermissionEnforcement, server-side
apply, Deployment defaulting and validation, protobuf bodies. Each rule pairs a refused request with an allowed one.

The admission plugin as the Kubernetes documentation ("Admission Controllers Reference",
OwnerReferencesPermissionEnforcement) describes it: changing `metadata.ownerReferences` needs `delete` on the
object; setting `blockOwnerDeletion: true` needs `update` on the owner's `finalizers` subresource.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from typing import Any

import pytest
import requests
from fsdp_operator.api import generate, schema
from fsdp_operator.local.server import ThreadedApiServer, protobuf
from fsdp_operator.local.server.admission import OwnerReferencesPermissionEnforcement
from fsdp_operator.local.server.rbac import MASTERS, Access, User, service_account
from test_operator import manifest

pytestmark = pytest.mark.integration

ADMIN = {"Authorization": "Bearer admin"}
USER = {"Authorization": "Bearer user"}
ACCOUNT = service_account("ml", "op")
JOBS = f"/apis/{schema.GROUP}/{schema.VERSION}/namespaces/ml/{schema.PLURAL}"
CONFIGMAPS = "/api/v1/namespaces/ml/configmaps"
DEPLOYMENTS = "/apis/apps/v1/namespaces/ml/deployments"
APPLY = "application/apply-patch+yaml"


def start(*, admission: bool = True) -> ThreadedApiServer:
    access = Access()
    access.add_token("admin", User("admin", (MASTERS,)))
    access.add_token("user", ACCOUNT)
    plugin = OwnerReferencesPermissionEnforcement() if admission else None
    api = ThreadedApiServer(access=access, admission=plugin).start()
    api.store.create(api.store.resource("namespaces"), {"metadata": {"name": "ml"}})
    api.store.create(api.store.resource("customresourcedefinitions", "apiextensions.k8s.io"), generate.crd())
    return api


@pytest.fixture
def api() -> Iterator[ThreadedApiServer]:
    server = start()
    try:
        yield server
    finally:
        server.stop()


def grant(api: ThreadedApiServer, *rules: dict[str, Any]) -> None:
    """A Role with `rules` bound to the test's ServiceAccount in `ml` (replacing the previous one)."""
    store = api.store
    roles, bindings = store.resource("roles", "rbac.authorization.k8s.io"), store.resource("rolebindings")
    for rtype in (roles, bindings):
        if store.find(rtype.plural, rtype.group, "ml"):
            store.delete(rtype, "op", "ml")
    store.create(roles, {"metadata": {"name": "op", "namespace": "ml"}, "rules": list(rules)})
    store.create(bindings, {
        "metadata": {"name": "op", "namespace": "ml"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "op"},
        "subjects": [{"kind": "ServiceAccount", "name": "op", "namespace": "ml"}],
    })  # fmt: skip


def rule(group: str, resource: str, *verbs: str) -> dict[str, Any]:
    return {"apiGroups": [group], "resources": [resource], "verbs": list(verbs)}


def owned_configmap(name: str, owner: dict[str, Any], *, block: bool | None) -> dict[str, Any]:
    ref = {"apiVersion": schema.API_VERSION, "kind": schema.KIND, "name": owner["metadata"]["name"],
           "uid": owner["metadata"]["uid"], "controller": True}  # fmt: skip
    if block is not None:
        ref["blockOwnerDeletion"] = block
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "ownerReferences": [ref]}}


def job(api: ThreadedApiServer) -> dict[str, Any]:
    created = requests.post(api.url + JOBS, json=manifest(), headers=ADMIN, timeout=10)
    assert created.status_code == 201, created.text
    return dict(created.json())


def test_block_owner_deletion_needs_update_on_the_owners_finalizers(api: ThreadedApiServer) -> None:
    owner = job(api)
    grant(api, rule("", "configmaps", "create"))
    refused = requests.post(
        api.url + CONFIGMAPS, json=owned_configmap("a", owner, block=True), headers=USER, timeout=10
    )
    assert refused.status_code == 403
    assert refused.json()["message"] == (
        'configmaps "a" is forbidden: cannot set blockOwnerDeletion if an ownerReference refers to a resource you '
        "can't set finalizers on: , <nil>"
    )
    # The same owner without blockOwnerDeletion: whoever may create an object may give it owners.
    for block in (None, False):
        name = f"plain-{block}".lower()
        plain = requests.post(
            api.url + CONFIGMAPS, json=owned_configmap(name, owner, block=block), headers=USER, timeout=10
        )
        assert plain.status_code == 201, plain.text
    # The permission is by the owner's name: another job's finalizers do not do.
    grant(api, rule("", "configmaps", "create"), {**rule(schema.GROUP, f"{schema.PLURAL}/finalizers", "update"),
                                                  "resourceNames": ["someone-else"]})  # fmt: skip
    body = owned_configmap("a", owner, block=True)
    assert requests.post(api.url + CONFIGMAPS, json=body, headers=USER, timeout=10).status_code == 403
    grant(api, rule("", "configmaps", "create"), rule(schema.GROUP, f"{schema.PLURAL}/finalizers", "update"))
    allowed = requests.post(api.url + CONFIGMAPS, json=body, headers=USER, timeout=10)
    assert allowed.status_code == 201, allowed.text
    # `update` on `*/finalizers` of every group does too (the plugin's "finalize anything" shortcut).
    grant(api, rule("", "configmaps", "create"), rule("*", "*/finalizers", "update"))
    body = owned_configmap("b", owner, block=True)
    assert requests.post(api.url + CONFIGMAPS, json=body, headers=USER, timeout=10).status_code == 201


def test_changing_owner_references_needs_delete_on_the_object(api: ThreadedApiServer) -> None:
    owner = job(api)
    plain = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"k": "v"}}
    assert requests.post(api.url + CONFIGMAPS, json=plain, headers=ADMIN, timeout=10).status_code == 201
    grant(api, rule("", "configmaps", "patch", "get"))
    merge = {**USER, "Content-Type": "application/merge-patch+json"}
    path = f"{CONFIGMAPS}/c"
    # A patch that leaves the owners alone needs no more than patch.
    assert requests.patch(api.url + path, json={"data": {"k": "w"}}, headers=merge, timeout=10).status_code == 200
    adopt = {"metadata": owned_configmap("c", owner, block=False)["metadata"]}
    refused = requests.patch(api.url + path, json=adopt, headers=merge, timeout=10)
    assert refused.status_code == 403
    assert refused.json()["message"] == (
        'configmaps "c" is forbidden: cannot set an ownerRef on a resource you can\'t delete: , <nil>'
    )
    grant(api, rule("", "configmaps", "patch", "get", "delete"))
    allowed = requests.patch(api.url + path, json=adopt, headers=merge, timeout=10)
    assert allowed.status_code == 200, allowed.text
    # Turning blockOwnerDeletion on later needs the owner's finalizers as well; keeping it on does not.
    block = {"metadata": owned_configmap("c", owner, block=True)["metadata"]}
    assert requests.patch(api.url + path, json=block, headers=merge, timeout=10).status_code == 403
    grant(api, rule("", "configmaps", "patch", "get", "delete"), rule(schema.GROUP, "*/finalizers", "update"))
    assert requests.patch(api.url + path, json=block, headers=merge, timeout=10).status_code == 200
    grant(api, rule("", "configmaps", "patch", "get"))
    assert requests.patch(api.url + path, json={"data": {"k": "x"}}, headers=merge, timeout=10).status_code == 200


def test_an_owner_of_an_unknown_kind_is_refused_and_the_plugin_can_be_off() -> None:
    for admission, expected in ((True, 403), (False, 201)):
        api = start(admission=admission)
        try:
            grant(api, rule("", "configmaps", "create"))
            ref = {
                "apiVersion": "example.com/v1",
                "kind": "Gadget",
                "name": "g",
                "uid": "1",
                "blockOwnerDeletion": True,
            }
            body = {"metadata": {"name": "x", "ownerReferences": [ref]}}
            answer = requests.post(api.url + CONFIGMAPS, json=body, headers=USER, timeout=10)
            assert answer.status_code == expected, answer.text
            if expected == 403:
                assert "cannot find RESTMapping for APIVersion example.com/v1 Kind Gadget" in answer.json()["message"]
        finally:
            api.stop()


def deployment(strategy: dict[str, Any], **labels: str) -> dict[str, Any]:
    selector = {"app": "op"}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "op"},
        "spec": {
            "replicas": 2,
            "strategy": strategy,
            "selector": {"matchLabels": selector},
            "template": {"metadata": {"labels": {**selector, **labels}}, "spec": {"containers": []}},
        },
    }


def apply(api: ThreadedApiServer, path: str, body: dict[str, Any], manager: str, force: bool = False) -> Any:
    params = {"fieldManager": manager, **({"force": "true"} if force else {})}
    headers = {**ADMIN, "Content-Type": APPLY}
    return requests.patch(api.url + path, json=body, params=params, headers=headers, timeout=10)


def test_server_side_apply_keeps_what_the_server_defaulted_and_drops_what_the_applier_dropped(
    api: ThreadedApiServer,
) -> None:
    """The sequence behind helm's failed 2 -> 1 replica upgrade: a defaulted rollingUpdate has no owner."""
    path = f"{DEPLOYMENTS}/op"
    created = apply(api, path, deployment({"type": "RollingUpdate"}), "helm")
    assert created.status_code == 201, created.text
    assert created.json()["spec"]["strategy"]["rollingUpdate"] == {"maxUnavailable": "25%", "maxSurge": "25%"}
    refused = apply(api, path, deployment({"type": "Recreate"}), "helm")
    assert refused.status_code == 422
    assert refused.json()["message"] == (
        'Deployment.apps "op" is invalid: spec.strategy.rollingUpdate: Forbidden: may not be specified when '
        "strategy type is 'Recreate'"
    )
    # Applied by helm (not defaulted), rollingUpdate is helm's: dropping it from the next apply removes it.
    owned = {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "25%"}}
    assert apply(api, path, deployment(owned), "helm").status_code == 200
    recreated = apply(api, path, deployment({"type": "Recreate"}), "helm")
    assert recreated.status_code == 200, recreated.text
    assert recreated.json()["spec"]["strategy"] == {"type": "Recreate"}
    (entry,) = recreated.json()["metadata"]["managedFields"]
    assert entry["manager"] == "helm" and entry["operation"] == "Apply"
    assert entry["fieldsV1"]["f:spec"]["f:strategy"] == {"f:type": {}}


def test_server_side_apply_conflicts_between_managers(api: ThreadedApiServer) -> None:
    path = f"{DEPLOYMENTS}/op"
    assert apply(api, path, deployment({"type": "Recreate"}), "helm").status_code == 201
    other = deployment({"type": "Recreate"})
    other["spec"]["replicas"] = 3
    conflict = apply(api, path, other, "kubectl")
    assert conflict.status_code == 409
    assert conflict.json()["message"] == 'Apply failed with 1 conflict: conflict with "helm": .spec.replicas'
    # The same values are shared, not a conflict; force takes the field over.
    assert apply(api, path, deployment({"type": "Recreate"}), "kubectl").status_code == 200
    forced = apply(api, path, other, "kubectl", force=True)
    assert forced.status_code == 200 and forced.json()["spec"]["replicas"] == 3
    helm_entry = next(e for e in forced.json()["metadata"]["managedFields"] if e["manager"] == "helm")
    assert "f:replicas" not in helm_entry["fieldsV1"]["f:spec"]
    missing = requests.patch(api.url + path, json=other, headers={**ADMIN, "Content-Type": APPLY}, timeout=10)
    assert missing.status_code == 422 and "fieldManager: Required value" in missing.json()["message"]


def test_a_deployment_whose_pod_labels_miss_the_selector_is_refused(api: ThreadedApiServer) -> None:
    bad = requests.post(api.url + DEPLOYMENTS, json=deployment({"type": "Recreate"}, app="other"), headers=ADMIN)
    assert bad.status_code == 422
    assert (
        "spec.template.metadata.labels: Invalid value: map[app:other]: `selector` does not match template"
        in (bad.json()["message"])
    )
    good = requests.post(api.url + DEPLOYMENTS, json=deployment({"type": "Recreate"}, team="ml"), headers=ADMIN)
    assert good.status_code == 201, good.text


def _field(number: int, payload: bytes) -> bytes:
    return bytes([number << 3 | 2, len(payload)]) + payload


def test_protobuf_secret_bodies_are_read(api: ThreadedApiServer) -> None:
    """client-go's typed clients (helm's release storage) send Secrets as Kubernetes protobuf."""
    meta = _field(1, b"release") + _field(11, _field(1, b"owner") + _field(2, b"helm"))
    secret = _field(1, meta) + _field(2, _field(1, b"release") + _field(2, b"\x00\xffdata")) + _field(3, b"helm.sh/r")
    type_meta = _field(1, b"v1") + _field(2, b"Secret")
    body = protobuf.MAGIC + _field(1, type_meta) + _field(2, secret)
    headers = {**ADMIN, "Content-Type": "application/vnd.kubernetes.protobuf"}
    created = requests.post(api.url + "/api/v1/namespaces/ml/secrets", data=body, headers=headers, timeout=10)
    assert created.status_code == 201, created.text
    stored = created.json()
    assert stored["metadata"]["labels"] == {"owner": "helm"} and stored["type"] == "helm.sh/r"
    assert base64.b64decode(stored["data"]["release"]) == b"\x00\xffdata"
    pod = protobuf.MAGIC + _field(1, _field(1, b"v1") + _field(2, b"Pod")) + _field(2, b"")
    refused = requests.post(api.url + "/api/v1/namespaces/ml/pods", data=pod, headers=headers, timeout=10)
    assert refused.status_code == 415 and "send JSON" in refused.json()["message"]


def test_server_side_apply_removes_a_dropped_field_only_when_no_other_applier_owns_it(api: ThreadedApiServer) -> None:
    path = f"{CONFIGMAPS}/shared"

    def config(**data: str) -> dict[str, Any]:
        return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "shared"}, "data": data}

    assert apply(api, path, config(a="1", b="2"), "helm").status_code == 201
    assert apply(api, path, config(b="2"), "kubectl").status_code == 200  # the same value: b is shared
    dropped = apply(api, path, config(a="1"), "helm")
    assert dropped.json()["data"] == {"a": "1", "b": "2"}  # kubectl still owns b
    assert apply(api, path, config(c="3"), "kubectl").json()["data"] == {"a": "1", "c": "3"}
    # Writes that are not applies leave the appliers' record alone.
    merge = {**ADMIN, "Content-Type": "application/merge-patch+json"}
    patched = requests.patch(api.url + path, json={"data": {"d": "4"}}, headers=merge, timeout=10).json()
    assert {e["manager"] for e in patched["metadata"]["managedFields"]} == {"helm", "kubectl"}
    assert apply(api, path, config(), "helm").json()["data"] == {"c": "3", "d": "4"}
