"""The watches' copies a job loop reads instead of the API server (`runtime/watched.py`), and when it reads events
about a provisioning cluster (`provisioning.WhyWaiting`)."""

from __future__ import annotations

import asyncio
from typing import Any

from fsdp_operator.decide.observed import ApplyNetworkPolicy, CreateAuthSecret, CreateRayCluster, PostEvent, together
from fsdp_operator.runtime.provisioning import EVENTS_EVERY, WhyWaiting, containers_held
from fsdp_operator.runtime.settings import OperatorConfig
from fsdp_operator.runtime.shared import Runtime
from fsdp_operator.runtime.watched import Watched, _pod_view, not_older
from hypothesis import given
from hypothesis import strategies as st


def job(version: str, uid: str = "u1", phase: str = "") -> dict[str, Any]:
    return {"metadata": {"name": "j", "uid": uid, "resourceVersion": version}, "status": {"phase": phase}}


def watched() -> Watched:
    w = Watched()
    w.jobs_watched = w.clusters_watched = w.pods_watched = True
    return w


def test_resource_versions_compare_as_numbers_only_when_both_are() -> None:
    assert not_older("10", "9") and not_older("9", "9") and not not_older("9", "10")
    assert not_older("b", "b") and not not_older("b", "a") and not not_older("10", "a")


def test_a_job_is_served_only_when_not_older_than_the_loops_own_write() -> None:
    w = watched()
    w.job("ns", "j", job("5"))
    assert w.fresh_job("ns", "j", "", 30) == job("5")  # no write of its own yet
    assert w.fresh_job("ns", "j", "5", 30) == job("5")
    assert w.fresh_job("ns", "j", "6", 30) is None  # the watch has not delivered the loop's write yet
    w.job("ns", "j", job("7"))
    assert w.fresh_job("ns", "j", "6", 30) == job("7")
    w.job("ns", "j", job("6"))  # an older event after a newer read is not taken
    assert w.fresh_job("ns", "j", "6", 30) == job("7")
    w.job("ns", "j", job("3", uid="u2"))  # a new object of the same name replaces it whatever its version
    assert w.fresh_job("ns", "j", "", 30) == job("3", uid="u2")
    assert w.fresh_job("ns", "j", "", -1) is None  # delivered too long ago: read it
    w.job("ns", "j", job("8", uid="u2"), deleted=True)
    assert w.fresh_job("ns", "j", "", 30) is None


def test_nothing_is_served_where_no_watch_feeds_it() -> None:
    w = Watched()
    w.job("ns", "j", job("5"))
    w.cluster("ns", "c", {"metadata": {"name": "c"}})
    assert w.fresh_job("ns", "j", "", 30) is None and w.fresh_cluster("ns", "c", 30) is None


def test_a_cluster_is_served_until_deleted_or_too_old() -> None:
    w = watched()
    body = {"metadata": {"name": "c"}, "status": {"state": "ready"}}
    w.cluster("ns", "c", body)
    assert w.fresh_cluster("ns", "c", 30) == body
    assert w.fresh_cluster("ns", "c", -1) is None
    w.cluster("ns", "c", None)  # a read found none, or the loop deleted it
    assert w.fresh_cluster("ns", "c", 30) is None
    w.cluster("ns", "c", body)
    w.cluster("ns", "c", body, deleted=True)
    assert w.fresh_cluster("ns", "c", 30) is None


def pod(name: str, cluster: str = "c", phase: str = "Pending", message: str = "") -> dict[str, Any]:
    conditions = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}]
    return {
        "metadata": {"name": name, "labels": {"ray.io/cluster": cluster}},
        "status": {"phase": phase, "conditions": conditions if message else []},
    }


def test_pods_are_kept_by_cluster_as_phase_and_conditions() -> None:
    w = watched()
    w.pod("ns", pod("c-head", phase="Running"))
    w.pod("ns", pod("c-w-0"))
    w.pod("ns", pod("d-head", cluster="d"))
    w.pod("ns", {"metadata": {"name": "other"}})  # no cluster label: not a RayCluster's
    assert sorted(p["metadata"]["name"] for p in w.pods("ns", "c")) == ["c-head", "c-w-0"]
    w.pod("ns", pod("c-w-0"), deleted=True)
    assert [p["metadata"]["name"] for p in w.pods("ns", "c")] == ["c-head"]
    assert w.pods("other", "c") == []


class CountingKube:
    def __init__(self, events: list[dict[str, Any]]) -> None:
        self.events = events
        self.calls: list[str] = []

    async def list_events(self, namespace: str, field_selector: str) -> list[dict[str, Any]]:
        self.calls.append(field_selector)
        return self.events

    async def list_pods(self, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        raise AssertionError("pods come from the watch")


CLUSTER = {"metadata": {"name": "c"}, "spec": {"workerGroupSpecs": [{"replicas": 2}]}}
REFUSED = {
    "reason": "FailedToCreateWorkerPod",
    "message": "pods is forbidden",
    "lastTimestamp": "2026-12-03T10:00:00Z",
    "involvedObject": {"kind": "RayCluster", "name": "c"},
}


def test_events_are_read_only_when_they_can_tell_something_and_at_most_once_per_period() -> None:
    async def main() -> None:
        kube = CountingKube([REFUSED])
        rt = Runtime(OperatorConfig(interval=1000.0), kube=kube)  # type: ignore[arg-type]
        rt.watched.pods_watched = True
        why = WhyWaiting()
        for name in ("c-head", "c-w-0", "c-w-1"):
            rt.watched.pod("ns", pod(name, phase="Running"))
        assert await why.read(rt, "ns", CLUSTER) == ("", "", "")
        assert kube.calls == []  # every pod there and none Pending: nothing to look up
        rt.watched.pod("ns", pod("c-w-1"), deleted=True)  # one missing: KubeRay's refusals are read
        assert await why.read(rt, "ns", CLUSTER) == ("", "KubeRay could not create a pod (FailedToCreateWorkerPod): "
                                                         "pods is forbidden", "")  # fmt: skip
        assert len(kube.calls) == 1
        for _ in range(5):  # within the period: the last reading, no request
            assert (await why.read(rt, "ns", CLUSTER))[1].startswith("KubeRay could not create")
        assert len(kube.calls) == 1
        rt.watched.pod("ns", pod("c-w-1", message="0/3 nodes are available"))  # the scheduler's word, from the pod
        assert await why.read(rt, "ns", CLUSTER) == ("pod c-w-1: 0/3 nodes are available", "", "")
        assert len(kube.calls) == 1
        why.read_at -= EVENTS_EVERY * 1000.0  # the period has passed
        rt.watched.pod("ns", pod("c-w-1"))  # Pending without a condition: the scheduler's events are read
        await why.read(rt, "ns", CLUSTER)
        assert kube.calls[1:] == ["involvedObject.kind=Pod,reason=FailedScheduling"]

    asyncio.run(main())


# A worker pod's status as the kubelet writes it while its container crash-loops (`kubectl get pod -o yaml`; the
# waiting message is the kubelet's "back-off ... restarting failed container=... pod=..." text).
CRASH_LOOPING: dict[str, Any] = {
    "metadata": {"name": "c-w-1", "uid": "u1", "labels": {"ray.io/cluster": "c", "ray.io/node-type": "worker"}},
    "spec": {"nodeName": "ip-10-0-1-7"},
    "status": {
        "phase": "Running",
        "conditions": [{"type": "Ready", "status": "False", "reason": "ContainersNotReady"}],
        "containerStatuses": [
            {
                "name": "ray-worker",
                "ready": False,
                "restartCount": 5,
                "image": "public.ecr.aws/deep-learning-containers/ray:train-ml-cuda-v1.1",
                "imageID": "sha256:" + "0" * 64,
                "state": {
                    "waiting": {
                        "reason": "CrashLoopBackOff",
                        "message": "back-off 2m40s restarting failed container=ray-worker pod=c-w-1_ns(u1)",
                    }
                },
                "lastState": {"terminated": {"exitCode": 1, "reason": "Error", "startedAt": "2026-12-05T10:00:00Z"}},
            }
        ],
    },
}


def test_a_container_the_kubelet_holds_back_is_named_with_its_reason_restarts_and_last_exit() -> None:
    """Through the pod watch's view, as a job loop reads it: CrashLoopBackOff with its restarts and last exit, an
    image that cannot be pulled with the kubelet's message; a container still being created is no trouble."""

    async def main() -> None:
        rt = Runtime(OperatorConfig(interval=1000.0), kube=CountingKube([]))  # type: ignore[arg-type]
        rt.watched.pods_watched = True
        for name in ("c-head", "c-w-0"):
            rt.watched.pod("ns", pod(name, phase="Running"))
        rt.watched.pod("ns", CRASH_LOOPING)
        assert (await WhyWaiting().read(rt, "ns", CLUSTER))[2] == (
            "pod c-w-1: container ray-worker CrashLoopBackOff (restarted 5 times, last exit code 1 (Error)): "
            "back-off 2m40s restarting failed container=ray-worker pod=c-w-1_ns(u1)"
        )

    asyncio.run(main())
    pull = {"waiting": {"reason": "ImagePullBackOff", "message": 'Back-off pulling image "ray:nope"'}}
    creating = {"waiting": {"reason": "ContainerCreating"}}
    pods = [{"metadata": {"name": n}, "status": {"containerStatuses": [{"name": "ray-worker", "restartCount": 0,
                                                                        "state": state}]}}
            for n, state in (("c-w-0", creating), ("c-w-1", pull))]  # fmt: skip
    assert (
        containers_held(pods) == 'pod c-w-1: container ray-worker ImagePullBackOff: Back-off pulling image "ray:nope"'
    )
    assert containers_held(pods[:1]) == "" and containers_held([{"metadata": {"name": "x"}}]) == ""


_KEYS = st.sampled_from(["name", "state", "waiting", "reason", "message", "lastState", "terminated", "exitCode",
                         "restartCount", "CrashLoopBackOff"])  # fmt: skip
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 3) | st.sampled_from(["", "CrashLoopBackOff", "ImagePullBackOff"]),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(_KEYS, children, max_size=4),
    max_leaves=12,
)


@given(st.lists(_JSON, max_size=3))
def test_any_container_statuses_through_the_watchs_view_are_read_without_raising(statuses: list[Any]) -> None:
    """Whatever a pod's containerStatuses hold (a watch brings what the API server stored), the reader says a line or
    nothing: never raises."""
    view = _pod_view({"metadata": {"name": "p"}, "status": {"containerStatuses": statuses}})
    said = containers_held([view])
    assert said == "" or said.startswith("pod p: container ")


def test_an_event_is_news_unless_only_versions_field_managers_or_finalizers_changed() -> None:
    """The loop's own status write (its answer held first, then the same object from the watch) and kopf's finalizer
    wake no loop; anything a pass decides from does."""
    w = watched()
    assert w.job("ns", "j", job("5"))  # first delivery
    assert not w.job("ns", "j", job("5"))  # the same object again: the watch event of the loop's own write
    bumped = job("6")
    bumped["metadata"].update(finalizers=["fsdp.dev/finalizer"], managedFields=[{"manager": "kopf"}])
    assert not w.job("ns", "j", bumped)  # kopf added its finalizer
    assert w.job("ns", "j", job("7", phase="Failed"))  # another writer's status
    spec = job("8", phase="Failed")
    spec["spec"] = {"suspend": True}
    assert w.job("ns", "j", spec)
    labelled = job("9", phase="Failed")
    labelled["spec"] = {"suspend": True}
    labelled["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "q"}
    assert w.job("ns", "j", labelled)
    assert not w.job("ns", "j", job("4", phase="Failed"))  # older than what is held: kept out, no news
    assert w.job("ns", "j", job("10", uid="u2"))  # a new object under the name
    assert w.job("ns", "j", job("11", uid="u2"), deleted=True)
    cluster = {"metadata": {"name": "c", "resourceVersion": "1"}, "status": {"state": ""}}
    assert w.cluster("ns", "c", cluster)
    assert not w.cluster("ns", "c", {**cluster, "metadata": {"name": "c", "resourceVersion": "2"}})
    assert w.cluster("ns", "c", {**cluster, "status": {"state": "ready"}})
    assert w.cluster("ns", "c", None)


def test_a_clusters_prerequisites_are_taken_together_and_nothing_else_is() -> None:
    secret = CreateAuthSecret(manifest={})
    policy = ApplyNetworkPolicy(manifest={})
    cluster = CreateRayCluster(manifest={})
    event = PostEvent("Normal", "Creating", "m")
    assert list(together((secret, policy, cluster, event))) == [[secret, policy], [cluster], [event]]
    assert list(together((cluster, secret, event, policy))) == [[cluster], [secret], [event], [policy]]
    assert list(together(())) == []
