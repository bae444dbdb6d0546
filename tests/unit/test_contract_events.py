"""The trainer -> operator contract: every event kind and field the ranks print, as the status records it.

Events go over the real wire (`to_line()`, behind the prefix Ray puts before worker output), are parsed by
the operator's reader and folded by one reconcile pass of a Running job. Each event field is either found
in the status at a path written down below, or listed as deliberately not recorded, with the reason; a new
field on either side fails `test_every_event_field_is_accounted_for` until it is placed.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from fsdp_operator.api import schema
from fsdp_operator.decide.observed import RAY_RUNNING, ClusterView, Observed, RayJobInfo
from fsdp_operator.decide.reconcile import reconcile
from fsdp_operator.decide.status import JobStatus
from fsdp_train.contract.events import (
    EVENT_TYPES,
    Checkpoint,
    Evaluation,
    Event,
    Export,
    Failure,
    Interruption,
    Placement,
    Probe,
    Resolved,
    Step,
    Summary,
    Timings,
    Tracking,
    Transport,
    parse_lines,
)
from fsdp_train.contract.health_events import RankHealth, Stall
from support.running_job import NOW, first_attempt_running

CRD = Path(__file__).resolve().parents[2] / "crds" / "fsdptrainingjob.yaml"
EFA_LINE = "NCCL INFO NET/OFI Selected provider is efa, fabric is efa-direct (found 1 nics)"

MANIFEST = {
    "apiVersion": schema.API_VERSION,
    "kind": schema.KIND,
    "metadata": {"name": "qwen", "namespace": "ml", "uid": "u-1", "generation": 1},
    # One worker of one GPU: world size 1, so rank 0's events complete the picture. A model that fits one L4 whole
    # (the default 1.5B's full fine-tuning does not: validation refuses it for memory).
    "spec": {
        "model": {"name": "Qwen/Qwen2.5-0.5B"},
        "workers": {"replicas": 1, "gpusPerWorker": 1, "efaPerWorker": 1},
        "network": {"minCrossNodeBandwidthGBps": 3.5},
        "training": {"steps": 40},
    },
}

# One event of every kind, every field set to a value of its own.
EVENTS: list[Event] = [
    Placement(
        rank=0,
        time=1.5,
        world_size=1,
        local_rank=0,
        local_world_size=1,
        node_rank=0,
        node_ip="10.0.3.7",
        hostname="ip-10-0-3-7",
        pod="qwen-ray-gpu-workers-worker-x7k2p",
        device="NVIDIA L4",
        device_uuid="GPU-1f2e3d4c",
        backend="nccl",
    ),
    Transport(
        rank=0,
        time=2.5,
        transport="efa",
        plugin="Libfabric",
        provider="efa",
        nccl_version="2.29.7",
        ofi_version="1.20.0",
        evidence=EFA_LINE,
        source="/tmp/ray/nccl.host.17.log",
    ),
    Probe(
        rank=0,
        time=3.5,
        scope="cross-node",
        ranks=2,
        size_bytes=67108864,
        allreduce_busbw_gbps=4.12345,
        allgather_busbw_gbps=3.98765,
    ),
    Probe(
        rank=0,
        time=3.6,
        scope="all",
        ranks=8,
        size_bytes=67108864,
        allreduce_busbw_gbps=41.23456,
        allgather_busbw_gbps=39.87654,
    ),
    Step(
        rank=0,
        time=4.5,
        step=39,
        total_steps=40,
        loss=2.345678,
        tokens_per_second=8192.6,
        tokens_per_second_per_device=1024.4,
        mfu=0.412345,
        step_seconds=1.234567,
        peak_memory_bytes=21474836480,
        epoch=2,
        samples_seen=2496,
        tokens_seen=5111808,
        samples_digest="3f9a0c1d2e4b",
        extra={"grad_norm": 0.876543},
    ),
    Evaluation(rank=0, time=4.7, step=39, loss=1.987654, tokens=65000, seconds=2.5),
    Export(
        rank=0,
        time=6.7,
        step=40,
        path="s3://bucket/qwen/model",
        seconds=45.678,
        verified=True,
        training_loss=2.21234,
        export_loss=2.21256,
        check="",
    ),
    Checkpoint(rank=0, time=5.5, step=39, path="s3://bucket/qwen/step_00000039", seconds=12.3456, resumed=True),
    Summary(
        rank=0,
        time=6.5,
        steps=40,
        final_loss=2.2,
        first_loss=11.9,
        tokens_per_second=8100.4,
        mfu=0.40001,
        seconds=321.987,
        sharding="hybrid",
        resumed_from_step=20,
        eval_loss=1.9,
        epochs=3,
        precision="fp8",
        step_seconds=250.456,
        eval_seconds=12.345,
        export_seconds=45.678,
    ),
    Resolved(rank=0, time=5.5, sharding="full", precision="bf16"),
    Timings(
        rank=0,
        time=6.0,
        to_first_step_seconds=29.8878,
        startup_seconds=5.9942,
        probe_seconds=0.3667,
        build_seconds=9.3112,
        first_step_seconds=14.2156,
        compile_cache="cold",
    ),
    Tracking(
        rank=0,
        time=6.2,
        run_id="0a1b2c3d4e5f",
        url="http://mlflow.example:5000/#/experiments/1/runs/0a1b2c3d4e5f",
        problem="ConnectionError: connection refused (3 records not logged so far)",
    ),
    Failure(
        rank=0,
        time=7.5,
        message="RuntimeError: CUDA error: an illegal memory access was encountered",
        reason="CudaError",
    ),
    Interruption(
        rank=0,
        time=8.0,
        step=37,
        saved=True,
        checkpoint_step=37,
        seconds=4.25,
        notice_time=3.5,
        pod="tiny-ray-cpu-workers-worker-00001",
        node="ip-10-0-0-7",
        reason="preStop",
    ),
    RankHealth(
        rank=0,
        time=8.0,
        step=39,
        steps=20,
        step_seconds=1.23456,
        data_seconds=0.01234,
        collective_fraction=0.25,
        samples=480,
        hang_timeout_seconds=300.0,
    ),
]

# A stall ends the attempt (onHang): it is folded in a pass of its own, after the others.
STALL = Stall(
    rank=0,
    time=9.0,
    step=39,
    seconds=31.5,
    where="collective",
    at="train.py:88 in step",
    collective="all_reduce #12 ([1000] Float) entered, #11 completed (group 0 default_pg)",
    stack="train.py:88 in step | distributed_c10d.py:3252 in all_reduce",
    threads=3,
)

# event kind -> field -> where the status keeps it (dotted path), or None with the reason it is not kept.
RECORDED: dict[str, dict[str, str | tuple[None, str]]] = {
    "placement": {
        "rank": "ranks.0.rank",
        "local_rank": "ranks.0.localRank",
        "node_rank": "ranks.0.nodeRank",
        "node_ip": "ranks.0.nodeIP",
        "hostname": "ranks.0.hostname",
        "pod": "ranks.0.pod",
        "device": "ranks.0.device",
        "device_uuid": "ranks.0.deviceUUID",
        "world_size": (None, "the spec's world size is what the status compares against"),
        "local_world_size": (None, "follows from the ranks per node"),
        "backend": (None, "the transport section says what carried the traffic"),
        "time": (None, "the status keeps the operator's times, not the ranks' clocks"),
    },
    "transport": {
        "rank": "transport.ranks.0.rank",
        "transport": "transport.ranks.0.transport",
        "plugin": "transport.ranks.0.plugin",
        "provider": "transport.ranks.0.provider",
        "evidence": "transport.ranks.0.evidence",
        "nccl_version": (None, "diagnostic only: `fsdpctl diagnose nccl` prints it from the logs"),
        "ofi_version": (None, "diagnostic only: `fsdpctl diagnose nccl` prints it from the logs"),
        "source": (None, "a path inside the pod; the evidence line is what a reader needs"),
        "time": (None, "the status keeps the operator's times, not the ranks' clocks"),
    },
    "probe": {
        "rank": "probes.0.rank",
        "scope": "probes.0.scope",
        "ranks": "interconnect.crossNode.ranks",
        "size_bytes": "interconnect.crossNode.sizeBytes",
        "allreduce_busbw_gbps": "interconnect.crossNode.allreduceBusbwGBps",
        "allgather_busbw_gbps": "interconnect.crossNode.allgatherBusbwGBps",
        "time": (None, "the status keeps the operator's times, not the ranks' clocks"),
    },
    "step": {
        "step": "progress.step",
        "total_steps": "progress.totalSteps",
        "loss": "progress.loss",
        "tokens_per_second": "progress.tokensPerSecond",
        "tokens_per_second_per_device": "progress.tokensPerSecondPerDevice",
        "mfu": "progress.mfu",
        "step_seconds": "progress.stepSeconds",
        "peak_memory_bytes": "progress.peakMemoryBytes",
        "epoch": "progress.epoch",
        "samples_seen": "progress.samplesSeen",
        "tokens_seen": "progress.tokensSeen",
        "samples_digest": (None, "a fingerprint of the step's samples, for checking resumes in the log"),
        "extra": "progress.metrics.grad_norm",
        "rank": (None, "only rank 0 reports steps"),
        "time": (None, "the status keeps the operator's times, not the ranks' clocks"),
    },
    "tracking": {
        "run_id": "tracking.runId",
        "url": "tracking.url",
        "problem": "tracking.problem",
        "rank": (None, "one process of the job logs to the tracker"),
        "time": (None, "the status keeps the operator's times, not the ranks' clocks"),
    },
    "evaluation": {
        "step": "progress.evalStep",
        "loss": "progress.evalLoss",
        "tokens": (None, "how many targets the mean is over: diagnostic, in the log"),
        "seconds": (None, "diagnostic, in the log"),
        "rank": (None, "only rank 0 reports the evaluation"),
        "time": (None, "the status keeps the operator's times, not the ranks' clocks"),
    },
    "export": {
        "step": "output.step",
        "path": "output.path",
        "seconds": "output.seconds",
        "verified": "output.verified",
        "training_loss": "output.trainingLoss",
        "export_loss": "output.exportLoss",
        "check": (None, "in output.check only when the self-check failed"),
        "rank": (None, "only rank 0 reports the export"),
        "time": (None, "the status keeps the operator's times, not the ranks' clocks"),
    },
    "checkpoint": {
        "step": "checkpoint.step",
        "path": "checkpoint.path",
        "seconds": "checkpoint.seconds",
        "resumed": "checkpoint.resumed",
        "rank": (None, "only rank 0 reports checkpoints"),
        "time": (None, "the status keeps the operator's times, not the ranks' clocks"),
    },
    "summary": {
        "steps": "result.steps",
        "final_loss": "result.finalLoss",
        "first_loss": "result.firstLoss",
        "tokens_per_second": "result.tokensPerSecond",
        "mfu": "result.mfu",
        "seconds": "result.seconds",
        "sharding": "result.sharding",
        "resumed_from_step": "result.resumedFromStep",
        "eval_loss": "result.evalLoss",
        "epochs": "result.epochs",
        "precision": "result.precision",
        "step_seconds": "result.stepSeconds",
        "eval_seconds": "result.evalSeconds",
        "export_seconds": "result.exportSeconds",
        "rank": (None, "rank 0's summary is the job's result; the others are skipped"),
        "time": (None, "the status keeps the operator's times, not the ranks' clocks"),
    },
    "resolved": {
        "sharding": (None, "MLflow's parameter before the first step; status's result.sharding is the summary's"),
        "precision": (None, "MLflow's parameter before the first step; status's result.precision is the summary's"),
        "rank": (None, "only rank 0 reports what it resolved"),
        "time": (None, "the status keeps the operator's times, not the ranks' clocks"),
    },
    "timings": {
        "to_first_step_seconds": "timings.toFirstStepSeconds",
        "startup_seconds": "timings.startupSeconds",
        "probe_seconds": "timings.probeSeconds",
        "build_seconds": "timings.buildSeconds",
        "first_step_seconds": "timings.firstStepSeconds",
        "compile_cache": "timings.compileCache",
        "rank": (None, "only rank 0 reports its start"),
        "time": (None, "the status keeps the operator's times, not the ranks' clocks"),
    },
    "health": {
        "rank": "health.ranks.0.rank",
        "step": "health.ranks.0.step",
        "steps": "health.ranks.0.steps",
        "step_seconds": "health.ranks.0.stepSeconds",
        "data_seconds": "health.ranks.0.dataSeconds",
        "collective_fraction": "health.ranks.0.collectiveFraction",
        "samples": (None, "how many stack samples the fraction is over: diagnostic, in the log"),
        "hang_timeout_seconds": "health.ranks.0.timeoutSeconds",
        "time": (None, "the later stall's time replaces it in health.ranks.0.reportedAt (orders a rank's lines)"),
    },
    "stall": {
        "rank": "health.suspects.0.rank",
        "step": "health.ranks.0.stalledAtStep",
        "seconds": "health.ranks.0.stalledSeconds",
        "where": "health.ranks.0.where",
        "at": "health.ranks.0.at",
        "collective": "health.ranks.0.collective",
        "stack": "health.ranks.0.stack",
        "threads": (None, "how many threads the stack covers: diagnostic, in the log (faulthandler's dump)"),
        "time": "health.ranks.0.reportedAt",
    },
    "failure": {
        "rank": "rankFailures.0.rank",
        "message": "rankFailures.0.message",
        "reason": "rankFailures.0.reason",
        "time": (None, "the status keeps the operator's times, not the ranks' clocks"),
    },
    "interruption": {
        "step": "interruptions.0.step",
        "saved": "interruptions.0.saved",
        "checkpoint_step": "interruptions.0.checkpointStep",
        "seconds": "interruptions.0.secondsToSaved",
        "notice_time": "interruptions.0.noticeTime",
        "pod": "interruptions.0.pod",
        "node": "interruptions.0.node",
        "reason": "interruptions.0.reason",
        "message": (None, "empty when saved; the reason a notice was too short otherwise"),
        "rank": (None, "the entry names the pod and node, not the rank that reported"),
        "time": (None, "the status keeps the operator's times, not the ranks' clocks"),
    },
}

# The values at those paths, written down (rounded as the status rounds them).
EXPECTED_VALUES: dict[str, Any] = {
    "tracking.runId": "0a1b2c3d4e5f",
    "tracking.url": "http://mlflow.example:5000/#/experiments/1/runs/0a1b2c3d4e5f",
    "tracking.problem": "ConnectionError: connection refused (3 records not logged so far)",
    "ranks.0.rank": 0,
    "ranks.0.localRank": 0,
    "ranks.0.nodeRank": 0,
    "ranks.0.nodeIP": "10.0.3.7",
    "ranks.0.hostname": "ip-10-0-3-7",
    "ranks.0.pod": "qwen-ray-gpu-workers-worker-x7k2p",
    "ranks.0.device": "NVIDIA L4",
    "ranks.0.deviceUUID": "GPU-1f2e3d4c",
    "transport.ranks.0.rank": 0,
    "transport.ranks.0.transport": "efa",
    "transport.ranks.0.plugin": "Libfabric",
    "transport.ranks.0.provider": "efa",
    "transport.ranks.0.evidence": EFA_LINE,
    "probes.0.rank": 0,
    "probes.0.scope": "cross-node",
    "interconnect.crossNode.ranks": 2,
    "interconnect.crossNode.sizeBytes": 67108864,
    "interconnect.crossNode.allreduceBusbwGBps": 4.123,
    "interconnect.crossNode.allgatherBusbwGBps": 3.988,
    "progress.step": 39,
    "progress.totalSteps": 40,
    "progress.loss": 2.3457,
    "progress.tokensPerSecond": 8193,
    "progress.tokensPerSecondPerDevice": 1024,
    "progress.mfu": 0.4123,
    "progress.stepSeconds": 1.2346,
    "progress.peakMemoryBytes": 21474836480,
    "progress.epoch": 2,
    "progress.samplesSeen": 2496,
    "progress.tokensSeen": 5111808,
    "progress.metrics.grad_norm": 0.8765,
    "progress.evalStep": 39,
    "progress.evalLoss": 1.9877,
    "output.step": 40,
    "output.path": "s3://bucket/qwen/model",
    "output.seconds": 45.68,
    "output.verified": True,
    "output.trainingLoss": 2.2123,
    "output.exportLoss": 2.2126,
    "checkpoint.step": 39,
    "checkpoint.path": "s3://bucket/qwen/step_00000039",
    "checkpoint.seconds": 12.35,
    "checkpoint.resumed": True,
    "result.steps": 40,
    "result.finalLoss": 2.2,
    "result.firstLoss": 11.9,
    "result.tokensPerSecond": 8100,
    "result.mfu": 0.4,
    "result.seconds": 321.99,
    "result.sharding": "hybrid",
    "result.resumedFromStep": 20,
    "result.evalLoss": 1.9,
    "result.epochs": 3,
    "result.precision": "fp8",
    "result.stepSeconds": 250.46,
    "result.evalSeconds": 12.35,
    "result.exportSeconds": 45.68,
    "timings.toFirstStepSeconds": 29.89,
    "timings.startupSeconds": 5.99,
    "timings.probeSeconds": 0.37,
    "timings.buildSeconds": 9.31,
    "timings.firstStepSeconds": 14.22,
    "timings.compileCache": "cold",
    "rankFailures.0.rank": 0,
    "rankFailures.0.message": "RuntimeError: CUDA error: an illegal memory access was encountered",
    "rankFailures.0.reason": "CudaError",
    "interruptions.0.step": 37,
    "interruptions.0.saved": True,
    "interruptions.0.checkpointStep": 37,
    "interruptions.0.secondsToSaved": 4.25,
    "interruptions.0.noticeTime": "1970-01-01T00:00:03Z",
    "interruptions.0.pod": "tiny-ray-cpu-workers-worker-00001",
    "interruptions.0.node": "ip-10-0-0-7",
    "interruptions.0.reason": "preStop",
    "health.ranks.0.rank": 0,
    "health.ranks.0.step": 39,
    "health.ranks.0.steps": 20,
    "health.ranks.0.stepSeconds": 1.2346,
    "health.ranks.0.dataSeconds": 0.0123,
    "health.ranks.0.collectiveFraction": 0.25,
    "health.ranks.0.timeoutSeconds": 300.0,
    "health.suspects.0.rank": 0,
    "health.ranks.0.stalledAtStep": 39,
    "health.ranks.0.stalledSeconds": 31.5,
    "health.ranks.0.where": "collective",
    "health.ranks.0.at": "train.py:88 in step",
    "health.ranks.0.collective": "all_reduce #12 ([1000] Float) entered, #11 completed (group 0 default_pg)",
    "health.ranks.0.stack": "train.py:88 in step | distributed_c10d.py:3252 in all_reduce",
    "health.ranks.0.reportedAt": 9.0,
}


def at(path: str, tree: Any) -> Any:
    for part in path.split("."):
        tree = tree[int(part)] if isinstance(tree, list) else tree[part]
    return tree


def running() -> JobStatus:
    return first_attempt_running("qwen-ray", "qwen-5d41402a-1", NOW)


def one_pass(lines: list[str]) -> dict[str, Any]:
    """The status dict after one reconcile pass of a Running job that read `lines` from the Ray job log."""
    observed = Observed(
        now=NOW,
        cluster=ClusterView(name="qwen-ray", state="ready", ready_workers=1, desired_workers=1, owner_uid="u-1"),
        ray_job=RayJobInfo("qwen-5d41402a-1", RAY_RUNNING),
        events=tuple(parse_lines(lines)),
        log_offset=sum(len(line) + 1 for line in lines),
    )
    decision = reconcile(MANIFEST, running(), observed, training_package="/opt/fsdp_train")
    return decision.status.to_dict()


def wire(events: list[Event]) -> list[str]:
    """What the job log holds: Ray's worker prefix, then the line each rank printed."""
    return [f"(RayTrainWorker pid={4000 + e.rank}, ip=10.0.3.7) {e.to_line()}" for e in events]


def test_every_event_kind_is_in_the_sample() -> None:
    assert sorted(type(e).kind for e in [*EVENTS, STALL]) == sorted([*EVENT_TYPES, "probe"])


def test_every_event_field_is_accounted_for() -> None:
    assert set(RECORDED) == set(EVENT_TYPES)
    for kind, cls in EVENT_TYPES.items():
        assert set(RECORDED[kind]) == {f.name for f in dataclasses.fields(cls)}, kind


def test_every_event_field_lands_where_the_table_says() -> None:
    status = one_pass(wire([*EVENTS, STALL]))
    paths = {p for fields in RECORDED.values() for p in fields.values() if isinstance(p, str)}
    assert paths == set(EXPECTED_VALUES)
    for path in sorted(paths):
        assert at(path, status) == EXPECTED_VALUES[path], path
    # The step's loss also goes onto the bounded loss curve, as [step, loss].
    assert status["progress"]["lossHistory"] == [[39, 2.3457]]


def test_the_status_the_events_make_is_valid_against_the_crd() -> None:
    status = one_pass(wire(EVENTS))
    crd = yaml.safe_load(CRD.read_text())
    schema_ = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
    jsonschema.Draft7Validator(schema_, format_checker=jsonschema.FormatChecker()).validate(status)
    # The printer columns read these, typed as the CRD says.
    assert status["transport"]["summary"] == "efa"
    assert status["progress"]["stepOfTotal"] == "39/40"
    assert isinstance(status["progress"]["tokensPerSecond"], int)


def test_the_conditions_the_events_decide() -> None:
    status = one_pass(wire(EVENTS))
    conditions = {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}
    assert conditions == {
        "TransportVerified": ("True", "Verified"),
        "InterconnectHealthy": ("True", "Healthy"),  # 4.123 GB/s against the spec's floor of 3.5
        "JobSubmitted": ("True", "Accepted"),
        "Progressing": ("True", "RanksProgressing"),  # rank 0's health report, no stall
        "TrackingHealthy": ("False", "TrackerUnreachable"),  # a tracker that fails never fails the job
        "Reconciling": ("True", "JobRunning"),  # kstatus: InProgress while the job runs
        "Stalled": ("False", "JobRunning"),
        "Ready": ("False", "JobRunning"),
    }
    assert status["interconnect"]["floorGBps"] == 3.5
    assert status["interconnect"]["allRanks"] == {
        "ranks": 8,
        "sizeBytes": 67108864,
        "allreduceBusbwGBps": 41.235,
        "allgatherBusbwGBps": 39.877,
    }


def test_optional_fields_left_out_are_left_out_of_the_status() -> None:
    bare = [
        Placement(
            rank=0,
            world_size=1,
            local_rank=0,
            local_world_size=1,
            node_rank=0,
            node_ip="10.0.3.7",
            hostname="h",
            pod="",
            device="cpu",
        ),
        Step(rank=0, step=1, total_steps=40, loss=3.0, tokens_per_second=10.0, tokens_per_second_per_device=5.0),
        Summary(rank=0, steps=40, final_loss=2.0, first_loss=3.0, tokens_per_second=10.0),
    ]
    status = one_pass(wire(bare))
    assert "deviceUUID" not in status["ranks"][0]
    assert set(status["progress"]) == {"step", "totalSteps", "stepOfTotal", "loss", "tokensPerSecond",
                                       "tokensPerSecondPerDevice", "lossHistory", "firstStepTime"}  # fmt: skip
    assert set(status["result"]) == {"steps", "firstLoss", "finalLoss", "tokensPerSecond", "seconds"}


@pytest.mark.parametrize(
    "line",
    [
        "FSDP_EVENT {not json",
        'FSDP_EVENT ["a list"]',
        'FSDP_EVENT {"kind":"step","rank":0}',  # required fields missing
        'FSDP_EVENT {"kind":"telemetry","rank":0}',  # a kind this operator does not know
        'FSDP_EVENTS {"kind":"failure","rank":0,"message":"x"}',  # not the prefix
        "",
    ],
)
def test_a_line_the_operator_cannot_read_is_skipped_not_raised(line: str) -> None:
    """The pass goes on: what parses around the bad line is folded, the bad line changes nothing."""
    good = Step(rank=0, step=7, total_steps=40, loss=3.0, tokens_per_second=10.0, tokens_per_second_per_device=5.0)
    status = one_pass([line, *wire([good])])
    assert status["progress"]["step"] == 7 and "rankFailures" not in status


def test_only_rank_zeros_summary_is_the_result() -> None:
    summaries = [
        Summary(rank=0, steps=40, final_loss=2.0, first_loss=3.0, tokens_per_second=10.0),
        Summary(rank=1, steps=40, final_loss=9.0, first_loss=9.5, tokens_per_second=1.0),
    ]
    status = one_pass(wire(summaries))
    assert (status["result"]["finalLoss"], status["result"]["tokensPerSecond"]) == (2.0, 10)
