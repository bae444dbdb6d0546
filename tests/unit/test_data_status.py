"""spec.data and spec.output as the operator sees them: validation, the training config, the status the
ranks' data events fold into, and DataUnavailable as a final outcome."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from fsdp_operator.api import generate, render, schema
from fsdp_operator.api.spec import SpecError, parse_job, train_config
from fsdp_operator.decide.observed import Observed, PostEvent, StopJob
from fsdp_operator.decide.reconcile import reconcile
from fsdp_operator.decide.status import JobStatus, Phase, Reason
from fsdp_operator.runtime.rayjobs import RayJobInfo
from fsdp_train.contract.events import Evaluation, Export, Failure, Step, Summary
from support.running_job import first_attempt_running

NOW = datetime(2026, 11, 29, 12, 0, 0, tzinfo=UTC)
NAME, UID = "sft", "u1"


def manifest(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": schema.API_VERSION,
        "kind": schema.KIND,
        "metadata": {"name": NAME, "namespace": "ml", "uid": UID, "generation": 1},
        "spec": {"workers": {"replicas": 2}, **spec},
    }


def problems(**spec: Any) -> list[str]:
    with pytest.raises(SpecError) as e:
        parse_job(manifest(**spec))
    return e.value.problems


def test_data_and_output_reach_the_training_config() -> None:
    job = parse_job(
        manifest(
            data={
                "source": "s3://corpora/chat/",
                "kind": "chat",
                "field": "messages",
                "validationSplit": 0.05,
                "evalEverySteps": 50,
                "shuffleSeed": 7,
                "epochs": 2,
                "tokenizer": "Qwen/Qwen2.5-1.5B-Instruct",
            },
            output={"storage": "s3://models/sft", "everyCheckpoint": True},
        )
    )
    cfg = train_config(job.spec).to_dict()
    assert {k: cfg[k] for k in ("data", "data_kind", "data_field", "validation_split", "eval_every_steps")} == {
        "data": "s3://corpora/chat/",
        "data_kind": "chat",
        "data_field": "messages",
        "validation_split": 0.05,
        "eval_every_steps": 50,
    }
    assert (cfg["shuffle_seed"], cfg["epochs"], cfg["tokenizer"]) == (7, 2, "Qwen/Qwen2.5-1.5B-Instruct")
    assert (cfg["output_path"], cfg["export_every_checkpoint"]) == ("s3://models/sft", True)
    assert render.train_config(job)["data"] == "s3://corpora/chat/"


def test_by_default_the_data_is_random_and_nothing_is_exported() -> None:
    cfg = train_config(parse_job(manifest()).spec).to_dict()
    assert (cfg["data"], cfg["output_path"], cfg["validation_split"]) == ("random", "", 0.0)


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({"data": {"source": "ftp://host/x"}}, "spec.data.source: 'ftp://host/x' has an unsupported scheme"),
        ({"data": {"source": "hf://models/x"}}, "spec.data.source: 'hf://models/x' must be hf://datasets/OWNER/NAME"),
        ({"data": {"source": "/d", "format": "csv"}}, "spec.data.format: 'csv' is not one of jsonl, parquet, text"),
        ({"data": {"source": "/d", "kind": "dpo"}}, "spec.data.kind: 'dpo' is not one of text, chat"),
        ({"data": {"source": "/d", "validationSplit": 0.9}}, "spec.data.validationSplit: must be at most 0.5"),
        ({"data": {"validationSplit": 0.1}}, "spec.data.validationSplit: needs a data source other than random."),
        (
            {"data": {"source": "/d", "validationSplit": 0.1, "validationSource": "/v"}},
            "spec.data.validationSplit: and spec.data.validationSource exclude each other: set one.",
        ),
        ({"data": {"source": "/d", "epochs": -1}}, "spec.data.epochs: must be at least 0"),
        ({"output": {"storage": "models/x"}}, "spec.output.storage: 'models/x' has an unsupported scheme"),
        ({"output": {"everyCheckpoint": True}}, "spec.output.everyCheckpoint: needs spec.output.storage."),
        ({"data": {"source": "/d", "shuffle": True}}, "spec.data.shuffle: unknown field"),
    ],
)
def test_bad_data_and_output_fields_are_named(spec: dict[str, Any], expected: str) -> None:
    found = problems(**spec)
    assert any(p.startswith(expected) for p in found), found


def test_the_crd_has_the_groups_and_the_eval_loss_column() -> None:
    version = generate.crd()["spec"]["versions"][0]
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    assert spec["data"]["properties"]["source"]["default"] == "random"
    assert set(spec["output"]["properties"]) == {"storage", "everyCheckpoint", "merge"}
    columns = {c["name"]: c for c in version["additionalPrinterColumns"]}
    assert columns["Eval Loss"] == {"name": "Eval Loss", "type": "number", "jsonPath": ".status.progress.evalLoss"}


# --- status ------------------------------------------------------------------------------------------------


def running_status() -> JobStatus:
    return first_attempt_running("sft-ray", render.submission_id(NAME, UID, 1), NOW - timedelta(seconds=60))


def observe(*events: Any, ray: str = "RUNNING", message: str = "") -> Observed:
    from fsdp_operator.decide.observed import ClusterView

    view = ClusterView(name="sft-ray", state="ready", ready_workers=2, desired_workers=2, owner_uid=UID)
    info = RayJobInfo(render.submission_id(NAME, UID, 1), ray, message)
    return Observed(now=NOW, cluster=view, ray_job=info, events=events, log_offset=100)


def step(n: int, **extra: Any) -> Step:
    return Step(
        rank=0, step=n, total_steps=40, loss=1.5, tokens_per_second=1000, tokens_per_second_per_device=250, **extra
    )


def test_progress_carries_epoch_samples_tokens_and_the_last_eval_loss() -> None:
    m = manifest(data={"source": "/d", "validationSplit": 0.1})
    events = (
        step(10, epoch=0, samples_seen=80, tokens_seen=5120),
        Evaluation(rank=0, step=10, loss=2.345678, tokens=800),
        step(11, epoch=1, samples_seen=88, tokens_seen=5632),
        Export(rank=0, step=11, path="s3://models/sft", seconds=3.456),
    )
    status = reconcile(m, running_status(), observe(*events), training_package="/pkg").status
    p = status.progress
    assert (p["step"], p["epoch"], p["samplesSeen"], p["tokensSeen"]) == (11, 1, 88, 5632)
    assert (p["evalLoss"], p["evalStep"]) == (2.3457, 10)  # kept across later steps
    assert status.output == {"path": "s3://models/sft", "step": 11, "seconds": 3.46}
    assert status.to_dict()["output"]["path"] == "s3://models/sft"
    assert JobStatus.from_dict(status.to_dict()).output == status.output


def test_random_tokens_add_no_data_fields() -> None:
    status = reconcile(manifest(), running_status(), observe(step(3)), training_package="/pkg").status
    assert not {"epoch", "samplesSeen", "tokensSeen", "evalLoss"} & set(status.progress)


def test_the_summary_reports_the_final_eval_loss_and_epochs() -> None:
    summary = Summary(rank=0, steps=40, final_loss=1.1, first_loss=6.2, tokens_per_second=900, eval_loss=1.25, epochs=3)
    status = reconcile(manifest(), running_status(), observe(summary, ray="SUCCEEDED"), training_package="/pkg").status
    assert (status.result["evalLoss"], status.result["epochs"]) == (1.25, 3)


def test_unreadable_data_fails_at_once_without_retries_and_stops_the_job() -> None:
    m = manifest(data={"source": "s3://corpora/missing"}, runPolicy={"backoffLimit": 3})
    failure = Failure(
        rank=2, message="DataUnavailable: data source s3://corpora/missing does not exist", reason="DataUnavailable"
    )
    decision = reconcile(m, running_status(), observe(failure), training_package="/pkg")
    s = decision.status
    assert (s.phase, s.reason) == (Phase.FAILED, Reason.DATA_UNAVAILABLE)
    assert s.message == "data source s3://corpora/missing does not exist"
    assert s.attempts == 1  # no new attempt: another would read the same source
    assert any(isinstance(a, StopJob) for a in decision.actions)
    posted = [(a.type, a.reason) for a in decision.actions if isinstance(a, PostEvent)]
    assert ("Warning", "DataUnavailable") in posted


def test_the_driver_reporting_data_unavailable_after_ray_failed_is_the_reason_too() -> None:
    m = manifest(data={"source": "/data/x.jsonl"})
    failure = Failure(
        rank=0, message="DataUnavailable: data source /data/x.jsonl does not exist", reason="DataUnavailable"
    )
    status = reconcile(
        m, running_status(), observe(failure, ray="FAILED", message="exit 1"), training_package="/pkg"
    ).status
    assert (status.phase, status.reason) == (Phase.FAILED, Reason.DATA_UNAVAILABLE)


def test_other_failures_keep_their_reason() -> None:
    failure = Failure(rank=1, message="RuntimeError: CUDA out of memory")
    status = reconcile(
        manifest(),
        running_status(),
        observe(failure, ray="FAILED", message="exit 1"),
        training_package="/pkg",
    ).status
    assert status.reason == Reason.RAY_JOB_FAILED


def test_the_summary_lines_tell_the_eval_loss_the_data_and_where_the_model_went() -> None:
    from fsdp_operator.decide.summary import summary_lines

    status = {
        "phase": "Succeeded",
        "progress": {"stepOfTotal": "40/40", "evalLoss": 1.2346, "evalStep": 40, "epoch": 1,
                     "samplesSeen": 320, "tokensSeen": 20480},
        "output": {"path": "s3://models/sft", "step": 40},
    }  # fmt: skip
    lines = summary_lines(status)
    assert "eval loss  1.235 after step 40" in lines  # 4 significant digits
    assert "data       epoch 2, 320 sequences, 20,480 tokens" in lines  # progress.epoch 1 counts from 0
    assert "model      s3://models/sft (step 40)" in lines
