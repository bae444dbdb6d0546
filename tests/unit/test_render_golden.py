"""The RayCluster each example renders to, compared whole with a reviewed copy in tests/data/golden/.

Every key and value of the manifest matters to KubeRay or the kubelet (a misspelt `nodeSelector` or a
dropped EFA toleration is silently ignored by the API server), so the whole manifest is written down.
After an intended change to `render.py`, regenerate and review the diff:

    FSDP_UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/unit/test_render_golden.py
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml
from fsdp_operator.api import render
from fsdp_operator.api.spec import parse_job
from support.running_job import UID

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "data" / "golden"
EXAMPLES = sorted(p.name for p in (ROOT / "examples").glob("*.yaml"))


def rendered(example: str, **spec: object) -> dict[str, object]:
    manifest = yaml.safe_load((ROOT / "examples" / example).read_text())
    manifest["metadata"].update(uid=UID, namespace="ml", generation=1)
    manifest["spec"].update(spec)
    return render.raycluster(parse_job(manifest))


def check(name: str, manifest: dict[str, object]) -> None:
    path = GOLDEN / name
    text = yaml.safe_dump(manifest, sort_keys=True)
    if os.environ.get("FSDP_UPDATE_GOLDEN"):
        path.write_text(text)
    assert path.exists(), f"{path} is missing: run with FSDP_UPDATE_GOLDEN=1 and review it"
    assert yaml.safe_load(path.read_text()) == manifest, (
        f"{name}: the rendered RayCluster differs from the reviewed copy; if intended, regenerate it "
        "(FSDP_UPDATE_GOLDEN=1) and review the diff"
    )


@pytest.mark.parametrize("example", EXAMPLES)
def test_each_example_renders_its_reviewed_raycluster(example: str) -> None:
    check(f"raycluster-{example}", rendered(example))


def test_head_and_worker_placement_and_tolerations_reach_the_pods() -> None:
    manifest = rendered(
        "qwen2.5-1.5b-efa.yaml",
        head={"nodeSelector": {"pool": "cpu"}, "tolerations": [{"key": "head", "operator": "Exists"}]},
        workers={"nodeSelector": {"pool": "gpu"}, "tolerations": [{"key": "team", "operator": "Exists"}]},
    )
    check("raycluster-placement.yaml", manifest)


# --- the objects that close a job's Ray ports, written out ---------------------------------------------------

OWNER = {"apiVersion": "fsdp.dev/v1alpha1", "kind": "FSDPTrainingJob", "name": "tiny-cpu", "uid": UID,
         "controller": True, "blockOwnerDeletion": True}  # fmt: skip
LABELS = {"app.kubernetes.io/managed-by": "fsdp-operator", "app.kubernetes.io/name": "fsdp-training",
          "fsdp.dev/job": "tiny-cpu"}  # fmt: skip


def tiny_job() -> object:
    manifest = yaml.safe_load((ROOT / "examples" / "tiny-cpu.yaml").read_text())
    manifest["metadata"].update(uid=UID, namespace="ml", generation=1)
    return parse_job(manifest)


def test_the_auth_secret_is_owned_labelled_and_carries_no_token() -> None:
    assert render.auth_secret(tiny_job()) == {  # type: ignore[arg-type]
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "tiny-cpu-ray-auth", "namespace": "ml", "labels": LABELS, "ownerReferences": [OWNER]},
        "type": "Opaque",
    }


@pytest.mark.parametrize(
    ("security", "operator_peer"),
    [
        (
            render.Security(operator_namespace="fsdp-system", operator_pod_labels={"app": "op", "tier": "ctl"}),
            {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "fsdp-system"}},
             "podSelector": {"matchLabels": {"app": "op", "tier": "ctl"}}},
        ),
        (
            render.Security(),  # namespace unknown: the operator's pods by their labels, in any namespace
            {"namespaceSelector": {}, "podSelector": {"matchLabels": {"app.kubernetes.io/name": "fsdp-operator"}}},
        ),
    ],
)  # fmt: skip
def test_the_network_policy_admits_only_the_jobs_pods_and_the_operator_on_rays_ports(
    security: render.Security, operator_peer: dict[str, object]
) -> None:
    assert render.network_policy(tiny_job(), security) == {  # type: ignore[arg-type]
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": "tiny-cpu-ray-ports", "namespace": "ml", "labels": LABELS, "ownerReferences": [OWNER]},
        "spec": {
            "podSelector": {"matchLabels": {"ray.io/cluster": "tiny-cpu-ray"}},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [
                {"from": [{"podSelector": {"matchLabels": {"ray.io/cluster": "tiny-cpu-ray"}}}]},
                {
                    "from": [operator_peer],
                    "ports": [{"protocol": "TCP", "port": 6379}, {"protocol": "TCP", "port": 8265},
                              {"protocol": "TCP", "port": 10001}],
                },
            ],
            "egress": EGRESS,
        },
    }  # fmt: skip


# DNS, the job's own pods, HTTPS anywhere but link-local (IMDS, Pod Identity's agent): nothing else.
EGRESS = [
    {"ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]},
    {"to": [{"podSelector": {"matchLabels": {"ray.io/cluster": "tiny-cpu-ray"}}}]},
    {
        "to": [{"ipBlock": {"cidr": "0.0.0.0/0", "except": ["169.254.0.0/16"]}},
               {"ipBlock": {"cidr": "::/0", "except": ["fe80::/10", "fd00:ec2::254/128", "fd00:ec2::23/128"]}}],
        "ports": [{"protocol": "TCP", "port": 443}],
    },
]  # fmt: skip
IMDS = {"to": [{"ipBlock": {"cidr": "169.254.169.254/32"}}, {"ipBlock": {"cidr": "fd00:ec2::254/128"}}],
        "ports": [{"protocol": "TCP", "port": 80}]}  # fmt: skip
POD_IDENTITY = {"to": [{"ipBlock": {"cidr": "169.254.170.23/32"}}, {"ipBlock": {"cidr": "fd00:ec2::23/128"}}],
                "ports": [{"protocol": "TCP", "port": 80}]}  # fmt: skip


@pytest.mark.parametrize(
    ("spec", "extra"),
    [
        ({}, []),
        ({"network": {"transport": "socket", "allowInstanceMetadata": True}}, [IMDS]),
        ({"serviceAccountName": "trainer"}, [POD_IDENTITY]),
        ({"serviceAccountName": "trainer", "network": {"transport": "socket", "allowInstanceMetadata": True}},
         [IMDS, POD_IDENTITY]),
    ],
)  # fmt: skip
def test_egress_reaches_instance_metadata_only_when_the_job_opts_in(
    spec: dict[str, object], extra: list[object]
) -> None:
    manifest = yaml.safe_load((ROOT / "examples" / "tiny-cpu.yaml").read_text())
    manifest["metadata"].update(uid=UID, namespace="ml", generation=1)
    manifest["spec"].update(spec)
    policy = render.network_policy(parse_job(manifest), render.Security())
    assert policy["spec"]["egress"] == EGRESS + extra


@pytest.mark.parametrize(
    ("job_name", "cluster", "secret"),
    [
        ("tiny-cpu", "tiny-cpu-ray", "tiny-cpu-ray-auth"),
        # Longer than 38 - len("-ray"): cut, with sha256(name)[:8] (from sha256sum) so long names stay apart.
        ("a-very-long-training-job-name-for-qwen-2", "a-very-long-training-job-name-03589f41", None),
        ("a-very-long-training-job-name-for-qwen-3", "a-very-long-training-job-name-3afa6aba", None),
        # A DNS-1035 label starts with a letter: a leading digit gets one.
        ("7b-run", "j7b-run-8df8174f", None),
    ],
)
def test_cluster_names_are_fixed_dns_labels(job_name: str, cluster: str, secret: str | None) -> None:
    assert render.raycluster_name(job_name) == cluster
    assert len(cluster) <= 38 and cluster[0].isalpha() and not cluster.endswith("-")
    if secret:
        assert render.auth_secret_name(job_name) == secret
