"""`fsdpctl status JOB`: a job in a cluster (the emulated API server over HTTP) in a few lines and a loss curve."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from fsdp_operator.api import generate, schema
from fsdp_operator.cli.main import main
from fsdp_operator.local.server import ThreadedApiServer

pytestmark = pytest.mark.integration

STATUS = {
    "phase": "Succeeded",
    "reason": "Completed",
    "message": "training finished after 20 steps",
    "ranks": [{"rank": r, "nodeIP": f"127.0.0.{r // 2 + 2}", "nodeRank": r // 2} for r in range(4)],
    "transport": {"summary": "socket", "requested": "socket"},
    "interconnect": {"crossNode": {"allreduceBusbwGBps": 0.412, "allgatherBusbwGBps": 0.391}},
    "progress": {
        "step": 20, "totalSteps": 20, "stepOfTotal": "20/20", "loss": 5.6, "tokensPerSecond": 8068,
        "lossHistory": [[s, round(6.4 - 0.04 * s, 4)] for s in range(1, 21)],
    },
    "result": {"steps": 20, "firstLoss": 6.36, "finalLoss": 5.6, "tokensPerSecond": 8068},
    "dashboardURL": "http://127.0.0.2:8265",
    "conditions": [
        {"type": "Complete", "status": "True", "reason": "Completed", "message": "", "lastTransitionTime": ""},
    ],
}  # fmt: skip


def test_status_shows_the_summary_and_the_loss_curve(
    apiserver: ThreadedApiServer, kubeconfig: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = apiserver.store
    store.create(store.resource("customresourcedefinitions", "apiextensions.k8s.io"), generate.crd())
    jobs = store.resource(schema.PLURAL, schema.GROUP)
    store.create(jobs, {"apiVersion": schema.API_VERSION, "kind": schema.KIND, "metadata": {"name": "tiny"},
                        "spec": {"workers": {"replicas": 2}}}, "default")  # fmt: skip
    store.patch(jobs, "tiny", lambda obj: {**obj, "status": STATUS}, "default", subresource="status")

    assert main(["status", "tiny", "--kubeconfig", str(kubeconfig)]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[:9] == [
        "FSDPTrainingJob default/tiny",
        "phase      Succeeded (Completed: training finished after 20 steps)",
        "ranks      4 on 2 nodes",
        "transport  socket (requested socket)",
        "bandwidth  crossNode: all-reduce 0.412 GB/s, all-gather 0.391 GB/s",
        "steps      20/20",
        "loss       6.36 -> 5.6",
        "tokens/s   8,068 (mean of training steps 2..N); 8,068 (last 10 steps, the table's column)",
        "dashboard  http://127.0.0.2:8265",
    ]
    assert "  Complete  True    Completed" in lines
    assert "loss by step" in out and "┌" in out and ("▀" in out or "▄" in out)

    assert main(["status", "missing", "--kubeconfig", str(kubeconfig)]) == 1
    assert "no FSDPTrainingJob default/missing" in capsys.readouterr().err


def test_status_without_a_cluster_exits_2_without_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["status", "tiny", "--kubeconfig", str(tmp_path / "absent")]) == 2
    err = capsys.readouterr().err
    assert "no usable kubeconfig" in err and "Traceback" not in err
    with ThreadedApiServer() as gone:
        kubeconfig = gone.write_kubeconfig(tmp_path / "kubeconfig")
    assert main(["status", "tiny", "--kubeconfig", str(kubeconfig)]) == 2  # the server is stopped
    err = capsys.readouterr().err
    assert "cannot reach the API server" in err and "Traceback" not in err


def test_status_works_with_the_kubeconfig_run_local_prints(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """run-local's API server under run-local's own access rules (RBAC on, the operator a ServiceAccount): the
    kubeconfig it writes for the person works for the `kubernetes` client too (it answered 401: the client sends the
    kubeconfig's token over plain HTTP, where kubectl sends none and is let in as the anonymous admin)."""
    import asyncio

    import yaml
    from fsdp_operator.local.run import LocalRun

    manifest = yaml.safe_load((Path(__file__).resolve().parents[2] / "examples" / "tiny-cpu.yaml").read_text())
    run = LocalRun(manifest, tmp_path, io.StringIO())

    async def serve() -> None:
        await run.api.start()
        try:
            store = run.api.store
            store.create(store.resource("customresourcedefinitions", "apiextensions.k8s.io"), generate.crd())
            store.create(store.resource(schema.PLURAL, schema.GROUP), manifest, "default")
            store.patch(store.resource(schema.PLURAL, schema.GROUP), "tiny-cpu", lambda obj: {**obj, "status": STATUS},
                        "default", subresource="status")  # fmt: skip
            run.write_kubeconfigs()
            code = await asyncio.to_thread(main, ["status", "tiny-cpu", "--kubeconfig", str(run.kubeconfig)])
            assert code == 0
        finally:
            await run.api.stop()

    asyncio.run(serve())
    assert "phase      Succeeded" in capsys.readouterr().out
