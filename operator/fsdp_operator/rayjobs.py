"""Ray's job API and cluster view behind one small protocol: the real client and an in-memory fake.

The real `RayJobsClient` wraps `ray.job_submission.JobSubmissionClient` (blocking, so every call runs
in a thread with a timeout) and asks the dashboard's state API (`/api/v0/nodes`) which nodes are
alive, because pod readiness alone races with Ray's own view (KubeRay #962, #4199, #4760).
`FakeRay` plays Ray for the integration tests; run-local uses the real client.
"""

from __future__ import annotations

import asyncio
import json
import re
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from fsdp_operator.reconcile import RAY_FAILED, RAY_PENDING, RAY_RUNNING, RAY_STOPPED, RAY_SUCCEEDED, RAY_TERMINAL
from fsdp_operator.reconcile import RayJobInfo as RayJobInfo
from fsdp_operator.reconcile import RayNodes as RayNodes
from fsdp_operator.render import Submission

T = TypeVar("T")


class RayUnavailable(RuntimeError):
    """Ray's API did not answer (connection refused, timeout, 5xx): try again later."""


class SubmissionRejected(RuntimeError):
    """Ray refused the submission itself (HTTP 400 other than "already exists"): retrying will not help."""


class RayJobs(Protocol):
    """One Ray cluster's job API, addressed by submission id."""

    async def nodes(self) -> RayNodes: ...

    async def submit(self, submission: Submission) -> bool:
        """Submit; True when this call created the job, False when it already existed."""
        ...

    async def info(self, submission_id: str) -> RayJobInfo | None:
        """The job's state, or None when Ray does not know the submission id."""
        ...

    async def logs(self, submission_id: str, offset: int) -> str:
        """The job's driver log from character `offset` on ('' when nothing new)."""
        ...

    async def stop(self, submission_id: str) -> bool: ...

    async def delete(self, submission_id: str) -> None: ...


RayJobsFactory = Callable[[str], RayJobs]
"""Makes the client for a dashboard URL (`http://host:8265`)."""


def summarize_nodes(nodes: list[dict[str, Any]]) -> RayNodes:
    """Alive non-head nodes and their total GPUs and CPUs, from `/api/v0/nodes` records."""
    alive = [n for n in nodes if n.get("state") == "ALIVE" and not n.get("is_head_node")]
    gpus = sum(float((n.get("resources_total") or {}).get("GPU", 0)) for n in alive)
    cpus = sum(float((n.get("resources_total") or {}).get("CPU", 0)) for n in alive)
    return RayNodes(alive_workers=len(alive), gpus=gpus, cpus=cpus)


_STATUS_CODE = re.compile(r"status code (\d{3})")


def _http_status(error: Exception) -> int | None:
    match = _STATUS_CODE.search(str(error))
    return int(match.group(1)) if match else None


class RayJobsClient:
    """The real client. Each call runs the blocking SDK in a thread, bounded by `timeout` seconds."""

    def __init__(self, address: str, *, timeout: float = 20.0) -> None:
        self.address = address.rstrip("/")
        self.timeout = timeout
        self._client: Any = None

    async def _call(self, fn: Callable[[], T]) -> T:
        try:
            return await asyncio.wait_for(asyncio.to_thread(fn), timeout=self.timeout)
        except TimeoutError as e:
            raise RayUnavailable(f"{self.address}: no answer within {self.timeout:g}s") from e

    def _sdk(self) -> Any:
        if self._client is None:
            # Imported here: the import is heavy and only needed once a cluster exists.
            from ray.job_submission import JobSubmissionClient

            timeout = self.timeout

            class BoundedClient(JobSubmissionClient):
                # The SDK sends every request without a timeout: a head that accepts and never answers would
                # hold the worker thread forever (`_call` gives up waiting, the thread does not), and enough of
                # those exhaust the executor that every job's Ray calls share.
                def _do_request(self, *args: Any, **kwargs: Any) -> Any:
                    kwargs.setdefault("timeout", timeout)
                    return super()._do_request(*args, **kwargs)

            try:
                self._client = BoundedClient(self.address)
            except (ConnectionError, RuntimeError, OSError) as e:
                raise RayUnavailable(f"{self.address}: {e}") from e
        return self._client

    async def nodes(self) -> RayNodes:
        def fetch() -> RayNodes:
            url = f"{self.address}/api/v0/nodes?limit=10000&detail=false"
            try:
                with urllib.request.urlopen(url, timeout=self.timeout) as response:
                    body = json.loads(response.read())
            except (urllib.error.URLError, OSError, ValueError) as e:
                raise RayUnavailable(f"{url}: {e}") from e
            if not body.get("result"):
                raise RayUnavailable(f"{url}: {body.get('msg') or 'no result'}")
            records = ((body.get("data") or {}).get("result") or {}).get("result") or []
            return summarize_nodes(list(records))

        return await self._call(fetch)

    async def submit(self, submission: Submission) -> bool:
        def run() -> bool:
            client = self._sdk()
            try:
                client.submit_job(
                    entrypoint=submission.entrypoint,
                    submission_id=submission.submission_id,
                    runtime_env=submission.runtime_env,
                    metadata=dict(submission.metadata),
                )
            except RuntimeError as e:
                code = _http_status(e)
                if "already exists" in str(e):
                    return False
                if code is not None and 400 <= code < 500:
                    raise SubmissionRejected(str(e)[-2000:]) from e
                raise RayUnavailable(str(e)[-500:]) from e
            except (ValueError, TypeError) as e:
                # Raised by the SDK before any request: a runtime_env it cannot use.
                raise SubmissionRejected(str(e)) from e
            except (ConnectionError, OSError) as e:
                raise RayUnavailable(str(e)) from e
            return True

        return await self._call(run)

    async def info(self, submission_id: str) -> RayJobInfo | None:
        def run() -> RayJobInfo | None:
            try:
                details = self._sdk().get_job_info(submission_id)
            except RuntimeError as e:
                if _http_status(e) == 404 or "does not exist" in str(e):
                    return None
                raise RayUnavailable(str(e)[-500:]) from e
            except (ConnectionError, OSError) as e:
                raise RayUnavailable(str(e)) from e
            return RayJobInfo(submission_id, str(details.status.value), str(details.message or ""))

        return await self._call(run)

    async def logs(self, submission_id: str, offset: int) -> str:
        def run() -> str:
            try:
                text = str(self._sdk().get_job_logs(submission_id))
            except (RuntimeError, ConnectionError, OSError) as e:
                raise RayUnavailable(str(e)[-500:]) from e
            return text[offset:]

        return await self._call(run)

    async def stop(self, submission_id: str) -> bool:
        def run() -> bool:
            try:
                return bool(self._sdk().stop_job(submission_id))
            except RuntimeError as e:
                if _http_status(e) == 404 or "does not exist" in str(e):
                    return False
                raise RayUnavailable(str(e)[-500:]) from e
            except (ConnectionError, OSError) as e:
                raise RayUnavailable(str(e)) from e

        return await self._call(run)

    async def delete(self, submission_id: str) -> None:
        def run() -> None:
            try:
                self._sdk().delete_job(submission_id)
            except RuntimeError as e:
                if _http_status(e) == 404 or "does not exist" in str(e):
                    return
                raise RayUnavailable(str(e)[-500:]) from e
            except (ConnectionError, OSError) as e:
                raise RayUnavailable(str(e)) from e

        await self._call(run)


class CachingFactory:
    """One `RayJobsClient` per address (the SDK checks versions over HTTP when it is built)."""

    def __init__(self, *, timeout: float = 20.0) -> None:
        self.timeout = timeout
        self._clients: dict[str, RayJobsClient] = {}

    def __call__(self, address: str) -> RayJobs:
        client = self._clients.get(address)
        if client is None:
            client = self._clients[address] = RayJobsClient(address, timeout=self.timeout)
        return client


# --- the in-memory fake ------------------------------------------------------------------------------


@dataclass
class FakeJob:
    submission: Submission
    address: str
    status: str = RAY_PENDING
    message: str = ""
    log: str = ""


@dataclass
class FakeCluster:
    nodes: RayNodes = field(default_factory=lambda: RayNodes(0, 0.0, 0.0))
    jobs: dict[str, FakeJob] = field(default_factory=dict)


Script = Callable[["FakeRay", FakeJob], Iterator[None]]
"""What a fake job does: a generator that prints (`emit`) and ends (`finish`); each `yield` waits one tick."""


class FakeRay:
    """Plays every Ray cluster the tests make: nodes, jobs, logs. Tests script it through the methods below.

    It starts no tasks of its own (an in-process kopf cancels tasks it did not see at startup): the test's
    own loop calls `advance()` to move every running job's `script` one step.
    """

    def __init__(self, script: Script | None = None) -> None:
        self.clusters: dict[str, FakeCluster] = {}
        self.script = script
        """Run for each new job; without one, a job stays RUNNING until a test calls `finish()`."""
        self.submit_calls: list[str] = []
        self.created: list[str] = []
        """Submission ids in the order Ray accepted them as new jobs (the duplicate check counts these)."""
        self.stopped: list[str] = []
        self.reject: dict[str, str] = {}
        """Submission id -> message: Ray answers 400 to that submission."""
        self.down = False
        """Every cluster's API stops answering (connection refused) while this is set."""
        self._players: dict[str, Iterator[None]] = {}

    # --- what the fake KubeRay and the tests call ---
    def add_cluster(self, address: str, nodes: RayNodes) -> None:
        cluster = self.clusters.setdefault(address, FakeCluster())
        cluster.nodes = nodes

    def remove_cluster(self, address: str) -> None:
        """The head went away: its jobs are gone and its API stops answering."""
        cluster = self.clusters.pop(address, None)
        for sid in cluster.jobs if cluster else ():
            self._players.pop(sid, None)

    # --- faults the tests inject (Ray's side; the API server's are in `local/faults.py`) ---
    def lose_job(self, submission_id: str) -> None:
        """Ray forgets one job (`ray job delete`, or a head without persistent GCS): its id is unknown again."""
        for cluster in self.clusters.values():
            cluster.jobs.pop(submission_id, None)
        self._players.pop(submission_id, None)

    def restart_head(self, address: str) -> None:
        """The head restarted without a persistent GCS: every job is forgotten, the nodes join again."""
        cluster = self.clusters.get(address)
        for sid in list(cluster.jobs if cluster else ()):
            self.lose_job(sid)

    def job(self, submission_id: str) -> FakeJob:
        for cluster in self.clusters.values():
            if submission_id in cluster.jobs:
                return cluster.jobs[submission_id]
        raise KeyError(submission_id)

    def emit(self, submission_id: str, *lines: str) -> None:
        job = self.job(submission_id)
        if job.status == RAY_PENDING:
            job.status = RAY_RUNNING
        job.log += "".join(line + "\n" for line in lines)

    def finish(self, submission_id: str, status: str = RAY_SUCCEEDED, message: str = "") -> None:
        job = self.job(submission_id)
        job.status = status
        defaults = {RAY_SUCCEEDED: "Job finished successfully.", RAY_FAILED: "Job failed."}
        job.message = message or defaults.get(status, "")

    def advance(self) -> None:
        """Move every running job's script one step."""
        for sid, player in list(self._players.items()):
            try:
                job = self.job(sid)
            except KeyError:
                self._players.pop(sid, None)
                continue
            if job.status in RAY_TERMINAL:
                self._players.pop(sid, None)
                continue
            try:
                next(player)
            except StopIteration:
                self._players.pop(sid, None)

    def client(self, address: str) -> RayJobs:
        return _FakeRayJobs(self, address)

    def _cluster(self, address: str) -> FakeCluster:
        cluster = self.clusters.get(address)
        if cluster is None or self.down:
            raise RayUnavailable(f"{address}: connection refused")
        return cluster

    def _start(self, job: FakeJob) -> None:
        if self.script is None:
            job.status = RAY_RUNNING
        else:
            self._players[job.submission.submission_id] = self.script(self, job)


class _FakeRayJobs:
    def __init__(self, ray: FakeRay, address: str) -> None:
        self.ray = ray
        self.address = address

    async def nodes(self) -> RayNodes:
        return self.ray._cluster(self.address).nodes

    async def submit(self, submission: Submission) -> bool:
        cluster = self.ray._cluster(self.address)
        sid = submission.submission_id
        self.ray.submit_calls.append(sid)
        if sid in cluster.jobs:
            return False
        if sid in self.ray.reject:
            raise SubmissionRejected(self.ray.reject[sid])
        job = cluster.jobs[sid] = FakeJob(submission=submission, address=self.address)
        self.ray.created.append(sid)
        self.ray._start(job)
        return True

    async def info(self, submission_id: str) -> RayJobInfo | None:
        job = self.ray._cluster(self.address).jobs.get(submission_id)
        return None if job is None else RayJobInfo(submission_id, job.status, job.message)

    async def logs(self, submission_id: str, offset: int) -> str:
        job = self.ray._cluster(self.address).jobs.get(submission_id)
        if job is None:
            raise RayUnavailable(f"job {submission_id} does not exist")
        return job.log[offset:]

    async def stop(self, submission_id: str) -> bool:
        job = self.ray._cluster(self.address).jobs.get(submission_id)
        if job is None or job.status in RAY_TERMINAL:
            return False
        job.status, job.message = RAY_STOPPED, "Job was intentionally stopped."
        self.ray.stopped.append(submission_id)
        return True

    async def delete(self, submission_id: str) -> None:
        self.ray._cluster(self.address).jobs.pop(submission_id, None)


__all__ = [
    "RAY_FAILED",
    "RAY_PENDING",
    "RAY_RUNNING",
    "RAY_STOPPED",
    "RAY_SUCCEEDED",
    "CachingFactory",
    "FakeRay",
    "RayJobInfo",
    "RayJobs",
    "RayJobsClient",
    "RayJobsFactory",
    "RayNodes",
    "RayUnavailable",
    "Script",
    "SubmissionRejected",
    "summarize_nodes",
]
