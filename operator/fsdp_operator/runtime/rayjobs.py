"""Ray's job API and cluster view behind one small protocol: the real client and an in-memory fake.

The real `RayJobsClient` wraps `ray.job_submission.JobSubmissionClient` (blocking, so every call runs
in a thread with a timeout) and asks the dashboard's state API (`/api/v0/nodes`) which nodes are
alive, because pod readiness alone races with Ray's own view (KubeRay #962, #4199, #4760). With Ray's
token authentication on, every request carries the job's token as `Authorization: Bearer`.
`FakeRay` plays Ray for the integration tests; run-local uses the real client.

The job log is read incrementally. Ray 2.58's job API has two ways to read a driver log: `get_job_logs`
(`GET /api/jobs/{id}/logs`, the whole log every time) and `tail_job_logs` (a websocket that sends the log
from its start and then each new chunk as it is written). The state API's `/api/v0/logs/file` takes a
line count from the end, not an offset. So the client keeps one `tail_job_logs` stream per job open
(`_LogTail`): each pass takes what arrived since the last, a restarted operator skips the stream's
first `offset` characters once, and a bounded buffer holds the stream back (TCP flow control) while
the operator is behind. Should the stream fail repeatedly, one pass falls back to `get_job_logs`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from fsdp_train.contract import events

from fsdp_operator.api.render import Submission
from fsdp_operator.decide.observed import RAY_FAILED, RAY_PENDING, RAY_RUNNING, RAY_STOPPED, RAY_SUCCEEDED, RAY_TERMINAL
from fsdp_operator.decide.observed import RayJobInfo as RayJobInfo
from fsdp_operator.decide.observed import RayNodes as RayNodes

T = TypeVar("T")
log = logging.getLogger(__name__)

LOG_CHUNK = 256 * 1024
"""Characters of job log one pass reads at most: the bound on one job's parsing work per pass."""
TAIL_BUFFER = 4 * 1024 * 1024
"""Characters a log stream buffers ahead of the operator before it stops reading the websocket."""
TAIL_FAILURES_BEFORE_FALLBACK = 3


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

    async def logs(self, submission_id: str, offset: int, limit: int = LOG_CHUNK, *, final: bool = False) -> str:
        """At most `limit` characters of the job's driver log from character `offset` on ('' when nothing new).

        `final`: the job has ended, so the log is complete; the answer holds `limit` characters, or all up to
        the log's end (a streaming reader waits for the stream to deliver it).
        """
        ...

    async def stop(self, submission_id: str) -> bool: ...

    async def delete(self, submission_id: str) -> None: ...


class RayJobsFactory(Protocol):
    """Makes the client for a dashboard URL (`http://host:8265`) and the cluster's auth token ('' when none)."""

    def __call__(self, address: str, token: str = "") -> RayJobs: ...


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

    def __init__(self, address: str, *, timeout: float = 20.0, token: str = "") -> None:
        self.address = address.rstrip("/")
        self.timeout = timeout
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._client: Any = None
        self._tails: dict[str, _LogTail] = {}

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
                # Explicit headers: Ray's own token lookup reads this process's environment, one token for all.
                self._client = BoundedClient(self.address, headers=dict(self.headers))
            except (ConnectionError, RuntimeError, OSError) as e:
                raise RayUnavailable(f"{self.address}: {e}") from e
        return self._client

    async def nodes(self) -> RayNodes:
        def fetch() -> RayNodes:
            url = f"{self.address}/api/v0/nodes?limit=10000&detail=false"
            try:
                request = urllib.request.Request(url, headers=self.headers)
                with urllib.request.urlopen(request, timeout=self.timeout) as response:
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

    async def logs(self, submission_id: str, offset: int, limit: int = LOG_CHUNK, *, final: bool = False) -> str:
        tail = self._tails.get(submission_id)
        if tail is not None and tail.failed:
            self._tails.pop(submission_id)
            failures = tail.failures + 1
            log.info(f"log stream of {submission_id} ended ({tail.error}); failure {failures}")
            if failures >= TAIL_FAILURES_BEFORE_FALLBACK:
                return await self._whole_log(submission_id, offset, limit)  # the stream keeps failing: read once
            tail = None
        else:
            failures = 0
        if tail is None or offset < tail.base:
            if tail is not None:
                tail.close()
            sdk = await self._call(self._sdk)
            tail = self._tails[submission_id] = _LogTail(sdk, submission_id, skip=offset, failures=failures)
        if final and not await tail.settle(offset, limit, self.timeout):
            # The stream did not deliver the end in time: one whole read makes sure no last line is lost.
            return await self._whole_log(submission_id, offset, limit)
        return tail.read(offset, limit)

    async def _whole_log(self, submission_id: str, offset: int, limit: int) -> str:
        def run() -> str:
            try:
                text = str(self._sdk().get_job_logs(submission_id))
            except (RuntimeError, ConnectionError, OSError) as e:
                raise RayUnavailable(str(e)[-500:]) from e
            return text[offset : offset + limit]

        return await self._call(run)

    def forget(self, submission_id: str) -> None:
        """Close the job's log stream (the job is finished or stopped)."""
        tail = self._tails.pop(submission_id, None)
        if tail is not None:
            tail.close()

    async def stop(self, submission_id: str) -> bool:
        self.forget(submission_id)

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


class _LogTail:
    """One job's driver log, followed over Ray's websocket (`tail_job_logs`) into a bounded buffer.

    Positions are characters from the start of the log. `base` is the position of `buffer[0]`; the stream
    always starts at 0, so a tail opened at `skip` drops that many characters first.
    """

    def __init__(self, sdk: Any, submission_id: str, *, skip: int, failures: int) -> None:
        self.base = skip
        self.buffer = ""
        self.failures = failures
        self.error: BaseException | None = None
        self._skip = skip
        self._chunks: list[str] = []
        self._buffered = 0
        self._room = asyncio.Event()
        self._room.set()
        self._grown = asyncio.Event()
        self._ended = False
        self._task = asyncio.get_running_loop().create_task(self._follow(sdk, submission_id))

    @property
    def failed(self) -> bool:
        return self.error is not None

    async def _follow(self, sdk: Any, submission_id: str) -> None:
        try:
            async for chunk in sdk.tail_job_logs(submission_id):
                if self._skip:
                    cut = min(self._skip, len(chunk))
                    chunk, self._skip = chunk[cut:], self._skip - cut
                self._chunks.append(chunk)
                self._buffered += len(chunk)
                self._grown.set()
                if self._buffered >= TAIL_BUFFER:
                    self._room.clear()
                    await self._room.wait()  # the operator is behind: stop reading, the socket holds Ray back
            if self._skip:
                self.error = RayUnavailable(f"log of {submission_id} is shorter than the recorded offset")
            self._ended = True
        except asyncio.CancelledError:
            raise
        except Exception as e:  # whatever ended the stream, the next read opens a new one
            self.error = e
        finally:
            self._grown.set()

    async def settle(self, offset: int, limit: int, timeout: float) -> bool:
        """Wait until `limit` characters past `offset` arrived or the stream ended; False when it failed or
        `timeout` passed first."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not self._ended and self.error is None:
            if self.base + len(self.buffer) + sum(map(len, self._chunks)) - offset >= limit:
                return True
            self._grown.clear()
            try:
                await asyncio.wait_for(self._grown.wait(), max(deadline - loop.time(), 0.0))
            except TimeoutError:
                return False
        return self.error is None

    def read(self, offset: int, limit: int) -> str:
        if self._chunks:
            self.buffer += "".join(self._chunks)
            self._chunks.clear()
        if offset > self.base:
            drop = min(offset - self.base, len(self.buffer))
            self.buffer, self.base = self.buffer[drop:], self.base + drop
        self._buffered = len(self.buffer)
        if self._buffered < TAIL_BUFFER:
            self._room.set()
        return self.buffer[offset - self.base : offset - self.base + limit] if offset >= self.base else ""

    def close(self) -> None:
        self._task.cancel()


class CachingFactory:
    """One `RayJobsClient` per address and token (the SDK checks versions over HTTP when it is built)."""

    def __init__(self, *, timeout: float = 20.0) -> None:
        self.timeout = timeout
        self._clients: dict[tuple[str, str], RayJobsClient] = {}

    def __call__(self, address: str, token: str = "") -> RayJobs:
        client = self._clients.get((address, token))
        if client is None:
            client = self._clients[(address, token)] = RayJobsClient(address, timeout=self.timeout, token=token)
        return client


# --- the in-memory fake ------------------------------------------------------------------------------


@dataclass
class FakeJob:
    submission: Submission
    address: str
    status: str = RAY_PENDING
    message: str = ""
    log: str = ""
    signer: events.Signer | None = None
    """Signs what `FakeRay.emit` prints, as the bundled emitter of this attempt does."""


def _signed(line: str, signer: events.Signer) -> str:
    """`line` with its unsigned event (if any) signed; other lines, and ones whose JSON does not parse, as they are."""
    start = line.find(events.PREFIX + " {")
    if start < 0:
        return line
    begin = start + len(events.PREFIX) + 1
    try:
        payload, end = json.JSONDecoder().raw_decode(line, begin)
    except (ValueError, RecursionError):
        return line
    if not isinstance(payload, dict):
        return line
    return line[:start] + signer.line(payload) + line[end:]


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
        self.tokens: dict[str, str] = {}
        """Address -> the token the cluster's Ray requires (token auth on); absent: no auth."""
        self.log_reads: list[tuple[str, int, int]] = []
        """(submission id, offset, characters returned) of every log read, to check reads are incremental."""
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

    # --- faults the tests inject (Ray's side; the API server's are in `local/server/faults.py`) ---
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
        """The bundled training function prints `lines`: each event line in them is signed with the attempt's key
        (from the submission, as `fsdp_train.contract.events.take_key` reads it), as the real emitter signs it."""
        job = self.job(submission_id)
        key = bytes.fromhex(str(job.submission.runtime_env.get("env_vars", {}).get(events.KEY_ENV, "")))
        if key and job.signer is None:
            job.signer = events.Signer(key)
        signer = job.signer
        self.print(submission_id, *(_signed(line, signer) if signer else line for line in lines))

    def print(self, submission_id: str, *lines: str) -> None:
        """Other code of the job prints `lines` verbatim (a user's print, a dependency): nothing is signed."""
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

    def client(self, address: str, token: str = "") -> RayJobs:
        return _FakeRayJobs(self, address, token)

    def _cluster(self, address: str, token: str = "") -> FakeCluster:
        cluster = self.clusters.get(address)
        if cluster is None or self.down:
            raise RayUnavailable(f"{address}: connection refused")
        required = self.tokens.get(address)
        if required is not None and token != required:
            # What Ray's token middleware answers (401 without a token, 403 with a wrong one).
            raise RayUnavailable(f"{address}: {'403 Forbidden' if token else '401 Unauthorized'}")
        return cluster

    def _start(self, job: FakeJob) -> None:
        if self.script is None:
            job.status = RAY_RUNNING
        else:
            self._players[job.submission.submission_id] = self.script(self, job)


class _FakeRayJobs:
    def __init__(self, ray: FakeRay, address: str, token: str) -> None:
        self.ray = ray
        self.address = address
        self.token = token

    def _cluster(self) -> FakeCluster:
        return self.ray._cluster(self.address, self.token)

    async def nodes(self) -> RayNodes:
        return self._cluster().nodes

    async def submit(self, submission: Submission) -> bool:
        cluster = self._cluster()
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
        job = self._cluster().jobs.get(submission_id)
        return None if job is None else RayJobInfo(submission_id, job.status, job.message)

    async def logs(self, submission_id: str, offset: int, limit: int = LOG_CHUNK, *, final: bool = False) -> str:
        job = self._cluster().jobs.get(submission_id)
        if job is None:
            raise RayUnavailable(f"job {submission_id} does not exist")
        text = job.log[offset : offset + limit]
        self.ray.log_reads.append((submission_id, offset, len(text)))
        return text

    async def stop(self, submission_id: str) -> bool:
        job = self._cluster().jobs.get(submission_id)
        if job is None or job.status in RAY_TERMINAL:
            return False
        job.status, job.message = RAY_STOPPED, "Job was intentionally stopped."
        self.ray.stopped.append(submission_id)
        return True

    async def delete(self, submission_id: str) -> None:
        self._cluster().jobs.pop(submission_id, None)


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
