"""CRDs for tests: a small test CRD (group `example.fsdp.dev`, kind Widget) with a status subresource,
printer columns, a short name and a schema, for tests of the emulated API server, kopf and kubectl;
and KubeRay's RayCluster schema from ../shared, where rendered RayClusters are checked against it."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import yaml

GROUP = "example.fsdp.dev"
VERSION = "v1"
PLURAL = "widgets"
KIND = "Widget"
API_VERSION = f"{GROUP}/{VERSION}"


def namespaced_crd(
    group: str, version: str, names: dict[str, Any], columns: list[dict[str, str]], schema: dict[str, Any]
) -> dict[str, Any]:
    """A namespaced CRD of one version, served and stored, with a status subresource and printer columns."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{names['plural']}.{group}"},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": names,
            "versions": [
                {
                    "name": version,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": columns,
                    "schema": {"openAPIV3Schema": schema},
                }
            ],
        },
    }


def widget_crd() -> dict[str, Any]:
    names = {
        "plural": PLURAL,
        "singular": "widget",
        "kind": KIND,
        "listKind": f"{KIND}List",
        "shortNames": ["wd"],
        "categories": ["fsdp"],
    }
    columns = [
        {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
        {"name": "Replicas", "type": "integer", "jsonPath": ".spec.replicas"},
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    ]
    spec = {
        "type": "object",
        "properties": {
            "replicas": {"type": "integer", "minimum": 0},
            "size": {"type": "string", "enum": ["small", "large"]},
            "extra": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
        },
    }
    status = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    return namespaced_crd(
        GROUP, VERSION, names, columns, {"type": "object", "properties": {"spec": spec, "status": status}}
    )


def widget(name: str, replicas: int = 1, namespace: str = "default", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"replicas": replicas, **spec},
    }


# --- KubeRay's own CRDs (in ../shared, outside the project) -------------------------------------------

KUBERAY_CRDS = Path(__file__).resolve().parents[2].parent / "shared" / "crds"
KUBERAY_VERSIONS = ("kuberay-v1.4.0", "kuberay-v1.7.0")


@functools.cache
def kuberay_raycluster_schema(version: str) -> dict[str, Any] | None:
    """The openAPIV3Schema of KubeRay's RayCluster v1 in `version`, or None when ../shared is absent."""
    path = KUBERAY_CRDS / version / "ray.io_rayclusters.yaml"
    if not path.exists():
        return None
    crd = yaml.load(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    (v1,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    schema: dict[str, Any] = v1["schema"]["openAPIV3Schema"]
    return schema
