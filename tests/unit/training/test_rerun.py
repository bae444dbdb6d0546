"""Reruns on the same checkpoint storage: resume only the same run, say so, and never end with nothing.

One rank in this process (gloo), a tiny Qwen2 from a random init, real checkpoints in a temporary folder.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from fsdp_train.contract.config import TrainConfig
from fsdp_train.contract.events import Checkpoint, Evaluation, Export, Failure, Step, parse_lines
from fsdp_train.models.parallelize import Topology
from fsdp_train.run.loop import FAIL_AT_STEP_ENV, Host, train
from fsdp_train.state.checkpoint import CheckpointMismatch, DirectoryCheckpoints
from support.cpu_ranks import CPU_STEPS, printed
from support.tiny_hf import documents, train_tokenizer, write_jsonl

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

TINY = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4}
TRAIN: dict[str, Any] = {
    "model_overrides": {**TINY, "num_key_value_heads": 2, "vocab_size": 512},
    "steps": 4,
    **CPU_STEPS,
    "probe_size_bytes": 0,
    "checkpoint_interval": 2,
}


def run(cfg: TrainConfig, topo: Topology, env: dict[str, str] | None = None) -> dict[str, Any]:
    checkpointer = DirectoryCheckpoints(cfg.checkpoint_path) if cfg.checkpoint_path else None
    host = Host(node_ip="127.0.0.1", env=env or {})
    if checkpointer is not None:
        host = dataclasses.replace(host, checkpointer=checkpointer)
    return train(cfg, topo, host)


def data_config(tmp_path: Path, **more: Any) -> TrainConfig:
    tokenizer = tmp_path / "tokenizer"
    if not tokenizer.exists():
        train_tokenizer(tokenizer)
        write_jsonl(tmp_path / "corpus.jsonl", [{"text": d} for d in documents(60)])
    return TrainConfig.from_dict(
        {**TRAIN, "tokenizer": str(tokenizer), "data": str(tmp_path / "corpus.jsonl"), "shuffle_seed": 3, **more}
    )


def test_a_rerun_with_another_learning_rate_is_refused_naming_the_field(
    one_rank: Topology, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = TrainConfig.from_dict({**TRAIN, "checkpoint_path": str(tmp_path / "ckpt")})
    run(cfg, one_rank)
    printed(capsys)
    changed = dataclasses.replace(cfg, learning_rate=2e-3)
    with pytest.raises(CheckpointMismatch, match=r"learning_rate: 0\.001 -> 0\.002"):
        run(changed, one_rank)
    events = printed(capsys)
    assert not [e for e in events if isinstance(e, Step)]  # no step trained, no "Succeeded after 4 steps"
    (failure,) = [e for e in events if isinstance(e, Failure)]
    assert "CheckpointMismatch" in failure.message and "checkpoint.storage" in failure.message
    assert failure.reason == "CheckpointMismatch"  # every failure has a reason


def test_a_rerun_of_a_finished_run_says_it_resumed_and_still_exports(
    one_rank: Topology, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = TrainConfig.from_dict(
        {**TRAIN, "checkpoint_path": str(tmp_path / "ckpt"), "output_path": str(tmp_path / "export")}
    )
    run(cfg, one_rank)
    printed(capsys)
    summary = run(cfg, one_rank)  # the same settings: nothing left to train
    out = capsys.readouterr().out
    assert "NaN" not in out and "Infinity" not in out  # no figure on the wire is invented
    events = list(parse_lines(out.splitlines()))
    resumed = [e for e in events if isinstance(e, Checkpoint) and e.resumed]
    assert [(e.step, e.path) for e in resumed] == [(4, str(tmp_path / "ckpt"))]
    (export,) = [e for e in events if isinstance(e, Export)]
    assert export.verified and export.step == 4 and export.path == str(tmp_path / "export")
    assert summary["resumed_from_step"] == 4 and summary["steps"] == 4
    assert (tmp_path / "export" / "model.safetensors").is_file()
    # What this run did: no step trained (no losses, no rate: absent), the export it ran, timed.
    assert summary["first_loss"] is None and summary["final_loss"] is None
    assert summary["tokens_per_second"] is None and summary["mfu"] is None
    assert summary["export_seconds"] > 0 and summary["export_seconds"] == pytest.approx(export.seconds, abs=0.5)


def test_a_rerun_of_a_finished_data_run_evaluates_what_it_exports(
    one_rank: Topology, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = data_config(
        tmp_path,
        checkpoint_path=str(tmp_path / "ckpt"),
        output_path=str(tmp_path / "export"),
        validation_split=0.2,
    )
    first = run(cfg, one_rank)
    printed(capsys)
    again = run(cfg, one_rank)
    events = printed(capsys)
    assert [e.step for e in events if isinstance(e, Evaluation)] == [4]
    assert again["eval_loss"] == pytest.approx(first["eval_loss"], abs=1e-4)  # the same weights, the same rows


def test_resuming_with_gradient_accumulation_continues_the_data_where_it_stopped(
    one_rank: Topology, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A resumed run skips steps x batch x grad_accum samples per rank: its steps train the samples, and reach
    the losses, of an uninterrupted run."""
    cfg = data_config(tmp_path, checkpoint_path=str(tmp_path / "ckpt"))
    with pytest.raises(RuntimeError, match="injected failure after step 2"):
        run(cfg, one_rank, {FAIL_AT_STEP_ENV: "2"})
    printed(capsys)
    run(cfg, one_rank, {FAIL_AT_STEP_ENV: "2"})
    resumed = {e.step: e for e in printed(capsys) if isinstance(e, Step)}
    assert sorted(resumed) == [3, 4]
    run(data_config(tmp_path), one_rank)
    whole = {e.step: e for e in printed(capsys) if isinstance(e, Step)}
    for step in (3, 4):
        assert resumed[step].samples_digest == whole[step].samples_digest, step
        assert resumed[step].samples_seen == whole[step].samples_seen == step * 2 * 2
        assert resumed[step].loss == pytest.approx(whole[step].loss, abs=1e-5)
