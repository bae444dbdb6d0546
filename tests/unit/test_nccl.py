"""NCCL log classification: every captured/assembled fixture, and the variations a real fleet produces."""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest
from fsdp_train.contract.events import Transport
from fsdp_train.contract.nccl import NO_PREFIX, NcclVerdict, classify_by_rank, classify_text

NCCL_DIR = Path(__file__).resolve().parents[1] / "data" / "nccl"

EXPECTED = {
    "efa-g6-assembled.log": "efa",
    "h200-silent-socket-fallback.log": "socket",
    "socket-fallback-assembled.log": "socket",
    "h200-nvlink-p2p.log": "none",
    "h200-libfabric-required-missing.log": "init-failed",
    "h200-shm-interleaved.log": "none",
    "h200-ib-required-missing.log": "init-failed",
}
PREFIX = re.compile(r"^(\[[^]]*\] )?[\w.-]+:\d+:\d+ \[\d+\] ")


def fixture(name: str) -> str:
    return (NCCL_DIR / name).read_text()


def test_every_fixture_is_covered() -> None:
    assert sorted(p.name for p in NCCL_DIR.glob("*.log")) == sorted(EXPECTED)


@pytest.mark.parametrize(("name", "transport"), sorted(EXPECTED.items()))
def test_fixture_verdict(name: str, transport: str) -> None:
    verdict = classify_text(fixture(name))
    assert verdict.transport == transport
    assert verdict.evidence in {line.strip() for line in fixture(name).splitlines()}
    assert verdict.evidence in verdict.evidence_lines


def test_captured_interleaved_logs_split_per_rank() -> None:
    shm = classify_by_rank(fixture("h200-shm-interleaved.log"))
    assert {k: (v.process, v.transport) for k, v in shm.items()} == {"1": ("vm:761", "none"), "0": ("vm:760", "none")}
    assert "via SHM/direct/direct" in shm["0"].evidence
    ib = classify_by_rank(fixture("h200-ib-required-missing.log"))
    assert {k: v.transport for k, v in ib.items()} == {"vm:1256": "init-failed", "vm:1257": "init-failed"}


def test_efa_fixture_details() -> None:
    v = classify_text(fixture("efa-g6-assembled.log"))
    assert (v.plugin, v.provider, v.nccl_version, v.ofi_version) == ("Libfabric", "efa", "2.29.7+cuda13.0", "1.20.0")
    assert "Selected provider is efa" in v.evidence


def test_silent_fallback_is_socket_per_rank_with_the_channel_as_evidence() -> None:
    ranks = classify_by_rank(fixture("h200-silent-socket-fallback.log"))
    assert list(ranks) == ["0", "1"]
    assert [(v.process, v.rank, v.transport, v.plugin) for v in ranks.values()] == [
        ("vm:882", 0, "socket", "Socket"),
        ("vm:883", 1, "socket", "Socket"),
    ]
    assert all("via NET/Socket" in v.evidence for v in ranks.values())
    # The missing plugin is recorded, though it does not decide.
    assert any("libnccl-net-ofi.so" in line for line in ranks["0"].evidence_lines)


def test_using_network_socket_without_network_channels_is_not_socket() -> None:
    # NCCL selects Socket on the NVLink host but every channel is P2P: no network in use.
    text = fixture("h200-nvlink-p2p.log")
    assert "Using network Socket" in text
    ranks = classify_by_rank(text)
    assert {k: (v.transport, v.plugin) for k, v in ranks.items()} == {"0": ("none", "Socket"), "1": ("none", "Socket")}
    assert "via P2P/CUMEM" in ranks["1"].evidence


def test_assembled_socket_fallback_keeps_the_ofi_failure_in_the_evidence() -> None:
    v = classify_text(fixture("socket-fallback-assembled.log"))
    assert (v.transport, v.plugin, v.provider, v.ofi_version) == ("socket", "Socket", "", "1.20.0")
    assert any("No eligible providers" in line for line in v.evidence_lines)


def test_required_plugin_missing_fails_each_process() -> None:
    ranks = classify_by_rank(fixture("h200-libfabric-required-missing.log"))
    # No init line printed a rank, so the processes are keyed host:pid.
    assert list(ranks) == ["vm:818", "vm:819"]
    assert all(
        v.transport == "init-failed" and "Failed to initialize any NET plugin" in v.evidence for v in ranks.values()
    )


# --- variations ------------------------------------------------------------------------------------------


def crlf(text: str) -> str:
    return text.replace("\n", "\r\n")


def kubectl_timestamps(text: str) -> str:
    return "".join(f"2026-11-29T20:12:{i % 60:02d}.123456789Z {line}\n" for i, line in enumerate(text.splitlines()))


def ray_prefix(text: str) -> str:
    # Ray colours its worker prefix when attached to a terminal.
    return "".join(f"\x1b[36m(RayTrainWorker pid=4242, ip=10.0.3.7)\x1b[0m {line}\n" for line in text.splitlines())


def no_prefix(text: str) -> str:
    return "".join(PREFIX.sub("", line) + "\n" for line in text.splitlines())


def with_noise(text: str) -> str:
    noise = [
        "Epoch 0: loss 2.31",
        'FSDP_EVENT {"evidence":"vm:1:1 [0] NCCL INFO Using network Socket","kind":"transport","rank":0}',
        "INFO worker.py:1 -- Using network configuration from env",
        "",
    ]
    lines = text.splitlines()
    out: list[str] = []
    for i, line in enumerate(lines):
        out.append(line)
        out.append(noise[i % len(noise)])
    return "\n".join(out)


VARIATIONS = [crlf, kubectl_timestamps, ray_prefix, no_prefix, with_noise]


@pytest.mark.parametrize("vary", VARIATIONS, ids=lambda f: f.__name__)
@pytest.mark.parametrize(("name", "transport"), sorted(EXPECTED.items()))
def test_variation_keeps_the_verdict(vary: object, name: str, transport: str) -> None:
    assert callable(vary)
    verdict = classify_text(vary(fixture(name)))
    assert verdict.transport == transport
    assert verdict.evidence and "\r" not in verdict.evidence and "\x1b" not in verdict.evidence


@pytest.mark.parametrize("vary", [crlf, kubectl_timestamps, with_noise], ids=lambda f: f.__name__)
def test_variation_keeps_the_ranks(vary: object) -> None:
    assert callable(vary)
    plain = classify_by_rank(fixture("h200-silent-socket-fallback.log"))
    varied = classify_by_rank(vary(fixture("h200-silent-socket-fallback.log")))
    assert {k: (v.transport, v.process) for k, v in varied.items()} == {
        k: (v.transport, v.process) for k, v in plain.items()
    }


def test_lines_without_prefix_form_one_group() -> None:
    ranks = classify_by_rank(no_prefix(fixture("efa-g6-assembled.log")))
    assert list(ranks) == [NO_PREFIX]
    assert ranks[NO_PREFIX].transport == "efa"
    assert ranks[NO_PREFIX].process == ""


def test_ray_prefix_stands_in_for_the_missing_nccl_prefix() -> None:
    text = ray_prefix(no_prefix(fixture("socket-fallback-assembled.log")))
    ranks = classify_by_rank(text)
    assert list(ranks) == ["10.0.3.7:4242"]
    assert ranks["10.0.3.7:4242"].transport == "socket"


def interleave(*texts: str, seed: int = 7) -> str:
    """Shuffle several processes' lines together, each process keeping its own order."""
    queues = [t.splitlines() for t in texts]
    rng = random.Random(seed)
    out: list[str] = []
    while any(queues):
        q = rng.choice([q for q in queues if q])
        out.append(q.pop(0))
    return "\n".join(out) + "\n"


def test_interleaved_processes_are_split_by_prefix() -> None:
    efa = fixture("efa-g6-assembled.log")
    fallback = fixture("h200-silent-socket-fallback.log")
    text = interleave(efa, fallback)
    ranks = classify_by_rank(text)
    assert {k: v.transport for k, v in ranks.items()} == {"ip-10-0-1-17:2211": "efa", "0": "socket", "1": "socket"}
    # One socket process is enough to make the log a fallback.
    assert classify_text(text).transport == "socket"


def test_efa_with_intra_node_only_processes_is_efa() -> None:
    p2p = fixture("h200-nvlink-p2p.log").replace("vm:", "other:")
    text = interleave(fixture("efa-g6-assembled.log"), p2p)
    assert classify_text(text).transport == "efa"


def test_duplicate_ranks_fall_back_to_process_keys() -> None:
    first = fixture("h200-nvlink-p2p.log")
    second = first.replace("vm:", "other:")
    ranks = classify_by_rank(first + second)
    assert list(ranks) == ["vm:607", "vm:608", "other:607", "other:608"]
    assert [v.rank for v in ranks.values()] == [0, 1, 0, 1]


def older_plugin(text: str) -> str:
    """aws-ofi-nccl <= 1.12 called itself 'AWS Libfabric' and capitalised 'Provider'."""
    return text.replace("Libfabric", "AWS Libfabric").replace("Selected provider", "Selected Provider")


def test_older_aws_libfabric_plugin_name_is_efa() -> None:
    v = classify_text(older_plugin(fixture("efa-g6-assembled.log")))
    assert (v.transport, v.plugin, v.provider) == ("efa", "AWS Libfabric", "efa")


def test_older_plugin_channels_only_is_efa() -> None:
    text = "host:1:1 [0] NCCL INFO Channel 00 : 0[0] -> 1[0] [send] via NET/AWS Libfabric/0/GDRDMA\n"
    v = classify_text(text)
    assert (v.transport, v.plugin) == ("efa", "AWS Libfabric")


@pytest.mark.parametrize("provider", ["tcp", "sockets", "tcp;ofi_rxm"])
def test_libfabric_over_tcp_is_socket(provider: str) -> None:
    text = fixture("efa-g6-assembled.log").replace("Selected provider is efa", f"Selected provider is {provider}")
    v = classify_text(text)
    assert (v.transport, v.plugin, v.provider) == ("socket", "Libfabric", provider)
    assert f"Selected provider is {provider}" in v.evidence


def test_efa_direct_fabric_is_efa() -> None:
    text = fixture("efa-g6-assembled.log").replace("provider is efa, fabric is efa", "provider is efa-direct")
    assert classify_text(text).transport == "efa"


IB_LOG = """\
gpu-a:10:10 [0] NCCL INFO NCCL version 2.21.5+cuda12.4
gpu-a:10:10 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB ; OOB eth0:10.1.0.2<0>
gpu-a:10:10 [0] NCCL INFO Using network IB
gpu-a:10:10 [0] NCCL INFO comm 0x5 rank 0 nRanks 16 nNodes 2 localRanks 8 localRank 0 MNNVL 0
gpu-a:10:10 [0] NCCL INFO Channel 00/0 : 8[0] -> 0[0] [receive] via NET/IB/0/GDRDMA
gpu-a:10:10 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/IPC/read
"""


def test_ib() -> None:
    v = classify_text(IB_LOG)
    assert (v.transport, v.plugin, v.rank) == ("ib", "IB", 0)
    assert "via NET/IB/0/GDRDMA" in v.evidence


def test_ibext_plugin_is_ib() -> None:
    assert classify_text(IB_LOG.replace("NET/IB/0", "NET/IBext_v8/0")).transport == "ib"


def test_init_lines_only_single_node_is_none() -> None:
    # Cut before any channel line: NCCL's nNodes 1 still shows no network is needed.
    lines = fixture("h200-nvlink-p2p.log").splitlines()
    cut = next(i for i, line in enumerate(lines) if "nNodes" in line)
    v = classify_text("\n".join(lines[: cut + 1]))
    assert v.transport == "none"
    assert "nNodes 1" in v.evidence
    assert v.evidence in v.evidence_lines  # the deciding line is listed with the others


def test_init_lines_only_multi_node_follows_the_selected_network() -> None:
    lines = fixture("h200-silent-socket-fallback.log").splitlines()
    cut = next(i for i, line in enumerate(lines) if "Init COMPLETE" in line)
    v = classify_text("\n".join(lines[: cut + 1]))
    assert (v.transport, v.evidence) == ("socket", "vm:882:882 [0] NCCL INFO Using network Socket")


def test_selected_libfabric_without_channels_is_efa() -> None:
    lines = [line for line in fixture("efa-g6-assembled.log").splitlines() if "Channel" not in line]
    assert classify_text("\n".join(lines)).transport == "efa"


def test_socket_plugin_init_alone_is_socket() -> None:
    v = classify_text("h:1:1 [0] NCCL INFO NET/Socket : Using [0]eth0:10.0.0.1<0>\n")
    assert (v.transport, v.plugin) == ("socket", "Socket")


def test_ofi_failure_with_nothing_after_is_unknown_with_evidence() -> None:
    lines = fixture("socket-fallback-assembled.log").splitlines()
    cut = next(i for i, line in enumerate(lines) if "initialization failed" in line)
    v = classify_text("\n".join(lines[: cut + 1]))
    assert v.transport == "unknown"
    assert "No eligible providers" in v.evidence


def test_older_nccl_network_not_found_is_init_failed() -> None:
    text = "\n[2024-03-01 10:00:00] node:5:5 [0] misc/net.cc:700 NCCL WARN Error: network AWS Libfabric not found.\n"
    assert classify_text(text).transport == "init-failed"


def test_nothing_is_unknown() -> None:
    assert classify_text("") == NcclVerdict(transport="unknown")
    assert classify_text("just a program's own output\n").transport == "unknown"
    assert classify_by_rank("just a program's own output\n") == {}


def test_own_events_are_not_read_as_nccl_output() -> None:
    event = Transport(rank=0, transport="socket", evidence="vm:1:1 [0] NCCL INFO Channel 00/0 : 1 via NET/Socket/0")
    text = event.to_line() + "\n" + fixture("efa-g6-assembled.log")
    assert classify_text(text).transport == "efa"


def test_rank_comes_from_the_largest_communicator() -> None:
    text = (
        "h:1:1 [0] NCCL INFO ncclCommInitRankConfig comm 0x1 rank 1 nranks 2 cudaDev 0 - Init START\n"
        "h:1:1 [0] NCCL INFO ncclCommInitRankConfig comm 0x2 rank 5 nranks 8 cudaDev 0 - Init START\n"
        "h:1:1 [0] NCCL INFO Channel 00/0 : 4[0] -> 5[1] via P2P/CUMEM\n"
    )
    assert list(classify_by_rank(text)) == ["5"]


def test_a_socket_channel_anywhere_in_a_process_wins() -> None:
    # Two communicators in one process: the intra-node one on P2P, the cross-node one on Socket.
    text = (
        "h:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM\n"
        "h:1:1 [0] NCCL INFO Channel 00/0 : 1[1] -> 0[0] [receive] via NET/Socket/0\n"
    )
    assert classify_text(text).transport == "socket"


def test_socket_beats_efa_within_one_process() -> None:
    text = (
        "h:1:1 [0] NCCL INFO NET/OFI Selected provider is efa, fabric is efa (found 4 nics)\n"
        "h:1:1 [0] NCCL INFO Channel 00/0 : 8[0] -> 0[0] [receive] via NET/Libfabric/0\n"
        "h:1:1 [0] NCCL INFO Channel 00/0 : 9[1] -> 0[0] [receive] via NET/Socket/0\n"
    )
    v = classify_text(text)
    assert (v.transport, v.plugin, v.provider) == ("socket", "Socket", "")
    assert v.evidence.endswith("via NET/Socket/0")
