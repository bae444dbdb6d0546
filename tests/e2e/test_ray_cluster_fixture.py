"""The slow suites' local Ray cluster (tests/support/ray_cluster.py) starts a node again whose `ray start` exited before
the cluster was up, as the kubelet restarts a pod's exited container: on a loaded machine a raylet that does not
register within Ray's 30 s takes its `ray start --block` down, and the cluster then never reached its 3 nodes. A
head that exits takes the whole cluster with it (the workers joined its GCS)."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest
from support import ray_cluster
from support.ray_cluster import RAY_TESTS, local_cluster, ray_available

pytestmark = [pytest.mark.e2e, RAY_TESTS]


@pytest.mark.slow  # a Ray cluster's start: a minute or two of the slow suite's
@pytest.mark.timeout(600)
@pytest.mark.skipif(not ray_available(), reason="ray is not installed")
@pytest.mark.parametrize("node", ["--node-ip-address=127.0.0.2", "--head"], ids=["worker", "head"])
def test_a_node_whose_start_exits_is_started_again(node: str, monkeypatch: pytest.MonkeyPatch) -> None:
    real_popen = subprocess.Popen
    failed: list[list[str]] = []

    def popen(args: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
        if node in args and not failed:
            failed.append(args)
            return real_popen([sys.executable, "-c", "raise SystemExit(1)"], **kwargs)  # its first start fails
        return real_popen(args, **kwargs)

    monkeypatch.setattr(ray_cluster.subprocess, "Popen", popen)
    with local_cluster() as address:
        alive_nodes = "[n['NodeManagerAddress'] for n in ray.nodes() if n['Alive']]"
        probe = f"import json, ray; ray.init(); print(json.dumps({alive_nodes}))"
        out = subprocess.run(
            [sys.executable, "-c", probe], env=ray_cluster.ray_env(RAY_ADDRESS=address), capture_output=True, text=True
        )
    assert failed, f"no start with {node} was made to fail"
    assert out.returncode == 0, out.stderr
    alive = json.loads(out.stdout.strip().splitlines()[-1])
    # Three nodes alive, both workers among them (the head's address is the one Ray reads from the machine).
    assert len(alive) == 3 and {"127.0.0.2", "127.0.0.3"} <= set(alive), alive
