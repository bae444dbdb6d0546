"""`fsdpctl diagnose nccl`: verdict per file and rank, JSON output, and the exit status contract."""

from __future__ import annotations

import gzip
import io
import json
from pathlib import Path

import pytest
from fsdp_operator.cli.diagnose import diagnose_nccl

NCCL_DIR = Path(__file__).resolve().parents[1] / "data" / "nccl"
EFA = str(NCCL_DIR / "efa-g6-assembled.log")
SOCKET = str(NCCL_DIR / "h200-silent-socket-fallback.log")
P2P = str(NCCL_DIR / "h200-nvlink-p2p.log")
MISSING = str(NCCL_DIR / "h200-libfabric-required-missing.log")


def test_efa_file_exits_zero(capsys: pytest.CaptureFixture[str]) -> None:
    assert diagnose_nccl([EFA]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{EFA}: efa (EFA in use)")
    assert "provider=efa" in out and "aws-ofi-nccl=1.20.0" in out
    assert "evidence: ip-10-0-1-17:2211:2211 [0] NCCL INFO NET/OFI Selected provider is efa" in out


@pytest.mark.parametrize("path", [SOCKET, P2P, MISSING])
def test_anything_but_efa_exits_one(path: str) -> None:
    assert diagnose_nccl([path]) == 1


def test_one_fallback_among_efa_files_exits_one(capsys: pytest.CaptureFixture[str]) -> None:
    assert diagnose_nccl([EFA, SOCKET]) == 1
    out = capsys.readouterr().out
    assert f"{SOCKET}: socket (NCCL used TCP sockets, not EFA)" in out
    assert "  rank 0 (vm:882): socket  vm:882:882 [0] NCCL INFO Channel" in out
    assert "  rank 1 (vm:883): socket" in out


def test_processes_without_rank_are_listed_by_host_pid(capsys: pytest.CaptureFixture[str]) -> None:
    diagnose_nccl([MISSING])
    out = capsys.readouterr().out
    assert "  vm:818: init-failed" in out and "  vm:819: init-failed" in out


def test_unreadable_input_exits_two_with_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    missing = tmp_path / "nope.log"
    assert diagnose_nccl([EFA, str(missing)]) == 2
    captured = capsys.readouterr()
    assert captured.err == f"diagnose nccl: cannot read {missing}: No such file or directory\n"
    # The readable file is still reported.
    assert f"{EFA}: efa" in captured.out


def test_a_directory_is_unreadable(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert diagnose_nccl([str(tmp_path)]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_unreadable_beats_fallback(tmp_path: Path) -> None:
    assert diagnose_nccl([str(tmp_path / "gone.log"), SOCKET]) == 2


def test_no_files_and_bad_output_exit_two(capsys: pytest.CaptureFixture[str]) -> None:
    assert diagnose_nccl([]) == 2
    assert diagnose_nccl([EFA], output="yaml") == 2
    assert capsys.readouterr().out == ""


def test_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert diagnose_nccl([EFA, SOCKET], output="json") == 1
    report = json.loads(capsys.readouterr().out)
    assert report["efa"] is False
    efa, socket = report["files"]
    assert (efa["path"], efa["efa"], efa["transport"], efa["provider"]) == (EFA, True, "efa", "efa")
    assert socket["transport"] == "socket" and socket["efa"] is False
    assert set(socket["ranks"]) == {"0", "1"}
    assert socket["ranks"]["1"]["process"] == "vm:883"
    assert socket["ranks"]["1"]["rank"] == 1
    assert any("libnccl-net-ofi.so" in line for line in socket["ranks"]["0"]["evidence_lines"])


def test_json_reports_unreadable_files(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert diagnose_nccl([str(tmp_path / "gone.log")], output="json") == 2
    report = json.loads(capsys.readouterr().out)
    assert report["files"][0]["path"].endswith("gone.log") and report["files"][0]["error"]


def test_stdin(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO(Path(EFA).read_text()))
    assert diagnose_nccl(["-"]) == 0
    assert capsys.readouterr().out.startswith("<stdin>: efa")


def test_gzip_and_crlf(tmp_path: Path) -> None:
    packed = tmp_path / "rank0.log.gz"
    packed.write_bytes(gzip.compress(Path(EFA).read_bytes().replace(b"\n", b"\r\n")))
    assert diagnose_nccl([str(packed)]) == 0


def test_corrupt_gzip_is_unreadable(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    broken = tmp_path / "rank0.log.gz"
    broken.write_bytes(gzip.compress(b"NCCL INFO Using network Socket\n" * 50)[:40])
    assert diagnose_nccl([str(broken)]) == 2
    assert capsys.readouterr().err.startswith(f"diagnose nccl: cannot read {broken}: ")


def test_binary_garbage_is_read_not_crashed_on(tmp_path: Path) -> None:
    junk = tmp_path / "core"
    junk.write_bytes(bytes(range(256)) * 4)
    assert diagnose_nccl([str(junk)]) == 1
