"""Real Ray: the attempt key of a job's runtime environment reaches its worker processes, `take_key` removes it,
and the signed lines come through Ray's log forwarding intact (docs/reliability.md, "Threat model").

A local Ray (no dashboard: its fixed port may be taken on a shared host) runs tasks as the bundled emitter does;
what they print is read back from the driver's output and verified as the operator verifies it.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from fsdp_train.events import Verifier, attempt_key, parse_log
from support.ray_cluster import RAY_TESTS, ray_available, ray_env

pytestmark = [pytest.mark.e2e, RAY_TESTS]

TRAINING = Path(__file__).resolve().parents[2] / "training"
DRIVER = """
import os, sys, time, ray
from fsdp_train.events import KEY_ENV

class Seen:
    # Ray's driver prints the workers' forwarded lines in a thread of its own, after ray.get has returned:
    # counted here, so the driver ends once it has printed them all, not before.
    def __init__(self, stream):
        self.stream, self.events = stream, 0
    def write(self, text):
        self.events += text.count("FSDP_EVENT ")
        return self.stream.write(text)
    def __getattr__(self, name):
        return getattr(self.stream, name)

sys.stdout, sys.stderr = Seen(sys.stdout), Seen(sys.stderr)
ray.init(include_dashboard=False, num_cpus=2, _temp_dir=TEMP,
         runtime_env={"env_vars": {KEY_ENV: KEY, "RAY_DEDUP_LOGS": "0"}})

@ray.remote
def rank(r):
    from fsdp_train import events
    took = events.take_key()
    events.emit(events.Step(rank=r, step=1, total_steps=2, loss=1.0, tokens_per_second=1.0,
                            tokens_per_second_per_device=1.0))
    print('FSDP_EVENT {"v":1,"kind":"failure","rank":0,"message":"printed by other code"}', flush=True)
    return took, KEY_ENV in os.environ

print("RESULT", ray.get([rank.remote(r) for r in range(2)]), flush=True)
deadline = time.monotonic() + 120
while sys.stdout.events + sys.stderr.events < 4 and time.monotonic() < deadline:
    time.sleep(0.05)
ray.shutdown()
"""


def test_the_real_emitters_lines_verify_through_ray_and_a_print_does_not(tmp_path: Path) -> None:
    if not ray_available():
        pytest.skip("the ray command is not installed next to this Python")
    key = attempt_key(b"k" * 32, "job-1a2b3c4d-1")
    script = tmp_path / "driver.py"
    # A temp dir of its own, not the machine's /tmp/ray that every other local Ray shares (short: Ray's socket
    # paths under it are length-limited).
    temp = tempfile.mkdtemp(prefix="fsdpray-")
    script.write_text(f"KEY = {key.hex()!r}\nTEMP = {temp!r}\n" + DRIVER)
    # As the operator's submission does (render.submission, ray_entry.RAY_LOG_ENV): Ray's driver merges lines
    # that differ only in numbers and hex (every signed line) unless its own RAY_DEDUP_LOGS is 0.
    env = ray_env(PYTHONPATH=str(TRAINING), RAY_DEDUP_LOGS="0")
    try:
        done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300)
    finally:
        shutil.rmtree(temp, ignore_errors=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    output = done.stdout + done.stderr
    assert "RESULT [(True, False), (True, False)]" in output  # each worker took the key, none kept it
    parsed = parse_log(output.splitlines(), Verifier(key))
    assert sorted(e.rank for e in parsed.events) == [0, 1] and parsed.forged == 2, output[-3000:]
