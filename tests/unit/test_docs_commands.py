"""The shell blocks of README.md and docs/ marked runnable (a fenced block whose info string is `sh runnable`) run
as a user would paste them, from the repository's root with the project's `fsdpctl` on PATH, and succeed.

Blocks that need a cluster, AWS or minutes of Ray are not marked; the text around each says what it needs.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BLOCK = re.compile(r"^```sh runnable\n(?P<body>.*?)^```$", re.MULTILINE | re.DOTALL)


def runnable_blocks() -> list[tuple[str, str]]:
    found = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for i, match in enumerate(BLOCK.finditer(path.read_text())):
            found.append((f"{path.relative_to(ROOT)}#{i + 1}", match["body"]))
    return found


def test_the_docs_mark_their_runnable_blocks() -> None:
    assert [name for name, _ in runnable_blocks() if name.startswith("docs/byo-function.md")]


@pytest.mark.parametrize(("name", "body"), runnable_blocks(), ids=[name for name, _ in runnable_blocks()])
def test_a_runnable_block_runs(name: str, body: str, tmp_path: Path) -> None:
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "HOME": str(tmp_path),
    }
    # A block's own /tmp files go to this test's directory: parallel runs and earlier runs never meet.
    script = body.replace("/tmp/", f"{tmp_path}/")
    result = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, f"{name}:\n{body}\n--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}"
