"""The Helm chart, through the real helm binary: lint, render, every value an admin sets, the schema."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from fsdp_operator.api import generate, schema
from support import k8s_tools

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "fsdp-operator"
IMAGE = ("--set", "image.repository=registry.example.com/fsdp-operator")


@pytest.fixture(scope="module")
def helm() -> Path:
    return k8s_tools.needed("helm")


def helm_run(helm: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(helm), *args], capture_output=True, text=True, check=False)


def template(helm: Path, *args: str, image: bool = True) -> list[dict[str, Any]]:
    proc = helm_run(
        helm, "template", "demo", str(CHART), "--namespace", "ml", "--include-crds", *(IMAGE if image else ()), *args
    )
    assert proc.returncode == 0, proc.stderr
    return [doc for doc in yaml.safe_load_all(proc.stdout) if doc]


def by_kind(docs: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    kinds: dict[str, list[dict[str, Any]]] = {}
    for doc in docs:
        kinds.setdefault(doc["kind"], []).append(doc)
    return kinds


def one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (found,) = by_kind(docs)[kind]
    return found


def container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (c,) = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    return c


@pytest.mark.parametrize(
    "settings",
    [
        (),
        ("replicas=3", "metrics.serviceMonitor.enabled=true"),
        ("watchAllNamespaces=false", "watchNamespaces={a,b}", "replicas=2", "networkPolicy.dns.podLabels=null"),
        ("metrics.enabled=false", "networkPolicy.enabled=false", "serviceAccount.create=false"),
    ],
    ids=["defaults", "replicas-and-monitor", "namespaced-peering", "minimal"],
)
def test_lint_strict(helm: Path, settings: tuple[str, ...]) -> None:
    extra = [arg for setting in settings for arg in ("--set", setting)]
    proc = helm_run(helm, "lint", "--strict", str(CHART), *IMAGE, *extra)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_image_is_a_clear_required_value(helm: Path) -> None:
    proc = helm_run(helm, "template", "demo", str(CHART))
    assert proc.returncode != 0
    assert "image.repository is required" in proc.stderr and "Dockerfile.operator" in proc.stderr


def test_default_render(helm: Path) -> None:
    docs = template(helm)
    kinds = by_kind(docs)
    assert sorted(kinds) == [
        "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition", "Deployment", "NetworkPolicy",
        "Service", "ServiceAccount",
    ]  # fmt: skip
    crds = {c["metadata"]["name"]: c for c in kinds["CustomResourceDefinition"]}
    assert crds[f"{schema.PLURAL}.{schema.GROUP}"] == generate.crd()
    assert set(crds) == {f"{schema.PLURAL}.{schema.GROUP}", "clusterkopfpeerings.kopf.dev", "kopfpeerings.kopf.dev"}
    deployment = one(docs, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    c = container(docs)
    assert c["image"] == "registry.example.com/fsdp-operator:0.1.0"
    assert c["args"] == [
        "operator",
        "--liveness=http://0.0.0.0:8080/healthz",
        "--metrics-port=9090",
        "--log-level=INFO",
        "--log-format=json",
    ]
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert c["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert pod["serviceAccountName"] == one(docs, "ServiceAccount")["metadata"]["name"]
    assert pod["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": 10001,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert deployment["spec"]["strategy"]["type"] == "Recreate"
    service = one(docs, "Service")
    assert service["spec"]["ports"] == [{"name": "metrics", "port": 9090, "targetPort": "metrics", "protocol": "TCP"}]


def test_every_admin_value_lands_where_it_should(helm: Path) -> None:
    values = {
        "serviceAccount": {"annotations": {"eks.amazonaws.com/role-arn": "arn:aws:iam::111122223333:role/op"}},
        "imagePullSecrets": [{"name": "regcred"}],
        "podAnnotations": {"example.com/team": "ml"},
        "podLabels": {"team": "ml"},
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "role", "operator": "In", "values": ["system"]}]}]}}},
        "priorityClassName": "system-cluster-critical",
        "podSecurityContext": {"fsGroup": 2000},
        "securityContext": {"readOnlyRootFilesystem": False},
        "extraEnv": [{"name": "HTTPS_PROXY", "value": "http://proxy:3128"},
                     {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "ops", "effect": "NoSchedule"}],
        "nodeSelector": {"role": "system"},
        "networkPolicy": {"extraEgress": [{"to": [{"ipBlock": {"cidr": "10.0.0.0/8"}}], "ports": [{"port": 443}]}]},
        "logLevel": "DEBUG",
        "logFormat": "text",
        "image": {"repository": "overridden-by-set", "tag": "1.2.3", "pullPolicy": "Always"},
        "metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "prom"}}},
    }  # fmt: skip
    path = Path(__file__).parent / ".values-admin.yaml"
    path.write_text(yaml.safe_dump(values))
    try:
        docs = template(helm, "-f", str(path))
    finally:
        path.unlink()
    account = one(docs, "ServiceAccount")
    assert account["metadata"]["annotations"] == {"eks.amazonaws.com/role-arn": "arn:aws:iam::111122223333:role/op"}
    template_ = one(docs, "Deployment")["spec"]["template"]
    pod = template_["spec"]
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    assert template_["metadata"]["annotations"] == {"example.com/team": "ml"}
    assert template_["metadata"]["labels"]["team"] == "ml"
    assert pod["affinity"] == values["affinity"]
    assert pod["priorityClassName"] == "system-cluster-critical"
    assert pod["securityContext"]["fsGroup"] == 2000 and pod["securityContext"]["runAsNonRoot"] is True
    c = container(docs)
    assert c["securityContext"]["readOnlyRootFilesystem"] is False
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    # One env list: the extra variables come after the operator's own, which they must not replace (a second
    # `env:` key would be a duplicate key, dropped by some parsers and refused by others).
    names = [e["name"] for e in c["env"]]
    assert names == [
        "FSDP_OPERATOR_NAMESPACE", "FSDP_OPERATOR_POD_LABELS", "FSDP_JOB_NETWORK_POLICY", "FSDP_RAY_TOKEN_AUTH",
        "FSDP_NODE_NOTICES", "HTTPS_PROXY", "POD_IP",
    ]  # fmt: skip
    assert c["env"][-2:] == values["extraEnv"]
    assert pod["tolerations"] == values["tolerations"] and pod["nodeSelector"] == {"role": "system"}
    assert one(docs, "NetworkPolicy")["spec"]["egress"][-1] == values["networkPolicy"]["extraEgress"][0]
    assert "--log-level=DEBUG" in c["args"] and "--log-format=text" in c["args"]
    assert (c["image"], c["imagePullPolicy"]) == ("registry.example.com/fsdp-operator:1.2.3", "Always")
    monitor = one(docs, "ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "prom"
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"
    service_labels = one(docs, "Service")["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service_labels.items()
    assert "app.kubernetes.io/version" not in monitor["spec"]["selector"]["matchLabels"]


def test_job_security_settings_reach_the_operator(helm: Path) -> None:
    """The chart's values become the environment `OperatorConfig.from_env` reads."""
    from fsdp_operator.runtime.settings import OperatorConfig

    def config(*args: str) -> OperatorConfig:
        env = {e["name"]: e for e in container(template(helm, *args))["env"]}
        assert env["FSDP_OPERATOR_NAMESPACE"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
        values = {name: e.get("value", "") for name, e in env.items()}
        return OperatorConfig.from_env({**values, "FSDP_OPERATOR_NAMESPACE": "ml"})

    default = config().security
    assert default.token_auth and default.network_policy and default.operator_namespace == "ml"
    assert default.operator_pod_labels == {
        "app.kubernetes.io/name": "fsdp-operator",
        "app.kubernetes.io/instance": "demo",
    }
    off = config("--set", "jobNetworkPolicy.enabled=false", "--set", "rayTokenAuth.enabled=false").security
    assert not off.token_auth and not off.network_policy


def test_replicas_elect_a_leader_through_kopf_peering(helm: Path) -> None:
    docs = template(helm, "--set", "replicas=3")
    deployment = one(docs, "Deployment")
    assert deployment["spec"]["replicas"] == 3 and deployment["spec"]["strategy"]["type"] == "RollingUpdate"
    assert "--peering=demo-fsdp-operator" in container(docs)["args"]
    assert one(docs, "ClusterKopfPeering")["metadata"]["name"] == "demo-fsdp-operator"
    rules = one(docs, "ClusterRole")["rules"]
    assert {
        "apiGroups": ["kopf.dev"],
        "resources": ["clusterkopfpeerings"],
        "verbs": ["list", "watch", "patch"],
    } in rules
    namespaced = template(helm, "--set", "replicas=2", "--set", "watchAllNamespaces=false")
    assert one(namespaced, "KopfPeering")["metadata"]["namespace"] == "ml"
    assert any("kopfpeerings" in r["resources"] for r in one(namespaced, "Role")["rules"])
    assert "ClusterKopfPeering" not in by_kind(template(helm))


def test_namespaced_modes(helm: Path) -> None:
    docs = template(helm, "--set", "watchAllNamespaces=false")
    assert one(docs, "Role")["metadata"]["namespace"] == "ml"
    assert "--namespace=ml" in container(docs)["args"]
    # kopf lists namespaces and CRDs at cluster scope even when namespaced, and availabilityZone: auto lists
    # nodes: a small ClusterRole for that.
    cluster_rules = one(docs, "ClusterRole")["rules"]
    assert {g for r in cluster_rules for g in r["resources"]} == {"namespaces", "customresourcedefinitions", "nodes"}
    several = template(helm, "--set", "watchAllNamespaces=false", "--set", "watchNamespaces={team-a,team-b}")
    assert sorted(r["metadata"]["namespace"] for r in by_kind(several)["Role"]) == ["team-a", "team-b"]
    assert sorted(r["metadata"]["namespace"] for r in by_kind(several)["RoleBinding"]) == ["team-a", "team-b"]
    args = container(several)["args"]
    assert "--namespace=team-a" in args and "--namespace=team-b" in args


def test_network_policy_default_is_narrow(helm: Path) -> None:
    policy = one(template(helm), "NetworkPolicy")["spec"]
    dns, api, ray = policy["egress"]
    assert dns["to"] == [{
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
        "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}},
    }]  # fmt: skip
    # Offline (`helm template`) the API server's address is unknown: its two ports, no other.
    assert api == {"ports": [{"port": 443, "protocol": "TCP"}, {"port": 6443, "protocol": "TCP"}]}
    assert ray["ports"] == [{"port": 8265, "protocol": "TCP"}]
    pinned = one(template(helm, "--set", "networkPolicy.apiServerCIDRs={10.0.0.0/16}"), "NetworkPolicy")["spec"]
    assert pinned["egress"][1]["to"] == [{"ipBlock": {"cidr": "10.0.0.0/16"}}]
    assert [p["port"] for p in policy["ingress"][0]["ports"]] == [8080, 9090]


def test_values_schema_rejects_bad_values(helm: Path) -> None:
    for setting, field in (
        ("replicas=-1", "replicas"),
        ("logFormat=xml", "logFormat"),
        ("watchNamespaces={Not_A_Namespace}", "watchNamespaces"),
        ("serviceAccount.annotation=x", "annotation"),
        ("extraEnv[0].name=A,extraEnv[0].valeu=x", "valeu"),
        ("extraEnv[0].name=A,extraEnv[0].valueFrom.secretKeyRef.name=s,extraEnv[0].value=x", "extraEnv"),
        ("tolerations[0].key=k,tolerations[0].efect=NoSchedule", "efect"),
        ("imagePullSecrets[0].nmae=regcred", "imagePullSecrets"),
        ("networkPolicy.extraEgres[0].ports[0].port=443", "extraEgres"),
        ("logFormatt=json", "logFormatt"),
    ):
        proc = helm_run(helm, "template", "demo", str(CHART), *IMAGE, "--set", setting)
        assert proc.returncode != 0 and field in proc.stderr, (setting, proc.stderr)


def test_watch_namespaces_without_the_namespaced_mode_is_refused(helm: Path) -> None:
    """A list of namespaces with watchAllNamespaces still true would silently grant (and watch) every namespace."""
    proc = helm_run(helm, "template", "demo", str(CHART), *IMAGE, "--set", "watchNamespaces={team-a}")
    assert proc.returncode != 0 and "set watchAllNamespaces=false" in proc.stderr, proc.stderr
