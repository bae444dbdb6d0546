"""`fsdpctl render` and `validate`: outputs, exit codes, and no traceback for any user mistake."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from fsdp_operator.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("example", ["qwen2.5-1.5b-efa.yaml", "qwen2.5-1.5b-efa-tuned.yaml", "tiny-cpu.yaml"])
def test_validate_accepts_the_examples(capsys: pytest.CaptureFixture[str], example: str) -> None:
    code, out, _ = run(capsys, "validate", "-f", str(EXAMPLES / example))
    assert code == 0 and "valid FSDPTrainingJob" in out


def test_render_prints_a_raycluster(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "render", "-f", str(EXAMPLES / "qwen2.5-1.5b-efa.yaml"))
    assert code == 0
    rc = yaml.safe_load(out)
    assert rc["kind"] == "RayCluster" and rc["metadata"]["name"] == "qwen25-1p5b-efa-ray"
    code, out, _ = run(capsys, "render", "-f", str(EXAMPLES / "tiny-cpu.yaml"), "-o", "json")
    assert code == 0 and json.loads(out)["spec"]["workerGroupSpecs"][0]["groupName"] == "cpu-workers"


def test_invalid_spec_lists_every_problem_and_exits_1(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "apiVersion: fsdp.dev/v1alpha1\nkind: FSDPTrainingJob\nmetadata: {name: j}\n"
        "spec: {workers: {gpusPerWorker: 5}, network: {transport: socket, requireEFA: true},\n"
        "       training: {steps: 10, warmupSteps: 10}}\n"
    )
    code, out, err = run(capsys, "validate", "-f", str(bad))
    assert code == 1 and out == ""
    assert "3 problems" in err
    assert "  spec.workers.gpusPerWorker: 5 GPUs requested, g6.12xlarge has 4" in err.splitlines()
    assert "spec.network.requireEFA: true contradicts transport: socket" in err
    assert "spec.training.warmupSteps: must be less than spec.training.steps (10 >= 10)." in err


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("spec: [unclosed\n", "not valid YAML: line 2, column 1"),
        ("apiVersion: v1\nkind: Pod\nmetadata: {name: p}\n", "expected apiVersion: fsdp.dev/v1alpha1"),
        ("- a\n- b\n", "expected a mapping"),
        ("a: 1\n---\nb: 2\n", "expected one YAML document"),
        ("", "found 0"),
        # A tab that indents a line, at the first key (PyYAML: "cannot start any token") and deeper.
        ("apiVersion: fsdp.dev/v1alpha1\nmetadata:\n\tname: x\n", "line 3, column 1: a tab indents this line"),
        ("spec:\n  workers:\n    replicas: 2\n\tcpu: '1'\n", "line 4, column 1: a tab indents this line"),
        ("spec:\n  \t workers: {}\n", "a tab indents this line; YAML indents with spaces only"),
    ],
)
def test_unusable_input_exits_2_with_the_reason(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, content: str, message: str
) -> None:
    path = tmp_path / "in.yaml"
    path.write_text(content)
    for command in ("validate", "render"):
        code, out, err = run(capsys, command, "-f", str(path))
        assert code == 2 and out == ""
        assert err.startswith("error: ") and message in err
        assert "Traceback" not in err


def test_missing_file_exits_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = run(capsys, "validate", "-f", str(tmp_path / "nope.yaml"))
    assert code == 2 and "cannot read" in err


def test_console_script_end_to_end(tmp_path: Path) -> None:
    """The installed `fsdpctl` entry point, as a user runs it: no traceback on bad input."""
    fsdpctl = Path(sys.executable).with_name("fsdpctl")
    if not fsdpctl.exists():
        pytest.skip("fsdpctl console script not installed in this environment")
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: [\n")
    proc = subprocess.run([str(fsdpctl), "validate", "-f", str(bad)], capture_output=True, text=True, check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and "not valid YAML" in proc.stderr
    good = subprocess.run(
        [str(fsdpctl), "render", "-f", "-"],
        input=(EXAMPLES / "tiny-cpu.yaml").read_text(),
        capture_output=True,
        text=True,
        check=False,
    )
    assert good.returncode == 0 and yaml.safe_load(good.stdout)["kind"] == "RayCluster"


def test_run_local_refuses_an_invalid_job_before_starting_anything(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "apiVersion: fsdp.dev/v1alpha1\nkind: FSDPTrainingJob\nmetadata: {name: j}\nspec: {workers: {replicas: 0}}\n"
    )
    code, out, err = run(capsys, "run-local", "-f", str(bad))
    assert code == 2 and out == ""
    assert "spec.workers.replicas: must be at least 1, got 0" in err


def test_standard_input_closed_is_a_message_not_a_traceback(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Started with `<&-`, Python sets sys.stdin to None: reading it raised AttributeError."""
    monkeypatch.setattr(sys, "stdin", None)
    code, out, err = run(capsys, "validate", "-f", "-")
    assert code == 2 and out == ""
    assert err == "error: -: standard input is closed; give a file, or pipe the manifest in\n"


def test_standard_input_closed_from_the_shell() -> None:
    """The real case: `fsdpctl validate -f - <&-` in a shell."""
    command = f"'{sys.executable}' -m fsdp_operator.cli.main validate -f - <&-"
    proc = subprocess.run(["/bin/sh", "-c", command], capture_output=True, text=True, check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "standard input is closed" in proc.stderr


def test_a_stream_of_many_empty_documents_is_refused_early(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """3 MiB of `---` lines (786,432 empty documents) took 13.6 s to read before being refused as "found 0"."""
    path = tmp_path / "empty-docs.yaml"
    path.write_text("---\n" * (3 * 2**20 // 4 - 1))
    started = time.process_time()
    code, _, err = run(capsys, "validate", "-f", str(path))
    assert code == 2 and "holds more than 100 documents" in err
    assert time.process_time() - started < 3  # refused after the first hundred, not after all of them
