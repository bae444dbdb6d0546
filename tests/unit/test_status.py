"""The status shape: conditions, round trips, folding the ranks' events, what gets written and when."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

from fsdp_operator.api import schema
from fsdp_operator.api.spec import Job, parse_job
from fsdp_operator.decide.budget import merge_patch, progress_only
from fsdp_operator.decide.folding import fold_events
from fsdp_operator.decide.status import (
    ConditionType,
    JobStatus,
    Phase,
    Reason,
    get_condition,
    is_terminal,
    set_condition,
)
from fsdp_train.contract.events import (
    Checkpoint,
    Evaluation,
    Event,
    Failure,
    Placement,
    Probe,
    Step,
    Summary,
    Timings,
    Transport,
    parse_lines,
)
from support.running_job import NOW


def job(**network: Any) -> Job:
    spec: dict[str, Any] = {"workers": {"replicas": 2}, "runPolicy": {"maxWorkerRestarts": 3}}
    if network:
        spec["network"] = network
    return parse_job(
        {
            "apiVersion": schema.API_VERSION,
            "kind": schema.KIND,
            "metadata": {"name": "qwen", "namespace": "ml", "uid": "u1", "generation": 3},
            "spec": spec,
        }
    )


def step(n: int, **extra: Any) -> Step:
    return Step(rank=0, step=n, total_steps=100, loss=5.0 - n / 100, tokens_per_second=1000.6 * n,
                tokens_per_second_per_device=125.2 * n, **extra)  # fmt: skip


def test_phases_and_terminal() -> None:
    assert [is_terminal(p) for p in Phase] == [False, False, False, False, True, True, False, False, False]
    assert not is_terminal(None)


def test_condition_transition_time_moves_only_when_status_flips() -> None:
    first = set_condition([], "WorkersReady", "False", "WorkersNotReady", "0/2", now=NOW, generation=1)
    later = NOW + timedelta(seconds=30)
    same = set_condition(first, "WorkersReady", "False", "WorkersNotReady", "1/2", now=later, generation=2)
    assert same[0]["lastTransitionTime"] == "2026-11-29T12:00:00Z" and same[0]["message"] == "1/2"
    assert same[0]["observedGeneration"] == 2
    flipped = set_condition(same, "WorkersReady", "True", "AllWorkersJoined", "2/2", now=later, generation=2)
    assert flipped[0]["lastTransitionTime"] == "2026-11-29T12:00:30Z"
    both = set_condition(flipped, "Validated", "True", "Valid", "", now=NOW, generation=2)
    assert [c["type"] for c in both] == ["WorkersReady", "Validated"] and get_condition(both, "Validated")


def test_round_trip_and_empty_fields_left_out() -> None:
    assert JobStatus().to_dict() == {}
    status = JobStatus(
        phase=Phase.RUNNING,
        reason=Reason.JOB_RUNNING,
        ray_cluster_name="qwen-ray",
        submission_id="qwen-1234-1",
        attempts=1,
        start_time=NOW,
        progress={"step": 1, "stepOfTotal": "1/100"},
    )
    raw = status.to_dict()
    assert raw["startTime"] == "2026-11-29T12:00:00Z" and "endTime" not in raw and "ranks" not in raw
    assert JobStatus.from_dict(raw) == status
    # What someone else wrote by hand does not crash the operator.
    odd = JobStatus.from_dict({"phase": "Exploded", "reason": 7, "attempts": "two", "ranks": ["x", {"rank": 0}]})
    assert odd.phase is None and odd.reason is None and odd.attempts == 0 and odd.ranks == [{"rank": 0}]


def test_printer_columns_read_what_status_writes() -> None:
    status = JobStatus(phase=Phase.RUNNING, reason=Reason.JOB_RUNNING, workers="2/2")
    events = [step(12), Transport(rank=0, transport="efa"), Evaluation(rank=0, step=12, loss=2.5)]
    folded = fold_events(job(), status, events, now=NOW).status
    raw = {"status": folded.to_dict()}
    for column in schema.PRINTER_COLUMNS:
        path = column["jsonPath"].lstrip(".").split(".")
        if path[0] != "status":
            continue
        value: Any = raw
        for part in path:
            value = value[part]
        assert value not in (None, ""), column["name"]
        if column["type"] == "integer":
            assert isinstance(value, int) and not isinstance(value, bool), column["name"]
    assert raw["status"]["progress"]["stepOfTotal"] == "12/100"
    assert raw["status"]["progress"]["tokensPerSecond"] == 12007


def placement(rank: int, node_rank: int) -> Placement:
    return Placement(rank=rank, world_size=8, local_rank=rank % 4, local_world_size=4, node_rank=node_rank,
                     node_ip=f"10.0.0.{node_rank + 1}", hostname=f"host-{node_rank}", pod=f"pod-{node_rank}",
                     device="NVIDIA L4", device_uuid=f"GPU-{rank}")  # fmt: skip


def test_fold_ranks_progress_checkpoint_result_failures() -> None:
    events: list[Event] = [
        placement(4, 1),
        placement(0, 0),
        step(10),
        step(12, mfu=0.41),
        step(11),  # an older line re-read after a restart
        Checkpoint(rank=0, step=12, path="s3://bucket/ckpt/12", seconds=3.21),
        Summary(rank=1, steps=100, final_loss=9.0, first_loss=9.0, tokens_per_second=1),
        Summary(rank=0, steps=100, final_loss=1.5, first_loss=6.0, tokens_per_second=20000.2, mfu=0.4, sharding="full"),
        Failure(rank=2, message="boom"),
        Failure(rank=2, message="boom"),
    ]
    status = fold_events(job(), JobStatus(), events, now=NOW).status
    assert [r["rank"] for r in status.ranks] == [0, 4]
    assert status.ranks[1] == {
        "rank": 4,
        "localRank": 0,
        "nodeRank": 1,
        "nodeIP": "10.0.0.2",
        "pod": "pod-1",
        "hostname": "host-1",
        "device": "NVIDIA L4",
        "deviceUUID": "GPU-4",
    }
    assert status.progress["step"] == 12 and status.progress["mfu"] == 0.41
    assert status.checkpoint == {"step": 12, "path": "s3://bucket/ckpt/12", "seconds": 3.21}
    assert status.result["finalLoss"] == 1.5 and status.result["sharding"] == "full"
    assert status.rank_failures == [{"rank": 2, "message": "boom"}]


def test_fold_is_idempotent_for_a_re_read_log() -> None:
    events: list[Event] = [placement(0, 0), Transport(rank=0, transport="efa"), step(3)]
    once = fold_events(job(), JobStatus(), events, now=NOW).status
    twice = fold_events(job(), once, events, now=NOW).status
    assert twice == once


def test_fold_transport_and_interconnect_through_transport_module() -> None:
    socket = Transport(rank=1, transport="socket", evidence="NET/Socket : Using [0]eth0")
    folded = fold_events(job(), JobStatus(), [Transport(rank=0, transport="efa"), socket], now=NOW)
    assert folded.transport_failure and "NET/Socket" in folded.transport_failure
    assert folded.status.transport["summary"] == "mixed"
    assert folded.status.ranks == [{"rank": 0, "transport": "efa"}, {"rank": 1, "transport": "socket"}]
    assert get_condition(folded.status.conditions, ConditionType.TRANSPORT_VERIFIED)["status"] == "False"  # type: ignore[index]

    lenient = fold_events(job(requireEFA=False), JobStatus(), [socket], now=NOW)
    assert lenient.transport_failure is None

    probe = Probe(rank=0, scope="cross-node", ranks=2, size_bytes=1 << 26, allreduce_busbw_gbps=3.3,
                  allgather_busbw_gbps=2.1)  # fmt: skip
    slow = fold_events(job(), JobStatus(), [probe], now=NOW).status
    assert slow.interconnect["crossNode"]["allreduceBusbwGBps"] == 3.3 and slow.interconnect["floorGBps"] == 5.0
    healthy = get_condition(slow.conditions, ConditionType.INTERCONNECT_HEALTHY)
    assert healthy is not None and healthy["status"] == "False" and healthy["reason"] == "BelowFloor"
    # The probe survives a round trip through the API server and is folded again the same way.
    assert fold_events(job(), JobStatus.from_dict(slow.to_dict()), [], now=NOW).status == slow


def test_events_parsed_from_ray_worker_lines() -> None:
    lines = [
        "(RayTrainWorker pid=123, ip=10.0.0.1) " + step(7).to_line(),
        "some other output",
        "(RayTrainWorker pid=124, ip=10.0.0.2) FSDP_EVENT {broken",
    ]
    status = fold_events(job(), JobStatus(), parse_lines(lines), now=NOW).status
    assert status.progress["stepOfTotal"] == "7/100"


def test_progress_only_and_merge_patch() -> None:
    old = {"phase": "Running", "progress": {"step": 1}, "logOffset": 10, "conditions": [{"type": "A"}]}
    assert progress_only(old, {**old, "progress": {"step": 2}, "logOffset": 20})
    assert not progress_only(old, {**old, "phase": "Succeeded"})
    assert not progress_only(old, {**old, "ranks": [{"rank": 0}]})

    new = {"phase": "Running", "progress": {"step": 2}, "conditions": [{"type": "A"}, {"type": "B"}]}
    patch = merge_patch(old, new)
    assert patch == {"progress": {"step": 2}, "logOffset": None, "conditions": [{"type": "A"}, {"type": "B"}]}
    nested = merge_patch({"transport": {"summary": "efa", "evidence": "x"}}, {"transport": {"summary": "efa"}})
    assert nested == {"transport": {"evidence": None}}
    assert merge_patch(new, new) == {}


def test_non_finite_numbers_never_reach_the_api_server() -> None:
    """A diverged loss or a probe timed at zero is NaN or infinity: JSON has neither, the API server refuses both."""
    nan, inf = float("nan"), float("inf")
    lines = [
        Step(
            rank=0, step=1, total_steps=100, loss=nan, tokens_per_second=inf, tokens_per_second_per_device=nan
        ).to_line(),
        Probe(
            rank=0, scope="cross-node", ranks=2, size_bytes=1, allreduce_busbw_gbps=inf, allgather_busbw_gbps=nan
        ).to_line(),
        Summary(rank=0, steps=0, final_loss=nan, first_loss=nan, tokens_per_second=nan).to_line(),
    ]
    status = fold_events(job(), JobStatus(), list(parse_lines(lines)), now=NOW).status
    json.dumps(status.to_dict(), allow_nan=False)  # raises on NaN or infinity
    # Unknown figures are absent (no field, an empty column), not null, 0 or NaN.
    assert "loss" not in status.progress and "tokensPerSecond" not in status.progress
    assert "finalLoss" not in status.result and "tokensPerSecond" not in status.result


def test_fold_timings_and_precision() -> None:
    events: list[Event] = [
        Timings(
            rank=0,
            to_first_step_seconds=19.2658,
            startup_seconds=6.5214,
            probe_seconds=0.3276,
            build_seconds=10.0476,
            first_step_seconds=2.3693,
            compile_cache="warm",
        ),
        Summary(rank=0, steps=3, final_loss=1.5, first_loss=6.0, tokens_per_second=55603.6, precision="fp8"),
    ]
    status = fold_events(job(), JobStatus(), events, now=NOW).status
    assert status.timings == {
        "toFirstStepSeconds": 19.27,
        "startupSeconds": 6.52,
        "probeSeconds": 0.33,
        "buildSeconds": 10.05,
        "firstStepSeconds": 2.37,
        "compileCache": "warm",
    }
    assert status.result["precision"] == "fp8"
    assert JobStatus.from_dict(status.to_dict()).timings == status.timings


def test_fold_counts_worker_group_restarts_once_each() -> None:
    def placed(rank: int, at: float) -> Placement:
        return Placement(rank=rank, world_size=2, local_rank=0, local_world_size=1, node_rank=rank,
                         node_ip=f"10.0.0.{rank + 1}", hostname="h", pod="p", device="cpu", time=at)  # fmt: skip

    t0 = NOW.timestamp()
    first = [placed(0, t0), placed(1, t0 + 0.2), step(1), step(2)]
    folded = fold_events(job(), JobStatus(), first, now=NOW).status
    assert folded.worker_restarts == 0 and folded.worker_group_start == NOW
    # Ray Train restarted the group 30 s later: rank 0 is placed again, steps resume from a checkpoint.
    again = fold_events(job(), folded, [placed(0, t0 + 30.4), placed(1, t0 + 30.5), step(2)], now=NOW).status
    assert again.worker_restarts == 1 and again.worker_group_start == NOW + timedelta(seconds=30)
    # The same lines read again (an operator restart re-reads from its last written offset): no new count.
    reread = fold_events(job(), JobStatus.from_dict(again.to_dict()), [placed(0, t0 + 30.4)], now=NOW).status
    assert reread.worker_restarts == 1 and reread.to_dict()["workerRestarts"] == 1


def test_without_rank_detail_keeps_the_verdict_and_drops_what_each_rank_reported() -> None:
    from dataclasses import replace

    from fsdp_operator.decide.folding import without_rank_detail

    full = replace(
        JobStatus(phase=Phase.RUNNING, reason=Reason.JOB_RUNNING, progress={"step": 3}, conditions=[{"type": "X"}]),
        ranks=[{"rank": 0}],
        probes=[{"group": "allRanks"}],
        rank_failures=[{"rank": 1}],
        transport={"requested": "efa", "summary": "efa", "fallbackRanks": [], "evidence": "e", "perRank": [{}], "x": 1},
    )
    kept = without_rank_detail(full)
    assert (kept.ranks, kept.probes, kept.rank_failures) == ([], [], [])
    assert kept.transport == {"requested": "efa", "summary": "efa", "fallbackRanks": [], "evidence": "e"}
    assert (kept.phase, kept.reason, kept.progress, kept.conditions) == (
        Phase.RUNNING, Reason.JOB_RUNNING, {"step": 3}, [{"type": "X"}],
    )  # fmt: skip
    assert full.ranks == [{"rank": 0}]  # the original is left as it was


def test_a_rerun_of_a_finished_run_shows_its_step_and_no_invented_figures() -> None:
    """A rerun that resumes at the last step trains none: the table's STEP is where it stands (100/100), the
    losses and the rate are absent (not NaN, not 0), the export time is what the export took."""
    lines = [
        Checkpoint(rank=0, step=100, path="/ckpt", resumed=True).to_line(),
        Summary(
            rank=0, steps=100, final_loss=None, first_loss=None, tokens_per_second=None, resumed_from_step=100,
            export_seconds=3.5,
        ).to_line(),
    ]  # fmt: skip
    status = fold_events(job(), JobStatus(), list(parse_lines(lines)), now=NOW).status.to_dict()
    assert status["progress"] == {"step": 100, "stepOfTotal": "100/100", "totalSteps": 100}
    assert "firstLoss" not in status["result"] and "tokensPerSecond" not in status["result"]
    assert status["result"]["resumedFromStep"] == 100
    text = json.dumps(status)
    assert "NaN" not in text and "null" not in text


def test_the_loss_curve_and_the_first_loss_span_every_attempt() -> None:
    """An attempt interrupted after step 70 that resumes from its step-63 checkpoint: the curve keeps steps 1..63 of
    the first attempt and takes 64..100 from the second (the first's 64..70 replaced), and the first loss is the
    run's step 1, not the second attempt's step 64 (status once covered the last attempt only, MLflow all of it)."""
    from fsdp_operator.decide.status import cleared_run_data

    first = fold_events(job(), JobStatus(attempts=1), [step(n) for n in range(1, 71)], now=NOW).status
    second = cleared_run_data(first)
    assert second.progress == {"lossHistory": first.progress["lossHistory"]} and second.result == {}
    resumed = [step(n, extra={"x": 1.0}) for n in range(64, 101)]
    summary = Summary(rank=0, steps=100, final_loss=4.0, first_loss=5.0 - 64 / 100, tokens_per_second=10.0,
                      resumed_from_step=63)  # fmt: skip
    done = fold_events(job(), second, [*resumed, summary], now=NOW).status
    curve = done.progress["lossHistory"]
    steps = [int(s) for s, _ in curve]
    assert steps[0] == 1 and steps[-1] == 100 and steps == sorted(set(steps)), steps
    assert done.result["firstLoss"] == curve[0][1] == round(5.0 - 1 / 100, 4)
    assert done.progress["step"] == 100
    # A run that never resumed keeps its own summary's first loss.
    fresh = fold_events(job(), JobStatus(attempts=1), [step(1), step(2), summary.__class__(
        rank=0, steps=2, final_loss=4.0, first_loss=4.99, tokens_per_second=10.0)], now=NOW).status  # fmt: skip
    assert fresh.result["firstLoss"] == 4.99
