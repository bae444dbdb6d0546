"""The Ray job entrypoint without Ray: its config parser, its one-line errors, its exit codes.

What needs a Ray cluster (`run`, `train_fn_per_worker`) runs in tests/e2e/test_training_ray.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fsdp_train.run import ray_entry
from fsdp_train.run.ray_entry import RayJobConfig, main, one_line


@pytest.fixture(autouse=True)
def keep_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in ray_entry.RAY_LOG_ENV:  # main() sets these for Ray; give the old values back afterwards
        monkeypatch.setenv(key, "unset")


def test_defaults() -> None:
    job = RayJobConfig.from_dict({})
    assert (job.num_workers, job.use_gpu, job.resources_per_worker, job.max_failures) == (1, False, {}, 0)
    assert (job.storage_path, job.name, job.run_storage) == (None, "fsdp-train", None)


def test_a_function_job_names_its_function() -> None:
    job = RayJobConfig.from_dict({"function": {"callable": "pkg.mod:fn", "config": {"a": [1]}, "probe_size_bytes": 8}})
    assert job.function is not None and job.function.to_dict() == {
        "callable": "pkg.mod:fn",
        "code": "",
        "config": {"a": [1]},
        "probe_size_bytes": 8,
    }
    assert RayJobConfig.from_dict({}).function is None


def test_run_storage_prefers_the_storage_path_then_the_checkpoint_path() -> None:
    both = {"train": {"checkpoint_path": "/ckpt"}, "storage_path": "s3://b/run"}
    assert RayJobConfig.from_dict(both).run_storage == "s3://b/run"
    assert RayJobConfig.from_dict({"train": {"checkpoint_path": "/ckpt"}}).run_storage == "/ckpt"
    assert RayJobConfig.from_dict({"storage_path": ""}).storage_path is None


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ([], "the entrypoint config must be a JSON object."),
        ({"scaling": ["num_workers"]}, "scaling must be a mapping."),
        ({"scaling": {"gpus": 1}},
         "scaling.gpus is not a known field (known: num_workers, resources_per_worker, use_gpu)."),
        ({"scaling": {"num_workers": 0}}, "scaling.num_workers must be an integer greater than 0, got 0."),
        ({"scaling": {"num_workers": True}}, "scaling.num_workers must be an integer greater than 0, got True."),
        ({"scaling": {"num_workers": 2.0}}, "scaling.num_workers must be an integer greater than 0, got 2.0."),
        ({"scaling": {"use_gpu": 1}}, "scaling.use_gpu must be true or false, got 1."),
        ({"scaling": {"resources_per_worker": {"CPU": -1}}},
         "scaling.resources_per_worker must map names to numbers, got {'CPU': -1}."),
        ({"scaling": {"resources_per_worker": {"GPU": True}}},
         "scaling.resources_per_worker must map names to numbers, got {'GPU': True}."),
        ({"max_failures": -2}, "max_failures must be an integer of -1 (unlimited) or more, got -2."),
        ({"max_failures": False}, "max_failures must be an integer of -1 (unlimited) or more, got False."),
        ({"storage_path": 3}, "storage_path must be a string or null, got 3."),
        ({"name": 3}, "name must be a string, got 3."),
        ({"train": {"steps": 0}}, "training.steps must be greater than 0."),
        ({"function": {"callable": "train"}}, "function.callable must be 'package.module:function', got 'train'."),
        ({"function": "pkg:fn"}, "function must be a mapping."),
    ],
)  # fmt: skip
def test_every_bad_field_is_named(config: Any, message: str) -> None:
    with pytest.raises(ValueError) as raised:
        RayJobConfig.from_dict(config)
    assert str(raised.value) == message


@pytest.mark.parametrize(
    ("field", "value"),
    [("num_workers", 1), ("resources_per_worker", {"CPU": 0}), ("resources_per_worker", {"GPU": 0.5})],
)
def test_the_smallest_accepted_scaling_values(field: str, value: Any) -> None:
    job = RayJobConfig.from_dict({"scaling": {field: value}})
    assert getattr(job, field) == value


def test_max_failures_accepts_minus_one_for_unlimited() -> None:
    assert RayJobConfig.from_dict({"max_failures": -1}).max_failures == -1


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("boom", "RuntimeError: boom"),
        ("", "RuntimeError"),
        ("Traceback (most recent call last):\n  File x\nValueError: bad value\n\n", "ValueError: bad value"),
        (
            "worker died\nTorchDistributedError: rank 1: RuntimeError: CUDA out of memory\n(pid=3) noise",
            "TorchDistributedError: rank 1: RuntimeError: CUDA out of memory",
        ),
        ("A message: with a colon", "RuntimeError: A message: with a colon"),
        ("KeyboardInterrupt: stopped", "KeyboardInterrupt: stopped"),
        ("  \n first line \nsecond", "RuntimeError: first line"),
    ],
)
def test_one_line_names_the_root_cause(text: str, line: str) -> None:
    assert one_line(RuntimeError(text)) == line


def test_one_line_names_an_errors_own_reason_as_its_failure_event_does() -> None:
    from fsdp_train.run.preflight import PreflightFailed

    missing = PreflightFailed(["spec.data.source: /d.jsonl not found"], reason="DataUnavailable")
    assert one_line(missing) == "DataUnavailable: spec.data.source: /d.jsonl not found"
    assert one_line(PreflightFailed(["spec.model: m not found"])) == "PreflightFailed: spec.model: m not found"


def test_main_reports_an_invalid_config_with_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--config-json", "{not json"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fsdp_train: invalid config: Expecting property name enclosed in double quotes")


def test_main_reports_a_failed_run_with_exit_1_and_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def fails(job: RayJobConfig) -> dict[str, Any]:
        raise RuntimeError("Training failed.\nRayTaskError: rank 0: ValueError: loss is NaN at step 7")

    monkeypatch.setattr(ray_entry, "run", fails)
    assert main(["--config-json", "{}"]) == 1
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last == "fsdp_train: training failed: RayTaskError: rank 0: ValueError: loss is NaN at step 7"


def test_main_prints_the_summary_and_sets_the_log_environment(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import os

    seen: list[dict[str, str]] = []

    def succeeds(job: RayJobConfig) -> dict[str, Any]:
        seen.append({k: os.environ[k] for k in ("RAY_DEDUP_LOGS", "RAY_TRAIN_ENABLE_PRINT_PATCH")})
        return {"steps": 2, "final_loss": 1.5}

    monkeypatch.setattr(ray_entry, "run", succeeds)
    assert main(["--config-json", '{"name": "x"}']) == 0
    assert seen == [{"RAY_DEDUP_LOGS": "0", "RAY_TRAIN_ENABLE_PRINT_PATCH": "0"}]
    assert capsys.readouterr().out == 'fsdp_train: training finished: {"final_loss": 1.5, "steps": 2}\n'


def test_a_missing_data_file_fails_the_driver_in_seconds_naming_the_field(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Before Ray starts and before the tokenizer is fetched (a hub id here, which would take a minute to fail)."""
    import json
    import time

    from fsdp_train.contract.events import Failure, parse_lines

    config = {"train": {"data": str(tmp_path / "gone.jsonl"), "model": "acme/model", "model_init": "pretrained"}}
    started = time.monotonic()
    assert main(["--config-json", json.dumps(config)]) == 1
    assert time.monotonic() - started < 30
    captured = capsys.readouterr()
    (failure,) = [e for e in parse_lines(captured.out.splitlines()) if isinstance(e, Failure)]
    assert failure.reason == "DataUnavailable"
    assert failure.message == f"PreflightFailed: spec.data.source: {tmp_path / 'gone.jsonl'} not found (no such " \
        "file or directory on this node)"  # fmt: skip
    assert "--config-json" not in captured.err and "acme/model" not in captured.err
