"""Hostile chart values, through the real `helm template` and `helm lint --strict`: each is refused with a message
naming the value, or rendered harmless (it lands, verbatim, only where it was meant to go).

A value rendered unquoted into YAML can add keys: `priorityClassName=$'x\\n      hostNetwork: true'` gave the
operator's pod the node's network. `extraEnv` and `podLabels` could override what the chart sets itself.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from support import k8s_tools

pytestmark = pytest.mark.integration

CHART = Path(__file__).resolve().parents[2] / "charts" / "fsdp-operator"
IMAGE = ("--set", "image.repository=registry.example.com/fsdp-operator")
INJECTED = "\n      hostNetwork: true\n      hostPID: true"
EGRESS_TO_ALL = "\n        - ipBlock: {cidr: 0.0.0.0/0}"

# (id, helm arguments, a word the refusal must name)
REFUSED: list[tuple[str, tuple[str, ...], str]] = [
    ("priorityClassName", ("--set-string", f"priorityClassName=x{INJECTED}"), "priorityClassName"),
    ("serviceAccount.name", ("--set-string", f"serviceAccount.name=op{INJECTED}"), "serviceAccount"),
    ("dns.namespace", ("--set-string", f"networkPolicy.dns.namespace=kube-system}}{EGRESS_TO_ALL}"), "namespace"),
    ("image.tag", ("--set-string", f"image.tag=1{INJECTED}"), "tag"),
    ("image.repository", ("--set-string", f"image.repository=r/x{INJECTED}"), "repository"),
    ("imagePullSecrets", ("--set-string", f"imagePullSecrets[0].name=s{INJECTED}"), "imagePullSecrets"),
    ("nodeSelector", ("--set-string", f"nodeSelector.role=x{INJECTED}"), "nodeSelector"),
    ("podLabels-value", ("--set-string", f"podLabels.team=x{INJECTED}"), "podLabels"),
    ("podLabels-key", ("--set-string", "podLabels.bad key=x"), "'bad key' does not match pattern"),
    ("serviceMonitor.interval", ("--set-string", f"metrics.serviceMonitor.interval=30s{INJECTED}"), "interval"),
    ("watchNamespaces", ("--set", "watchAllNamespaces=false", "--set-string", f"watchNamespaces[0]=a{INJECTED}"),
     "watchNamespaces"),
    ("logLevel", ("--set-string", f"logLevel=INFO{INJECTED}"), "logLevel"),
    ("extraEnv-token-auth", ("--set", "extraEnv[0].name=FSDP_RAY_TOKEN_AUTH", "--set-string",
                             "extraEnv[0].value=false"), "extraEnv sets FSDP_RAY_TOKEN_AUTH"),
    ("extraEnv-namespace", ("--set", "extraEnv[0].name=FSDP_OPERATOR_NAMESPACE", "--set-string", "extraEnv[0].value="),
     "extraEnv sets FSDP_OPERATOR_NAMESPACE"),
    ("extraEnv-pod-labels", ("--set", "extraEnv[0].name=FSDP_OPERATOR_POD_LABELS", "--set", "extraEnv[0].value=a=b"),
     "extraEnv sets FSDP_OPERATOR_POD_LABELS"),
    ("extraEnv-network-policy", ("--set", "extraEnv[0].name=FSDP_JOB_NETWORK_POLICY", "--set-string",
                                 "extraEnv[0].value=false"), "extraEnv sets FSDP_JOB_NETWORK_POLICY"),
    ("extraEnv-twice", ("--set-string", "extraEnv[0].name=A,extraEnv[0].value=1",
                        "--set-string", "extraEnv[1].name=A,extraEnv[1].value=2"), "extraEnv sets A twice"),
    ("extraEnv-name", ("--set-string", "extraEnv[0].name=1 BAD=NAME,extraEnv[0].value=x"), "extraEnv"),
    ("podLabels-selector-name", ("--set-string", "podLabels.app\\.kubernetes\\.io/name=other"),
     "podLabels sets app.kubernetes.io/name"),
    ("podLabels-selector-instance", ("--set-string", "podLabels.app\\.kubernetes\\.io/instance=other"),
     "podLabels sets app.kubernetes.io/instance"),
    ("serviceMonitor-labels", ("--set", "metrics.serviceMonitor.enabled=true", "--set-string",
                               "metrics.serviceMonitor.labels.app\\.kubernetes\\.io/name=x"), "serviceMonitor.labels"),
    ("replicas-1e9", ("--set-json", "replicas=1e9"), "replicas"),
    ("negative-cpu", ("--set", "resources.requests.cpu=-1"), "cpu"),
    ("negative-memory", ("--set-string", "resources.limits.memory=-512Mi"), "memory"),
    ("request-above-limit", ("--set-string", "resources.requests.memory=1Gi"), "resources.requests.memory"),
    ("request-above-limit-cpu", ("--set-string", "resources.requests.cpu=1500m"), "resources.requests.cpu"),
    ("cidr", ("--set-string", "networkPolicy.apiServerCIDRs[0]=999.999.999.999/99"), "apiServerCIDRs"),
    ("cidr-injection", ("--set-string", f"networkPolicy.apiServerCIDRs[0]=10.0.0.0/8}}{EGRESS_TO_ALL}"),
     "apiServerCIDRs"),
    ("metrics-port-is-liveness-port", ("--set", "metrics.port=8080"), "metrics.port and livenessPort"),
]  # fmt: skip

# Values that toYaml writes as data: they land verbatim where they were meant to, and add nothing.
HARMLESS: list[tuple[str, tuple[str, ...], list[str], str]] = [
    ("podAnnotations", ("--set-string", f"podAnnotations.a=x{INJECTED}"),
     ["spec", "template", "metadata", "annotations", "a"], f"x{INJECTED}"),
    ("extraEnv-value", ("--set", "extraEnv[0].name=PROXY", "--set-string", f"extraEnv[0].value=x{INJECTED}"),
     ["spec", "template", "spec", "containers", 0, "env", -1, "value"], f"x{INJECTED}"),
    ("tolerations", ("--set", "tolerations[0].key=k,tolerations[0].operator=Equal", "--set-string",
                     f"tolerations[0].value=v{INJECTED}"), ["spec", "template", "spec", "tolerations", 0, "value"],
     f"v{INJECTED}"),
    ("serviceAccount.annotations", ("--set-string", f"serviceAccount.annotations.a=x{INJECTED}"), [], ""),
]  # fmt: skip


@pytest.fixture(scope="module")
def helm() -> Path:
    return k8s_tools.needed("helm")


def run(helm: Path, command: str, *args: str) -> subprocess.CompletedProcess[str]:
    target = ("template", "demo") if command == "template" else ("lint", "--strict")
    return subprocess.run(
        [str(helm), *target, str(CHART), "--namespace", "ml", *IMAGE, *args],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip


def documents(proc: subprocess.CompletedProcess[str]) -> list[dict[str, Any]]:
    assert proc.returncode == 0, proc.stderr
    return [doc for doc in yaml.safe_load_all(proc.stdout) if doc]


def pod_specs(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [d["spec"]["template"]["spec"] for d in docs if d["kind"] == "Deployment"]


@pytest.mark.parametrize(("args", "named"), [(a, n) for _, a, n in REFUSED], ids=[i for i, _, _ in REFUSED])
def test_hostile_values_are_refused_by_template_and_lint(helm: Path, args: tuple[str, ...], named: str) -> None:
    """`helm template` (and so `install`/`upgrade`) refuses each, naming the value. `helm lint` refuses what the
    values schema refuses; the rest (the chart's `fail`: values compared with each other or with what the chart
    owns) it prints, since lint renders in lint mode, where `fail` is a message, not an error."""
    template = run(helm, "template", *args)
    assert template.returncode != 0, f"helm template accepted {args}:\n{template.stdout[-2000:]}"
    assert named in template.stderr, template.stderr[-2000:]
    lint = run(helm, "lint", *args)
    output = lint.stdout + lint.stderr
    assert lint.returncode != 0 or ('msg="funcMap fail"' in output and named in output), output[-2000:]
    for proc in (template, lint):
        assert "goroutine" not in proc.stderr and "panic" not in proc.stderr


@pytest.mark.parametrize(
    ("args", "path", "value"), [(a, p, v) for _, a, p, v in HARMLESS], ids=[i for i, _, _, _ in HARMLESS]
)
def test_values_written_as_data_add_nothing(helm: Path, args: tuple[str, ...], path: list[Any], value: str) -> None:
    assert run(helm, "lint", *args).returncode == 0
    docs = documents(run(helm, "template", *args))
    plain = documents(run(helm, "template"))
    # The same objects with the same keys as without the value; the pod gains no host namespaces.
    assert [(d["kind"], sorted(d)) for d in docs] == [(d["kind"], sorted(d)) for d in plain]
    (pod,) = pod_specs(docs)
    assert not {"hostNetwork", "hostPID", "hostIPC"} & set(pod)
    assert sorted(pod) == sorted({*pod_specs(plain)[0], *(["tolerations"] if "tolerations" in path else [])})
    if path:
        (found,) = [d for d in docs if d["kind"] == "Deployment"]
        node: Any = found
        for key in path:
            node = node[key]
        assert node == value


def test_sane_values_still_render(helm: Path) -> None:
    """The refusals are not too wide: IPv6 CIDRs, numeric quantities, requests equal to limits, env names with
    dots and dashes, other labels, a different metrics port."""
    args = (
        "--set", "networkPolicy.apiServerCIDRs={10.0.0.0/16,fd00::/8}",
        "--set", "resources.requests.cpu=1", "--set", "resources.limits.cpu=2",
        "--set-string", "resources.requests.memory=512Mi",
        "--set", "extraEnv[0].name=my.proxy-url,extraEnv[0].value=x",
        "--set-string", "podLabels.team=ml", "--set", "metrics.port=9100", "--set", "replicas=3",
        "--set-string", "priorityClassName=system-cluster-critical", "--set-string", "serviceAccount.name=op",
        "--set", "metrics.serviceMonitor.enabled=true", "--set-string", "metrics.serviceMonitor.labels.release=prom",
    )  # fmt: skip
    assert run(helm, "lint", *args).returncode == 0
    docs = documents(run(helm, "template", *args))
    (pod,) = pod_specs(docs)
    assert pod["priorityClassName"] == "system-cluster-critical" and pod["serviceAccountName"] == "op"
    (policy,) = [d for d in docs if d["kind"] == "NetworkPolicy"]
    assert policy["spec"]["egress"][1]["to"] == [
        {"ipBlock": {"cidr": "10.0.0.0/16"}},
        {"ipBlock": {"cidr": "fd00::/8"}},
    ]
    assert pod["containers"][0]["resources"]["requests"] == {"cpu": 1, "memory": "512Mi"}
