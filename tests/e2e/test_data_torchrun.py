"""The data pipeline, pretrained weights and the exported model under real torchrun processes, through S3.

A tiny Qwen2 saved with ``save_pretrained`` and a tokenizer trained here are uploaded to moto's S3 server
on loopback, with a generated JSONL corpus; the job reads all three from ``s3://`` (``AWS_ENDPOINT_URL``),
checkpoints there and exports there. A second run resumes from the first run's mid-epoch checkpoint.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fsdp_train.contract.events import Checkpoint, Evaluation, Event, Export, Failure, Step, Summary, parse_line
from support.s3 import S3, free_port, moto_s3
from support.tiny_hf import documents, save_tiny_model, write_jsonl

pytestmark = pytest.mark.e2e

STEPS = 10
CHECKPOINT_EVERY = 5


def torchrun(cfg: dict[str, Any], env: dict[str, str], nproc: int = 2) -> subprocess.CompletedProcess[str]:
    cmd = [
        sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}", "--master-addr=127.0.0.1",
        f"--master-port={free_port()}", "-m", "fsdp_train", "--config-json", json.dumps(cfg),
    ]  # fmt: skip
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("FSDP_TRAIN_", "NCCL_"))}
    return subprocess.run(
        cmd, env={**clean, "OMP_NUM_THREADS": "1", **env}, capture_output=True, text=True, timeout=240, check=False
    )


def events_of(output: str) -> list[Event]:
    return [e for e in map(parse_line, output.splitlines()) if e is not None]


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3]:
    local = tmp_path_factory.mktemp("assets")
    with moto_s3() as server:
        server.upload(save_tiny_model(local / "model"), "models/tiny")
        # 60 documents (54 after the validation split) pack into 4 steps of 8 sequences of 64 tokens per
        # epoch: the checkpoint after step 5 is in the middle of the second epoch, and the resumed run
        # crosses into the third.
        server.upload(write_jsonl(local / "corpus.jsonl", [{"text": d} for d in documents(60)]), "corpus/a.jsonl")
        yield server


def config(s3: S3, run: str) -> dict[str, Any]:
    return {
        "model": f"s3://{s3.bucket}/models/tiny",
        "model_init": "pretrained",
        "data": f"s3://{s3.bucket}/corpus",
        "validation_split": 0.1,
        "eval_every_steps": 5,
        "shuffle_seed": 7,
        "steps": STEPS,
        "seq_len": 64,
        "batch_size_per_rank": 2,
        "grad_accum": 2,
        "learning_rate": 1e-2,
        "lr_schedule": "constant",
        "mixed_precision": "fp32",
        "probe_size_bytes": 0,
        "checkpoint_path": f"s3://{s3.bucket}/{run}/ckpt",
        "checkpoint_interval": CHECKPOINT_EVERY,
        "output_path": f"s3://{s3.bucket}/{run}/model",
    }


@pytest.fixture(scope="module")
def first_run(s3: S3, tmp_path_factory: pytest.TempPathFactory) -> list[Event]:
    cache = tmp_path_factory.mktemp("cache")
    proc = torchrun(
        config(s3, "a"), {**s3.env, "FSDP_TRAIN_DATA_CACHE": str(cache), "FSDP_TRAIN_MODEL_CACHE": str(cache)}
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return events_of(proc.stdout)


def steps_of(events: list[Event]) -> dict[int, Step]:
    return {e.step: e for e in events if isinstance(e, Step)}


def test_a_data_job_trains_evaluates_checkpoints_and_exports_through_s3(s3: S3, first_run: list[Event]) -> None:
    steps = steps_of(first_run)
    assert sorted(steps) == list(range(1, STEPS + 1))
    assert [steps[s].epoch for s in sorted(steps)] == [0, 0, 0, 0, 1, 1, 1, 1, 2, 2]
    assert steps[STEPS].samples_seen == STEPS * 8 and steps[STEPS].tokens_seen == STEPS * 8 * 64
    evals = [e for e in first_run if isinstance(e, Evaluation)]
    assert [e.step for e in evals] == [5, 10] and all(0 < e.loss < 10 and e.tokens > 0 for e in evals)
    assert [e.step for e in first_run if isinstance(e, Checkpoint)] == [5, 10]
    exports = [e for e in first_run if isinstance(e, Export)]
    assert [(e.step, e.path) for e in exports] == [(STEPS, f"s3://{s3.bucket}/a/model")]
    summary = next(e for e in first_run if isinstance(e, Summary) and e.rank == 0)
    assert summary.eval_loss == evals[-1].loss
    names = {key.rsplit("/", 1)[-1] for key in s3.keys("a/model/")}
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json"} <= names


@pytest.mark.slow  # the fast ground: test_data.py's restored position, test_rerun.py, test_notice.py (docs/testing.md)
def test_a_run_resumed_mid_epoch_trains_the_same_samples_as_the_uninterrupted_one(
    s3: S3, first_run: list[Event], tmp_path: Path
) -> None:
    # Run b starts from run a's checkpoint after step 5 (the first step of epoch 1).
    s3.copy_prefix("a/ckpt/step_00000005", "b/ckpt/step_00000005")
    proc = torchrun(config(s3, "b"), {**s3.env, "FSDP_TRAIN_DATA_CACHE": str(tmp_path)})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    resumed = events_of(proc.stdout)
    assert {e.resumed_from_step for e in resumed if isinstance(e, Summary)} == {CHECKPOINT_EVERY}
    before, after = steps_of(first_run), steps_of(resumed)
    assert sorted(after) == list(range(CHECKPOINT_EVERY + 1, STEPS + 1))
    for step in after:
        assert after[step].samples_digest == before[step].samples_digest, step
        assert after[step].epoch == before[step].epoch and after[step].samples_seen == before[step].samples_seen
        assert abs(after[step].loss - before[step].loss) < 1e-4, (step, after[step].loss, before[step].loss)
    # Every sample of an epoch trains once: the digests of one epoch's steps are all different.
    assert len({s.samples_digest for s in before.values()}) == STEPS


@pytest.mark.slow  # the driver's path is in test_data_ray; the causes are unit-tested in test_data.py
def test_an_unreadable_source_fails_at_once_with_data_unavailable(s3: S3, tmp_path: Path) -> None:
    cfg = {**config(s3, "c"), "data": f"s3://{s3.bucket}/no-such-prefix", "model_init": "random",
           "model": "Qwen/Qwen2.5-1.5B", "tokenizer": f"s3://{s3.bucket}/models/tiny"}  # fmt: skip
    proc = torchrun(cfg, {**s3.env, "FSDP_TRAIN_DATA_CACHE": str(tmp_path), "FSDP_TRAIN_MODEL_CACHE": str(tmp_path)})
    assert proc.returncode != 0
    failures = [e for e in events_of(proc.stdout) if isinstance(e, Failure)]
    assert {f.rank for f in failures} == {0, 1}
    assert {f.reason for f in failures} == {"DataUnavailable"}
    assert all(f"s3://{s3.bucket}/no-such-prefix does not exist" in f.message for f in failures)
    assert not any(isinstance(e, Step) for e in events_of(proc.stdout))
