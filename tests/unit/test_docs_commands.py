"""The shell blocks of README.md and docs/ run as a user would paste them, or say what they need.

Every fenced block names its language. A shell block (`sh`, `bash`, `console`, ...) carries one mark after it:
- `runnable`: run here, from the repository's root with the project's `fsdpctl` on PATH, and it succeeds; `runnable
  slow` runs behind the `slow` marker (minutes of Ray). A `console` block is a transcript: its `$ ` commands run
  and print exactly the lines shown under them.
- `cluster` (a Kubernetes cluster, or the API server of a `fsdpctl run-local` that is still running), `aws` (AWS
  credentials), `gpu` (NVIDIA GPUs), `long` (a benchmark or one of the project's own test suites: minutes to hours,
  or a server the reader starts first): not run here; the text around each says what it needs.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from support.ray_cluster import RAY_TESTS

ROOT = Path(__file__).resolve().parents[2]
# A fence may be indented (a block in a list item); its body's lines are, by as much.
FENCE = re.compile(
    r"^(?P<indent>[ \t]*)(?P<fence>```+|~~~+)(?P<info>[^\n`]*)\n(?P<body>.*?)^(?P=indent)(?P=fence)[ \t]*$",
    re.MULTILINE | re.DOTALL,
)
SHELLS = {"sh", "bash", "shell", "zsh", "console", "shell-session"}
NEEDS = {"cluster", "aws", "gpu", "long"}
HEREDOC = re.compile(r"<<-?\s*'?(?P<word>\w+)'?")


def fenced_blocks() -> list[tuple[str, list[str], str]]:
    """(README.md#3 or docs/x.md#1, the info string's words, the body) of every fenced block."""
    found = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for i, match in enumerate(FENCE.finditer(path.read_text())):
            body = "".join(line.removeprefix(match["indent"]) for line in match["body"].splitlines(keepends=True))
            found.append((f"{path.relative_to(ROOT)}#{i + 1}", match["info"].split(), body))
    return found


def runnable(slow: bool) -> list[tuple[str, str, str]]:
    """(name, language, body) of the shell blocks marked `runnable`, with `slow` or without."""
    return [
        (name, info[0], body)
        for name, info, body in fenced_blocks()
        if info and info[0] in SHELLS and "runnable" in info[1:] and ("slow" in info[1:]) == slow
    ]


def transcript(body: str) -> tuple[str, str]:
    """A console block as (its commands, the output it shows): a command starts at `$ ` and goes on over lines that
    end in a backslash and over a heredoc's lines; every other line is output."""
    commands: list[str] = []
    output: list[str] = []
    lines = body.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line.startswith("$ "):
            output.append(line)
            i += 1
            continue
        command = [line[2:]]
        heredoc = HEREDOC.search(line)
        while command[-1].endswith("\\") and i + 1 < len(lines):
            i += 1
            command.append(lines[i])
        if heredoc:
            while i + 1 < len(lines) and lines[i] != heredoc["word"]:
                i += 1
                command.append(lines[i])
        commands.append("\n".join(command))
        i += 1
    return "\n".join(commands) + "\n", "\n".join(output)


def run_block(name: str, language: str, body: str, tmp_path: Path, *, slow: bool = False) -> None:
    env = {
        name: value
        for name, value in os.environ.items()
        if name not in ("AWS_PROFILE", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")
    }
    env.update(
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        HOME=str(tmp_path),  # no ~/.aws, ~/.kube of this machine
        AWS_EC2_METADATA_DISABLED="true",  # no credentials from an instance's metadata either
        PYTHONUNBUFFERED="1",
    )
    # A fast block's own /tmp files go to this test's directory: parallel runs and earlier runs never meet. A slow
    # block runs as written (its files name each other, as examples/tiny-finetune.yaml names /tmp/fsdp-tiny-model),
    # alone in the Ray lane.
    text = body if slow else body.replace("/tmp/", f"{tmp_path}/")
    if language == "console":
        commands, shown = transcript(text)
        result = subprocess.run(
            ["bash", "-c", "exec 2>&1\n" + commands], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
        )
        # Blank lines are the page's layout (one between two commands), not output.
        printed = [line for line in result.stdout.splitlines() if line.strip()]
        wanted = [line for line in shown.splitlines() if line.strip()]
        assert printed == wanted, f"{name}:\n{body}\n--- printed\n{result.stdout}"
        return
    # Output to a file, and the block's own session ended after it: a server it starts in the background (`&`) would
    # hold a pipe open, and outlive the test.
    log = tmp_path / "block.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            ["bash", "-euo", "pipefail", "-c", text], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        try:
            code = proc.wait(timeout=1500)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
    assert code == 0, f"{name}:\n{body}\n--- output\n{log.read_text()[-4000:]}"


def test_every_fenced_block_names_its_language_and_every_shell_block_runs_or_says_what_it_needs() -> None:
    unnamed = [name for name, info, _ in fenced_blocks() if not info]
    assert not unnamed, f"fenced blocks without a language (`text` for output): {unnamed}"
    unmarked = [
        (name, " ".join(info))
        for name, info, _ in fenced_blocks()
        if info[0] in SHELLS and not ({"runnable"} | NEEDS) & set(info[1:])
    ]
    assert not unmarked, f"shell blocks marked neither runnable nor {sorted(NEEDS)}: {unmarked}"
    assert runnable(slow=False) and runnable(slow=True)


def test_a_transcript_is_read_as_commands_and_the_output_they_print() -> None:
    body = "$ cat > /tmp/x <<'EOF'\na: 1\nEOF\n$ grep a \\\n    /tmp/x; echo $?\na: 1\n0\n"
    assert transcript(body) == ("cat > /tmp/x <<'EOF'\na: 1\nEOF\ngrep a \\\n    /tmp/x; echo $?\n", "a: 1\n0")


@pytest.mark.parametrize(("name", "language", "body"), runnable(slow=False), ids=[n for n, _, _ in runnable(False)])
def test_a_runnable_block_runs(name: str, language: str, body: str, tmp_path: Path) -> None:
    run_block(name, language, body, tmp_path)


@pytest.mark.slow
@RAY_TESTS  # a run-local each: one Ray cluster at a time with the others
@pytest.mark.timeout(1800)
@pytest.mark.parametrize(("name", "language", "body"), runnable(slow=True), ids=[n for n, _, _ in runnable(True)])
def test_a_slow_runnable_block_runs(name: str, language: str, body: str, tmp_path: Path) -> None:
    run_block(name, language, body, tmp_path, slow=True)
