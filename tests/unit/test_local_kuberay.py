"""The local KubeRay stand-in's pure parts, and the marker that lets it stop every process it started."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from fsdp_operator import render
from fsdp_operator.local.kuberay import _container_env, _cpus, kill_marked, marked_processes
from fsdp_operator.spec import parse_job


def rendered_worker() -> dict[str, object]:
    job = parse_job(
        {"apiVersion": "fsdp.dev/v1alpha1", "kind": "FSDPTrainingJob", "metadata": {"name": "j"}, "spec": {}}
    )
    container: dict[str, object] = render.raycluster(job)["spec"]["workerGroupSpecs"][0]["template"]["spec"][
        "containers"
    ][0]
    return container


def test_container_env_fills_in_the_downward_api_like_a_kubelet() -> None:
    env = _container_env(rendered_worker(), "pod-0", "node-a")
    assert env["POD_NAME"] == "pod-0" and env["NODE_NAME"] == "node-a"
    assert env["FI_PROVIDER"] == "efa" and env["NCCL_DEBUG"] == "INFO"


def test_cpus_come_from_the_limit_and_stand_in_for_gpus() -> None:
    assert _cpus({"resources": {"limits": {"cpu": "2"}}}, 1) == 2
    assert _cpus({"resources": {"limits": {"cpu": "1500m"}}}, 1) == 2
    assert _cpus({"resources": {"limits": {"cpu": "1", "nvidia.com/gpu": "4"}}}, 1) == 4
    assert _cpus({}, 3) == 3


def test_marked_processes_are_found_and_killed() -> None:
    marker = f"FSDP_TEST_MARKER=m{os.getpid()}"
    name, value = marker.split("=")
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env={**os.environ, name: value})
    try:
        deadline = time.monotonic() + 5
        while child.pid not in marked_processes(marker) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert marked_processes(marker) == [child.pid]
        kill_marked(marker)
        assert child.wait(timeout=5) < 0
        assert marked_processes(marker) == []
    finally:
        child.kill()
