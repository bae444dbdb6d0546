"""Custom objects against their schema in the emulated API server (`local/server/validation.py`): the compiled validity
check never passes what jsonschema refuses, and validation ratcheting (`validate` with the stored object) leaves an
update exactly the errors of validating it whole, less those in root fields it leaves unchanged."""

from __future__ import annotations

from typing import Any

import jsonschema
from fsdp_operator.api import generate, render
from fsdp_operator.api.spec import parse_job
from fsdp_operator.local.cluster.kuberay import RAYCLUSTER_CRD
from fsdp_operator.local.server import validation
from hypothesis import given, settings
from hypothesis import strategies as st

SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-5, 5)
    | st.sampled_from([0.3, 1.0, 2.5, 2**31, 2**63, -(2**63) - 1, 1e308])
    | st.sampled_from(["", "a", "small", "Running", "a\n", "\u0663", "x" * 300, "1Gi", "10.0.0.1", "A_B"])
)
JSON = st.recursive(
    SCALARS,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.sampled_from(["a", "replicas"]), children),
    max_leaves=6,
)
WIDGET = {
    "type": "object",
    "required": ["spec"],
    "properties": {
        "spec": {
            "type": "object",
            "properties": {"replicas": {"type": "integer", "minimum": 0}, "size": {"type": "string"}},
        },
        "status": {"type": "object", "properties": {"phase": {"type": "string", "enum": ["Running"]}}},
    },
}
"""Root keywords the validator splits the root from its fields for (`type`, `properties`, `required`)."""
GUARDED = {**WIDGET, "minProperties": 2}
"""A root keyword that is not split off: the whole object is validated and its errors filtered."""
OURS = generate.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def root_fields(schema: dict[str, Any]) -> Any:
    """Objects of the schema's root fields (each absent, one of its own kind, or any JSON value)."""
    names = [name for name in schema["properties"] if name != "metadata"]
    return st.fixed_dictionaries({}, optional={name: JSON for name in names})


def expected(new: dict[str, Any], old: dict[str, Any], schema: dict[str, Any]) -> list[tuple[str, str]]:
    changed = {key for key in new if key not in old or old[key] != new[key]}
    return [e for e in validation.validate(new, schema) if e[0] == "<root>" or e[0].split(".")[0] in changed]


@settings(max_examples=300)
@given(st.sampled_from([WIDGET, GUARDED, OURS]), st.data())
def test_an_update_is_held_to_its_changed_fields(schema: dict[str, Any], data: st.DataObject) -> None:
    old = data.draw(root_fields(schema), "old")
    # Each root field kept from the old object or drawn anew.
    new = {key: value for key, value in old.items() if data.draw(st.booleans(), f"keep {key}")}
    new |= data.draw(root_fields(schema), "changes")
    assert validation.validate(new, schema, old) == expected(new, old, schema)


def json_schema(crd: dict[str, Any]) -> dict[str, Any]:
    version = next(v for v in crd["spec"]["versions"] if v.get("storage"))
    converted: dict[str, Any] = validation._to_json_schema(version["schema"]["openAPIV3Schema"])
    converted.get("properties", {}).pop("metadata", None)
    return converted


def leaves(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    if isinstance(value, dict):
        return [path] + [p for k, v in value.items() for p in leaves(v, (*path, k))]
    if isinstance(value, list):
        return [path] + [p for i, v in enumerate(value) for p in leaves(v, (*path, i))]
    return [path]


def replaced(value: Any, path: tuple[Any, ...], new: Any) -> Any:
    if not path:
        return new
    copied = dict(value) if isinstance(value, dict) else list(value)
    copied[path[0]] = replaced(value[path[0]], path[1:], new)
    return copied


def _valid_objects() -> list[tuple[dict[str, Any], dict[str, Any]]]:
    from integration.test_operator import manifest

    job = manifest("a", steps=10, workers={"replicas": 2})
    parsed = parse_job({**job, "metadata": {**job["metadata"], "uid": "u"}})
    cluster = render.raycluster(parsed, render.Security(token_auth=True))
    return [(job, json_schema(generate.crd())), (cluster, json_schema(RAYCLUSTER_CRD))]


VALID = _valid_objects()
CHECKERS = [validation._Checker.of(schema) for _, schema in VALID]


@settings(max_examples=400)
@given(st.sampled_from(range(len(VALID))), st.data())
def test_the_compiled_check_never_passes_what_jsonschema_refuses(which: int, data: st.DataObject) -> None:
    """Any field of a valid job or RayCluster replaced by any JSON value: where jsonschema finds errors, the fast
    check must not call it valid (the reverse only costs time: jsonschema's answer then stands)."""
    obj, schema = VALID[which]
    path = data.draw(st.sampled_from(leaves(obj)[1:]), "path")
    changed = replaced(obj, path, data.draw(JSON, "value"))
    checker = CHECKERS[which]
    assert checker.fast is not None
    if checker.fast.is_valid(changed):
        assert not list(jsonschema.Draft4Validator(schema).iter_errors(changed)), path


def test_a_schema_with_multiple_of_is_checked_by_jsonschema_alone() -> None:
    schema = {"type": "object", "properties": {"ratio": {"type": "number", "multipleOf": 0.1}}}
    assert validation._Checker.of(schema).fast is None
    assert validation.validate({"ratio": 0.3}, schema) != []  # 0.3 / 0.1 is not a whole number in floating point


def test_without_the_stored_object_everything_is_validated() -> None:
    invalid = {"spec": {"replicas": -1}, "status": {"phase": "Lost"}}
    assert [path for path, _ in validation.validate(invalid, WIDGET)] == ["spec.replicas", "status.phase"]
    assert [path for path, _ in validation.validate(invalid, WIDGET, {"spec": {"replicas": -1}})] == ["status.phase"]
    assert [path for path, _ in validation.validate({}, WIDGET, invalid)] == ["<root>"]  # spec is required
