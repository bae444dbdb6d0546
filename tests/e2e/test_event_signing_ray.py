"""Real Ray: the attempt key of a job's runtime environment reaches its worker processes, `take_key` removes it,
and the signed lines come through Ray's log forwarding intact (docs/reliability.md, "Threat model").

A local Ray (no dashboard: its fixed port may be taken on a shared host) runs tasks as the bundled emitter does;
what they print is read back from the driver's output and verified as the operator verifies it.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest
from fsdp_train.contract.events import Verifier, attempt_key, parse_log
from support.ray_cluster import RAY_TESTS, ray_available, ray_env, run_ray_driver

# Each case may start its driver up to five times (`run_ray_driver`) while the suite's other Ray clusters start. In the
# Ray lane, one at a time with its other clusters: its agents' default port is fixed, and a Ray node's start beside
# another one's, when the run starts, timed out in turn (issue 54).
pytestmark = [pytest.mark.e2e, RAY_TESTS, pytest.mark.timeout(900)]

TRAINING = Path(__file__).resolve().parents[2] / "training"
# Both drivers count the event lines they print: Ray's driver prints the workers' forwarded lines in a thread of its
# own, after ray.get has returned, so a driver ends once it has printed them all, not before.
SEEN = """
class Seen:
    def __init__(self, stream):
        self.stream, self.events = stream, 0
    def write(self, text):
        self.events += text.count("FSDP_EVENT ")
        return self.stream.write(text)
    def __getattr__(self, name):
        return getattr(self.stream, name)

sys.stdout, sys.stderr = Seen(sys.stdout), Seen(sys.stderr)
"""

DRIVER = (
    """
import os, sys, time, ray
from fsdp_train.contract.events import KEY_ENV
"""
    + SEEN
    + """
ray.init(include_dashboard=False, num_cpus=2, _temp_dir=TEMP,
         runtime_env={"env_vars": {KEY_ENV: KEY, "RAY_DEDUP_LOGS": "0"}})

@ray.remote
def rank(r):
    from fsdp_train.contract import events
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
)


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
        done = run_ray_driver(script, env)
    finally:
        shutil.rmtree(temp, ignore_errors=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    output = done.stdout + done.stderr
    assert "RESULT [(True, False), (True, False)]" in output  # each worker took the key, none kept it
    parsed = parse_log(output.splitlines(), Verifier(key))
    assert sorted(e.rank for e in parsed.events) == [0, 1] and parsed.forged == 2, output[-3000:]


AS_A_JOB = (
    """
import json, os, sys, time, ray
from fsdp_train.contract import events
from fsdp_train.run.ray_entry import with_key
"""
    + SEEN
    + """
assert events.take_key(emitter=events.DRIVER)  # what ray_entry.main does first
ray.init(include_dashboard=False, num_cpus=2)

@ray.remote
def child():
    return events.KEY_ENV in os.environ, events.KEY_ENV in json.dumps(ray.get_runtime_context().runtime_env)

def rank(config):
    r = config["rank"]
    seen = {
        "environ": events.KEY_ENV in os.environ,
        "runtime_env": events.KEY_ENV in json.dumps(ray.get_runtime_context().runtime_env),
        "child": ray.get(child.remote()),
    }
    # User code prints without a newline just before the emitter's line: the genuine line must still verify.
    print("FSDP_EVENT " + "x" * config["unfinished"], end="", flush=True)
    events.emit(events.Step(rank=r, step=1, total_steps=2, loss=1.0, tokens_per_second=1.0,
                            tokens_per_second_per_device=1.0))
    return seen

remote_rank = ray.remote(with_key(rank, events.signing_key()))
results = ray.get([remote_rank.remote({"rank": r, "unfinished": u}) for r, u in ((0, 10), (1, 70000))])
print("RESULT", json.dumps(results), flush=True)
deadline = time.monotonic() + 120
while sys.stdout.events + sys.stderr.events < 4 and time.monotonic() < deadline:
    time.sleep(0.05)
ray.shutdown()
"""
)


def test_the_key_leaves_no_copy_in_rays_runtime_environment_and_follows_an_unfinished_line(tmp_path: Path) -> None:
    """Submitted as the operator submits (the key in the job's runtime environment, which Ray's job supervisor hands
    the driver in RAY_JOB_CONFIG_JSON_ENV_VAR): after the driver's take_key, no worker has the key in its environment
    or its runtime context, nor does a task a rank starts; the ranks sign with the key `with_key` hands them, and a
    line of theirs after an unfinished line of other code (10 and 70,000 characters) verifies."""
    if not ray_available():
        pytest.skip("the ray command is not installed next to this Python")
    key = attempt_key(b"k" * 32, "job-1a2b3c4d-1")
    script = tmp_path / "driver.py"
    script.write_text(AS_A_JOB)
    job_env = {"FSDP_EVENT_KEY": key.hex(), "RAY_DEDUP_LOGS": "0"}
    job_config = json.dumps({"runtime_env": {"env_vars": job_env}, "metadata": {}})
    env = ray_env(PYTHONPATH=str(TRAINING), RAY_JOB_CONFIG_JSON_ENV_VAR=job_config, **job_env)
    done = run_ray_driver(script, env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    output = done.stdout + done.stderr
    (result,) = [line for line in output.splitlines() if line.startswith("RESULT ")]
    seen = json.loads(result.removeprefix("RESULT "))
    assert seen == [{"environ": False, "runtime_env": False, "child": [False, False]}] * 2, seen
    parsed = parse_log(output.splitlines(), Verifier(key))
    assert sorted(e.rank for e in parsed.events) == [0, 1], output[-3000:]
