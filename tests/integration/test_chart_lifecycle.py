"""The chart's life on a cluster, through the real helm and kubectl, against the strict emulated API server.

HTTPS with a bearer token, RBAC, and the OwnerReferencesPermissionEnforcement admission plugin; helm 4 writes
with server-side apply and keeps its releases in protobuf-encoded Secrets. In both RBAC modes: install, upgrade
1 -> 2 -> 1 replicas, uninstall, with nothing on stderr and nothing left but the CRDs (helm never deletes the
CRDs of a chart's crds/ directory, by design). With the chart installed, the operator's ServiceAccount, with
the permissions the chart grants it and nothing else, creates a job's Secret, NetworkPolicy and RayCluster,
each naming the job as owner with blockOwnerDeletion.
"""

from __future__ import annotations

import asyncio
import os
import ssl
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from fsdp_operator.api import render, schema
from fsdp_operator.api.spec import parse_job
from fsdp_operator.local.cluster.kuberay import RAYCLUSTER_CRD
from fsdp_operator.local.server import ThreadedApiServer
from fsdp_operator.local.server.admission import OwnerReferencesPermissionEnforcement
from fsdp_operator.local.server.rbac import MASTERS, Access, User, service_account
from fsdp_operator.runtime.kube import AioKube
from support import k8s_tools
from support.tls import self_signed
from test_operator import manifest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

CHART = Path(__file__).resolve().parents[2] / "charts" / "fsdp-operator"
NAMESPACE = "ml"
API_SERVER_IP = "10.0.0.1"
ACCOUNT = service_account(NAMESPACE, "demo-fsdp-operator")
CHART_CRDS = {"fsdptrainingjobs.fsdp.dev", "kopfpeerings.kopf.dev", "clusterkopfpeerings.kopf.dev"}


def objects(api: ThreadedApiServer) -> set[tuple[str, str, str]]:
    """(resource, namespace, name) of every stored object."""
    store = api.store
    with store.lock:
        types = list(store.types.values())
    return {
        (rtype.group_resource, obj["metadata"].get("namespace", ""), obj["metadata"]["name"])
        for rtype in types
        for obj in store.list_objects(rtype)[0]
    }


def strict_server(tmp_path: Path) -> ThreadedApiServer:
    access = Access()
    access.add_token("admin", User("admin", (MASTERS,)))
    access.add_token("operator", ACCOUNT)
    api = ThreadedApiServer(
        access=access, admission=OwnerReferencesPermissionEnforcement(), tls=self_signed(tmp_path / "tls")
    ).start()
    store = api.store
    store.create(store.resource("namespaces"), {"metadata": {"name": NAMESPACE}})
    # What a real cluster has: the API server's own addresses, in both forms (v1 Endpoints is deprecated), and
    # KubeRay's CRD (installed with KubeRay, before this chart).
    store.create(store.resource("endpoints"), {
        "metadata": {"name": "kubernetes", "namespace": "default"},
        "subsets": [{"addresses": [{"ip": API_SERVER_IP}], "ports": [{"name": "https", "port": 6443}]}],
    })  # fmt: skip
    store.create(store.resource("endpointslices", "discovery.k8s.io"), {
        "metadata": {"name": "kubernetes", "namespace": "default",
                     "labels": {"kubernetes.io/service-name": "kubernetes"}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": [API_SERVER_IP], "conditions": {"ready": True}}],
        "ports": [{"name": "https", "port": 6443, "protocol": "TCP"}],
    })  # fmt: skip
    store.create(store.resource("customresourcedefinitions", "apiextensions.k8s.io"), RAYCLUSTER_CRD)
    return api


class Tools:
    def __init__(self, api: ThreadedApiServer, home: Path) -> None:
        self.kubeconfig = api.write_kubeconfig(home / "kubeconfig", NAMESPACE, user={"token": "admin"})
        helm_homes = {f"HELM_{kind.upper()}_HOME": str(home / kind) for kind in ("cache", "config", "data")}
        self.env = {**os.environ, "KUBECONFIG": str(self.kubeconfig), "HOME": str(home), **helm_homes}

    def helm(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(k8s_tools.helm()), *args], capture_output=True, text=True, env=self.env,
                              timeout=120, check=False)  # fmt: skip


def release(tools: Tools, watch_all: bool, replicas: int) -> None:
    proc = tools.helm(
        "upgrade", "--install", "demo", str(CHART), "--namespace", NAMESPACE,
        "--set", "image.repository=registry.example.com/fsdp-operator",
        "--set", f"watchAllNamespaces={str(watch_all).lower()}", "--set", f"replicas={replicas}",
    )  # fmt: skip
    assert proc.returncode == 0 and proc.stderr == "", f"replicas={replicas}: {proc.stderr}"


def deployment(api: ThreadedApiServer) -> dict[str, Any]:
    (found,) = api.store.find("deployments", "apps", NAMESPACE)
    return found


async def create_children_as_the_operator(api: ThreadedApiServer, job: dict[str, Any], ca: Path) -> list[bool]:
    """What the controller creates for a job, through its own client, with the ServiceAccount's token."""
    parsed = parse_job(job)
    security = render.Security(operator_namespace=NAMESPACE)
    kube = AioKube(api.url, headers={"Authorization": "Bearer operator"}, ssl_context=ssl.create_default_context(
        cafile=str(ca)))  # fmt: skip
    try:
        return [
            await kube.create_secret(render.auth_secret(parsed)),
            await kube.create_network_policy(render.network_policy(parsed, security)),
            await kube.create_raycluster(render.raycluster(parsed, security)),
        ]
    finally:
        await kube.close()


@pytest.mark.parametrize("watch_all", [True, False], ids=["all-namespaces", "one-namespace"])
def test_install_upgrade_uninstall_leave_nothing_and_print_nothing(watch_all: bool, tmp_path: Path) -> None:
    k8s_tools.needed("helm")
    k8s_tools.needed("kubectl")
    api = strict_server(tmp_path)
    try:
        tools = Tools(api, tmp_path)
        before = objects(api)
        release(tools, watch_all, 1)
        assert deployment(api)["spec"]["strategy"] == {"type": "Recreate"}
        (policy,) = api.store.find("networkpolicies", "networking.k8s.io", NAMESPACE)
        assert {"ipBlock": {"cidr": f"{API_SERVER_IP}/32"}} in policy["spec"]["egress"][1]["to"]

        # The operator, with exactly what the chart grants, creates a job's children with blockOwnerDeletion.
        job_file = tmp_path / "job.yaml"
        job_file.write_text(yaml.safe_dump(manifest("demo-job")))
        applied = k8s_tools.run_kubectl(tools.kubeconfig, "apply", "--server-side", "-f", str(job_file))
        assert applied.stderr == "", applied.stderr
        (job,) = api.store.find(schema.PLURAL, schema.GROUP, NAMESPACE)
        created = asyncio.run(create_children_as_the_operator(api, job, tmp_path / "tls" / "apiserver.crt"))
        assert created == [True, True, True]
        admission = api.server.admission
        assert admission is not None
        finalizers = {c for c in admission.checks if c[2] == f"{schema.PLURAL}/finalizers"}
        assert finalizers == {("update", schema.GROUP, f"{schema.PLURAL}/finalizers", "demo-job", True)}
        deleted = k8s_tools.run_kubectl(tools.kubeconfig, "delete", "-f", str(job_file))
        assert deleted.stderr == "", deleted.stderr

        release(tools, watch_all, 2)
        strategy = deployment(api)["spec"]["strategy"]
        assert strategy == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "25%"}}
        peering = "clusterkopfpeerings" if watch_all else "kopfpeerings"
        assert [p["metadata"]["name"] for p in api.store.find(peering, "kopf.dev")] == ["demo-fsdp-operator"]
        release(tools, watch_all, 1)
        assert deployment(api)["spec"]["strategy"] == {"type": "Recreate"}
        assert api.store.find(peering, "kopf.dev") == []

        uninstalled = tools.helm("uninstall", "demo", "--namespace", NAMESPACE)
        assert uninstalled.returncode == 0 and uninstalled.stderr == "", uninstalled.stderr
        left = {(resource, ns, name) for resource, ns, name in objects(api) - before}
        assert left == {("customresourcedefinitions.apiextensions.k8s.io", "", crd) for crd in CHART_CRDS}
        assert not any(resource == "secrets" for resource, _, _ in objects(api))  # helm's release records too
    finally:
        api.stop()
