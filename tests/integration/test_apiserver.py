"""The emulated Kubernetes API server, tested over real HTTP against the semantics kopf and kubectl rely on."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import requests
from fsdp_operator.local.server import ThreadedApiServer
from support.crds import GROUP, PLURAL, VERSION, widget, widget_crd

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

CM = "/api/v1/namespaces/default/configmaps"
PODS = "/api/v1/namespaces/default/pods"
CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
WIDGETS = f"/apis/{GROUP}/{VERSION}/namespaces/default/{PLURAL}"
MERGE = {"Content-Type": "application/merge-patch+json"}
JSON_PATCH = {"Content-Type": "application/json-patch+json"}
STRATEGIC = {"Content-Type": "application/strategic-merge-patch+json"}
TABLE = {"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"}


class Client:
    """A thin HTTP client: every call returns (status code, decoded body)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.session = requests.Session()

    def call(self, method: str, path: str, body: Any = None, **kwargs: Any) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body)
        response = self.session.request(method, self.url + path, data=data, timeout=10, **kwargs)
        return response.status_code, response.json() if response.content else None

    def get(self, path: str, **kwargs: Any) -> tuple[int, Any]:
        return self.call("GET", path, **kwargs)

    def post(self, path: str, body: Any) -> tuple[int, Any]:
        return self.call("POST", path, body, headers={"Content-Type": "application/json"})

    def put(self, path: str, body: Any) -> tuple[int, Any]:
        return self.call("PUT", path, body, headers={"Content-Type": "application/json"})

    def patch(self, path: str, body: Any, headers: dict[str, str] = MERGE) -> tuple[int, Any]:
        return self.call("PATCH", path, body, headers=headers)

    def delete(self, path: str, **kwargs: Any) -> tuple[int, Any]:
        return self.call("DELETE", path, **kwargs)

    def watch(self, path: str, **params: str) -> Iterator[dict[str, Any]]:
        response = self.session.get(self.url + path, params={"watch": "true", **params}, stream=True, timeout=10)
        for line in response.iter_lines():
            if line:
                yield json.loads(line)


@pytest.fixture
def k8s(apiserver: ThreadedApiServer) -> Client:
    return Client(apiserver.url)


@pytest.fixture
def widgets(k8s: Client) -> Client:
    assert k8s.post(CRDS, widget_crd())[0] == 201
    return k8s


def configmap(name: str, **labels: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "labels": labels}, "data": {"a": "1"}}


def test_discovery(k8s: Client) -> None:
    for path in ("/version", "/version/"):
        assert k8s.get(path)[1]["major"] == "1"
    assert k8s.get("/api")[1]["versions"] == ["v1"]
    core = {r["name"]: r for r in k8s.get("/api/v1")[1]["resources"]}
    # kopf finds no watchers at all without namespaces in discovery.
    assert {"namespaces", "pods", "pods/status", "services", "events", "configmaps", "secrets"} <= set(core)
    assert core["pods"]["shortNames"] == ["po"] and "watch" in core["pods"]["verbs"]
    groups = {g["name"] for g in k8s.get("/apis")[1]["groups"]}
    assert {"apiextensions.k8s.io", "events.k8s.io"} <= groups
    assert k8s.get(f"/apis/{GROUP}/{VERSION}")[0] == 404

    # A CRD registers its group, version, names, scope and subresources at once.
    assert k8s.post(CRDS, widget_crd())[0] == 201
    assert GROUP in {g["name"] for g in k8s.get("/apis")[1]["groups"]}
    assert k8s.get(f"/apis/{GROUP}")[1]["preferredVersion"]["version"] == VERSION
    listed = {r["name"]: r for r in k8s.get(f"/apis/{GROUP}/{VERSION}")[1]["resources"]}
    assert listed[PLURAL]["shortNames"] == ["wd"] and listed[PLURAL]["categories"] == ["fsdp"]
    assert listed[PLURAL]["namespaced"] is True and listed[PLURAL]["kind"] == "Widget"
    assert listed[f"{PLURAL}/status"]["verbs"] == ["get", "patch", "update"]
    crd = k8s.get(f"{CRDS}/{PLURAL}.{GROUP}")[1]
    assert {c["type"]: c["status"] for c in crd["status"]["conditions"]}["Established"] == "True"
    assert f"apis/{GROUP}/{VERSION}" in k8s.get("/openapi/v3")[1]["paths"]


def test_create_get_and_errors(k8s: Client) -> None:
    code, created = k8s.post(CM, configmap("one"))
    assert code == 201
    meta = created["metadata"]
    assert meta["uid"] and meta["creationTimestamp"].endswith("Z") and meta["generation"] == 1
    assert k8s.get(f"{CM}/one")[1] == created

    code, status = k8s.post(CM, configmap("one"))
    assert (code, status["kind"], status["reason"]) == (409, "Status", "AlreadyExists")
    assert status["details"] == {"name": "one", "group": "", "kind": "configmaps"}
    code, status = k8s.get(f"{CM}/missing")
    assert (code, status["reason"], status["message"]) == (404, "NotFound", 'configmaps "missing" not found')
    assert k8s.post(CM, configmap("Not_Valid"))[0] == 422
    assert k8s.post("/api/v1/namespaces/nowhere/configmaps", configmap("x"))[1]["message"] == (
        'namespaces "nowhere" not found'
    )

    code, generated = k8s.post(CM, {"metadata": {"generateName": "gen-"}})
    assert code == 201 and generated["metadata"]["name"].startswith("gen-")
    assert len(generated["metadata"]["name"]) == len("gen-") + 5


def test_a_yaml_bodys_aliases_are_stored_as_separate_objects(apiserver: ThreadedApiServer, k8s: Client) -> None:
    # A request's body is stored without a copy; YAML's aliases (`&labels`, `*labels`) name one mapping twice, which
    # JSON cannot, so the server makes them two first: nothing stored is shared with another place.
    body = "metadata: {name: aliased, labels: &labels {a: b}, annotations: *labels}\ndata: {a: '1'}\n"
    response = k8s.session.post(k8s.url + CM, data=body, headers={"Content-Type": "application/yaml"}, timeout=10)
    assert response.status_code == 201, response.text
    stored = apiserver.store.peek(apiserver.store.resource("configmaps"), "aliased", "default")
    assert stored is not None
    assert stored["metadata"]["labels"] == stored["metadata"]["annotations"] == {"a": "b"}
    assert stored["metadata"]["labels"] is not stored["metadata"]["annotations"]


def test_resource_version_is_one_global_counter(k8s: Client) -> None:
    versions = [int(k8s.post(CM, configmap(f"cm{i}"))[1]["metadata"]["resourceVersion"]) for i in range(3)]
    ns = k8s.post("/api/v1/namespaces", {"metadata": {"name": "other"}})[1]
    versions.append(int(ns["metadata"]["resourceVersion"]))
    assert versions == sorted(versions) and len(set(versions)) == 4
    listing = k8s.get(CM)[1]
    assert listing["kind"] == "ConfigMapList" and int(listing["metadata"]["resourceVersion"]) >= versions[-1]


def test_list_selectors(k8s: Client) -> None:
    k8s.post("/api/v1/namespaces", {"metadata": {"name": "other"}})
    k8s.post(CM, configmap("a", app="x", tier="web"))
    k8s.post(CM, configmap("b", app="y"))
    k8s.post(CM, configmap("c"))
    k8s.post("/api/v1/namespaces/other/configmaps", configmap("d", app="x"))

    def names(path: str, **params: str) -> list[str]:
        return [i["metadata"]["name"] for i in k8s.get(path, params=params)[1]["items"]]

    assert names(CM, labelSelector="app=x") == ["a"]
    assert names(CM, labelSelector="app==x,tier=web") == ["a"]
    assert names(CM, labelSelector="app!=x") == ["b", "c"]
    assert names(CM, labelSelector="app in (x, y)") == ["a", "b"]
    assert names(CM, labelSelector="app notin (x)") == ["b", "c"]
    assert names(CM, labelSelector="app") == ["a", "b"]
    assert names(CM, labelSelector="!app") == ["c"]
    assert names("/api/v1/configmaps", labelSelector="app=x") == ["d", "a"] or names(
        "/api/v1/configmaps", labelSelector="app=x"
    ) == ["a", "d"]
    assert names(CM, fieldSelector="metadata.name=b") == ["b"]
    assert names("/api/v1/configmaps", fieldSelector="metadata.namespace=other") == ["d"]
    assert names("/api/v1/configmaps", fieldSelector="metadata.namespace!=other,metadata.name!=a") == ["b", "c"]
    assert k8s.get(CM, params={"fieldSelector": "data.a=1"})[0] == 400

    code, deleted = k8s.delete(CM, params={"labelSelector": "app"})  # deletecollection
    assert code == 200 and [i["metadata"]["name"] for i in deleted["items"]] == ["a", "b"]
    assert names(CM) == ["c"]


def test_put_conflicts_and_generation(widgets: Client) -> None:
    created = widgets.post(WIDGETS, widget("w", replicas=1))[1]
    assert widgets.put(f"{WIDGETS}/w", {**created, "spec": {"replicas": 2}})[0] == 200
    code, status = widgets.put(f"{WIDGETS}/w", {**created, "spec": {"replicas": 3}})  # stale resourceVersion
    assert (code, status["reason"]) == (409, "Conflict")
    current = widgets.get(f"{WIDGETS}/w")[1]
    assert current["spec"]["replicas"] == 2 and current["metadata"]["generation"] == 2

    labelled = widgets.patch(f"{WIDGETS}/w", {"metadata": {"labels": {"a": "b"}}})[1]
    assert labelled["metadata"]["generation"] == 2  # metadata changes do not bump it
    unchanged = widgets.patch(f"{WIDGETS}/w", {"metadata": {"labels": {"a": "b"}}})[1]
    assert unchanged["metadata"]["resourceVersion"] == labelled["metadata"]["resourceVersion"]  # no-op patch
    stale = {"metadata": {"resourceVersion": created["metadata"]["resourceVersion"]}, "spec": {"replicas": 9}}
    assert widgets.patch(f"{WIDGETS}/w", stale)[0] == 409  # a resourceVersion in a patch is a precondition


def test_patch_types(widgets: Client) -> None:
    widgets.post(WIDGETS, widget("w", replicas=1, extra={"keep": 1, "drop": 2}))
    patched = widgets.patch(f"{WIDGETS}/w", {"spec": {"extra": {"drop": None, "new": 3}}})[1]
    assert patched["spec"]["extra"] == {"keep": 1, "new": 3}

    version = patched["metadata"]["resourceVersion"]
    ops = [
        {"op": "test", "path": "/metadata/resourceVersion", "value": version},
        {"op": "replace", "path": "/spec/replicas", "value": 5},
        {"op": "add", "path": "/metadata/finalizers", "value": ["x/y"]},
    ]
    code, patched = widgets.patch(f"{WIDGETS}/w", ops, JSON_PATCH)
    assert code == 200 and patched["spec"]["replicas"] == 5 and patched["metadata"]["finalizers"] == ["x/y"]
    code, status = widgets.patch(f"{WIDGETS}/w", ops, JSON_PATCH)  # the test op now fails
    assert (code, status["reason"]) == (422, "Invalid")
    assert widgets.patch(f"{WIDGETS}/w", [{"op": "remove", "path": "/spec/nothing"}], JSON_PATCH)[0] == 422

    # Strategic merge is for built-in kinds; custom resources answer 415 like the real server.
    assert widgets.patch(f"{WIDGETS}/w", {"spec": {"replicas": 1}}, STRATEGIC)[0] == 415
    pod = {
        "metadata": {"name": "p"},
        "spec": {"containers": [{"name": "a", "image": "x"}, {"name": "b", "image": "y"}]},
    }
    widgets.post(PODS, pod)
    smp = {"spec": {"containers": [{"name": "b", "image": "z"}]}}
    containers = widgets.patch(f"{PODS}/p", smp, STRATEGIC)[1]["spec"]["containers"]
    assert containers == [{"name": "a", "image": "x"}, {"name": "b", "image": "z"}]


def test_status_subresource_split(widgets: Client) -> None:
    created = widgets.post(WIDGETS, {**widget("w"), "status": {"phase": "Bogus"}})[1]
    assert "status" not in created  # status is the controller's: dropped on create
    after_status = widgets.patch(
        f"{WIDGETS}/w/status",
        {"status": {"phase": "Ready"}, "spec": {"replicas": 7}, "metadata": {"labels": {"x": "y"}}},
    )[1]
    assert after_status["status"] == {"phase": "Ready"}
    assert after_status["spec"]["replicas"] == 1 and "labels" not in after_status["metadata"]
    assert after_status["metadata"]["generation"] == 1
    after_main = widgets.patch(f"{WIDGETS}/w", {"status": {"phase": "Lost"}, "spec": {"replicas": 2}})[1]
    assert after_main["status"] == {"phase": "Ready"} and after_main["spec"]["replicas"] == 2
    full = widgets.get(f"{WIDGETS}/w/status")[1]
    assert widgets.put(f"{WIDGETS}/w/status", {**full, "status": {"phase": "Done"}})[1]["status"]["phase"] == "Done"


def test_delete_with_finalizers(apiserver: ThreadedApiServer, widgets: Client) -> None:
    widgets.post(WIDGETS, {**widget("w"), "metadata": {"name": "w", "finalizers": ["a/b", "c/d"]}})
    code, marked = widgets.delete(f"{WIDGETS}/w")
    assert code == 200 and marked["metadata"]["deletionTimestamp"]
    assert widgets.get(f"{WIDGETS}/w")[0] == 200
    code, status = widgets.patch(f"{WIDGETS}/w", {"metadata": {"finalizers": ["a/b", "c/d", "e/f"]}})
    assert code == 422 and "no new finalizers" in status["message"]
    widgets.patch(f"{WIDGETS}/w", {"metadata": {"finalizers": ["c/d"]}})
    assert widgets.get(f"{WIDGETS}/w")[0] == 200
    widgets.patch(f"{WIDGETS}/w", [{"op": "remove", "path": "/metadata/finalizers"}], JSON_PATCH)
    assert widgets.get(f"{WIDGETS}/w")[0] == 404
    assert [e.type for e in apiserver.store.history if e.key == (GROUP, PLURAL)] == [
        "ADDED",
        "MODIFIED",
        "MODIFIED",
        "DELETED",
    ]


def test_garbage_collection_of_dependents(widgets: Client) -> None:
    owner = widgets.post(WIDGETS, widget("owner"))[1]
    ref = {"apiVersion": owner["apiVersion"], "kind": "Widget", "name": "owner", "uid": owner["metadata"]["uid"]}
    widgets.post(CM, {"metadata": {"name": "child", "ownerReferences": [ref]}})
    widgets.post(CM, {"metadata": {"name": "kept", "ownerReferences": [ref]}})
    widgets.patch(f"{CM}/kept", {"metadata": {"finalizers": ["hold/it"]}})
    widgets.delete(f"{WIDGETS}/owner")
    assert widgets.get(f"{CM}/child")[0] == 404
    assert widgets.get(f"{CM}/kept")[1]["metadata"]["deletionTimestamp"]  # its own finalizer holds it

    owner = widgets.post(WIDGETS, widget("owner2"))[1]
    ref = {**ref, "name": "owner2", "uid": owner["metadata"]["uid"]}
    widgets.post(CM, {"metadata": {"name": "orphan", "ownerReferences": [ref]}})
    widgets.delete(f"{WIDGETS}/owner2", params={"propagationPolicy": "Orphan"})
    orphan = widgets.get(f"{CM}/orphan")[1]
    assert "ownerReferences" not in orphan["metadata"]


def test_namespace_deletion_removes_its_objects(k8s: Client) -> None:
    k8s.post("/api/v1/namespaces", {"metadata": {"name": "gone"}})
    k8s.post("/api/v1/namespaces/gone/configmaps", configmap("x"))
    assert k8s.delete("/api/v1/namespaces/gone")[0] == 200
    assert k8s.get("/api/v1/namespaces/gone")[0] == 404
    assert k8s.get("/api/v1/namespaces/gone/configmaps/x")[0] == 404


def test_crd_deletion_removes_the_type(widgets: Client) -> None:
    widgets.post(WIDGETS, widget("w"))
    widgets.delete(f"{CRDS}/{PLURAL}.{GROUP}")
    assert widgets.get(WIDGETS)[0] == 404
    assert widgets.get(f"/apis/{GROUP}/{VERSION}")[0] == 404


def test_schema_pruning_and_validation(widgets: Client) -> None:
    created = widgets.post(WIDGETS, widget("w", unknown="dropped", extra={"free": {"form": 1}}))[1]
    assert "unknown" not in created["spec"] and created["spec"]["extra"] == {"free": {"form": 1}}
    strict = widgets.call(
        "POST",
        WIDGETS + "?fieldValidation=Strict",
        widget("s", unknown=1),
        headers={"Content-Type": "application/json"},
    )
    assert strict[0] == 400 and 'unknown field "spec.unknown"' in strict[1]["message"]
    code, status = widgets.post(WIDGETS, widget("bad", replicas=-1))
    assert (code, status["reason"]) == (422, "Invalid") and "spec.replicas" in status["message"]


def test_watch_semantics(apiserver: ThreadedApiServer, widgets: Client) -> None:
    first = widgets.post(CM, configmap("a"))[1]
    widgets.post(CM, configmap("b"))
    since = first["metadata"]["resourceVersion"]

    # With a resourceVersion: only what happened after it.
    events = list(widgets.watch(CM, resourceVersion=since, timeoutSeconds="0.3"))
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [("ADDED", "b")]

    # Without one: the current state as ADDED events; with sendInitialEvents, then the end-of-initial bookmark.
    initial = widgets.watch(
        CM,
        sendInitialEvents="true",
        allowWatchBookmarks="true",
        resourceVersionMatch="NotOlderThan",
        timeoutSeconds="0.3",
        labelSelector="!skip",
    )
    events = list(initial)
    assert [e["type"] for e in events] == ["ADDED", "ADDED", "BOOKMARK"]
    assert events[-1]["object"]["metadata"]["annotations"] == {"k8s.io/initial-events-end": "true"}

    # Live events, in order, filtered by the selector, ending at timeoutSeconds.
    def writer() -> None:
        time.sleep(0.2)
        widgets.patch(f"{CM}/a", {"data": {"a": "2"}})
        widgets.post(CM, configmap("skipped", skip="yes"))
        widgets.delete(f"{CM}/b")

    thread = threading.Thread(target=writer)
    thread.start()
    started = time.monotonic()
    now = widgets.get(CM)[1]["metadata"]["resourceVersion"]
    events = list(widgets.watch(CM, resourceVersion=now, timeoutSeconds="1", labelSelector="!skip"))
    thread.join()
    assert 0.9 < time.monotonic() - started < 3  # timeoutSeconds ends the stream
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [("MODIFIED", "a"), ("DELETED", "b")]
    versions = [int(e["object"]["metadata"]["resourceVersion"]) for e in events]
    assert versions == sorted(versions) and versions[0] > int(now)


def test_watch_bookmarks_and_expired_versions() -> None:
    with ThreadedApiServer(bookmark_interval=0.2, history_length=3) as api:
        k8s = Client(api.url)
        for i in range(5):
            k8s.post(CM, configmap(f"c{i}"))
        events = list(k8s.watch(CM, resourceVersion="2", timeoutSeconds="1"))
        assert events[0]["type"] == "ERROR" and events[0]["object"]["code"] == 410  # compacted away: relist
        now = k8s.get(CM)[1]["metadata"]["resourceVersion"]
        events = list(k8s.watch(CM, resourceVersion=now, allowWatchBookmarks="true", timeoutSeconds="0.7"))
        assert events and {e["type"] for e in events} == {"BOOKMARK"}
        assert events[0]["object"]["metadata"]["resourceVersion"] == now


def test_server_side_tables(widgets: Client) -> None:
    widgets.post(WIDGETS, widget("w", replicas=4))
    widgets.patch(f"{WIDGETS}/w/status", {"status": {"phase": "Ready"}})
    table = widgets.get(WIDGETS, headers=TABLE)[1]
    assert table["kind"] == "Table" and table["apiVersion"] == "meta.k8s.io/v1"
    assert [c["name"] for c in table["columnDefinitions"]] == ["Name", "Phase", "Replicas", "Age"]
    cells = table["rows"][0]["cells"]
    assert cells[:3] == ["w", "Ready", 4] and cells[3].endswith("s")
    assert table["rows"][0]["object"]["kind"] == "PartialObjectMetadata"
    widgets.post(PODS, {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "x"}]}})
    pods = widgets.get(f"{PODS}/p", headers=TABLE)[1]
    assert [c["name"] for c in pods["columnDefinitions"]][:5] == ["Name", "Ready", "Status", "Restarts", "Age"]
    assert pods["rows"][0]["cells"][:4] == ["p", "0/1", "Pending", "0"]


def test_kubernetes_client_library(apiserver: ThreadedApiServer, tmp_path: Any) -> None:
    from kubernetes import client, config

    api_client = config.new_client_from_config(str(apiserver.write_kubeconfig(tmp_path / "kubeconfig")))
    core = client.CoreV1Api(api_client)
    assert "default" in [ns.metadata.name for ns in core.list_namespace().items]
    custom = client.CustomObjectsApi(api_client)
    client.ApiextensionsV1Api(api_client).create_custom_resource_definition(widget_crd())
    custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, widget("w"))
    custom.patch_namespaced_custom_object_status(GROUP, VERSION, "default", PLURAL, "w", {"status": {"phase": "X"}})
    assert custom.get_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "w")["status"] == {"phase": "X"}
    assert apiserver.count("create", PLURAL, GROUP) == 1 and apiserver.store.created[f"{PLURAL}.{GROUP}"] == 1
    with pytest.raises(client.ApiException) as error:
        custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, widget("w"))
    assert error.value.status == 409
