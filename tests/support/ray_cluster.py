"""Local Ray clusters (a head and worker "nodes" on loopback addresses), started and stopped by process group."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

BIN = Path(sys.executable).parent

RAY_TESTS = pytest.mark.xdist_group("ray")
"""Mark of the tests that start Ray clusters (run-local's, `ray start`'s): under `--dist loadgroup` they run on one
xdist worker, one after the other (about 3.8 GiB each)."""

SECOND_RAY_LANE = pytest.mark.xdist_group("ray-2")
"""Mark of the user-function suite's run-local cases (all `slow`, the longest of `make test-all`): their clusters run
in a lane of their own, beside `RAY_TESTS`' (two clusters at once at most). Their nodes may share 127.0.0.N
addresses: every port of a node is chosen free (`free_port`, `--dashboard-agent-listen-port`), and each cluster has
its own GCS."""

LONGEST_LANES = tuple(str(mark.args[0]) for mark in (RAY_TESTS, SECOND_RAY_LANE))
"""The groups of the run-local clusters: the run's longest lanes, handed out first (tests/conftest.py)."""
RAY_LANES = LONGEST_LANES
"""Every group whose tests start Ray: run at full priority beside the rest of the run (tests/conftest.py)."""

NODE_START_TIMED_OUT = "The current node timed out during startup"
"""What `ray.init` and `ray start` raise when the node's raylet has not registered with the GCS within Ray's fixed 30 s
(`ray/_private/node.py`); on a loaded 2-core machine its agents can start later than that."""

HEAD_START_SECONDS = 120.0
"""How long `local_cluster` waits for its head's GCS to listen, starts that exited first included."""
NODES_SECONDS = 300.0
"""How long `local_cluster` waits for all its nodes, restarts of exited nodes (the head's: the whole cluster)
included."""


def run_ray_driver(
    script: Path, env: dict[str, str], timeout: float = 300, tries: int = 5
) -> subprocess.CompletedProcess[str]:
    """`python script`, a driver that starts a one-node Ray with `ray.init`; started again (at most `tries` times in
    all) when only its node's start timed out, after a back-off (15 s, then doubled: 225 s of waiting at most) as a
    pod whose container exited is restarted: the machine's load at that moment is what made it time out (the suite's
    first minutes, when three Ray clusters start at once, could take three tries in a row)."""
    backoff = 15.0
    for attempt in range(tries):
        if attempt:
            time.sleep(backoff)
            backoff *= 2
        done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=timeout)
        if done.returncode == 0 or NODE_START_TIMED_OUT not in done.stdout + done.stderr:
            break
    return done


def ray_available() -> bool:
    return (BIN / "ray").exists()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def ray_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FSDP_TRAIN_", "RAY_"))}
    # The Python that runs Ray's workers is the one on PATH when `ray start` ran.
    env.update(PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}", OMP_NUM_THREADS="1", **extra)
    return env


def run_ray_entry(
    address: str, job: dict[str, Any], timeout: float = 300, **env: str
) -> subprocess.CompletedProcess[str]:
    """`python -m fsdp_train.run.ray_entry --config-json JOB`, a driver of the cluster at `address`, to its end."""
    return subprocess.run(
        [sys.executable, "-m", "fsdp_train.run.ray_entry", "--config-json", json.dumps(job)],
        env=ray_env(RAY_ADDRESS=address, **env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def stop_groups(pgids: list[int], grace: float = 10.0) -> None:
    """SIGTERM each process group, then SIGKILL whatever is left of them after ``grace`` seconds."""
    alive = list(pgids)
    for pgid in alive:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while alive and time.monotonic() < deadline:
        time.sleep(0.5)
        alive = [pgid for pgid in alive if group_exists(pgid)]
    for pgid in alive:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)


def group_exists(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def wait_for_nodes(address: str, count: int, timeout: float, tend: Callable[[], None] = lambda: None) -> None:
    """Until `count` nodes are alive; `tend()` runs between two probes (restarting what exited)."""
    probe = "import ray; ray.init(); print(sum(n['Alive'] for n in ray.nodes()))"
    deadline = time.monotonic() + timeout
    seen = ""
    while time.monotonic() < deadline:
        try:  # bounded: a driver's `ray.init` against a cluster whose node is half up can wait for ever
            out = subprocess.run(
                [sys.executable, "-c", probe],
                env=ray_env(RAY_ADDRESS=address),
                capture_output=True,
                text=True,
                timeout=max(min(60.0, deadline - time.monotonic()), 1.0),
            )
            seen = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else out.stderr[-500:]
        except subprocess.TimeoutExpired:
            seen = "the probe's ray.init did not return within 60 s"
        if seen == str(count):
            return
        tend()
        time.sleep(2)
    raise AssertionError(f"Ray cluster did not reach {count} nodes: {seen}")


@contextlib.contextmanager
def local_cluster(*, workers: int = 2, head_cpus: int = 0, dashboard_port: int = 0, **worker_env: str) -> Iterator[str]:
    """A head (`head_cpus` CPUs) and `workers` 2-CPU worker nodes on 127.0.0.2, 127.0.0.3, ...; yields the address.
    With `dashboard_port`, the head serves its dashboard (Ray's job API) there, on 127.0.0.1.

    ``worker_env`` goes into the environment of every Ray process, so the training workers see it.
    """
    # Short paths: Ray's unix sockets live under the temp dir and must stay below 108 characters.
    base = Path(tempfile.mkdtemp(prefix="fsdpray-"))
    port = free_port()
    address = f"127.0.0.1:{port}"
    common = ["--block", "--disable-usage-stats", "--object-store-memory=80000000"]
    # Ray's fixed default ports (the client server's 10001, each dashboard agent's 52365, which every agent also
    # binds on 127.0.0.1) would collide with another Ray on this machine, or between this cluster's own nodes.
    head = ["--head", f"--port={port}", f"--num-cpus={head_cpus}", "--node-ip-address=127.0.0.1"]
    dashboard = ["--include-dashboard=true", "--dashboard-host=127.0.0.1", f"--dashboard-port={dashboard_port}"]
    commands = [
        [
            *head,
            *(dashboard if dashboard_port else ["--include-dashboard=false"]),
            f"--ray-client-server-port={free_port()}",
        ],
        *([f"--address={address}", "--num-cpus=2", f"--node-ip-address=127.0.0.{2 + n}"] for n in range(workers)),
    ]
    procs: list[subprocess.Popen[bytes]] = []
    started: list[int] = []  # every `ray start` session, restarted ones too: all are stopped at the end

    def start(index: int) -> subprocess.Popen[bytes]:
        temp = base / f"n{index}-{len(started)}"
        with (base / f"start{index}.log").open("ab") as log:
            proc = subprocess.Popen(
                [
                    str(BIN / "ray"),
                    "start",
                    *commands[index],
                    *common,
                    f"--temp-dir={temp}",
                    f"--dashboard-agent-listen-port={free_port()}",
                    # Chosen here: with an agent-chosen port the head's client server waits for the node's
                    # record to learn it and, after 30 s on a loaded machine, takes the head down.
                    f"--runtime-env-agent-port={free_port()}",
                ],
                env=ray_env(**worker_env),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        started.append(proc.pid)
        return proc

    def start_head() -> subprocess.Popen[bytes]:
        """The head, once its GCS listens (the workers register there); a start that exits first is made again."""
        deadline = time.monotonic() + HEAD_START_SECONDS
        while True:
            head = start(0)
            while head.poll() is None and not listening(port):
                if time.monotonic() > deadline:
                    raise AssertionError(f"nothing listens on 127.0.0.1:{port} after {HEAD_START_SECONDS} s")
                time.sleep(0.2)
            if head.poll() is None:
                return head
            stop_groups([head.pid], grace=2.0)  # what its session left behind

    def restart_exited_nodes() -> None:
        # A node whose `ray start --block` exited (its raylet did not register within Ray's 30 s on a loaded
        # machine: NODE_START_TIMED_OUT) is started again, as the kubelet restarts a pod's exited container. The
        # workers joined the head's GCS: when the head exited, the whole cluster starts again, the head first.
        if procs[0].poll() is not None:
            stop_groups([proc.pid for proc in procs], grace=2.0)
            procs[0] = start_head()
            procs[1:] = [start(index) for index in range(1, len(procs))]
            return
        for index in range(1, len(procs)):
            if procs[index].poll() is not None:
                stop_groups([procs[index].pid], grace=2.0)  # what its session left behind
                procs[index] = start(index)

    try:
        procs.append(start_head())
        procs.extend(start(index) for index in range(1, len(commands)))
        wait_for_nodes(address, len(commands), timeout=NODES_SECONDS, tend=restart_exited_nodes)
        yield address
    finally:
        # Each `ray start` leads its own session: stopping that process group stops exactly the Ray
        # processes this fixture started (raylet, GCS, agents), and no other Ray on the machine.
        stop_groups(started)
        shutil.rmtree(base, ignore_errors=True)
