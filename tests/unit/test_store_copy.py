"""The emulated API server's copy of stored objects (`resources.json_copy`): deep, equal, and never shared."""

from __future__ import annotations

from typing import Any

from fsdp_operator.local.resources import json_copy
from hypothesis import given
from hypothesis import strategies as st

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda children: st.lists(children) | st.dictionaries(st.text(), children),
    max_leaves=40,
)


def _containers(value: Any) -> list[int]:
    if isinstance(value, dict):
        return [id(value), *(i for item in value.values() for i in _containers(item))]
    if isinstance(value, list):
        return [id(value), *(i for item in value for i in _containers(item))]
    return []


@given(JSON)
def test_a_copy_is_equal_and_shares_no_dict_or_list(value: Any) -> None:
    copied = json_copy(value)
    assert copied == value
    assert not set(_containers(copied)) & set(_containers(value))


def test_what_is_not_json_is_copied_deeply_all_the_same() -> None:
    inner = {"a": [1]}
    value = {"t": (inner,), "s": {1, 2}}
    copied = json_copy(value)
    assert copied == value and copied["t"][0] is not inner and copied["s"] is not value["s"]
