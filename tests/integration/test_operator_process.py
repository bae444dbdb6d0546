"""`python -m fsdp_operator` as its own process: kubeconfig login, liveness, a reconcile, exit on SIGINT."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
from fsdp_operator.api import generate, render, schema
from fsdp_operator.local.cluster.kuberay import RAYCLUSTER_CRD
from fsdp_operator.local.server import ThreadedApiServer
from support import chart_rbac

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_operator_process_reconciles_and_stops(apiserver: ThreadedApiServer, tmp_path: Path) -> None:
    """The process logs in from a kubeconfig as the chart's ServiceAccount, under the chart's RBAC for one
    namespace (`watchAllNamespaces: false`, `--namespace default`)."""
    access = chart_rbac.secure(apiserver, chart_rbac.rendered_rbac(watch_all=False, watched=("default",)))
    kubeconfig = apiserver.write_kubeconfig(tmp_path / "kubeconfig", user={"token": chart_rbac.OPERATOR_TOKEN})
    http = requests.Session()
    http.headers.update(chart_rbac.ADMIN_AUTH)
    for crd in (generate.crd(), RAYCLUSTER_CRD):
        assert http.post(f"{apiserver.url}/apis/apiextensions.k8s.io/v1/customresourcedefinitions", json=crd).ok
    port, metrics_port = _free_port(), _free_port()
    env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
    command = [sys.executable, "-m", "fsdp_operator", "--namespace", "default", "--liveness",
               f"http://127.0.0.1:{port}/healthz", "--metrics-port", str(metrics_port),
               "--log-format", "json"]  # fmt: skip
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    jobs = f"{apiserver.url}/apis/{schema.GROUP}/{schema.VERSION}/namespaces/default/{schema.PLURAL}"
    try:
        job = {"apiVersion": schema.API_VERSION, "kind": schema.KIND, "metadata": {"name": "proc"}, "spec": {}}
        assert http.post(jobs, json=job).status_code == 201
        deadline = time.monotonic() + 180  # a process started on a loaded 2-core machine: generous, left at the event
        status: dict[str, object] = {}
        while time.monotonic() < deadline and process.poll() is None:
            status = http.get(f"{jobs}/proc").json().get("status") or {}
            if status.get("phase") == "Provisioning":
                break
            time.sleep(0.2)
        assert status.get("phase") == "Provisioning", status
        # Status is written before the pass acts: the Secret, the NetworkPolicy and then the cluster follow.
        cluster_url = f"{apiserver.url}/apis/ray.io/v1/namespaces/default/rayclusters/proc-ray"
        while time.monotonic() < deadline and http.get(cluster_url).status_code == 404:
            time.sleep(0.1)
        cluster = http.get(cluster_url).json()
        assert cluster["metadata"]["labels"][render.LABEL_JOB] == "proc"
        assert http.get(f"http://127.0.0.1:{port}/healthz", timeout=5).status_code == 200
        finalizers = http.get(f"{jobs}/proc").json()["metadata"]["finalizers"]
        assert finalizers == ["fsdp.dev/finalizer"]
        metrics = http.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).text
        assert 'fsdp_jobs{phase="Provisioning"} 1.0' in metrics, metrics
    finally:
        process.send_signal(signal.SIGINT)
        output, _ = process.communicate(timeout=20)
    assert process.returncode == 0, output
    assert access.denied == [] and access.calls_by(chart_rbac.ACCOUNT.name), access.denied
    # --log-format json: every line the operator logs is one JSON object (for log pipelines).
    lines = [line for line in output.splitlines() if line.strip()]
    assert lines and all(json.loads(line).get("message") for line in lines), output[-2000:]
