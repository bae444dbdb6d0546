"""The Helm chart, through the real helm binary: lint, render, RBAC that matches what the operator does."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from fsdp_operator import schema
from support import k8s_tools

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "fsdp-operator"


@pytest.fixture(scope="module")
def helm() -> Path:
    try:
        return k8s_tools.helm()
    except k8s_tools.ToolsUnavailable as e:
        pytest.skip(str(e))


def template(helm: Path, *args: str) -> list[dict[str, Any]]:
    proc = subprocess.run(
        [str(helm), "template", "demo", str(CHART), "--namespace", "ml", "--include-crds", *args],
        capture_output=True,
        text=True,
        check=True,
    )
    return [doc for doc in yaml.safe_load_all(proc.stdout) if doc]


def by_kind(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {doc["kind"]: doc for doc in docs}


def test_lint_strict(helm: Path) -> None:
    proc = subprocess.run([str(helm), "lint", "--strict", str(CHART)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_default_render(helm: Path) -> None:
    docs = by_kind(template(helm))
    assert set(docs) == {
        "CustomResourceDefinition", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Deployment", "NetworkPolicy"
    }  # fmt: skip
    assert docs["CustomResourceDefinition"] == schema.crd()
    pod = docs["Deployment"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["args"][0] == "operator" and not any(a.startswith("--namespace") for a in container["args"])
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert pod["serviceAccountName"] == docs["ServiceAccount"]["metadata"]["name"]
    assert docs["Deployment"]["spec"]["strategy"]["type"] == "Recreate"


def test_rbac_covers_what_the_operator_touches(helm: Path) -> None:
    rules = by_kind(template(helm))["ClusterRole"]["rules"]

    def allowed(group: str, resource: str, verb: str) -> bool:
        return any(group in r["apiGroups"] and resource in r["resources"] and verb in r["verbs"] for r in rules)

    for verb in ("get", "list", "watch", "patch"):
        assert allowed("fsdp.dev", "fsdptrainingjobs", verb)
    assert allowed("fsdp.dev", "fsdptrainingjobs/status", "patch")
    for verb in ("create", "get", "delete", "list", "watch"):
        assert allowed("ray.io", "rayclusters", verb)
    assert allowed("", "events", "create") and allowed("", "pods", "list")
    # Secrets: each job's Ray token, created and read back by name; never listed or watched (no bulk reads).
    assert allowed("", "secrets", "create") and allowed("", "secrets", "get")
    assert not allowed("", "secrets", "list") and not allowed("", "secrets", "watch")
    assert allowed("networking.k8s.io", "networkpolicies", "create")


def test_job_security_settings_reach_the_operator(helm: Path) -> None:
    """The chart's values become the environment `OperatorConfig.from_env` reads."""
    from fsdp_operator.settings import OperatorConfig

    def config(*args: str) -> OperatorConfig:
        (container,) = by_kind(template(helm, *args))["Deployment"]["spec"]["template"]["spec"]["containers"]
        env = {e["name"]: e.get("value", "") for e in container["env"]}
        assert container["env"][0]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
        return OperatorConfig.from_env({**env, "FSDP_OPERATOR_NAMESPACE": "ml"})

    default = config().security
    assert default.token_auth and default.network_policy and default.operator_namespace == "ml"
    assert default.operator_pod_labels == {
        "app.kubernetes.io/name": "fsdp-operator",
        "app.kubernetes.io/instance": "demo",
    }
    off = config("--set", "jobNetworkPolicy.enabled=false", "--set", "rayTokenAuth.enabled=false").security
    assert not off.token_auth and not off.network_policy


def test_single_namespace_mode_uses_a_role(helm: Path) -> None:
    docs = by_kind(template(helm, "--set", "watchAllNamespaces=false"))
    assert "Role" in docs and "ClusterRole" not in docs
    assert docs["Role"]["metadata"]["namespace"] == "ml"
    assert "--namespace=ml" in docs["Deployment"]["spec"]["template"]["spec"]["containers"][0]["args"]


def test_values_schema_rejects_bad_values(helm: Path) -> None:
    proc = subprocess.run(
        [str(helm), "template", "demo", str(CHART), "--set", "replicas=2"], capture_output=True, text=True, check=False
    )
    assert proc.returncode != 0 and "replicas" in proc.stderr
