"""The chart's RBAC, as the real `helm template` renders it, enforced by the emulated API server.

Every fixture that runs the operator goes through `secure()`: the API server authenticates by bearer token and
authorizes by RBAC, the OwnerReferencesPermissionEnforcement admission plugin is on, the chart's
ServiceAccount with its ClusterRole/Roles and bindings is installed, and the operator presents
`OPERATOR_TOKEN` (the ServiceAccount). What a test does as a person (creating jobs, the KubeRay and Kueue
doubles, kubectl) presents `ADMIN_TOKEN`, a member of `system:masters`, explicitly.
"""

from __future__ import annotations

import copy
import functools
import subprocess
from pathlib import Path
from typing import Any

import yaml
from fsdp_operator.local.server import ApiServer, ThreadedApiServer
from fsdp_operator.local.server.admission import OwnerReferencesPermissionEnforcement
from fsdp_operator.local.server.rbac import MASTERS, Access, User, service_account

from support import k8s_tools

CHART = Path(__file__).resolve().parents[2] / "charts" / "fsdp-operator"
RELEASE_NAMESPACE = "ml"
ACCOUNT = service_account(RELEASE_NAMESPACE, "demo-fsdp-operator")
OPERATOR_TOKEN, ADMIN_TOKEN = "operator-token", "admin-token"
OPERATOR_AUTH = {"Authorization": f"Bearer {OPERATOR_TOKEN}"}
ADMIN_AUTH = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
RBAC_KINDS = {"Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding"}


@functools.cache
def _render(watch_all: bool, replicas: int, watched: tuple[str, ...], node_notices: bool = False) -> str:
    helm = k8s_tools.needed("helm")
    proc = subprocess.run(
        [str(helm), "template", "demo", str(CHART), "--namespace", RELEASE_NAMESPACE,
         "--set", "image.repository=registry.example.com/fsdp-operator",
         "--set", f"watchAllNamespaces={str(watch_all).lower()}", "--set", f"replicas={replicas}",
         *(("--set", "watchNamespaces={" + ",".join(watched) + "}") if watched else ()), "--include-crds",
         *(("--set", "nodeNotices.enabled=true") if node_notices else ())],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return proc.stdout


def rendered_rbac(
    watch_all: bool, replicas: int = 1, watched: tuple[str, ...] = (), node_notices: bool = False
) -> list[dict[str, Any]]:
    """The chart's RBAC objects, and with replicas > 1 its kopf peering CRDs and peering object (rendered once
    per set of values in a test run); `node_notices`: with `nodeNotices.enabled`."""
    docs = [d for d in yaml.safe_load_all(_render(watch_all, replicas, tuple(watched), node_notices)) if d]
    kinds = RBAC_KINDS | ({"ClusterKopfPeering", "KopfPeering"} if replicas > 1 else set())
    peering_crds = [
        d for d in docs
        if d["kind"] == "CustomResourceDefinition" and d["spec"]["group"] == "kopf.dev" and replicas > 1
    ]  # fmt: skip
    return copy.deepcopy(peering_crds + [d for d in docs if d["kind"] in kinds])


def rules_of(doc: dict[str, Any]) -> set[tuple[str, str, str]]:
    """(verb, group, resource) for every combination a Role's or ClusterRole's rules allow."""
    return {
        (verb, group, resource)
        for rule in doc["rules"]
        for verb in rule["verbs"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
    }


def secure(
    api: ThreadedApiServer, docs: list[dict[str, Any]] | None = None, namespaces: tuple[str, ...] = ()
) -> Access:
    """Turn on authentication, RBAC and OwnerReferencesPermissionEnforcement on a running emulated API server,
    and install `docs` (by default the chart's RBAC for watching every namespace) and the `namespaces`. A server
    secured already keeps its access and roles."""
    return secure_server(api.server, docs, namespaces)


def secure_server(
    server: ApiServer, docs: list[dict[str, Any]] | None = None, namespaces: tuple[str, ...] = ()
) -> Access:
    """`secure()` for an `ApiServer` itself (one served from a process of its own, for instance)."""
    if server.access is not None:
        return server.access
    docs = rendered_rbac(watch_all=True) if docs is None else docs
    access = Access()
    access.add_token(ADMIN_TOKEN, User("admin", (MASTERS,)))
    access.add_token(OPERATOR_TOKEN, ACCOUNT)
    store = server.store
    existing = {n["metadata"]["name"] for n in store.find("namespaces")}
    for namespace in sorted({RELEASE_NAMESPACE, *namespaces} - existing):
        store.create(store.resource("namespaces"), {"metadata": {"name": namespace}})
    for doc in docs:
        group, _ = doc["apiVersion"].split("/")
        store.create(store.resource(doc["kind"].lower(), group), doc)
    server.admission = OwnerReferencesPermissionEnforcement()
    server.access = access
    return access


def secured_server(
    docs: list[dict[str, Any]], namespaces: tuple[str, ...] = (), **kwargs: Any
) -> tuple[ThreadedApiServer, Access]:
    """A fresh emulated API server, `secure()`d with `docs`."""
    api = ThreadedApiServer(**kwargs).start()
    return api, secure(api, docs, namespaces)
