"""parse_job remembers a spec's parse: never a wrong answer for a value that is equal but not the same JSON."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from fsdp_operator.api import memo, schema, spec
from fsdp_operator.api.spec import SpecError, parse_job
from hypothesis import given, settings
from hypothesis import strategies as st

# Scalars Python calls equal across types (1 == 1.0 == True, 0 == -0.0 == False): the collisions that matter.
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 3),
    st.sampled_from([0.0, -0.0, 1.0, 2.0, 1.5, float("nan"), float("inf")]),
    st.sampled_from(["", "1", "a", "True"]),
)
json_values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.sampled_from("abc"), inner, max_size=3)),
    max_leaves=8,
)


def same_json(a: Any, b: Any) -> bool:
    """Equal with equal types throughout, dict order included (what json_key promises for a shared key)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(same_json(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same_json(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float):
        return repr(a) == repr(b)
    return bool(a == b)


@settings(max_examples=400, derandomize=True, database=None, deadline=None)
@given(json_values, json_values)
def test_two_values_share_a_key_only_when_they_are_the_same_json(a: Any, b: Any) -> None:
    key_a, key_b = memo.json_key(a, 10_000), memo.json_key(b, 10_000)
    assert key_a is not None and key_b is not None
    assert (key_a == key_b) == same_json(a, b)


@pytest.mark.parametrize(
    "value",
    [
        {1: "int key"},
        {"a": (1, 2)},
        {"a": {1, 2}},
        {"a": b"bytes"},
        type("Str", (str,), {})("a str subclass"),
        {"a": "x" * 200},  # over the length given below
        {"a": 10**5000},  # repr refuses it (over 4,300 digits)
        {"a": [2**300]},
    ],
)
def test_values_that_are_not_plain_json_or_too_long_have_no_key(value: Any) -> None:
    assert memo.json_key(value, 100) is None


def test_a_value_nested_deeper_than_the_limit_has_no_key_and_raises_nothing() -> None:
    deep: Any = "leaf"
    for _ in range(100_000):
        deep = {"a": [deep]}
    assert memo.json_key(deep, 10**9) is None
    shallow: Any = "leaf"
    for _ in range(memo.MAX_DEPTH // 2):
        shallow = {"a": [shallow]}
    assert memo.json_key(shallow, 10**9) == repr(shallow)


def test_the_memo_computes_each_value_once_and_forgets_the_least_recently_used() -> None:
    calls: list[Any] = []

    def compute(value: object) -> str:
        calls.append(value)
        return f"result of {value!r}"

    remembered = memo.JsonMemo(compute, max_entries=2, max_key_chars=1000)
    assert remembered({"a": 1}) == remembered({"a": 1}) == "result of {'a': 1}"
    assert remembered({"a": True}) == "result of {'a': True}"  # equal to {"a": 1} in Python, not the same JSON
    assert remembered({"a": 1}) == "result of {'a': 1}"  # still remembered: used last
    remembered({"b": 2})  # a third value: {"a": True} goes
    remembered({"a": True})
    remembered({1: "no key"})
    remembered({1: "no key"})  # not plain JSON: computed every time
    assert calls == [{"a": 1}, {"a": True}, {"b": 2}, {"a": True}, {1: "no key"}, {1: "no key"}]


def job(spec_: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": schema.API_VERSION, "kind": schema.KIND, "metadata": {"name": "qwen"}, "spec": spec_}


def outcome(manifest: dict[str, Any]) -> Any:
    try:
        return parse_job(manifest)
    except SpecError as e:
        return str(e)


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ({"workers": {"replicas": 1}}, {"workers": {"replicas": True}}),  # 1 == True: accepted, then refused
        ({"workers": {"replicas": True}}, {"workers": {"replicas": 1}}),
        ({"training": {"steps": 2}}, {"training": {"steps": "2"}}),
        ({"training": {"learningRate": 1}}, {"training": {"learningRate": 1.0}}),
        ({"training": {"steps": 0}}, {"training": {"steps": False}}),
    ],
)
def test_a_remembered_spec_never_answers_for_an_equal_spec_of_other_types(
    first: dict[str, Any], second: dict[str, Any]
) -> None:
    spec._parsed_spec.clear()
    outcome(job(first))
    remembered = outcome(job(second))
    spec._parsed_spec.clear()
    assert remembered == outcome(job(second))


def test_the_same_spec_is_parsed_once_and_the_job_still_follows_its_metadata(monkeypatch: pytest.MonkeyPatch) -> None:
    parses: list[Any] = []
    parse_spec = spec._parse_spec

    def counted(raw: Any) -> Any:
        parses.append(raw)
        return parse_spec(raw)

    monkeypatch.setattr(spec, "_parsed_spec", memo.JsonMemo(counted, max_entries=8, max_key_chars=64 * 1024))
    manifest = job({"workers": {"replicas": 2}, "training": {"steps": 5}})
    first = parse_job(manifest)
    renamed = copy.deepcopy(manifest)
    renamed["metadata"] = {"name": "other", "generation": 4, "labels": {"team": "a"}}
    second = parse_job(renamed)
    assert len(parses) == 1
    assert second.spec is first.spec
    assert (second.name, second.generation, second.labels) == ("other", 4, {"team": "a"})
    renamed["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "Not A Name"}
    with pytest.raises(SpecError, match="queue-name"):  # the labels' own checks run on every parse
        parse_job(renamed)
    changed = job({"workers": {"replicas": 3}, "training": {"steps": 5}})
    assert parse_job(changed).spec.workers.replicas == 3
    assert len(parses) == 2
