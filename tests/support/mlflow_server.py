"""A real MLflow tracking server on loopback (`mlflow server`, SQLite store, served artifacts) for the tests.

Full `mlflow` lives in its own virtualenv, `<repo>/.tools/mlflow-server`, which `make setup` makes (its pyarrow pin
conflicts with the project's; pyproject.toml says why). The server is started in a process group of its own and
stopped by it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from support.ray_cluster import free_port

REPO = Path(__file__).resolve().parents[2]
MLFLOW = REPO / ".tools" / "mlflow-server" / "bin" / "mlflow"
# Its start (database migrations, the app's imports) took 25 s on a loaded 2-core machine; generous.
START_SECONDS = 240.0


@dataclass
class Server:
    uri: str
    process: subprocess.Popen[bytes]
    log: Path

    def stop(self) -> None:
        """Stop it (its whole process group: uvicorn's workers too) and wait until it is gone."""
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=30)


def answers(uri: str) -> bool:
    try:
        with urllib.request.urlopen(f"{uri}/health", timeout=5) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


@contextlib.contextmanager
def mlflow_server(root: Path) -> Iterator[Server]:
    """`mlflow server` on 127.0.0.1 (a free port), its store and artifacts under `root`; stopped on the way out."""
    assert MLFLOW.exists(), f"{MLFLOW} is missing: run `make setup` (it installs the MLflow server there)"
    root.mkdir(parents=True, exist_ok=True)
    for _ in range(3):  # the free port may be taken between finding it and the server binding it
        port = free_port()
        log = root / f"mlflow-{port}.log"
        with log.open("wb") as out:
            process = subprocess.Popen(
                [
                    str(MLFLOW),
                    "server",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(port),
                    "--workers",
                    "1",
                    "--backend-store-uri",
                    f"sqlite:///{root / 'mlflow.db'}",
                    "--artifacts-destination",
                    str(root / "artifacts"),
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                # The server's job runner (huey consumers for MLflow's server-side jobs, which tracking never
                # uses) starts eight processes that import MLflow: about 45 CPU-s per server, off.
                env={
                    **{k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")},
                    "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
                },
            )
        server = Server(f"http://127.0.0.1:{port}", process, log)
        deadline = time.monotonic() + START_SECONDS
        while process.poll() is None and not answers(server.uri) and time.monotonic() < deadline:
            time.sleep(0.5)
        if process.poll() is None and answers(server.uri):
            try:
                yield server
            finally:
                server.stop()
            return
        server.stop()
    raise AssertionError(f"the MLflow server did not answer within {START_SECONDS:.0f}s:\n{log.read_text()[-3000:]}")
