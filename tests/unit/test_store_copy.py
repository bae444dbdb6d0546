"""The emulated API server's copy of stored objects (`resources.json_copy`): deep, equal, and never shared."""

from __future__ import annotations

from typing import Any

from fsdp_operator.local.server.resources import json_copy
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


def _types(value: Any) -> list[type]:
    """Every value's exact type, in order: `True == 1` and `1 == 1.0`, so equality alone would not tell."""
    if isinstance(value, dict):
        return [dict, *(t for key, item in value.items() for t in (type(key), *_types(item)))]
    if isinstance(value, list):
        return [list, *(t for item in value for t in _types(item))]
    return [type(value)]


@given(JSON)
def test_a_copy_is_equal_and_shares_no_dict_or_list(value: Any) -> None:
    copied = json_copy(value)
    assert copied == value
    assert _types(copied) == _types(value)
    assert not set(_containers(copied)) & set(_containers(value))


def test_what_appears_twice_is_two_in_the_copy() -> None:
    env = [{"name": "A", "value": "1"}]
    value = {"head": {"env": env}, "worker": {"env": env}}
    copied = json_copy(value)
    assert copied == value
    assert copied["head"]["env"] is not copied["worker"]["env"]
    copied["head"]["env"][0]["value"] = "2"
    assert copied["worker"]["env"][0]["value"] == "1"


def test_what_is_not_json_is_copied_deeply_all_the_same() -> None:
    inner = {"a": [1]}
    value = {"t": (inner,), "s": {1, 2}}
    copied = json_copy(value)
    assert copied == value and copied["t"][0] is not inner and copied["s"] is not value["s"]
