"""Shared fixtures: an emulated API server per test, and the `support` helpers on the import path."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # `import support.<module>` from any test

from fsdp_operator.local import ThreadedApiServer


@pytest.fixture
def apiserver() -> Iterator[ThreadedApiServer]:
    """A fresh emulated Kubernetes API server on a free loopback port, in a background thread."""
    with ThreadedApiServer() as server:
        yield server


@pytest.fixture
def kubeconfig(apiserver: ThreadedApiServer, tmp_path: Path) -> Path:
    """A kubeconfig file pointing at the `apiserver` fixture."""
    return apiserver.write_kubeconfig(tmp_path / "kubeconfig")
