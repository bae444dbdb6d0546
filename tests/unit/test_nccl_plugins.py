"""Which transport each NET plugin and libfabric provider stands for, one log line pair at a time."""

from __future__ import annotations

import pytest
from fsdp_train.contract.nccl import classify_text


def log(network: str, provider: str = "") -> str:
    lines = [f"h:1:1 [0] NCCL INFO NET/OFI Selected provider is {provider}, fabric is x (found 1 nics)"] * bool(
        provider
    )
    return "\n".join([*lines, f"h:1:1 [0] NCCL INFO Using network {network}"]) + "\n"


@pytest.mark.parametrize(
    ("network", "provider", "transport"),
    [
        ("Libfabric", "efa", "efa"),
        ("AWS Libfabric", "efa-direct", "efa"),
        ("Libfabric", "", "efa"),  # aws-ofi-nccl without a provider line: its only provider on AWS is EFA
        ("Libfabric", "tcp", "socket"),
        ("ofi", "TCP", "socket"),
        ("Libfabric", "udp;ofi_rxd", "socket"),
        ("Libfabric", "sockets", "socket"),
        ("Libfabric", "verbs;ofi_rxm", "unknown"),  # a provider that is neither EFA nor a socket
        ("IB", "", "ib"),
        ("Socket", "", "socket"),
        ("Custom", "", "unknown"),
    ],
)
def test_plugin_and_provider(network: str, provider: str, transport: str) -> None:
    verdict = classify_text(log(network, provider))
    assert (verdict.transport, verdict.plugin, verdict.provider) == (transport, network, provider)
