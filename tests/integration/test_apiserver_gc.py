"""The emulated API server's garbage collector, against what the Kubernetes documentation says it does.

Sections cited: "Garbage Collection" (https://kubernetes.io/docs/concepts/architecture/garbage-collection/),
its "Cascading deletion" (foreground and background), and "Owners and Dependents"
(https://kubernetes.io/docs/concepts/overview/working-with-objects/owners-dependents/, `ownerReferences` and
`blockOwnerDeletion`). The real collector is a controller: it acts in the background, some time after the owner
is gone (`gc_delay`), and a cluster whose controller manager does not run has none (`gc_delay=None`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from fsdp_operator.local.server import ThreadedApiServer
from fsdp_operator.local.server.store import FOREGROUND_FINALIZER
from support.crds import GROUP, PLURAL, VERSION, widget, widget_crd
from test_apiserver import CM, CRDS, Client

pytestmark = [pytest.mark.integration, pytest.mark.timeout(30)]

WIDGETS = f"/apis/{GROUP}/{VERSION}/namespaces/default/{PLURAL}"
DELAY = 0.3


def until(condition: Callable[[], Any], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met"
        time.sleep(0.01)


@pytest.fixture(params=[DELAY, None], ids=["delayed", "no-collector"])
def gc(request: pytest.FixtureRequest) -> Iterator[tuple[Client, ThreadedApiServer]]:
    with ThreadedApiServer(gc_delay=request.param) as api:
        client = Client(api.url)
        assert client.post(CRDS, widget_crd())[0] == 201
        yield client, api


def owner_and_ref(k8s: Client, name: str) -> dict[str, Any]:
    owner = k8s.post(WIDGETS, widget(name))[1]
    return {"apiVersion": owner["apiVersion"], "kind": "Widget", "name": name, "uid": owner["metadata"]["uid"]}


def child(k8s: Client, name: str, *refs: dict[str, Any]) -> None:
    assert k8s.post(CM, {"metadata": {"name": name, "ownerReferences": list(refs)}})[0] == 201


def exists(k8s: Client, path: str) -> bool:
    return k8s.get(path)[0] == 200


def test_background_deletion_removes_dependents_later_or_never(gc: tuple[Client, ThreadedApiServer]) -> None:
    """ "Background cascading deletion": the owner goes at once, the collector deletes the dependents in the
    background. A dependent with another owner that still exists is kept ("Owners and dependents")."""
    k8s, api = gc
    ref, other = owner_and_ref(k8s, "owner"), owner_and_ref(k8s, "other")
    child(k8s, "child", ref)
    child(k8s, "shared", ref, other)
    started = time.monotonic()
    assert k8s.delete(f"{WIDGETS}/owner")[0] == 200
    assert not exists(k8s, f"{WIDGETS}/owner")
    assert exists(k8s, f"{CM}/child"), "collected inside the deleting request: no real collector does that"
    if api.store.gc_delay is None:
        assert api.store._gc_thread is None and not api.store.collection_pending
        assert exists(k8s, f"{CM}/child") and exists(k8s, f"{CM}/shared")
        assert k8s.delete(f"{CM}/child")[0] == 200  # gone only when someone deletes it
        return
    until(lambda: not exists(k8s, f"{CM}/child"))
    assert time.monotonic() - started >= DELAY
    until(lambda: not api.store.collection_pending)
    assert exists(k8s, f"{CM}/shared")


def test_a_dependent_created_for_an_owner_that_is_gone_is_collected(gc: tuple[Client, ThreadedApiServer]) -> None:
    """An ownerReference to an owner that does not exist: the dependent is deleted once every owner is verified
    absent ("Owners and dependents"), and never without a collector."""
    k8s, api = gc
    ref = owner_and_ref(k8s, "owner")
    assert k8s.delete(f"{WIDGETS}/owner")[0] == 200
    child(k8s, "late", ref)
    if api.store.gc_delay is None:
        assert exists(k8s, f"{CM}/late") and not api.store.collection_pending
    else:
        until(lambda: not exists(k8s, f"{CM}/late"))


def test_foreground_deletion_waits_for_blocking_dependents(gc: tuple[Client, ThreadedApiServer]) -> None:
    """ "Foreground cascading deletion": the owner enters a deletion in progress state (deletionTimestamp, the
    foregroundDeletion finalizer) and stays visible until the collector has deleted the dependents; a dependent
    with blockOwnerDeletion: true and a finalizer of its own holds the owner until it is gone."""
    k8s, api = gc
    plain = owner_and_ref(k8s, "owner")
    blocking = {**plain, "blockOwnerDeletion": True}
    child(k8s, "blocker", blocking)
    child(k8s, "plain", plain)
    assert k8s.patch(f"{CM}/blocker", {"metadata": {"finalizers": ["hold/it"]}})[0] == 200
    code, owner = k8s.delete(f"{WIDGETS}/owner", params={"propagationPolicy": "Foreground"})
    assert code == 200
    assert owner["metadata"]["deletionTimestamp"] and FOREGROUND_FINALIZER in owner["metadata"]["finalizers"]
    if api.store.gc_delay is None:
        assert exists(k8s, f"{CM}/blocker") and exists(k8s, f"{CM}/plain")
        assert k8s.get(f"{WIDGETS}/owner")[1]["metadata"]["finalizers"] == [FOREGROUND_FINALIZER]
        return
    until(lambda: not exists(k8s, f"{CM}/plain"))
    until(lambda: k8s.get(f"{CM}/blocker")[1]["metadata"].get("deletionTimestamp"))
    until(lambda: not api.store.collection_pending)
    assert exists(k8s, f"{WIDGETS}/owner"), "the owner went while a blocking dependent was still there"
    assert k8s.patch(f"{CM}/blocker", {"metadata": {"finalizers": None}})[0] == 200
    until(lambda: not exists(k8s, f"{WIDGETS}/owner"))


def test_foreground_deletion_is_not_held_by_non_blocking_dependents() -> None:
    """Only dependents with blockOwnerDeletion: true hold the owner ("Foreground cascading deletion")."""
    with ThreadedApiServer(gc_delay=DELAY) as api:
        k8s = Client(api.url)
        assert k8s.post(CRDS, widget_crd())[0] == 201
        child(k8s, "held", owner_and_ref(k8s, "owner"))
        assert k8s.patch(f"{CM}/held", {"metadata": {"finalizers": ["hold/it"]}})[0] == 200
        assert k8s.delete(f"{WIDGETS}/owner", params={"propagationPolicy": "Foreground"})[0] == 200
        until(lambda: not exists(k8s, f"{WIDGETS}/owner"))
        assert k8s.get(f"{CM}/held")[1]["metadata"].get("deletionTimestamp")


def test_the_immediate_collector_deletes_inside_the_request() -> None:
    """`gc_delay=0` (tests about something else): dependents are gone when the owner's DELETE answers."""
    with ThreadedApiServer(gc_delay=0.0) as api:
        k8s = Client(api.url)
        assert k8s.post(CRDS, widget_crd())[0] == 201
        ref = owner_and_ref(k8s, "owner")
        child(k8s, "child", ref)
        assert k8s.delete(f"{WIDGETS}/owner")[0] == 200
        assert not exists(k8s, f"{CM}/child")
        # A dependent created after its owner's deletion (its creator read the owner before): gone when the create
        # answers, not left for ever (a Kueue Workload once outlived its RayCluster so, test_kueue.py).
        child(k8s, "late", ref)
        assert not exists(k8s, f"{CM}/late")


def test_a_foreground_deletion_without_dependents_still_waits_for_the_collector(
    gc: tuple[Client, ThreadedApiServer],
) -> None:
    """The API server marks the owner whatever its dependents; the collector removes the finalizer (docs: "the
    controller deletes the owner object" once the dependents are gone), so without one the owner stays."""
    k8s, api = gc
    owner_and_ref(k8s, "lonely")
    code, owner = k8s.delete(f"{WIDGETS}/lonely", params={"propagationPolicy": "Foreground"})
    assert code == 200 and owner["metadata"]["finalizers"] == [FOREGROUND_FINALIZER]
    if api.store.gc_delay is None:
        assert exists(k8s, f"{WIDGETS}/lonely") and not api.store.collection_pending
    else:
        until(lambda: not exists(k8s, f"{WIDGETS}/lonely"))
