"""The emulated API server's pure parts: patch algorithms, selectors, JSONPath, ages, CRD parsing."""

from __future__ import annotations

import pytest
from fsdp_operator.local.server.patching import PatchError, json_patch, merge_patch, strategic_merge_patch
from fsdp_operator.local.server.resources import InvalidDefinition, type_from_crd
from fsdp_operator.local.server.selectors import SelectorError, parse_field_selector, parse_label_selector
from fsdp_operator.local.server.tables import human_duration, json_path
from support.crds import widget_crd


def test_merge_patch_rfc7386() -> None:
    assert merge_patch({"a": {"b": 1, "c": 2}, "l": [1, 2]}, {"a": {"b": None, "d": 3}, "l": [3]}) == {
        "a": {"c": 2, "d": 3},
        "l": [3],
    }


def test_json_patch_operations() -> None:
    doc = {"a": [1, 2], "b": {"c": "x"}}
    ops = [
        {"op": "add", "path": "/a/-", "value": 3},
        {"op": "add", "path": "/a/0", "value": 0},
        {"op": "move", "from": "/b/c", "path": "/d"},
        {"op": "copy", "from": "/d", "path": "/b/e"},
        {"op": "test", "path": "/a", "value": [0, 1, 2, 3]},
        {"op": "replace", "path": "/a/1", "value": 9},
        {"op": "remove", "path": "/a/0"},
        {"op": "add", "path": "/k~1v", "value": True},
    ]
    assert json_patch(doc, ops) == {"a": [9, 2, 3], "b": {"e": "x"}, "d": "x", "k/v": True}
    assert doc == {"a": [1, 2], "b": {"c": "x"}}  # the input is not modified
    with pytest.raises(PatchError) as failed:
        json_patch(doc, [{"op": "test", "path": "/b/c", "value": "y"}])
    assert failed.value.status == 422
    with pytest.raises(PatchError):
        json_patch(doc, [{"op": "replace", "path": "/missing", "value": 1}])
    with pytest.raises(PatchError) as malformed:
        json_patch(doc, {"op": "add"})
    assert malformed.value.status == 400


def test_strategic_merge_patch_directives() -> None:
    pod = {"spec": {"containers": [{"name": "a", "image": "x"}, {"name": "b", "image": "y"}]}}
    deleted = strategic_merge_patch(pod, {"spec": {"containers": [{"name": "a", "$patch": "delete"}]}})
    assert deleted == {"spec": {"containers": [{"name": "b", "image": "y"}]}}
    replaced = strategic_merge_patch(pod, {"spec": {"$patch": "replace", "containers": []}})
    assert replaced == {"spec": {"containers": []}}
    meta = strategic_merge_patch({"finalizers": ["a", "b"]}, {"$deleteFromPrimitiveList/finalizers": ["a"]})
    assert meta == {"finalizers": ["b"]}


def test_label_and_field_selectors() -> None:
    labels = {"app": "x", "tier": "web"}
    cases = {
        "app=x": True,
        "app==y": False,
        "app!=y,tier": True,
        "app in (x,y), !gone": True,
        "tier notin (web)": False,
        "": True,
    }
    for text, expected in cases.items():
        assert parse_label_selector(text)(labels) is expected, text
    with pytest.raises(SelectorError):
        parse_label_selector("app in x")
    selector = parse_field_selector(
        "metadata.name=a,status.phase!=Failed", frozenset({"metadata.name", "status.phase"})
    )
    assert selector({"metadata": {"name": "a"}, "status": {"phase": "Running"}})
    assert not selector({"metadata": {"name": "a"}, "status": {"phase": "Failed"}})
    with pytest.raises(SelectorError):
        parse_field_selector("spec.x=1", frozenset({"metadata.name"}))


def test_json_path_and_human_durations() -> None:
    obj = {"status": {"conditions": [{"type": "A", "status": "False"}, {"type": "Ready", "status": "True"}]}}
    assert json_path(obj, '.status.conditions[?(@.type=="Ready")].status') == ["True"]
    assert json_path(obj, ".status.conditions[0].type") == ["A"]
    assert json_path(obj, ".status.missing") == []
    assert [human_duration(s) for s in (5, 150, 630, 3 * 3600 + 60, 30 * 3600, 3 * 86400 + 3600)] == [
        "5s",
        "2m30s",
        "10m",
        "3h1m",
        "30h",
        "3d1h",
    ]


def test_crd_parsing() -> None:
    rtype = type_from_crd(widget_crd())
    assert (rtype.group, rtype.plural, rtype.kind, rtype.namespaced) == ("example.fsdp.dev", "widgets", "Widget", True)
    assert rtype.short_names == ("wd",) and rtype.status_subresource and not rtype.builtin
    assert [c.name for c in rtype.printer_columns["v1"]] == ["Phase", "Replicas", "Age"]
    wrong = widget_crd()
    wrong["metadata"]["name"] = "widgets.elsewhere"
    with pytest.raises(InvalidDefinition):
        type_from_crd(wrong)
