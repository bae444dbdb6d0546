"""Validation ratcheting in the emulated API server (`validation.validate` with the stored object): the errors of an
update are exactly the errors of validating it whole, less those in root fields it leaves unchanged."""

from __future__ import annotations

from typing import Any

from fsdp_operator.api import generate
from fsdp_operator.local import validation
from hypothesis import given, settings
from hypothesis import strategies as st

JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | st.sampled_from(["", "a", "small", "Running"]),
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


def test_without_the_stored_object_everything_is_validated() -> None:
    invalid = {"spec": {"replicas": -1}, "status": {"phase": "Lost"}}
    assert [path for path, _ in validation.validate(invalid, WIDGET)] == ["spec.replicas", "status.phase"]
    assert [path for path, _ in validation.validate(invalid, WIDGET, {"spec": {"replicas": -1}})] == ["status.phase"]
    assert [path for path, _ in validation.validate({}, WIDGET, invalid)] == ["<root>"]  # spec is required
