"""The per-rank training loop on CPU, fast: one rank in this process, two ranks as processes of their own
(`support.rank_processes`).

The end-to-end suites run the same loop under torchrun and Ray Train; these run it without either, so
that `make test` covers the loop (events, checkpoints, a failure and its resume, the probe, HSDP) in seconds.
Ranks meet through a `FileStore` in a temporary folder: no port is picked for them.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from fsdp_train.contract.config import TrainConfig
from fsdp_train.contract.events import (
    Checkpoint,
    Event,
    Failure,
    Placement,
    Probe,
    Resolved,
    Step,
    Summary,
    Transport,
    parse_lines,
)
from fsdp_train.models.parallelize import Topology
from fsdp_train.run.loop import FAIL_AT_STEP_ENV, Host, random_tokens, train
from fsdp_train.state.checkpoint import DirectoryCheckpoints
from support.cpu_ranks import CPU_STEPS, printed, run_rank
from support.rank_processes import rank_context

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

TINY = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 256,
}
TRAIN: dict[str, Any] = {
    "model_overrides": TINY,
    "steps": 3,
    **CPU_STEPS,
    "loss_chunk_tokens": 8,
    "probe_size_bytes": 4096,
}
LN_VOCAB = math.log(256)  # a fresh model's loss on uniform random tokens: 5.545


def of(kind: type[Event], events: list[Event]) -> list[Any]:
    return [e for e in events if isinstance(e, kind)]


def test_one_rank_reports_and_trains(one_rank: Topology, capsys: pytest.CaptureFixture[str]) -> None:
    summary = train(TrainConfig.from_dict(TRAIN), one_rank, Host(node_ip="10.1.2.3", env={}))
    events = printed(capsys)
    kinds = ["placement", "transport", "resolved", "step", "timings", "step", "step", "summary"]
    assert [e.kind for e in events] == kinds
    (placement,) = of(Placement, events)
    assert (placement.rank, placement.world_size, placement.node_ip, placement.device, placement.backend) == (
        0, 1, "10.1.2.3", "cpu", "gloo",
    )  # fmt: skip
    (transport,) = of(Transport, events)
    assert (transport.transport, transport.source) == ("socket", "backend:gloo")
    steps = of(Step, events)
    assert [(s.step, s.total_steps) for s in steps] == [(1, 3), (2, 3), (3, 3)]
    assert abs(steps[0].loss - LN_VOCAB) < 0.3
    # 1 rank x 2 samples x 2 micro-batches x 16 tokens per step.
    assert all(s.tokens_per_second > 0 and s.mfu is None for s in steps)
    assert summary["kind"] == "summary" and summary["steps"] == 3 and summary["sharding"] == "full"
    assert summary["final_loss"] == steps[-1].loss and summary["first_loss"] == steps[0].loss
    assert summary["resumed_from_step"] == 0
    assert summary["precision"] == "fp32"  # mixed_precision fp32


def test_a_failure_is_reported_then_the_rerun_resumes_from_the_checkpoint(
    one_rank: Topology, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    cfg = TrainConfig.from_dict(
        {**TRAIN, "steps": 4, "checkpoint_path": str(tmp_path / "ckpt"), "checkpoint_interval": 2}
    )
    host = Host(node_ip="10.1.2.3", checkpointer=DirectoryCheckpoints(cfg.checkpoint_path), env={FAIL_AT_STEP_ENV: "2"})
    with pytest.raises(RuntimeError, match=r"^FSDP_TRAIN_FAIL_AT_STEP=2: injected failure after step 2$"):
        train(cfg, one_rank, host)
    first = printed(capsys)
    assert [e.step for e in of(Step, first)] == [1, 2]
    assert [(c.step, c.path) for c in of(Checkpoint, first)] == [(2, str(tmp_path / "ckpt" / "step_00000002"))]
    (failure,) = of(Failure, first)
    assert failure.message == "RuntimeError: FSDP_TRAIN_FAIL_AT_STEP=2: injected failure after step 2"

    summary = train(cfg, one_rank, host)  # the same injection: a run resumed at step 2 is past it
    again = printed(capsys)
    assert [e.step for e in of(Step, again)] == [3, 4]
    assert [(c.step, c.resumed) for c in of(Checkpoint, again)] == [(2, True), (4, False)]
    assert summary["resumed_from_step"] == 2 and summary["steps"] == 4
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["step_00000002", "step_00000004"]

    # The resumed steps are the steps an uninterrupted run takes: same weights, optimizer state and data.
    train(TrainConfig.from_dict({**TRAIN, "steps": 4}), one_rank, Host(node_ip="10.1.2.3", env={}))
    uninterrupted = {e.step: e.loss for e in of(Step, printed(capsys))}
    for resumed in of(Step, again):
        assert resumed.loss == pytest.approx(uninterrupted[resumed.step], abs=1e-6), resumed.step


def test_a_run_that_fails_before_its_summary_has_told_mlflow_what_it_resolved(
    one_rank: Topology, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """training.precision and training.sharding reach the run as the rank resolved them (fp32 on a CPU, `auto`'s
    pick) before its first step: a run that fails after step 1 has them though it never wrote its summary."""
    from fsdp_train.watch import tracking
    from mlflow.tracking import MlflowClient

    uri = (tmp_path / "mlruns").as_uri()
    names = {"precision": "training.precision", "sharding": "training.sharding"}  # as the operator renders them
    settings = {"uri": uri, "experiment": "e", "run_name": "r", "uid": "u-1", "generation": 1, "param_names": names}
    train_config = {**TRAIN, "sharding": "auto"}
    tracker = tracking.start(settings, train_config, world_size=1, rank=0)
    assert tracker is not None
    host = Host(node_ip="10.1.2.3", env={FAIL_AT_STEP_ENV: "1"})
    with pytest.raises(RuntimeError, match="injected failure after step 1"):
        train(TrainConfig.from_dict(train_config), one_rank, host)
    tracker.close("FAILED")
    events = printed(capsys)
    assert not of(Summary, events) and of(Failure, events)
    (resolved,) = of(Resolved, events)
    assert (resolved.sharding, resolved.precision) == ("full", "fp32")
    run = MlflowClient(tracking_uri=uri).get_run(tracker.run_id)
    assert run.info.status == "FAILED"
    assert (run.data.params["training.precision"], run.data.params["training.sharding"]) == ("fp32", "full")


def test_pretrained_weights_are_loaded(one_rank: Topology, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """``model_init: pretrained`` from a local folder: the first step's loss is the saved model's own loss."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    torch.manual_seed(1)
    saved = AutoModelForCausalLM.from_config(Qwen2Config(**TINY, tie_word_embeddings=True))
    saved.save_pretrained(tmp_path / "tiny")
    cfg = {**TRAIN, "model": str(tmp_path / "tiny"), "model_init": "pretrained", "model_overrides": {}}
    cfg.update(steps=1, grad_accum=1)
    train(TrainConfig.from_dict(cfg), one_rank, Host(node_ip="10.1.2.3", env={}))
    (step,) = of(Step, printed(capsys))
    batch = random_tokens(seed=0, step=1, micro=0, first_sample=0, samples=2, seq_len=16, vocab=256)
    with torch.no_grad():
        want = saved(input_ids=batch, labels=batch).loss.item()
    assert step.loss == pytest.approx(want, abs=1e-5)


def test_the_global_batch_does_not_depend_on_the_number_of_ranks() -> None:
    """Sample i of a step is the same whichever rank draws it: 2 ranks x 2 samples == 1 rank x 4 samples."""
    common = {"seed": 5, "step": 3, "micro": 1, "seq_len": 8, "vocab": 256}
    whole = random_tokens(first_sample=0, samples=4, **common)
    halves = [random_tokens(first_sample=2 * r, samples=2, **common) for r in (0, 1)]
    assert whole.tolist() == halves[0].tolist() + halves[1].tolist()
    assert random_tokens(first_sample=0, samples=1, **{**common, "seed": 6}).tolist() != whole[:1].tolist()


def test_two_nodes_probe_the_link_and_pick_hybrid(tmp_path: Path) -> None:
    """Two ranks, one per node, as processes of their own: both probes, `auto` resolved to HSDP from the probe."""
    train_cfg = {**TRAIN, "sharding": "auto", "min_cross_node_gbps": 1e6}  # no loopback reaches this floor
    ctx = rank_context()
    outs = [tmp_path / f"rank{r}.out" for r in (0, 1)]
    procs = [
        ctx.Process(target=run_rank, args=(r, 2, 1, str(tmp_path / "store"), train_cfg, str(outs[r]))) for r in (0, 1)
    ]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=120)
    assert [proc.exitcode for proc in procs] == [0, 0], [o.read_text()[-2000:] for o in outs if o.exists()]
    rank0, rank1 = (list(parse_lines(o.read_text().splitlines())) for o in outs)

    probes = {p.scope: p for p in of(Probe, rank0)}
    assert probes.keys() == {"all", "cross-node"} and not of(Probe, rank1)  # rank 0 reports for the group
    assert (probes["all"].ranks, probes["cross-node"].ranks) == (2, 2)
    # 4096 bytes: 1024 float32 elements, divisible by the 2 ranks, so the whole buffer is timed.
    assert probes["all"].size_bytes == 4096
    assert all(p.allreduce_busbw_gbps > 0 and p.allgather_busbw_gbps > 0 for p in probes.values())
    placements = of(Placement, rank0) + of(Placement, rank1)
    assert [(p.rank, p.node_rank, p.local_rank, p.node_ip) for p in placements] == [
        (0, 0, 0, "127.0.0.2"),
        (1, 1, 0, "127.0.0.3"),
    ]
    summaries = of(Summary, rank0) + of(Summary, rank1)
    assert [(s.rank, s.sharding, s.steps) for s in summaries] == [(0, "hybrid", 3), (1, "hybrid", 3)]
    assert of(Step, rank1) == []  # only rank 0 reports steps
    assert [s.step for s in of(Step, rank0)] == [1, 2, 3]
    # Tokens per step: every rank's micro-batches, all ranks: 2 ranks x 2 rows x 2 micro-batches x 16 tokens. A
    # step's rate is over the steps since the first (which compiles), the first's over itself.
    logged = of(Step, rank0)
    for step in logged:
        window = [logged[0]] if step.step == 1 else logged[1 : step.step]
        seconds = sum(s.step_seconds for s in window)
        assert step.tokens_per_second * seconds == pytest.approx(2 * 2 * 2 * 16 * len(window))
        assert step.tokens_per_second_per_device == pytest.approx(step.tokens_per_second / 2)


def test_losses_read_a_step_late_are_each_steps_own(one_rank: Topology, capsys: pytest.CaptureFixture[str]) -> None:
    """The loop reads each step's loss and grad norm only after queueing the next step: the logged numbers must
    still be each step's own, as a step read back at once gives them."""
    import torch
    from fsdp_train.run.loop import build, step_figures

    cfg = TrainConfig.from_dict({**TRAIN, "steps": 5})
    assert cfg.max_grad_norm > 0
    train(cfg, one_rank, Host(node_ip="10.1.2.3", env={}))
    logged = [(s.step, s.loss, s.extra["grad_norm"]) for s in of(Step, printed(capsys))]
    model, optimizer, config = build(cfg, one_rank, "full", torch.device("cpu"))
    waited = [
        step_figures(cfg, one_rank, model, optimizer, step, "full", torch.device("cpu"), config.vocab_size).tolist()
        for step in range(1, 6)
    ]
    assert [s for s, _, _ in logged] == [1, 2, 3, 4, 5]
    assert [loss for _, loss, _ in logged] == pytest.approx([loss for loss, _ in waited], abs=1e-6)
    assert [norm for _, _, norm in logged] == pytest.approx([norm for _, norm in waited], rel=1e-5)
    assert len({loss for _, loss, _ in logged}) == 5  # the steps really differ: a shifted read would show
    assert all(norm > 0 for _, _, norm in logged)


def test_an_asynchronous_checkpoint_resumes_exactly(
    one_rank: Topology, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Snapshots written in the background (DCP's async_save) hold the state after their step: a run resumed
    from one takes the steps an uninterrupted run takes."""
    import shutil

    cfg = TrainConfig.from_dict(
        {**TRAIN, "steps": 4, "checkpoint_path": str(tmp_path / "ckpt"), "checkpoint_interval": 2}
    )
    checkpointer = DirectoryCheckpoints(cfg.checkpoint_path, asynchronous=True)
    train(cfg, one_rank, Host(node_ip="10.1.2.3", checkpointer=checkpointer, env={}))
    first = capsys.readouterr().out
    assert [(c.step, c.resumed) for c in of(Checkpoint, list(parse_lines(first.splitlines())))] == [
        (2, False),
        (4, False),
    ]
    # Each snapshot's write is reported once it is complete (the first at the second save, the last at the end).
    assert first.count("fsdp_train: checkpoint of step 2 written in") == 1
    assert first.count("fsdp_train: checkpoint of step 4 written in") == 1
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["step_00000002", "step_00000004"]
    uninterrupted = {e.step: e.loss for e in of(Step, list(parse_lines(first.splitlines())))}

    shutil.rmtree(tmp_path / "ckpt" / "step_00000004")  # as if the run had stopped after step 3
    summary = train(cfg, one_rank, Host(node_ip="10.1.2.3", checkpointer=checkpointer, env={}))
    again = printed(capsys)
    assert summary["resumed_from_step"] == 2
    resumed = of(Step, again)
    assert [s.step for s in resumed] == [3, 4]
    for step in resumed:
        assert step.loss == pytest.approx(uninterrupted[step.step], abs=1e-6), step.step
