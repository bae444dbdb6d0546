"""The emulated API server in a child process, so that a measurement of the operator's process is the operator's.

The child also records (on CLOCK_MONOTONIC, which all processes of the machine share) when each
FSDPTrainingJob and each RayCluster was committed, and counts the requests of the operator's two clients
(kopf's and the controller's, told apart by User-Agent) per verb and object: what the load test reports.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import multiprocessing
import time
from collections import Counter
from multiprocessing.connection import Connection
from types import TracebackType
from typing import Any

from aiohttp import web
from fsdp_operator.api import generate, schema
from fsdp_operator.local.cluster.kuberay import RAYCLUSTER_CRD
from fsdp_operator.local.server import ApiServer
from fsdp_operator.local.server.faults import FaultInjector, FaultPlan
from fsdp_operator.local.server.store import WatchEvent
from fsdp_operator.runtime.handlers import GC_THRESHOLDS
from fsdp_operator.runtime.kube import USER_AGENT

from support import chart_rbac
from support.collector import collector_pauses

OPERATOR_AGENTS = ("kopf/", USER_AGENT)


def _request_key(request: web.Request) -> tuple[str, str, str, str]:
    """(client, method, kind of object, subresource): `kind` is the plural; the name goes into per-object counts."""
    parts = [p for p in request.path.split("/") if p]
    client = "controller" if request.headers.get("User-Agent", "").startswith(USER_AGENT) else "kopf"
    watch = request.query.get("watch") in ("true", "1")
    method = "WATCH" if watch else request.method
    plural, subresource = "", ""
    if "namespaces" in parts and len(parts) > parts.index("namespaces") + 2:
        rest = parts[parts.index("namespaces") + 2 :]
    else:
        rest = parts[2:] if parts[:1] == ["api"] else parts[3:]
    if rest:
        plural = rest[0]
        subresource = rest[2] if len(rest) > 2 else ""
    return client, method, plural, subresource


async def _main(
    conn: Connection, plan: FaultPlan | None, rbac: list[dict[str, Any]] | None, pauses: list[tuple[float, float]]
) -> None:
    requests: Counter[tuple[str, str, str, str]] = Counter()
    status_writes: Counter[str] = Counter()
    created: dict[str, dict[str, float]] = {"jobs": {}, "clusters": {}, "loops": {}, "jobs_cpu": {}, "clusters_cpu": {}}
    """Commit times of jobs and RayClusters (`time.monotonic`, one clock for every process of the machine), when the
    controller first asked about each job, and this process's CPU seconds at each commit (`*_cpu`): what the
    emulated API server itself spent between two commits, which a real API server spends on other machines."""

    async def count(request: web.Request, response: web.StreamResponse) -> None:
        if not request.headers.get("User-Agent", "").startswith(OPERATOR_AGENTS):
            return
        key = _request_key(request)
        requests[key] += 1
        if key[0] == "controller" and key[2] == schema.PLURAL:
            # The controller's first request about a job: its loop (the kopf daemon) has started.
            name = request.path.split("/")[-2 if key[3] else -1]
            created["loops"].setdefault(name, time.monotonic())
        if key[1:] == ("PATCH", schema.PLURAL, "status") and key[0] == "controller":
            status_writes[request.path.split("/")[-2]] += 1

    api = ApiServer(faults=FaultInjector(plan or FaultPlan(), tap=count))
    await api.start()
    store = api.store
    crds = store.resource("customresourcedefinitions", "apiextensions.k8s.io")
    store.create(crds, generate.crd())
    store.create(crds, RAYCLUSTER_CRD)
    access = None if rbac is None else chart_rbac.secure_server(api, rbac)

    def recorder(kind: str) -> Any:
        def deliver(event: WatchEvent) -> None:
            name = event.object["metadata"]["name"]
            if event.type == "ADDED" and name not in created[kind]:
                created[kind][name] = time.monotonic()
                created[f"{kind}_cpu"][name] = time.process_time()

        return deliver

    store.subscribe(store.resource(schema.PLURAL, schema.GROUP), None, None, recorder("jobs"))
    store.subscribe(store.resource("rayclusters", "ray.io"), None, None, recorder("clusters"))
    conn.send(api.url)
    loop = asyncio.get_running_loop()
    while True:
        command = await loop.run_in_executor(None, conn.recv)
        if command == "phases":
            # Polled while the jobs run: their phases only, not every status copied and sent each time.
            def phase(job: dict[str, Any]) -> tuple[str, str]:
                return str(job["metadata"]["name"]), str((job.get("status") or {}).get("phase", ""))

            conn.send(dict(store.project(store.resource(schema.PLURAL, schema.GROUP), phase)))
        elif command == "jobs":
            # The jobs' statuses, read here: a test that polled them over HTTP from the operator's process would
            # parse every job's status there, every poll, and count that as the operator's memory and CPU.
            jobs = store.find(schema.PLURAL, schema.GROUP)
            conn.send({job["metadata"]["name"]: job.get("status") or {} for job in jobs})
        elif command == "stats":
            conn.send(
                {
                    "requests": [[*key, n] for key, n in requests.items()],
                    "status_writes": dict(status_writes),
                    "created": created,
                    "collector_pauses": pauses,
                    "injected": dict(api.faults.injected) if api.faults else {},
                    "denied": [] if access is None else [tuple(c) for c in access.denied],
                }
            )
        else:
            break
    await api.stop()


def _serve(conn: Connection, plan: FaultPlan | None, rbac: list[dict[str, Any]] | None) -> None:
    # The operator's collector thresholds (`handlers.GC_THRESHOLDS`): at Python's default the collector was a tenth
    # of this process's CPU under load, which a real API server does not spend.
    gc.set_threshold(*GC_THRESHOLDS)
    with collector_pauses() as pauses:
        asyncio.run(_main(conn, plan, rbac, pauses))


class ApiServerProcess:
    """`with ApiServerProcess() as api:` serves the emulator (with both CRDs) on `api.url` from a child process.

    With `rbac` (the chart's rendered RBAC objects, `chart_rbac.rendered_rbac`) it is `chart_rbac.secure`d: the
    operator must present `chart_rbac.OPERATOR_TOKEN`, what a test does as a person `ADMIN_TOKEN`; `stats()`
    lists the requests RBAC refused under `denied`."""

    def __init__(self, plan: FaultPlan | None = None, rbac: list[dict[str, Any]] | None = None) -> None:
        context = multiprocessing.get_context("spawn")
        self._conn, child = context.Pipe()
        self._process = context.Process(target=_serve, args=(child, plan, rbac), name="apiserver", daemon=True)
        self.url = ""

    def __enter__(self) -> ApiServerProcess:
        self._process.start()
        if not self._conn.poll(60):
            self._process.kill()
            raise RuntimeError("the API server process did not start within 60 s")
        self.url = str(self._conn.recv())
        return self

    def jobs(self) -> dict[str, dict[str, Any]]:
        """Every FSDPTrainingJob's status, by name (read in the API server's process)."""
        self._conn.send("jobs")
        result: dict[str, dict[str, Any]] = self._conn.recv()
        return result

    def phases(self) -> dict[str, str]:
        """Every FSDPTrainingJob's phase, by name ('' before it has one)."""
        self._conn.send("phases")
        result: dict[str, str] = self._conn.recv()
        return result

    def stats(self) -> dict[str, Any]:
        self._conn.send("stats")
        result: dict[str, Any] = self._conn.recv()
        return result

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        with contextlib.suppress(BrokenPipeError, OSError):
            self._conn.send("stop")
        self._process.join(10)
        if self._process.is_alive():
            self._process.kill()
            self._process.join(5)
