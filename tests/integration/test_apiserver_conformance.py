"""The emulated API server refuses, over real HTTP, what a real kube-apiserver refuses, with the real message's
shape: CRDs that are not structural, custom objects against their schema (after defaulting), and Pods the
operator or KubeRay might create. docs/conformance.md lists the rules and their documentation sections."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
from typing import Any

import pytest
import requests
from fsdp_operator.api import generate, schema
from fsdp_operator.local.cluster.kuberay import RAYCLUSTER_CRD
from fsdp_operator.local.server import ThreadedApiServer
from fsdp_operator.runtime.rayjobs import FakeRay
from support.crds import GROUP, KIND, PLURAL, VERSION, widget_crd
from support.fake_kuberay import FakeKubeRay

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
PODS = "/api/v1/namespaces/default/pods"
WIDGETS = f"/apis/{GROUP}/{VERSION}/namespaces/default/{PLURAL}"


def post(api: ThreadedApiServer, path: str, body: Any) -> tuple[int, Any]:
    response = requests.post(
        api.url + path, data=json.dumps(body), headers={"Content-Type": "application/json"}, timeout=10
    )
    return response.status_code, response.json()


@pytest.fixture
def api() -> Any:
    with ThreadedApiServer() as server:
        yield server


def test_the_crd_as_it_was_is_refused_with_the_real_servers_message(api: ThreadedApiServer) -> None:
    crd = generate.crd()
    overrides = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["model"][
        "properties"
    ]["overrides"]
    # The node as fields.py generated it before: an open map, bounds inside the typed anyOf.
    overrides.pop("properties", None)
    overrides["additionalProperties"] = {
        "anyOf": [{"type": "integer", "minimum": -2147483648, "maximum": 2147483647}, {"type": "string"}],
        "x-kubernetes-int-or-string": True,
    }
    code, status = post(api, CRDS, crd)
    node = (
        "spec.validation.openAPIV3Schema.properties[spec].properties[model].properties[overrides].additionalProperties"
    )
    assert code == 422, status
    assert status["reason"] == "Invalid"
    assert status["message"] == (
        f'CustomResourceDefinition.apiextensions.k8s.io "{schema.PLURAL}.{schema.GROUP}" is invalid: '
        f"[{node}.anyOf[0].type: Forbidden: must be empty to be structural, "
        f"{node}.anyOf[1].type: Forbidden: must be empty to be structural]"
    )
    assert [c["field"] for c in status["details"]["causes"]] == [f"{node}.anyOf[0].type", f"{node}.anyOf[1].type"]
    assert {c["reason"] for c in status["details"]["causes"]} == {"FieldValueForbidden"}
    # Nothing was registered: the kind is not served.
    assert requests.get(f"{api.url}/apis/{schema.GROUP}/{schema.VERSION}", timeout=10).status_code == 404


def test_the_crds_a_real_server_accepts_are_accepted(api: ThreadedApiServer) -> None:
    for crd in (generate.crd(), RAYCLUSTER_CRD, widget_crd()):
        code, status = post(api, CRDS, crd)
        assert code == 201, status.get("message")


def test_a_crd_update_is_held_to_the_same_rules(api: ThreadedApiServer) -> None:
    code, created = post(api, CRDS, widget_crd())
    assert code == 201
    changed = copy.deepcopy(created)
    spec_schema = changed["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    spec_schema["properties"]["replicas"] = {"minimum": 0}
    response = requests.put(f"{api.url}{CRDS}/{PLURAL}.{GROUP}", data=json.dumps(changed), timeout=10)
    assert response.status_code == 422
    assert response.json()["message"].endswith(
        "spec.validation.openAPIV3Schema.properties[spec].properties[replicas].type: Required value: must not be "
        "empty for specified object fields"
    )


def _defaulting_crd() -> dict[str, Any]:
    crd = widget_crd()
    spec_schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    spec_schema["properties"].update(
        {
            "size": {"type": "string", "enum": ["small", "large"], "default": "small"},
            "limits": {
                "type": "object",
                "properties": {"cpu": {"type": "string", "default": "1"}, "note": {"type": "string", "nullable": True}},
            },
            "withDefaultParent": {
                "type": "object",
                "default": {},
                "properties": {"level": {"type": "integer", "default": 3}},
            },
        }
    )
    return crd


def test_custom_objects_get_their_schema_defaults_as_a_real_server_applies_them(api: ThreadedApiServer) -> None:
    assert post(api, CRDS, _defaulting_crd())[0] == 201
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND, "metadata": {"name": "a"}, "spec": {"replicas": 1}}
    code, created = post(api, WIDGETS, body)
    assert code == 201, created
    # Absent fields get their default; a nested default only under a parent that exists or is itself defaulted.
    assert created["spec"] == {"replicas": 1, "size": "small", "withDefaultParent": {"level": 3}}
    body = copy.deepcopy(body)
    body["metadata"]["name"] = "b"
    body["spec"] = {"replicas": 1, "size": None, "limits": {"note": None}}
    code, created = post(api, WIDGETS, body)
    assert code == 201, created
    # null in a non-nullable field is defaulted; a nullable null stays.
    assert created["spec"]["size"] == "small"
    assert created["spec"]["limits"] == {"cpu": "1", "note": None}


def _pod(**container: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "labels": {"ray.io/cluster": "c"}},
        "spec": {"containers": [{"name": "ray", "image": "ray:2", **container}]},
    }


def _env(source: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"name": "X", "valueFrom": source}]


E = "spec.containers[0].env[0].valueFrom"
REFUSED_PODS: list[tuple[str, dict[str, Any], str]] = [
    (
        "fieldPath metadata.labels without a key",
        _pod(env=_env({"fieldRef": {"fieldPath": "metadata.labels"}})),
        f'{E}.fieldRef.fieldPath: Unsupported value: "metadata.labels": supported values: "metadata.name", '
        '"metadata.namespace", "metadata.uid", "spec.nodeName", "spec.serviceAccountName", "status.hostIP", '
        '"status.hostIPs", "status.podIP", "status.podIPs"',
    ),
    (
        "fieldPath spec.containers",
        _pod(env=_env({"fieldRef": {"fieldPath": "spec.containers"}})),
        f'{E}.fieldRef.fieldPath: Invalid value: "spec.containers": error converting fieldPath: field label not '
        "supported: spec.containers",
    ),
    (
        "fieldRef apiVersion v9",
        _pod(env=_env({"fieldRef": {"apiVersion": "v9", "fieldPath": "metadata.name"}})),
        f'{E}.fieldRef.fieldPath: Invalid value: "metadata.name": error converting fieldPath: unsupported pod '
        "version: v9",
    ),
    (
        "a subscript on a field that has none",
        _pod(env=_env({"fieldRef": {"fieldPath": "metadata.name['x']"}})),
        f"{E}.fieldRef.fieldPath: Invalid value: \"metadata.name['x']\": error converting fieldPath: field label "
        "does not support subscript",
    ),
    (
        "resourceFieldRef on an extended resource",
        _pod(env=_env({"resourceFieldRef": {"resource": "limits.nvidia.com/gpu"}})),
        f'{E}.resourceFieldRef.resource: Unsupported value: "limits.nvidia.com/gpu": supported values: '
        '"limits.cpu", "limits.ephemeral-storage", "limits.memory", "requests.cpu", "requests.ephemeral-storage", '
        '"requests.memory"',
    ),
    (
        "divisor 3 on limits.cpu",
        _pod(env=_env({"resourceFieldRef": {"resource": "limits.cpu", "divisor": "3"}})),
        f'{E}.resourceFieldRef.divisor: Invalid value: "limits.cpu": only divisor\'s values 1m and 1 are supported '
        "with the cpu resource",
    ),
    (
        "divisor 1024 on limits.memory (1Ki is the allowed spelling)",
        _pod(env=_env({"resourceFieldRef": {"resource": "limits.memory", "divisor": "1024"}})),
        f'{E}.resourceFieldRef.divisor: Invalid value: "limits.memory": only divisor\'s values 1, 1k, 1M, 1G, 1T, '
        "1P, 1E, 1Ki, 1Mi, 1Gi, 1Ti, 1Pi, 1Ei are supported with the memory resource",
    ),
    (
        "two sources",
        _pod(env=_env({"fieldRef": {"fieldPath": "metadata.name"}, "secretKeyRef": {"name": "s", "key": "k"}})),
        f'{E}: Invalid value: "": may not have more than one field specified at a time',
    ),
    (
        "an env name with '='",
        _pod(env=[{"name": "A=B", "value": "1"}]),
        'spec.containers[0].env[0].name: Invalid value: "A=B": a valid environment variable name must consist only '
        "of printable ASCII characters other than '='",
    ),
    (
        "a quantity that is not one",
        _pod(resources={"limits": {"memory": "1 GB"}}),
        'spec.containers[0].resources.limits[memory]: Invalid value: "1 GB": quantities must match the regular '
        "expression",
    ),
    (
        "requests above limits",
        _pod(resources={"requests": {"cpu": "2"}, "limits": {"cpu": "1000m"}}),
        'spec.containers[0].resources.requests: Invalid value: "2": must be less than or equal to cpu limit of 1',
    ),
    (
        "an extended resource requested without its limit",
        _pod(resources={"requests": {"nvidia.com/gpu": "1"}}),
        "spec.containers[0].resources.limits: Required value: Limit must be set for non overcommitable resources",
    ),
    (
        "a fractional GPU",
        _pod(resources={"limits": {"nvidia.com/gpu": "500m"}}),
        'spec.containers[0].resources.limits[nvidia.com/gpu]: Invalid value: "500m": must be an integer',
    ),
    (
        "a label value too long",
        {**_pod(), "metadata": {"name": "p", "labels": {"a": "x" * 64}}},
        f'metadata.labels: Invalid value: "{"x" * 64}": must be no more than 63 characters',
    ),
    (
        "a container name that is not a DNS label",
        {**_pod(), "spec": {"containers": [{"name": "Ray_Head", "image": "ray:2"}]}},
        'spec.containers[0].name: Invalid value: "Ray_Head": a lowercase RFC 1123 label must consist of',
    ),
    (
        "a volume mount of no volume",
        _pod(volumeMounts=[{"name": "dshm", "mountPath": "/dev/shm"}]),
        'spec.containers[0].volumeMounts[0].name: Not found: "dshm"',
    ),
    (
        "no image",
        {**_pod(), "spec": {"containers": [{"name": "ray", "image": ""}]}},
        "spec.containers[0].image: Required value",
    ),
]


@pytest.mark.parametrize(("pod", "message"), [c[1:] for c in REFUSED_PODS], ids=[c[0] for c in REFUSED_PODS])
def test_a_pod_a_real_server_refuses_is_refused(api: ThreadedApiServer, pod: dict[str, Any], message: str) -> None:
    code, status = post(api, PODS, pod)
    assert code == 422, status
    assert status["message"].startswith('Pod "p" is invalid: '), status["message"]
    assert message in status["message"], status["message"]
    assert not api.store.find("pods")


def test_the_pods_the_operator_renders_are_accepted(api: ThreadedApiServer) -> None:
    pod = _pod(
        env=[
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {
                "name": "ZONE",
                "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['topology.kubernetes.io/zone']"}},
            },
            {"name": "MEM_MI", "valueFrom": {"resourceFieldRef": {"resource": "limits.memory", "divisor": "1Mi"}}},
            {"name": "CPU", "valueFrom": {"resourceFieldRef": {"resource": "requests.cpu", "divisor": "1000m"}}},
            {"name": "my.env-name", "value": "relaxed names are allowed since v1.34"},
        ],
        resources={
            "requests": {"cpu": "40", "memory": "160Gi", "nvidia.com/gpu": "4"},
            "limits": {"cpu": "40", "memory": "160Gi", "nvidia.com/gpu": "4"},
        },
        volumeMounts=[{"name": "dshm", "mountPath": "/dev/shm"}],
    )
    pod["spec"]["volumes"] = [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "8Gi"}}]
    code, status = post(api, PODS, pod)
    assert code == 201, status.get("message")


def test_a_raycluster_whose_pods_are_refused_is_accepted_and_kuberay_reports_the_refusal(
    api: ThreadedApiServer,
) -> None:
    """As on a real cluster: the RayCluster is stored, KubeRay's pod create gets the 422, and KubeRay says so in
    a Warning event on the RayCluster; no worker pod exists, so the job waits for workers that never come."""
    assert post(api, CRDS, RAYCLUSTER_CRD)[0] == 201
    container = {
        "name": "ray-worker",
        "image": "ray:2",
        "env": [{"name": "RANK_HINT", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels"}}}],
    }
    rc = {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": {"name": "rc", "namespace": "default"},
        "spec": {
            "headGroupSpec": {"template": {"spec": {"containers": [{"name": "ray-head", "image": "ray:2"}]}}},
            "workerGroupSpecs": [
                {"groupName": "gpu", "replicas": 1, "template": {"spec": {"containers": [container]}}}
            ],
        },
    }
    code, created = post(api, "/apis/ray.io/v1/namespaces/default/rayclusters", rc)
    assert code == 201, created

    async def one_sync() -> None:
        kuberay = FakeKubeRay(api.url, FakeRay())
        async with kuberay.running(tick=3600):
            for _ in range(200):
                if any(e["reason"] == "FailedToCreateWorkerPod" for e in api.store.find("events")):
                    return
                await asyncio.sleep(0.05)

    asyncio.run(one_sync())
    (event,) = [e for e in api.store.find("events") if e["reason"] == "FailedToCreateWorkerPod"]
    assert event["type"] == "Warning"
    assert event["involvedObject"]["kind"] == "RayCluster"
    assert event["message"].startswith("Failed to create worker Pod default/rc-gpu-worker-00000, Pod ")
    assert 'Unsupported value: "metadata.labels"' in event["message"]
    assert [p["metadata"]["name"] for p in api.store.find("pods")] == ["rc-head"]


@pytest.mark.parametrize(
    "spec",
    [
        {"containers": "x"},
        {"containers": [{"name": "c", "image": "i", "env": ["x"]}]},
        {"containers": [{"name": "c", "image": "i", "env": [{"name": "a", "valueFrom": {"fieldRef": "x"}}]}]},
        {"containers": [{"name": "c", "image": "i", "resources": {"limits": [1]}}]},
        {"containers": [{"name": "c", "image": "i", "resources": {"limits": {"cpu": None}}}]},
        {"containers": [{"name": "c", "image": "i", "ports": [{"containerPort": 80, "name": 5}]}]},
        {
            "containers": [
                {
                    "name": "c",
                    "image": "i",
                    "env": [
                        {
                            "name": "a",
                            "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu", "divisor": "1e999999"}},
                        }
                    ],
                }
            ]
        },
    ],
)
def test_a_pod_of_the_wrong_shape_is_an_error_answer_never_a_crash(api: ThreadedApiServer, spec: Any) -> None:
    code, status = post(api, PODS, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": spec})
    assert code in (400, 422), status
    assert status["kind"] == "Status"


def test_the_local_kuberay_reports_a_refused_pod_and_starts_no_ray_process(
    api: ThreadedApiServer, tmp_path: Any
) -> None:
    """`fsdpctl run-local`'s KubeRay stand-in: the API server's answer for the pod is asked before any Ray
    process starts; a refusal is the Warning event KubeRay writes, and nothing runs."""
    from fsdp_operator.local.cluster.kuberay import LocalKubeRay

    assert post(api, CRDS, RAYCLUSTER_CRD)[0] == 201
    divisor = {"resourceFieldRef": {"resource": "limits.cpu", "divisor": "3"}}
    container = {"name": "ray-head", "image": "ray:2", "env": [{"name": "CPUS", "valueFrom": divisor}]}
    rc = {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": {"name": "rc", "namespace": "default"},
        "spec": {
            "headGroupSpec": {"template": {"spec": {"containers": [container]}}},
            "workerGroupSpecs": [
                {"groupName": "gpu", "replicas": 1, "template": {"spec": {"containers": [container]}}}
            ],
        },
    }
    assert post(api, "/apis/ray.io/v1/namespaces/default/rayclusters", rc)[0] == 201

    async def until_refused() -> LocalKubeRay:
        kuberay = LocalKubeRay(api.url, tmp_path)
        task = asyncio.create_task(kuberay.run())
        try:
            for _ in range(400):
                if any(e["reason"] == "FailedToCreateHeadPod" for e in api.store.find("events")):
                    break
                await asyncio.sleep(0.05)
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await kuberay.close()
        return kuberay

    kuberay = asyncio.run(until_refused())
    (event,) = [e for e in api.store.find("events") if e["reason"] == "FailedToCreateHeadPod"]
    assert event["message"].startswith("Failed to create head Pod default/rc-head-")
    assert "only divisor's values 1m and 1 are supported with the cpu resource" in event["message"]
    assert kuberay.started == [] and api.store.find("pods") == []


def test_a_fractional_byte_quantity_is_accepted_with_the_real_servers_warning(api: ThreadedApiServer) -> None:
    pod = _pod(resources={"requests": {"memory": "160m"}, "limits": {"memory": "1Gi"}})
    response = requests.post(
        api.url + PODS, data=json.dumps(pod), headers={"Content-Type": "application/json"}, timeout=10
    )
    assert response.status_code == 201, response.text
    assert response.headers.get("Warning") == (
        '299 - "spec.containers[0].resources.requests[memory]: fractional byte value "160m" is invalid, '
        'must be an integer"'
    )


@pytest.mark.parametrize(
    "spec_schema",
    [
        {"type": "object", "properties": []},
        {"type": "object", "properties": {"a": "x"}},
        {"type": "object", "anyOf": "x"},
        {"type": "array", "items": 5},
        {"type": ["object", "null"]},
        {"type": "object", "required": "a"},
    ],
)
def test_a_crd_schema_of_the_wrong_shape_is_a_decoding_error(api: ThreadedApiServer, spec_schema: Any) -> None:
    crd = widget_crd()
    crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"] = spec_schema
    code, status = post(api, CRDS, crd)
    assert code == 400, status
    assert status["message"].startswith(
        'CustomResourceDefinition in version "v1" cannot be handled as a CustomResourceDefinition'
    )
    assert "spec.versions[0].schema.openAPIV3Schema.properties[spec]" in status["message"]


def test_an_update_is_refused_only_for_the_fields_it_changes(api: ThreadedApiServer) -> None:
    """Validation ratcheting (CRDValidationRatcheting, GA in 1.33): an object stored before its CRD's schema was
    tightened keeps taking status writes and metadata changes; a change to the invalid field is held to the new
    schema, and a new object is refused."""
    assert post(api, CRDS, widget_crd())[0] == 201
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND, "metadata": {"name": "a"}, "spec": {"replicas": 5}}
    assert post(api, WIDGETS, body)[0] == 201
    crd = requests.get(f"{api.url}{CRDS}/{PLURAL}.{GROUP}", timeout=10).json()
    spec_schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    spec_schema["properties"]["replicas"]["maximum"] = 3
    response = requests.put(f"{api.url}{CRDS}/{PLURAL}.{GROUP}", json=crd, timeout=10)
    assert response.status_code == 200, response.text

    def patch(path: str, change: dict[str, Any]) -> requests.Response:
        headers = {"Content-Type": "application/merge-patch+json"}
        return requests.patch(f"{api.url}{WIDGETS}/{path}", data=json.dumps(change), headers=headers, timeout=10)

    assert patch("a/status", {"status": {"phase": "Running"}}).status_code == 200
    assert patch("a", {"metadata": {"labels": {"team": "a"}}}).status_code == 200
    refused = patch("a", {"spec": {"replicas": 4}})
    assert refused.status_code == 422 and refused.json()["details"]["causes"][0]["field"] == "spec.replicas"
    assert patch("a", {"spec": {"replicas": 2}}).status_code == 200
    code, status = post(api, WIDGETS, {**body, "metadata": {"name": "b"}})
    assert code == 422 and "spec.replicas" in status["message"], status
