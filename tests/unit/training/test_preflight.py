"""Preflight: what a job needs is checked in seconds, every problem at once, each naming its field.

Real directories, a real hub client against a real HTTP server on loopback (a hub that answers "no such
repository") and against a closed port (a hub that cannot be reached).
"""

from __future__ import annotations

import http.server
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from fsdp_operator.cli.main import main
from fsdp_train.contract.config import TrainConfig
from fsdp_train.run.preflight import data_problems, function_problems, job_problems, model_problems

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = ROOT / "examples"


def config(**more: Any) -> TrainConfig:
    return TrainConfig.from_dict({"steps": 2, "seq_len": 16, "batch_size_per_rank": 1, **more})


def no_hub(repo: str, wanted: str) -> str:
    raise AssertionError(f"the hub was asked about {repo} ({wanted})")


def test_a_missing_code_directory_and_a_missing_package_are_named(tmp_path: Path) -> None:
    assert function_problems("tinygpt.train:train_func", str(tmp_path / "gone")) == [
        f"spec.trainFunction.code: {tmp_path / 'gone'} not found (no such directory on this node)"
    ]
    (tmp_path / "other").mkdir()
    (problem,) = function_problems("tinygpt.train:train_func", str(tmp_path))
    assert problem.startswith("spec.trainFunction.callable: no package or module 'tinygpt'")
    (tmp_path / "tinygpt").mkdir()
    assert function_problems("tinygpt.train:train_func", str(tmp_path)) == []
    assert function_problems("tinygpt.train:f", "s3://bucket/code.zip") == []  # Ray fetches it
    (problem,) = function_problems("no_such_package_anywhere.m:f", "")
    assert "no module 'no_such_package_anywhere' is installed here" in problem


def test_every_problem_at_once_the_data_file_first(tmp_path: Path) -> None:
    cfg = config(data=str(tmp_path / "corpus.jsonl"), model=str(tmp_path / "model"), model_init="pretrained")
    problems = job_problems(cfg, hub=no_hub)
    assert problems == [
        f"spec.data.source: {tmp_path / 'corpus.jsonl'} not found (no such file or directory on this node)",
        f"spec.model.name: {tmp_path / 'model'} not found (no such directory on this node)",
    ]
    (tmp_path / "model").mkdir()
    (tmp_path / "corpus.jsonl").write_text('{"text": "a"}\n')
    problems = job_problems(cfg, hub=no_hub)
    assert problems == [
        f"spec.model.name (the tokenizer: spec.data.tokenizer is empty): {tmp_path / 'model'} holds no tokenizer "
        "(tokenizer.json, tokenizer_config.json, tokenizer.model, vocab.json)",
        f"spec.model.name: {tmp_path / 'model'} holds no config.json (a save_pretrained directory has one)",
    ]


def test_a_missing_data_file_is_named_even_when_the_hub_is_asked(tmp_path: Path) -> None:
    asked: list[str] = []

    def hub(repo: str, wanted: str) -> str:
        asked.append(repo)
        return f"{repo}: hub unreachable from this node (ConnectError: down) and not in its cache"

    cfg = config(data=f"file://{tmp_path}/gone.jsonl", model="Qwen/Qwen2.5-0.5B", model_init="pretrained")
    problems = job_problems(cfg, hub=hub)
    assert problems[0].startswith(f"spec.data.source: file://{tmp_path}/gone.jsonl not found")
    assert problems[1] == "spec.model.name: Qwen/Qwen2.5-0.5B: hub unreachable from this node (ConnectError: down) " \
        "and not in its cache"  # fmt: skip
    assert len(problems) == 2 and asked == ["Qwen/Qwen2.5-0.5B"]  # one question, one line
    assert all("--config-json" not in p for p in problems)


def test_a_model_built_without_download_needs_nothing() -> None:
    assert model_problems(config(model="Qwen/Qwen2.5-1.5B", model_init="random"), hub=no_hub) == []
    assert data_problems(config()) == []


class _NoSuchRepo(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b'{"error":"Repository not found"}'
        self.send_response(404)
        self.send_header("X-Error-Code", "RepoNotFound")
        self.send_header("X-Error-Message", "Repository not found")
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def hub_without_repos() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _NoSuchRepo)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def ask_hub(endpoint: str, home: Path) -> str:
    """hub_problem in a fresh process: huggingface_hub reads HF_ENDPOINT when it is imported."""
    env = {**os.environ, "HF_ENDPOINT": endpoint, "HF_HOME": str(home), "HF_HUB_OFFLINE": "0"}
    code = "from fsdp_train.run.preflight import hub_problem; print(hub_problem('acme/no-such-model', 'config.json'))"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_a_model_the_hub_does_not_have_is_not_found(hub_without_repos: str, tmp_path: Path) -> None:
    assert ask_hub(hub_without_repos, tmp_path) == (
        "acme/no-such-model not found on the Hugging Face hub (nor in this node's cache); check the name"
    )


def test_a_hub_that_does_not_answer_is_unreachable(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again when the block ends: nothing listens there
    answer = ask_hub(f"http://127.0.0.1:{port}", tmp_path)
    assert answer.startswith("acme/no-such-model: hub unreachable from this node (") and "not in its cache" in answer


def test_run_local_refuses_a_missing_code_directory_before_any_cluster(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert main(["run-local", "-f", str(EXAMPLES / "byo-function" / "job.yaml")]) == 2
    captured = capsys.readouterr()
    assert "spec.trainFunction.code: /opt/byo-function not found" in captured.err
    assert captured.out == ""  # no API server, no Ray: nothing was started


def test_run_local_refuses_a_missing_data_file_naming_it(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    manifest = yaml.safe_load((EXAMPLES / "tiny-finetune.yaml").read_text())
    manifest["spec"]["model"] = {"name": "Qwen/Qwen2.5-1.5B", "init": "random"}
    manifest["spec"]["data"]["source"] = str(tmp_path / "gone.jsonl")
    manifest["spec"]["data"]["tokenizer"] = str(tmp_path / "tok")
    manifest["spec"].pop("output", None)
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(manifest))
    assert main(["run-local", "-f", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"spec.data.source: {tmp_path / 'gone.jsonl'} not found" in err
    assert f"spec.data.tokenizer: {tmp_path / 'tok'} not found" in err


def test_a_missing_explicit_tokenizer_is_named_beside_a_missing_model(tmp_path: Path) -> None:
    """Only the model's own tokenizer is said once under spec.model.name when the model is missing: a tokenizer the
    job names in spec.data.tokenizer is another location, and its problem must not hide behind the model's."""
    (tmp_path / "corpus.jsonl").write_text('{"text": "a"}\n')
    cfg = config(data=str(tmp_path / "corpus.jsonl"), model=str(tmp_path / "model"), model_init="pretrained",
                 tokenizer=str(tmp_path / "tok"))  # fmt: skip
    assert job_problems(cfg, hub=no_hub) == [
        f"spec.data.tokenizer: {tmp_path / 'tok'} not found (no such directory on this node)",
        f"spec.model.name: {tmp_path / 'model'} not found (no such directory on this node)",
    ]
