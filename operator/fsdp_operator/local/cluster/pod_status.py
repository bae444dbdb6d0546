"""The statuses the kubelet writes for the stand-in's Ray pods whose process exited ("Pod Lifecycle",
https://kubernetes.io/docs/concepts/workloads/pods/pod-lifecycle/): pure, so that each shape is read in one place."""

from __future__ import annotations

from typing import Any

Obj = dict[str, Any]


def _not_ready(container: str, now: str, message: str = "") -> Obj:
    message = message or f"containers with unready status: [{container}]"
    return {"type": "Ready", "status": "False", "reason": "ContainersNotReady", "message": message,
            "lastTransitionTime": now}  # fmt: skip


def _exited(code: int | None, now: str) -> Obj:
    return {"exitCode": code if code is not None else 1, "reason": "Error", "finishedAt": now}


def restarted(container: str, code: int | None, restarts: int, now: str) -> Obj:
    """A container that exited and that the kubelet started again (restartPolicy Always, "Container restarts"): the
    pod Running and not Ready until its readiness passes again, the restart counted, the exit its last state."""
    return {
        "phase": "Running",
        "conditions": [_not_ready(container, now)],
        "containerStatuses": [{"name": container, "ready": False, "started": True, "restartCount": restarts,
                               "state": {"running": {"startedAt": now}},
                               "lastState": {"terminated": _exited(code, now)}}],
    }  # fmt: skip


def crash_loop(container: str, code: int | None, restarts: int, message: str, now: str) -> Obj:
    """A container that exited at each of its starts, as the kubelet shows one it keeps restarting: the pod Running
    and not Ready, the container waiting in CrashLoopBackOff with its restarts and last exit."""
    return {
        "phase": "Running",
        "conditions": [_not_ready(container, now)],
        "containerStatuses": [{"name": container, "ready": False, "restartCount": restarts,
                               "state": {"waiting": {"reason": "CrashLoopBackOff", "message": message}},
                               "lastState": {"terminated": _exited(code, now)}}],
    }  # fmt: skip


def failed(container: str, code: int | None, message: str, now: str) -> Obj:
    """A pod whose container ended and is not started again: Failed, not Ready, the container terminated."""
    return {
        "phase": "Failed",
        "conditions": [_not_ready(container, now, message)],
        "containerStatuses": [{"name": container, "ready": False, "restartCount": 0,
                               "state": {"terminated": _exited(code, now)}}],
    }  # fmt: skip
