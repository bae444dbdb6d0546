"""The operator under the chart's own RBAC, rendered by the real helm, against an API server that enforces it.

Both `watchAllNamespaces` modes: the ServiceAccount's Role/ClusterRole and bindings from `helm template`
are created in the emulated API server, which authenticates by bearer token and authorizes by RBAC;
the operator (kopf in-process, the real handlers and controller) runs a job through its whole life
as that ServiceAccount. Any 403 fails the test, and the calls it made must be exactly what the chart
grants: nothing missing, nothing granted that the code never calls.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from dataclasses import replace
from typing import Any

import pytest
import requests
from fsdp_operator.api import generate, schema
from fsdp_operator.local.cluster.kuberay import RAYCLUSTER_CRD
from fsdp_operator.local.server import ThreadedApiServer
from fsdp_operator.local.server.rbac import MASTERS, Access, User
from fsdp_operator.runtime import calls
from fsdp_operator.runtime.handlers import build_registry
from fsdp_operator.runtime.kube import AioKube
from fsdp_operator.runtime.rayjobs import FakeRay
from fsdp_operator.runtime.shared import Runtime
from support import chart_rbac
from support.aws import FixedZone
from support.chart_rbac import ACCOUNT, ADMIN_TOKEN, OPERATOR_TOKEN, RELEASE_NAMESPACE, rendered_rbac, rules_of
from support.fake_kuberay import FakeKubeRay
from support.kopf_runner import eventually, kopf_operator
from support.kueue import WORKLOAD_CRD, FakeKueue
from test_operator import FAST, Script, manifest

POD_SPEC = {"containers": [{"name": "c", "image": "i"}]}
"""The least a real server accepts as a Pod's spec."""

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

# The operator's calls come from its call table (fsdp_operator/runtime/calls.py); a job's plain life makes all but
# these, which the tests named make: a deleted namesake's leftovers (test_ownership.py, under this RBAC in both
# modes) and a queued job's Workloads (test_a_queued_job_runs_under_the_charts_rbac).
NOT_IN_A_PLAIN_LIFE = {
    c.rule for c in (calls.DELETE_SECRET, calls.GET_POLICY, calls.DELETE_POLICY, calls.LIST_WORKLOADS)
}
"""Calls a job's plain life does not make: the leftover and conflict paths and Kueue's Workloads. (A loop reads its job
on its first pass; later passes take it from the watch, and read it after a failed pass or a silent watch.)"""


def secured_server(docs: list[dict[str, Any]], namespaces: tuple[str, ...] = ()) -> tuple[ThreadedApiServer, Access]:
    """The strict emulator (RBAC, OwnerReferencesPermissionEnforcement) with the job and RayCluster CRDs."""
    api, access = chart_rbac.secured_server(docs, namespaces)
    crds = api.store.resource("customresourcedefinitions", "apiextensions.k8s.io")
    api.store.create(crds, generate.crd())
    api.store.create(crds, RAYCLUSTER_CRD)
    return api, access


def job_status(api: ThreadedApiServer, namespace: str) -> dict[str, Any]:
    """The status of the (one) job in `namespace`, read from the store; empty while it has none, or once it is gone."""
    found = api.store.find(schema.PLURAL, schema.GROUP, namespace)
    return dict(found[0].get("status") or {}) if found else {}


def operator_kube(api: ThreadedApiServer) -> AioKube:
    """The operator's client, as the chart's ServiceAccount."""
    return AioKube(api.url, headers={"Authorization": f"Bearer {OPERATOR_TOKEN}"}, timeout=FAST.kube_timeout)


async def post_job_once_watched(api: ThreadedApiServer, namespace: str, job: dict[str, Any]) -> None:
    """Once the operator watches the jobs (kopf's ready flag comes before its watches, as in test_operator's World),
    an admin creates `job` in `namespace`."""
    await eventually(
        lambda: api.count("watch", schema.PLURAL, schema.GROUP) > 0,
        message="the operator never started watching the jobs",
    )
    admin = requests.Session()
    admin.headers["Authorization"] = f"Bearer {ADMIN_TOKEN}"
    jobs = f"/apis/{schema.GROUP}/{schema.VERSION}/namespaces/{namespace}/{schema.PLURAL}"
    response = await asyncio.to_thread(admin.post, api.url + jobs, json=job)
    assert response.status_code == 201, response.text


def run_then_stop(api: ThreadedApiServer, main: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """`main()` to its end, then the API server stopped, whatever happened."""
    try:
        asyncio.run(main())
    finally:
        api.stop()


@pytest.mark.parametrize("node_notices", [False, True], ids=["", "node-notices"])
@pytest.mark.parametrize("replicas", [1, 2], ids=["one-replica", "peering"])
@pytest.mark.parametrize("watch_all", [True, False], ids=["all-namespaces", "one-namespace"])
def test_the_charts_rules_are_the_call_table(watch_all: bool, replicas: int, node_notices: bool) -> None:
    """The ClusterRole grants at cluster scope, and each Role in each watched namespace, exactly what the call
    table says the operator needs there: nothing missing, nothing the code never calls (`nodeNotices.enabled`
    adds the pod delete of `calls.NODE_NOTICE_CALLS`)."""
    watched = () if watch_all else ("team-a", "team-b")
    docs = rendered_rbac(watch_all, replicas, watched, node_notices)
    cluster, namespaced = calls.required(watch_all, peering=replicas > 1, node_notices=node_notices)
    (cluster_role,) = [d for d in docs if d["kind"] == "ClusterRole"]
    granted = rules_of(cluster_role)
    assert granted == cluster, f"granted but not in the table: {granted - cluster}; missing: {cluster - granted}"
    roles = {d["metadata"]["namespace"]: rules_of(d) for d in docs if d["kind"] == "Role"}
    assert set(roles) == set(watched)
    for namespace, rules in roles.items():
        assert rules == namespaced, (namespace, f"extra: {rules - namespaced}; missing: {namespaced - rules}")
    assert cluster and (namespaced or watch_all)


def test_the_call_table_builds_each_requests_path() -> None:
    """A request's method and path come from its call: the group, version and resource the table names."""
    assert calls.GET_SECRET.method == "GET" and calls.GET_SECRET.path("team a", "s/1") == (
        "/api/v1/namespaces/team%20a/secrets/s%2F1"
    )
    assert (
        calls.PATCH_JOB_STATUS.path("ml", "j")
        == f"/apis/{schema.GROUP}/{schema.VERSION}/namespaces/ml/{schema.PLURAL}/j/status"
    )
    assert calls.CREATE_POLICY.path("ml") == "/apis/networking.k8s.io/v1/namespaces/ml/networkpolicies"
    assert calls.LIST_NODES.path() == "/api/v1/nodes"
    for call in calls.CLIENT_CALLS:
        plural = call.resource.split("/")[0]
        assert f"/{plural}" in call.path("ns", "x") and call.method in ("GET", "POST", "PATCH", "DELETE")


def test_the_emulator_refuses_what_rbac_does_not_allow() -> None:
    """Authentication and authorization themselves, with the real server's answers."""
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": "reader", "namespace": "ml"},
        "rules": [
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["get"], "resourceNames": ["allowed"]},
            {"apiGroups": [""], "resources": ["pods/status"], "verbs": ["patch"]},
        ],
    }
    binding = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
               "metadata": {"name": "reader", "namespace": "ml"},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "reader"},
               "subjects": [{"kind": "ServiceAccount", "name": "demo-fsdp-operator", "namespace": "ml"}]}  # fmt: skip
    api, access = secured_server([role, binding])
    try:
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "allowed"}, "spec": POD_SPEC}
        admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        for name in ("allowed", "other"):
            created = requests.post(
                f"{api.url}/api/v1/namespaces/ml/pods", json={**pod, "metadata": {"name": name}}, headers=admin
            )
            assert created.status_code == 201, created.text
        user = {"Authorization": f"Bearer {OPERATOR_TOKEN}"}

        def code(method: str, path: str, headers: dict[str, str] = user, **kw: Any) -> int:
            return requests.request(method, api.url + path, headers=headers, timeout=5, **kw).status_code

        assert code("GET", "/api/v1/namespaces/ml/pods/allowed") == 200
        assert code("GET", "/api/v1/namespaces/ml/pods/other") == 403  # resourceNames
        assert code("GET", "/api/v1/namespaces/ml/pods") == 403  # resourceNames never match a list
        assert code("GET", "/api/v1/namespaces/default/pods/allowed") == 403  # the binding is in ml only
        assert code("GET", "/api/v1/pods") == 403  # cluster scope needs a ClusterRoleBinding
        patch = {"json": {"status": {}}, "headers": {**user, "Content-Type": "application/merge-patch+json"}}
        assert code("PATCH", "/api/v1/namespaces/ml/pods/other/status", **patch) == 200  # subresource rule
        assert code("PATCH", "/api/v1/namespaces/ml/pods/other", **patch) == 403  # ... not the resource
        assert code("GET", "/api/v1/namespaces/ml/pods/allowed", {}) == 401
        assert code("GET", "/api/v1/namespaces/ml/pods/allowed", {"Authorization": "Bearer wrong"}) == 401
        assert code("GET", "/api/v1/namespaces/ml/pods/other", admin) == 200  # system:masters
        assert code("GET", "/apis", user) == 200  # discovery is open to every authenticated user
        denied = requests.get(f"{api.url}/api/v1/pods", headers=user, timeout=5).json()
        assert denied["reason"] == "Forbidden"
        assert denied["message"] == (
            'pods is forbidden: User "system:serviceaccount:ml:demo-fsdp-operator" cannot list resource "pods" '
            'in API group "" at the cluster scope'
        )
        # An exec plugin's expiring token: long enough to be used once on a loaded machine, then refused.
        access.add_token("short-lived", User("admin", (MASTERS,)), ttl=3)
        short_lived = {"Authorization": "Bearer short-lived"}
        assert code("GET", "/api/v1/namespaces/ml/pods/other", short_lived) == 200
        deadline = time.monotonic() + 60
        while code("GET", "/api/v1/namespaces/ml/pods/other", short_lived) != 401:
            assert time.monotonic() < deadline, "the expired token is still accepted"
            time.sleep(0.2)
        access.rotate("admin", "new-admin-token")
        assert code("GET", "/api/v1/namespaces/ml/pods/other", admin) == 401
        assert code("GET", "/api/v1/namespaces/ml/pods/other", {"Authorization": "Bearer new-admin-token"}) == 200
    finally:
        api.stop()


def test_the_emulator_matches_rbacs_rules_for_wildcards_subresources_and_names() -> None:
    """Where a rule's reach differs from what it seems: `*` covers subresources, `pods/*` is no wildcard, a
    name in resourceNames admits a list or watch by `metadata.name`, a Role never reaches cluster-scoped
    resources, and a ClusterRole bound by a RoleBinding grants only in that namespace."""

    def rbac(kind: str, name: str, namespace: str | None, **body: Any) -> dict[str, Any]:
        meta = {"name": name, **({"namespace": namespace} if namespace else {})}
        return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": kind, "metadata": meta, **body}

    subject = [{"kind": "ServiceAccount", "name": "demo-fsdp-operator", "namespace": "ml"}]

    def ref(kind: str, name: str) -> dict[str, str]:
        return {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": name}

    docs = [
        rbac("Role", "all-pods", "team", rules=[{"apiGroups": [""], "resources": ["*"], "verbs": ["patch"]}]),
        rbac("Role", "slash-star", "ml", rules=[
            {"apiGroups": [""], "resources": ["secrets/*"], "verbs": ["patch"]},
            {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["list", "watch"], "resourceNames": ["one"]},
            {"apiGroups": [""], "resources": ["nodes"], "verbs": ["list"]},  # cluster-scoped: a Role cannot grant it
        ]),
        rbac("ClusterRole", "reader", None, rules=[{"apiGroups": [""], "resources": ["services"], "verbs": ["list"]}]),
        rbac("RoleBinding", "all-pods", "team", roleRef=ref("Role", "all-pods"), subjects=subject),
        rbac("RoleBinding", "slash-star", "ml", roleRef=ref("Role", "slash-star"), subjects=subject),
        rbac("RoleBinding", "reader", "ml", roleRef=ref("ClusterRole", "reader"), subjects=subject),
    ]  # fmt: skip
    api, _ = secured_server(docs, ("team",))
    try:
        admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        for path, body in (
            ("/api/v1/namespaces/team/pods", {"metadata": {"name": "p"}, "spec": POD_SPEC}),
            ("/api/v1/namespaces/ml/secrets", {"metadata": {"name": "s"}}),
        ):
            assert requests.post(api.url + path, json=body, headers=admin, timeout=5).status_code == 201
        user = {"Authorization": f"Bearer {OPERATOR_TOKEN}"}
        patch = {"json": {"status": {}}, "headers": {**user, "Content-Type": "application/merge-patch+json"}}

        def code(method: str, path: str, **kw: Any) -> int:
            kw.setdefault("headers", user)
            return requests.request(method, api.url + path, timeout=5, **kw).status_code

        assert code("PATCH", "/api/v1/namespaces/team/pods/p/status", **patch) == 200  # `*` covers subresources
        assert code("PATCH", "/api/v1/namespaces/team/pods/p", **patch) == 200
        assert code("PATCH", "/api/v1/namespaces/ml/secrets/s", **patch) == 403  # `secrets/*` is not `secrets`
        configmaps = "/api/v1/namespaces/ml/configmaps"
        assert code("GET", configmaps) == 403
        assert code("GET", configmaps, params={"fieldSelector": "metadata.name=one"}) == 200
        assert code("GET", configmaps, params={"fieldSelector": "metadata.name=two"}) == 403
        assert code("GET", configmaps, params={"fieldSelector": "metadata.name!=one"}) == 403
        assert code("GET", "/api/v1/nodes") == 403  # a Role names nodes in vain
        assert code("GET", "/api/v1/namespaces/ml/services") == 200  # a ClusterRole through a RoleBinding ...
        assert code("GET", "/api/v1/namespaces/default/services") == 403  # ... in the binding's namespace only
        assert code("GET", "/api/v1/services") == 403
    finally:
        api.stop()


@pytest.mark.parametrize(
    ("watch_all", "replicas", "watched"),
    [(True, 1, ()), (False, 1, ()), (True, 2, ()), (False, 2, ()), (False, 1, ("team-a", "team-b"))],
    ids=[
        "all-namespaces",
        "one-namespace",
        "all-namespaces-with-peering",
        "one-namespace-with-peering",
        "listed-namespaces",
    ],
)
def test_the_operator_runs_a_job_under_the_charts_rbac(
    watch_all: bool, replicas: int, watched: tuple[str, ...]
) -> None:
    docs = rendered_rbac(watch_all, replicas, watched)
    api, access = secured_server(docs, watched)
    # The job runs in the last watched namespace: the Role there (not only the first) must do.
    job_namespace = watched[-1] if watched else RELEASE_NAMESPACE
    script = Script()
    ray = FakeRay(script=script)
    kuberay = FakeKubeRay(api.url, ray)
    kuberay.headers["Authorization"] = f"Bearer {ADMIN_TOKEN}"
    kuberay.ready_delay = 0.3  # Pending pods first: the operator asks why (pods, then scheduling events)

    def status() -> dict[str, Any]:
        return job_status(api, job_namespace)

    def completed() -> bool:
        return any(e.get("reason") == "Completed" for e in api.store.find("events", None, job_namespace))

    async def main() -> None:
        async with kuberay.running():
            peering = "demo-fsdp-operator" if replicas > 1 else None
            runtime = Runtime(
                replace(FAST, peering=peering), kube=operator_kube(api), ray=ray.client, zones=FixedZone("us-east-1b")
            )
            namespaces = None if watch_all else list(watched or [RELEASE_NAMESPACE])
            registry = build_registry(runtime, login=False)
            async with kopf_operator(registry, api.url, namespaces=namespaces, token=OPERATOR_TOKEN):
                if replicas > 1:
                    # The replica announces itself (id, priority, heartbeat) in the peering object's status.
                    plural = "clusterkopfpeerings" if watch_all else "kopfpeerings"
                    await eventually(
                        lambda: any(p.get("status") for p in api.store.find(plural, "kopf.dev")),
                        message="the operator never wrote its heartbeat into the peering object",
                    )
                job = manifest(runPolicy={"ttlSecondsAfterFinished": 0}, placement={"availabilityZone": "auto"})
                await post_job_once_watched(api, job_namespace, job)
                try:
                    # With ttlSecondsAfterFinished: 0 the job may be gone before a poll sees it Succeeded: the
                    # Completed event outlives it.
                    await eventually(lambda: status().get("phase") == "Succeeded" or completed(), timeout=60)
                except AssertionError:
                    seen = sorted(access.calls_by(ACCOUNT.name))
                    raise AssertionError(
                        f"not Succeeded; status {status()}; 403s {access.denied}; 401s {access.unauthorized}; "
                        f"calls {seen}"
                    ) from None
                # ttlSecondsAfterFinished: 0: the operator deletes the job, its finalizer deletes the cluster.
                await eventually(
                    lambda: not api.store.find(schema.PLURAL, schema.GROUP) and not api.store.find("rayclusters"),
                    timeout=60,
                    message="the job or its RayCluster was not deleted",
                )

    run_then_stop(api, main)
    assert access.denied == [], f"403s: {access.denied}"
    made_calls = access.calls_by(ACCOUNT.name)
    made = {(verb, group, resource) for verb, group, resource, _ in made_calls}
    cluster, namespaced = calls.required(watch_all, peering=replicas > 1)
    admission_checks = {c.rule for c in calls.ADMISSION_CHECKS}
    expected = (cluster | namespaced) - NOT_IN_A_PLAIN_LIFE - admission_checks
    assert made == expected, f"missing: {expected - made}; not in the call table: {made - expected}"
    admission = api.server.admission
    assert admission is not None
    checked = {(verb, group, resource) for verb, group, resource, _, allowed in admission.checks if allowed}
    assert checked == admission_checks, admission.checks
    scopes = {(resource, scope) for _, _, resource, scope in made_calls}
    assert ("customresourcedefinitions", "cluster") in scopes
    assert (("namespaces", "cluster") in scopes) is not watch_all
    job_scopes = {scope for resource, scope in scopes if resource == "fsdptrainingjobs"}
    assert job_scopes == ({"cluster", "namespace"} if watch_all else {"namespace"})


def test_a_queued_job_runs_under_the_charts_rbac() -> None:
    """A job with a queueName reads Kueue's Workloads as the chart lets it (Kueue's double runs as admin)."""
    docs = rendered_rbac(watch_all=False)
    api, access = secured_server(docs)
    api.store.create(api.store.resource("customresourcedefinitions", "apiextensions.k8s.io"), WORKLOAD_CRD)
    ray = FakeRay(script=Script())
    kuberay = FakeKubeRay(api.url, ray)
    kueue = FakeKueue(api.url, {"nvidia.com/gpu": "8"})
    for double in (kuberay, kueue):
        double.headers["Authorization"] = f"Bearer {ADMIN_TOKEN}"
    events: list[str] = []

    def status() -> dict[str, Any]:
        return job_status(api, RELEASE_NAMESPACE)

    async def main() -> None:
        async with kuberay.running(), kueue.running():
            runtime = Runtime(FAST, kube=operator_kube(api), ray=ray.client)
            registry = build_registry(runtime, login=False)
            async with kopf_operator(registry, api.url, namespaces=[RELEASE_NAMESPACE], token=OPERATOR_TOKEN):
                job = manifest(network={"transport": "socket"})
                job["spec"]["queueName"] = "team-a"
                await post_job_once_watched(api, RELEASE_NAMESPACE, job)
                await eventually(lambda: status().get("phase") == "Succeeded", timeout=60,
                                 message=f"the queued job did not succeed: {status()}")  # fmt: skip
                events.extend(e["reason"] for e in api.store.find("events", None, RELEASE_NAMESPACE))

    run_then_stop(api, main)
    assert access.denied == [], f"403s: {access.denied}"
    made = {(verb, group, resource) for verb, group, resource, _ in access.calls_by(ACCOUNT.name)}
    assert calls.LIST_WORKLOADS.rule in made and "Admitted" in events, (made, events)


def test_a_create_the_api_server_refuses_is_named_in_the_jobs_status() -> None:
    """Under the chart's RBAC without `update` on `fsdptrainingjobs/finalizers` (as before it had it), the admission
    plugin refuses the job's Secret: the job says so in its status, not only in the operator's log."""
    docs = rendered_rbac(watch_all=False)
    for doc in docs:
        for rule in doc.get("rules") or []:
            rule["resources"] = [r for r in rule["resources"] if r != f"{schema.PLURAL}/finalizers"]
    api, _ = secured_server(docs)
    ray = FakeRay(script=Script())
    kuberay = FakeKubeRay(api.url, ray)
    kuberay.headers["Authorization"] = f"Bearer {ADMIN_TOKEN}"

    def status() -> dict[str, Any]:
        return job_status(api, RELEASE_NAMESPACE)

    async def main() -> None:
        async with kuberay.running():
            runtime = Runtime(FAST, kube=operator_kube(api), ray=ray.client, zones=FixedZone("us-east-1b"))
            registry = build_registry(runtime, login=False)
            async with kopf_operator(registry, api.url, namespaces=[RELEASE_NAMESPACE], token=OPERATOR_TOKEN):
                await post_job_once_watched(api, RELEASE_NAMESPACE, manifest())
                await eventually(
                    lambda: status().get("reason") == "CreateRefused",
                    timeout=60,
                    message="the refused create never reached the job's status",
                )

    run_then_stop(api, main)
    found = status()
    assert found["phase"] == "Provisioning", found
    assert "the API server refused the job's Secret" in found["message"], found
    assert "the API server refused the job's NetworkPolicy" in found["message"], found
    assert "cannot set blockOwnerDeletion" in found["message"], found
    assert not api.store.find("rayclusters"), "a RayCluster was created without its Secret"
