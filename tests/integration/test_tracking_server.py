"""The trainer's MLflow tracker (`fsdp_train.watch.tracking`) against a real tracking server (`mlflow server`, SQLite
store, served artifacts), read back through MLflow's own client: the default run's case of spec.tracking.

Two attempts of one job log what their rank 0 emits, as the bundled loop's events reach the tracker; the second (a
drained attempt's successor, or a retry) continues the first one's run. The same through `fsdpctl run-local` and
Ray is `slow` (tests/e2e/test_run_local.py's data job, tests/e2e/test_tracking_ray.py).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from fsdp_operator.api import render
from fsdp_operator.api.spec import parse_job
from fsdp_train.contract import events
from fsdp_train.contract.events import (
    Checkpoint,
    Evaluation,
    Export,
    Resolved,
    Step,
    Summary,
    Tracking,
    Transport,
    parse_lines,
)
from fsdp_train.watch import tracking
from support.mlflow_server import Server, mlflow_server
from support.running_job import UID

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]  # a server's start: 25 s on a loaded machine

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "tiny-cpu.yaml"
STEPS, SAVED_AT = 6, 3
"""The first attempt stops after step 3, saved there (a drain); the second trains steps 4 to 6."""


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    with mlflow_server(tmp_path / "mlflow") as running:
        yield running


def entrypoint_config(server: Server, export: Path, attempt: int) -> dict[str, Any]:
    """The entrypoint's config of one attempt of a tracked job, as the operator renders it (`render.submission`)."""
    manifest = yaml.safe_load(EXAMPLE.read_text())
    manifest["metadata"].update(name="tiny", namespace="default", uid=UID, generation=1)
    manifest["spec"]["training"]["steps"] = STEPS
    manifest["spec"]["output"] = {"storage": str(export)}
    manifest["spec"]["sharedVolume"] = {"claimName": "shared", "mountPath": str(export.parent)}  # what the ranks share
    manifest["spec"]["tracking"] = {
        "mlflow": {"trackingUri": server.uri, "experiment": "tests", "registeredModel": "tiny"}
    }
    job = parse_job(manifest)
    return render.submission(job, render.submission_id(job.name, job.uid, attempt), "/opt/fsdp_train").config


def step(n: int) -> Step:
    return Step(rank=0, step=n, total_steps=STEPS, loss=5.0 / n, tokens_per_second=100.0 * n,
                tokens_per_second_per_device=25.0 * n, extra={"grad_norm": 0.5})  # fmt: skip


def attempt(server: Server, export: Path, number: int, emitted: list[events.Event]) -> None:
    """Rank 0 of one attempt: its tracker started as the loop starts it, the events emitted, the tracker closed."""
    config = entrypoint_config(server, export, number)
    tracker = tracking.start(
        config["tracking"],
        config["train"],
        world_size=config["scaling"]["num_workers"],
        rank=0,
        learning_rate=lambda s: 0.001,
        fingerprint=lambda: "0123456789abcdef",
    )
    assert tracker is not None
    for event in emitted:
        events.emit(event)
    tracker.close("FINISHED", timeout=120)
    assert not tracker.problem and not tracker.lost, tracker.problem


def test_two_attempts_continue_one_run_each_step_once_and_the_export_becomes_a_model_version(
    server: Server, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    export = tmp_path / "export"  # spec.output.storage: the final export, as the loop writes it
    export.mkdir()
    (export / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    (export / "model.safetensors").write_bytes(b"\0" * 1024)
    attempt(
        server,
        export,
        1,
        [
            Transport(rank=0, transport="socket"),
            Resolved(rank=0, sharding="hybrid", precision="fp32"),  # what rank 0 resolved, before its first step
            *(step(n) for n in range(1, SAVED_AT + 1)),
            Evaluation(rank=0, step=2, loss=3.0),
            Checkpoint(rank=0, step=SAVED_AT, path=str(tmp_path / "ckpt" / "3")),
        ],
    )
    attempt(
        server,
        export,
        2,
        [
            Resolved(rank=0, sharding="hybrid", precision="fp32"),
            *(step(n) for n in range(SAVED_AT + 1, STEPS + 1)),
            Evaluation(rank=0, step=STEPS, loss=1.5),
            Export(rank=0, step=STEPS, path=str(export)),
            Summary(
                rank=0,
                steps=STEPS,
                final_loss=5.0 / STEPS,
                first_loss=5.0,
                tokens_per_second=300.0,
                sharding="hybrid",
                precision="fp32",
            ),
        ],
    )
    # What the operator reads: each attempt named the same run, the second said it continues it.
    printed = capsys.readouterr().out
    said = [e for e in parse_lines(printed.splitlines()) if isinstance(e, Tracking)]
    assert len({e.run_id for e in said}) == 1 and not any(e.problem for e in said), said
    assert f"tracking continues MLflow run {said[0].run_id}" in printed

    from mlflow.tracking import MlflowClient

    mlflow = MlflowClient(tracking_uri=server.uri, registry_uri=server.uri)
    (experiment,) = [e for e in mlflow.search_experiments() if e.name == "tests"]
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"  # MLflow 3's model-training view
    (run,) = mlflow.search_runs([experiment.experiment_id])  # one run for both attempts
    run_id = run.info.run_id
    assert run_id == said[0].run_id and run.info.status == "FINISHED"
    assert said[0].url == f"{server.uri}/#/experiments/{experiment.experiment_id}/runs/{run_id}"
    assert run.info.run_name == "default/tiny attempt 1" and run.data.tags["fsdp.dev/attempt"] == "2"
    params = run.data.params
    assert params["training.steps"] == "6" and params["training.seqLen"] == "64" and params["world_size"] == "4"
    assert params["model"] == "Qwen/Qwen2.5-1.5B" and params["data.source"] == "random"
    assert params["fingerprint"] == "0123456789abcdef" and params["operator_version"]
    # What ran, named as in the spec: fp32 on CPU ranks, whatever the spec's default says (bf16).
    assert params["training.precision"] == "fp32" and params["training.sharding"] == "hybrid"

    def history(key: str) -> list[tuple[int, float]]:
        return sorted((m.step, m.value) for m in mlflow.get_metric_history(run_id, key))

    assert history("loss") == [(n, 5.0 / n) for n in range(1, STEPS + 1)]  # each step once, across the attempts
    assert [s for s, _ in history("learning_rate")] == [s for s, _ in history("grad_norm")] == list(range(1, 7))
    assert history("eval_loss") == [(2, 3.0), (STEPS, 1.5)]
    assert history("checkpoint_step") == [(SAVED_AT, float(SAVED_AT))]
    assert run.data.tags["nccl.transport.rank0"] == "socket" and run.data.tags["export.uri"] == str(export)
    exported = {a.path for a in mlflow.list_artifacts(run_id, "export")}
    assert exported == {"export/config.json", "export/model.safetensors"}, exported
    (version,) = mlflow.search_model_versions("name='tiny'")
    assert version.run_id == run_id and version.source == f"{run.info.artifact_uri}/export"
    summary = json.loads(Path(mlflow.download_artifacts(run_id, "summary.json", str(tmp_path))).read_text())
    assert summary["steps"] == STEPS and summary["final_loss"] == 5.0 / STEPS
