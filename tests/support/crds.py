"""A small test CRD (group `example.fsdp.dev`, kind Widget) with a status subresource, printer columns,
a short name and a schema, for tests of the emulated API server, kopf and kubectl."""

from __future__ import annotations

from typing import Any

GROUP = "example.fsdp.dev"
VERSION = "v1"
PLURAL = "widgets"
KIND = "Widget"
API_VERSION = f"{GROUP}/{VERSION}"


def widget_crd() -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PLURAL}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "plural": PLURAL,
                "singular": "widget",
                "kind": KIND,
                "listKind": f"{KIND}List",
                "shortNames": ["wd"],
                "categories": ["fsdp"],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": [
                        {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
                        {"name": "Replicas", "type": "integer", "jsonPath": ".spec.replicas"},
                        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
                    ],
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {
                                "spec": {
                                    "type": "object",
                                    "properties": {
                                        "replicas": {"type": "integer", "minimum": 0},
                                        "size": {"type": "string", "enum": ["small", "large"]},
                                        "extra": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                                    },
                                },
                                "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                            },
                        }
                    },
                }
            ],
        },
    }


def widget(name: str, replicas: int = 1, namespace: str = "default", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"replicas": replicas, **spec},
    }
