"""The CRD schema rules of the emulated API server (local/server/structural.py), each refused schema paired with
the real kube-apiserver's message for it, and the CRDs real servers accept (ours, the chart's, KubeRay's)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from fsdp_operator.api import generate
from fsdp_operator.local.cluster.kuberay import RAYCLUSTER_CRD
from fsdp_operator.local.server import structural
from support.crds import KUBERAY_CRDS, KUBERAY_VERSIONS, widget_crd

ROOT = Path(__file__).resolve().parents[2]
S = "spec.validation.openAPIV3Schema"


def crd_with(spec_schema: dict[str, Any], *, status: bool = False) -> dict[str, Any]:
    """The Widget CRD with `spec_schema` as the schema of `.spec`."""
    crd = widget_crd()
    version = crd["spec"]["versions"][0]
    version["schema"]["openAPIV3Schema"]["properties"]["spec"] = spec_schema
    if not status:
        version.pop("subresources", None)
    return crd


def messages(crd: dict[str, Any]) -> list[str]:
    return [str(e) for e in structural.validate_crd(crd)]


# (schema of .spec, the real server's message for it). The messages are those of apiextensions-apiserver
# (pkg/apiserver/schema/validation.go, complete.go; pkg/apis/apiextensions/validation/validation.go).
REFUSED: list[tuple[str, dict[str, Any], str]] = [
    (
        "typed anyOf with bounds (the CRD as it was)",
        {
            "type": "object",
            "additionalProperties": {
                "anyOf": [{"type": "integer", "minimum": 0}, {"type": "string"}],
                "x-kubernetes-int-or-string": True,
            },
        },
        f"{S}.properties[spec].additionalProperties.anyOf[0].type: Forbidden: must be empty to be structural",
    ),
    (
        "no type on a field",
        {"type": "object", "properties": {"size": {"minimum": 1}}},
        f"{S}.properties[spec].properties[size].type: Required value: must not be empty for specified object fields",
    ),
    (
        "no type on array items",
        {"type": "object", "properties": {"xs": {"type": "array", "items": {"maxLength": 3}}}},
        f"{S}.properties[spec].properties[xs].items.type: Required value: must not be empty for specified array items",
    ),
    (
        "array without items",
        {"type": "object", "properties": {"xs": {"type": "array"}}},
        f"{S}.properties[spec].properties[xs].items: Required value: must be specified",
    ),
    (
        "default inside oneOf",
        {"type": "object", "oneOf": [{"default": {}}]},
        f"{S}.properties[spec].oneOf[0].default: Forbidden: must be undefined to be structural",
    ),
    (
        "nullable inside allOf",
        {"type": "object", "allOf": [{"nullable": True}]},
        f"{S}.properties[spec].allOf[0].nullable: Forbidden: must be false to be structural",
    ),
    (
        "description inside not",
        {"type": "object", "not": {"description": "x"}},
        f"{S}.properties[spec].not.description: Forbidden: must be empty to be structural",
    ),
    (
        "additionalProperties inside anyOf",
        {"type": "object", "anyOf": [{"additionalProperties": {"type": "string"}}]},
        f"{S}.properties[spec].anyOf[0].additionalProperties: Forbidden: must be undefined to be structural",
    ),
    (
        "x-kubernetes-int-or-string inside anyOf",
        {"type": "object", "anyOf": [{"x-kubernetes-int-or-string": True}]},
        f"{S}.properties[spec].anyOf[0].x-kubernetes-int-or-string: Forbidden: must be false to be structural",
    ),
    (
        "a field named only inside anyOf",
        {"type": "object", "anyOf": [{"properties": {"a": {"minimum": 1}}}]},
        f"{S}.properties[spec].properties[a]: Required value: because it is defined in "
        f"{S}.properties[spec].anyOf[0].properties[a]",
    ),
    (
        "properties and additionalProperties together",
        {"type": "object", "properties": {"a": {"type": "string"}}, "additionalProperties": {"type": "string"}},
        f"{S}.properties[spec].additionalProperties: Forbidden: additionalProperties and properties are "
        "mutual exclusive",
    ),
    (
        "uniqueItems",
        {"type": "array", "items": {"type": "string"}, "uniqueItems": True},
        f"{S}.properties[spec].uniqueItems: Forbidden: uniqueItems cannot be set to true since the runtime complexity "
        "becomes quadratic",
    ),
    ("$ref", {"type": "object", "$ref": "#/x"}, f"{S}.properties[spec].$ref: Forbidden: $ref is not supported"),
    (
        "patternProperties",
        {"type": "object", "patternProperties": {"^a": {"type": "string"}}},
        f"{S}.properties[spec].patternProperties: Forbidden: patternProperties is not supported",
    ),
    (
        "definitions",
        {"type": "object", "definitions": {"a": {"type": "string"}}},
        f"{S}.properties[spec].definitions: Forbidden: definitions is not supported",
    ),
    (
        "dependencies",
        {"type": "object", "dependencies": {"a": ["b"]}},
        f"{S}.properties[spec].dependencies: Forbidden: dependencies is not supported",
    ),
    ("id", {"type": "object", "id": "x"}, f"{S}.properties[spec].id: Forbidden: id is not supported"),
    (
        "additionalItems",
        {"type": "array", "items": {"type": "string"}, "additionalItems": False},
        f"{S}.properties[spec].additionalItems: Forbidden: additionalItems is not supported",
    ),
    (
        "type null",
        {"type": "null"},
        f"{S}.properties[spec].type: Forbidden: type cannot be set to null, use nullable as an alternative",
    ),
    (
        "an unknown type",
        {"type": "map"},
        f'{S}.properties[spec].type: Unsupported value: "map": supported values: "array", "boolean", "integer", '
        '"number", "object", "string"',
    ),
    (
        "items as an array",
        {"type": "array", "items": [{"type": "string"}]},
        f"{S}.properties[spec].items: Forbidden: items must be a schema object and not an array",
    ),
    (
        "int-or-string with preserve-unknown-fields",
        {"x-kubernetes-int-or-string": True, "x-kubernetes-preserve-unknown-fields": True},
        f"{S}.properties[spec].x-kubernetes-preserve-unknown-fields: Invalid value: true: must be false if "
        "x-kubernetes-int-or-string is true",
    ),
    (
        "preserve-unknown-fields false",
        {"type": "object", "x-kubernetes-preserve-unknown-fields": False},
        f"{S}.properties[spec].x-kubernetes-preserve-unknown-fields: Invalid value: false: must be true or undefined",
    ),
    (
        "embedded resource that is not an object",
        {"type": "string", "x-kubernetes-embedded-resource": True},
        f'{S}.properties[spec].type: Invalid value: "string": must be object if x-kubernetes-embedded-resource is true',
    ),
    (
        "embedded resource with neither properties nor preserve",
        {"type": "object", "x-kubernetes-embedded-resource": True},
        f"{S}.properties[spec].properties: Required value: must not be empty if x-kubernetes-embedded-resource is "
        "true without x-kubernetes-preserve-unknown-fields",
    ),
    (
        "list-type on a non-array",
        {"type": "object", "x-kubernetes-list-type": "set"},
        f'{S}.properties[spec].type: Invalid value: "object": must be array if x-kubernetes-list-type is specified',
    ),
    (
        "unknown list-type",
        {"type": "array", "items": {"type": "string"}, "x-kubernetes-list-type": "bag"},
        f'{S}.properties[spec].x-kubernetes-list-type: Unsupported value: "bag": supported values: "atomic", "set", '
        '"map"',
    ),
    (
        "list-type map without keys",
        {"type": "array", "items": {"type": "object"}, "x-kubernetes-list-type": "map"},
        f"{S}.properties[spec].x-kubernetes-list-map-keys: Required value: must not be empty if "
        "x-kubernetes-list-type is map",
    ),
    (
        "list-map-keys without list-type map",
        {
            "type": "array",
            "items": {"type": "object", "properties": {"n": {"type": "string"}}, "required": ["n"]},
            "x-kubernetes-list-map-keys": ["n"],
        },
        f"{S}.properties[spec].x-kubernetes-list-type: Required value: must be map if x-kubernetes-list-map-keys is "
        "non-empty",
    ),
    (
        "a map key that is not an item property",
        {
            "type": "array",
            "items": {"type": "object", "properties": {"n": {"type": "string"}}},
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["m"],
        },
        f'{S}.properties[spec].x-kubernetes-list-map-keys: Invalid value: ["m"]: entries must all be names of item '
        "properties",
    ),
    (
        "a map key neither required nor defaulted",
        {
            "type": "array",
            "items": {"type": "object", "properties": {"n": {"type": "string"}}},
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["n"],
        },
        f"{S}.properties[spec].items.properties[n].default: Required value: this property is in "
        "x-kubernetes-list-map-keys, so it must have a default or be a required property",
    ),
    (
        "a default of the wrong type",
        {"type": "object", "properties": {"n": {"type": "integer", "default": "two"}}},
        f"{S}.properties[spec].properties[n].default: Invalid value: \"two\": 'two' is not of type 'integer'",
    ),
    (
        "a default below its minimum",
        {"type": "object", "properties": {"n": {"type": "integer", "minimum": 1, "default": 0}}},
        f"{S}.properties[spec].properties[n].default: Invalid value: 0: 0 is less than the minimum of 1",
    ),
    (
        "a default with unknown fields",
        {"type": "object", "properties": {"o": {"type": "object", "properties": {}, "default": {"x": 1}}}},
        f'{S}.properties[spec].properties[o].default: Invalid value: {{"x": 1}}: must not have unknown fields',
    ),
    (
        "an invalid pattern",
        {"type": "string", "pattern": "("},
        f'{S}.properties[spec].pattern: Invalid value: "(": must be a valid regular expression',
    ),
]


@pytest.mark.parametrize(("spec_schema", "message"), [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED])
def test_a_real_server_refuses_this_schema_and_so_does_the_emulator(spec_schema: dict[str, Any], message: str) -> None:
    found = messages(crd_with(spec_schema))
    assert any(m.startswith(message) for m in found), found


def test_metadata_at_the_root_may_restrict_only_name_and_generate_name() -> None:
    crd = widget_crd()
    root = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    root["properties"]["metadata"] = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 9}}}
    assert messages(crd) == []
    root["properties"]["metadata"]["properties"]["labels"] = {"type": "object"}
    assert messages(crd) == [
        f"{S}.properties[metadata]: Forbidden: must not specify anything other than name and generateName, but "
        "metadata is implicitly specified"
    ]


@pytest.mark.parametrize(
    "extra",
    [{"description": "the job's metadata"}, {"title": "metadata"}, {"nullable": True}, {"maxProperties": 3}],
    ids=["description", "title", "nullable", "a value validation"],
)
def test_metadata_at_the_root_may_carry_not_even_a_description(extra: dict[str, Any]) -> None:
    """A real server compares the root `metadata` schema, less type, default and name/generateName, with an
    empty one: a description (or a title) is something other than name and generateName, and is refused
    (apiextensions-apiserver, validateStructuralMetadataInvariants). Our generator must not emit one either."""
    crd = widget_crd()
    root = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    root["properties"]["metadata"] = {"type": "object", **extra}
    assert messages(crd) == [
        f"{S}.properties[metadata]: Forbidden: must not specify anything other than name and generateName, but "
        "metadata is implicitly specified"
    ]
    ours = generate.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    assert set(ours["properties"].get("metadata") or {"type": "object"}) <= {"type", "properties"}


def test_defaults_are_forbidden_in_top_level_metadata() -> None:
    crd = widget_crd()
    root = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    root["properties"]["metadata"] = {"type": "object", "default": {}}
    assert f"{S}.properties[metadata].default: Forbidden: must not be set in top-level metadata" in messages(crd)


def test_additional_properties_at_the_root_and_a_non_object_root_are_refused() -> None:
    crd = widget_crd()
    crd["spec"]["versions"][0].pop("subresources")
    crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"] = {"type": "string"}
    assert f'{S}.type: Invalid value: "string": must be object at the root' in messages(crd)
    crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"] = {
        "type": "object",
        "additionalProperties": {"type": "string"},
    }
    assert f"{S}.additionalProperties: Forbidden: must not be used at the root" in messages(crd)


def test_a_version_without_a_schema_is_refused_and_differing_versions_report_per_version() -> None:
    crd = widget_crd()
    crd["spec"]["versions"][0].pop("schema")
    assert messages(crd) == ["spec.versions[0].schema.openAPIV3Schema: Required value: schemas are required"]
    crd = widget_crd()
    second = copy.deepcopy(crd["spec"]["versions"][0])
    second.update(name="v2", storage=False)
    second["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["size"] = {"minimum": 1}
    crd["spec"]["versions"].append(second)
    assert messages(crd) == [
        "spec.versions[1].schema.openAPIV3Schema.properties[spec].properties[size].type: Required value: must not be "
        "empty for specified object fields"
    ]


def test_the_int_or_string_shapes_a_real_server_allows_are_accepted() -> None:
    assert (
        messages(crd_with({"x-kubernetes-int-or-string": True, "anyOf": [{"type": "integer"}, {"type": "string"}]}))
        == []
    )
    assert (
        messages(
            crd_with(
                {
                    "x-kubernetes-int-or-string": True,
                    "allOf": [{"anyOf": [{"type": "integer"}, {"type": "string"}]}, {"pattern": "^[0-9]+$"}],
                }
            )
        )
        == []
    )
    assert messages(crd_with({"type": "object", "x-kubernetes-preserve-unknown-fields": True})) == []


def _crds(path: Path) -> list[dict[str, Any]]:
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return [
        d for d in yaml.load_all(path.read_text(), Loader=loader) if d and d.get("kind") == "CustomResourceDefinition"
    ]


def test_our_crds_pass_the_rules_of_a_real_server() -> None:
    assert messages(generate.crd()) == []
    assert messages(RAYCLUSTER_CRD) == []
    for path in [ROOT / "crds" / "fsdptrainingjob.yaml", *sorted((ROOT / "charts").glob("*/crds/*.yaml"))]:
        for crd in _crds(path):
            assert messages(crd) == [], path


@pytest.mark.parametrize("version", KUBERAY_VERSIONS)
def test_kuberays_real_crds_pass_so_the_rules_are_not_too_strict(version: str) -> None:
    paths = sorted((KUBERAY_CRDS / version).glob("*.yaml"))
    if not paths:
        pytest.skip(f"KubeRay's CRDs are not in {KUBERAY_CRDS / version} (../shared is absent)")
    for path in paths:
        for crd in _crds(path):
            assert messages(crd) == [], path.name
