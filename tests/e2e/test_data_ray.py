"""The data pipeline under Ray: Ray Data reads and tokenizes in the driver's cluster, workers resume exactly.

The default run's case is test_one_node_ray.py's: Ray Data feeds the bundled loop on a one-node Ray (evaluation,
checkpoints, export). In the `slow` ones here, a worker process is killed (SIGKILL) in the middle of an epoch; Ray
restarts the worker group, which resumes from the last checkpoint. The samples of every step after the restart must
be those of an uninterrupted run of the same job, which runs under torchrun on the same data: the two front ends
share tokenizing, packing and the sampler, so their sample sequences agree step by step.
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
from fsdp_train.contract.events import Event, Failure, Placement, Step, Summary, parse_line
from support.ray_cluster import RAY_TESTS, free_port, local_cluster, ray_available, run_ray_entry
from support.tiny_hf import documents, save_tiny_model, write_jsonl

pytestmark = [pytest.mark.e2e, RAY_TESTS]

KILL_RANK, KILL_STEP, CHECKPOINT_EVERY, STEPS = 1, 5, 3, 8
POLL = {"RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.1"}  # what the operator submits with


@pytest.fixture(scope="module")
def cluster() -> Iterator[str]:
    if not ray_available():
        pytest.skip("the ray command is not installed next to this Python")
    with local_cluster(FSDP_TRAIN_KILL_AT_STEP=f"{KILL_RANK}:{KILL_STEP}") as address:
        yield address


@pytest.fixture(scope="module")
def assets(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_assets(tmp_path_factory.mktemp("assets"))


def make_assets(root: Path) -> Path:
    """A tiny model with its tokenizer, and a corpus of two files of 30 documents each."""
    save_tiny_model(root / "model")
    write_jsonl(root / "corpus" / "part-0.jsonl", [{"text": d} for d in documents(30, seed=1)])
    write_jsonl(root / "corpus" / "part-1.jsonl", [{"text": d} for d in documents(30, seed=2)])
    return root


def train_config(assets: Path, **extra: Any) -> dict[str, Any]:
    return {
        "model": str(assets / "model"),
        "model_init": "pretrained",
        "data": str(assets / "corpus"),
        "shuffle_seed": 3,
        "steps": STEPS,
        "seq_len": 64,
        "batch_size_per_rank": 2,
        "learning_rate": 1e-2,
        "lr_schedule": "constant",
        "mixed_precision": "fp32",
        "probe_size_bytes": 0,
        **extra,
    }


def events_of(output: str) -> list[Event]:
    return [e for e in map(parse_line, output.splitlines()) if e is not None]


# Covered fast: a SIGKILLed Ray Train worker resuming from its checkpoint (test_byo_function's default case),
# the samples after a mid-epoch resume (test_data_torchrun), Ray Data's pipeline (test_one_node_ray.py).
@pytest.mark.slow
@pytest.mark.timeout(900)  # the Ray cluster's start (2 min on a loaded machine), an uninterrupted run and a killed one
def test_a_killed_worker_resumes_mid_epoch_with_the_uninterrupted_sample_sequence(
    cluster: str, assets: Path, tmp_path: Path
) -> None:
    job = {
        "train": train_config(assets, checkpoint_path=str(tmp_path / "ckpt"), checkpoint_interval=CHECKPOINT_EVERY),
        "scaling": {"num_workers": 4, "use_gpu": False, "resources_per_worker": {"CPU": 1}},
        "max_failures": 1,
        "storage_path": str(tmp_path / "storage"),
        "name": "killed",
    }
    proc = run_ray_entry(cluster, job, timeout=400, FSDP_TRAIN_DATA_CACHE=str(tmp_path / "cache"), **POLL)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    events = events_of(proc.stdout)
    assert len([e for e in events if isinstance(e, Placement)]) == 8  # two attempts of four ranks
    # SIGKILL leaves the killed rank no last words; its peers report the broken connection.
    assert KILL_RANK not in {e.rank for e in events if isinstance(e, Failure)}
    assert {e.resumed_from_step for e in events if isinstance(e, Summary)} == {CHECKPOINT_EVERY}
    ray_steps = [e for e in events if isinstance(e, Step)]
    # Steps 4 and 5 ran twice: before the kill, and again after resuming from step 3's checkpoint.
    assert [e.step for e in ray_steps] == [*range(1, KILL_STEP + 1), *range(CHECKPOINT_EVERY + 1, STEPS + 1)]

    # The same job without the kill, under torchrun: same data, same world size.
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=4", "--master-addr=127.0.0.1",
        f"--master-port={free_port()}", "-m", "fsdp_train", "--config-json", json.dumps(train_config(assets)),
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("FSDP_TRAIN_")}
    plain = subprocess.run(
        cmd, env={**env, "OMP_NUM_THREADS": "1", "FSDP_TRAIN_DATA_CACHE": str(tmp_path / "cache2")},
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert plain.returncode == 0, plain.stdout[-3000:] + plain.stderr[-3000:]
    uninterrupted = {e.step: e for e in events_of(plain.stdout) if isinstance(e, Step)}
    resumed = {e.step: e for e in ray_steps[KILL_STEP:]}
    assert sorted(resumed) == list(range(CHECKPOINT_EVERY + 1, STEPS + 1))
    for step, event in resumed.items():
        assert event.samples_digest == uninterrupted[step].samples_digest, step
        assert (event.epoch, event.samples_seen) == (uninterrupted[step].epoch, uninterrupted[step].samples_seen)
        assert abs(event.loss - uninterrupted[step].loss) < 1e-3, (step, event.loss, uninterrupted[step].loss)
    assert {e.epoch for e in resumed.values()} == {0, 1}  # the resumed run crossed an epoch boundary


@pytest.mark.slow  # the causes are unit-tested in test_data.py, the torchrun path in test_data_torchrun
def test_an_unreadable_source_fails_in_the_driver_with_data_unavailable(
    cluster: str, assets: Path, tmp_path: Path
) -> None:
    job = {
        "train": train_config(assets, data=str(tmp_path / "missing.jsonl")),
        "scaling": {"num_workers": 2, "use_gpu": False, "resources_per_worker": {"CPU": 1}},
        "name": "no-data",
    }
    proc = run_ray_entry(cluster, job, timeout=120)
    assert proc.returncode == 1
    failures = [e for e in events_of(proc.stdout) if isinstance(e, Failure)]
    assert [f.reason for f in failures] == ["DataUnavailable"]
    # The driver's preflight names the field and the path, before any rank starts.
    assert f"spec.data.source: {tmp_path / 'missing.jsonl'} not found" in failures[0].message
    assert proc.stderr.strip().splitlines()[-1].startswith("fsdp_train: training failed: DataUnavailable")


@pytest.mark.slow  # the rules are unit-tested in test_data.py; this is Ray Data's path to them
@pytest.mark.parametrize(
    ("rows", "field", "expected"),
    [
        # The field is not in the file at all: Ray Data's reader used to answer "UDF failed to process a data block".
        ([{"text": "the red fox"}] * 4, "conversations", "has no field 'conversations' (fields: text); set data.field"),
        # human/bot roles: no assistant turn, nothing to train on.
        (
            [{"conversations": [{"role": "human", "content": "hi"}, {"role": "bot", "content": "hello"}]}] * 4,
            "conversations",
            "4 of 4 rows, field 'conversations': unknown role 'bot'",
        ),
    ],
)
def test_data_that_cannot_be_trained_on_fails_in_the_driver_naming_file_and_field(
    cluster: str, assets: Path, tmp_path: Path, rows: list[dict[str, Any]], field: str, expected: str
) -> None:
    data = write_jsonl(tmp_path / "chat" / "part-0.jsonl", rows)
    job = {
        "train": train_config(assets, data=str(data.parent), data_field=field, data_kind="chat"),
        "scaling": {"num_workers": 2, "use_gpu": False, "resources_per_worker": {"CPU": 1}},
        "name": "bad-rows",
    }
    proc = run_ray_entry(cluster, job, timeout=180)
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    failures = [e for e in events_of(proc.stdout) if isinstance(e, Failure)]
    assert [f.reason for f in failures] == ["DataUnavailable"], proc.stderr[-2000:]
    assert expected in failures[0].message and str(data) in failures[0].message, failures[0].message
