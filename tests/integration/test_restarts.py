"""The operator killed (not stopped) at every phase boundary and at seeded random moments, then started again.

A kill here cancels every task of the in-process operator wherever it is, in the middle of an HTTP request
included, with no graceful shutdown: what survives is what the API server and Ray already have, as after a
SIGKILL. (The real process is SIGKILLed once, with real Ray, in tests/e2e/test_faults_ray.py.) After each
run: exactly one RayCluster and one accepted submission, and the same final status as an undisturbed run.

The kill points at phase boundaries are exact: the emulated API server's tap holds the answer to the write
that entered the phase until the operator is dead, so the kill falls between "status written" and "acted".
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import json
import random
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import kopf
import pytest
from aiohttp import web
from fsdp_operator.api import schema
from fsdp_operator.api.render import Submission
from fsdp_operator.local.server import ThreadedApiServer
from fsdp_operator.local.server.faults import FaultInjector
from fsdp_operator.runtime.handlers import build_registry
from fsdp_operator.runtime.kube import USER_AGENT, AioKube
from fsdp_operator.runtime.rayjobs import LOG_CHUNK, RayJobInfo, RayJobs, RayNodes
from fsdp_operator.runtime.shared import Runtime
from integration.test_operator import FAST, WATCHED, Script, World, manifest, scenario
from support.chart_rbac import ACCOUNT
from support.kopf_runner import eventually, operator_settings

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

STEPS = 4
REQUESTS_OF_A_RUN = 20
"""Seeded kill points are drawn from the first this-many API requests of an incarnation (an undisturbed run
makes about 34, see `test_undisturbed_run_is_what_an_operator_should_write`; the loop reads its job, RayCluster
and pods from kopf's watches), so each plan kills."""


@dataclass
class KillPlan:
    """Where to kill: at `boundary` (one exact point, see BOUNDARIES), or, with a `seed`, right after the
    operator's k-th API request for seeded random k (counted afresh for each incarnation): any point
    between two of its interactions with the cluster, mid-request included (the write done, the answer lost)."""

    boundary: str = ""
    seed: int | None = None
    kills: int = 1
    targets: list[int] = field(default_factory=list)
    """With a seed: the request counts at which each incarnation is killed."""
    killed: int = 0
    token: str = ""
    """The live incarnation's credentials (the tap counts its requests only)."""
    seen: int = 0
    """Requests of the live incarnation answered so far."""
    phases: list[str] = field(default_factory=list)
    """The phases the status writes stored, in order, each once per change."""


# Each boundary: (what the API server or Ray saw last, before the operator died). The status boundaries are
# the phases an undisturbed run writes (a test checks it: the first pass writes Provisioning, never Pending).
BOUNDARIES = {
    "Provisioning written": ("status", "Provisioning"),
    "RayCluster created": ("create", "rayclusters"),
    "Submitting written": ("status", "Submitting"),
    "submitted to Ray": ("ray", "submit"),
    "Running written": ("status", "Running"),
    "Succeeded written": ("status", "Succeeded"),
    "RayCluster deleted": ("delete", "rayclusters"),
}


_INCARNATION: contextvars.ContextVar[str] = contextvars.ContextVar("operator_incarnation", default="")
_OWNED: dict[str, weakref.WeakSet[asyncio.Future[Any]]] = {}


def _owning_task_factory(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Future[Any]:
    """Tags every task with the operator incarnation that (transitively) created it, through a context variable:
    a kill must cancel the operator's tasks only, not those of the fake KubeRay or of aiohttp sessions it shares."""
    task = asyncio.Task(coro, loop=loop, **kwargs)
    if owner := _INCARNATION.get():
        _OWNED.setdefault(owner, weakref.WeakSet()).add(task)
    return task


class Operator:
    """One in-process operator "process", with its own credentials; killed like a process is.

    A kill fences the operator's token at the API server and its Ray clients (nothing it still sends takes
    effect, as for a SIGKILLed process), then cancels every task it started, wherever each one is.
    """

    incarnations = 0

    def __init__(self, w: World, on_submit: Callable[[], Awaitable[None]] | None = None) -> None:
        Operator.incarnations += 1
        self.w = w
        self.on_submit = on_submit
        self.token = f"operator-{Operator.incarnations}"
        w.access.add_token(self.token, ACCOUNT)  # the chart's ServiceAccount, a token per incarnation
        self.runner: asyncio.Task[None] | None = None
        self.ignored: set[asyncio.Task[Any]] = set()
        self.runtime: Runtime | None = None
        self.fenced = False

    def _ray(self, address: str, token: str = "") -> RayJobs:
        return _FencedRay(self, self.w.ray.client(address, token))

    async def start(self) -> None:
        w = self.w
        kube = AioKube(w.api.url, headers={"Authorization": f"Bearer {self.token}"}, timeout=FAST.kube_timeout)
        self.runtime = Runtime(FAST, kube=kube, ray=self._ray)
        registry = build_registry(self.runtime, login=False)
        server, token = w.api.url, self.token

        @kopf.on.login(registry=registry)
        def login(**_: Any) -> kopf.ConnectionInfo:
            return kopf.ConnectionInfo(server=server, insecure=True, token=token)

        watches = [w.api.count("watch", plural, group) for plural, group in WATCHED]
        ready = asyncio.Event()
        self.ignored = asyncio.all_tasks()
        loop = asyncio.get_running_loop()
        if loop.get_task_factory() is not _owning_task_factory:
            loop.set_task_factory(_owning_task_factory)
        owner = _INCARNATION.set(self.token)
        try:
            tasks = await kopf.spawn_tasks(
                registry=registry, settings=operator_settings(), standalone=True, clusterwide=True,
                ready_flag=ready, stop_flag=asyncio.Event(),
            )  # fmt: skip
            self.runner = asyncio.create_task(kopf.run_tasks(tasks, ignored=self.ignored), name="operator")
        finally:
            _INCARNATION.reset(owner)
        # Killed during its own startup (a seeded kill point may fall there): nothing more to wait for.
        await eventually(lambda: ready.is_set() or self.fenced, timeout=60)
        await eventually(
            lambda: (
                self.fenced or all(w.api.count("watch", p, g) > n for (p, g), n in zip(WATCHED, watches, strict=True))
            ),
            message="the operator never started watching",
        )

    def cancel(self) -> None:
        """The kill itself (synchronous, on the operator's loop): fence, then cancel every task it started."""
        if not self.fenced:
            self.fenced = True
            faults = self.w.api.server.faults
            assert faults is not None
            faults.fence(f"Bearer {self.token}")
        for task in self._live_tasks():
            task.cancel()

    def _live_tasks(self) -> set[asyncio.Future[Any]]:
        return {t for t in _OWNED.get(self.token, ()) if not t.done() and t is not asyncio.current_task()}

    async def kill(self) -> None:
        # kopf answers a cancellation by stopping its daemons gracefully (with backoffs): cancel again until
        # all is gone, or give up after a few rounds; being fenced, what is left can no longer reach anything.
        for _ in range(20):
            self.cancel()
            if not (pending := self._live_tasks()):
                break
            await asyncio.wait(pending, timeout=0.1)
        if self.runtime is not None:
            await self.runtime.close()  # the kernel closes a killed process's sockets


class _FencedRay:
    """A Ray client that stops reaching Ray once its operator is dead; optionally dies right after a submit."""

    def __init__(self, op: Operator, inner: RayJobs) -> None:
        self.op = op
        self.inner = inner

    def _check(self) -> None:
        if self.op.fenced:
            raise asyncio.CancelledError  # a dead process sends nothing more

    async def nodes(self) -> RayNodes:
        self._check()
        return await self.inner.nodes()

    async def submit(self, submission: Submission) -> bool:
        self._check()
        created = await self.inner.submit(submission)
        if self.op.on_submit is not None:
            await self.op.on_submit()  # Ray has the job; the operator dies before it hears back
        return created

    async def info(self, submission_id: str) -> RayJobInfo | None:
        self._check()
        return await self.inner.info(submission_id)

    async def logs(self, submission_id: str, offset: int, limit: int = LOG_CHUNK, *, final: bool = False) -> str:
        self._check()
        return await self.inner.logs(submission_id, offset, limit, final=final)

    async def stop(self, submission_id: str) -> bool:
        self._check()
        return await self.inner.stop(submission_id)

    async def delete(self, submission_id: str) -> None:
        self._check()
        await self.inner.delete(submission_id)


def _tap(plan: KillPlan, kill_soon: Callable[[], Awaitable[None]]) -> Callable[..., Awaitable[None]]:
    """The API server's tap: kill the operator right after the request that crosses `plan.boundary`, or after
    its planned number of requests."""

    async def tap(request: web.Request, response: web.StreamResponse) -> None:
        if request.headers.get("Authorization") != f"Bearer {plan.token}":
            return
        phase = _written_phase(request, response)
        if phase and phase not in plan.phases[-1:]:
            plan.phases.append(phase)
        if plan.killed >= max(plan.kills, 1):
            return
        plan.seen += 1
        if plan.seed is not None:
            if plan.seen != plan.targets[plan.killed]:
                return
        elif not _crosses(request, response, *BOUNDARIES.get(plan.boundary, ("", ""))):
            return
        plan.killed += 1
        await kill_soon()

    return tap


def _written_phase(request: web.Request, response: web.StreamResponse) -> str:
    """The phase a status write of the operator stored; empty for any other request."""
    path = request.path
    if not request.headers.get("User-Agent", "").startswith(USER_AGENT) or request.method != "PATCH":
        return ""
    if not path.endswith("/status") or f"/{schema.PLURAL}/" not in path or response.status != 200:
        return ""
    body = getattr(response, "body", b"") or b"{}"
    return str(json.loads(bytes(body)).get("status", {}).get("phase") or "")


def _crosses(request: web.Request, response: web.StreamResponse, kind: str, what: str) -> bool:
    if not request.headers.get("User-Agent", "").startswith(USER_AGENT):
        return False
    path = request.path
    if kind == "status":
        return _written_phase(request, response) == what
    if kind == "create":
        return request.method == "POST" and path.endswith(f"/{what}") and response.status == 201
    if kind == "delete":
        return request.method == "DELETE" and f"/{what}/" in path
    return False


async def _run(w: World, plan: KillPlan, test_loop: asyncio.AbstractEventLoop) -> dict[str, Any]:
    """Apply a job, kill the operator as planned (starting a new one after each kill), wait for the end."""
    op: Operator | None = None

    async def kill_from_api_thread() -> None:
        # The tap runs on the API server's loop, the operator on the test's: kill it there, wait here.
        # (No task is started on the operator's loop for this: kopf cancels tasks it did not see at startup.)
        done: concurrent.futures.Future[None] = concurrent.futures.Future()

        def kill() -> None:
            assert op is not None
            op.cancel()
            if not done.done():  # the server may have cancelled this handler when the client went away
                done.set_result(None)

        test_loop.call_soon_threadsafe(kill)
        await asyncio.wrap_future(done)

    async def kill_from_inside() -> None:
        # Called by the operator itself once Ray accepted a submission: it dies before going on.
        assert op is not None
        plan.killed += 1
        op.cancel()
        await asyncio.Event().wait()

    injector = w.api.server.faults
    assert injector is not None
    injector.tap = _tap(plan, kill_from_api_thread)
    on_submit = kill_from_inside if plan.boundary == "submitted to Ray" else None

    if plan.seed is not None:
        rng = random.Random(plan.seed)
        plan.targets = [rng.randint(1, REQUESTS_OF_A_RUN) for _ in range(plan.kills)]
    op = Operator(w, on_submit)
    plan.token, plan.seen = op.token, 0
    await op.start()
    w.apply(manifest(steps=STEPS))
    handled = 0

    def next_kill_or_done() -> bool:
        return plan.killed > handled or (w.status().get("phase") == "Succeeded" and not w.clusters())

    while True:
        # Generous: under a loaded 2-core machine one restart cycle has taken over 30 s.
        await eventually(next_kill_or_done, timeout=120, message="no kill came and the job did not end")
        if plan.killed == handled:
            break
        handled = plan.killed
        await op.kill()
        op = Operator(w)
        plan.token, plan.seen = op.token, 0
        await op.start()
    try:
        await w.phase("Succeeded", timeout=60)
        await eventually(lambda: not w.clusters(), timeout=60, message="the RayCluster was left behind")
    finally:
        await op.kill()
    return w.status()


def comparable(status: dict[str, Any], w: World) -> dict[str, Any]:
    """A final status without what differs between two correct runs: times, the uid in submission ids, and the
    log cursor (each event line carries its wall-clock time, so the log's length varies by a character or so)."""
    varying = ("startTime", "endTime", "provisioningSince", "logOffset", "workerGroupStartTime")
    text = json.dumps({k: v for k, v in status.items() if k not in varying})
    text = text.replace(w.sid(1), "<submission 1>")
    out: dict[str, Any] = json.loads(text)
    out.get("progress", {}).pop("firstStepTime", None)  # the first step's wall-clock time
    out["conditions"] = sorted(
        ({k: v for k, v in c.items() if k != "lastTransitionTime"} for c in out.get("conditions", [])),
        key=lambda c: str(c["type"]),
    )
    return out


def _scenario(plan: KillPlan) -> tuple[World, dict[str, Any]]:
    with ThreadedApiServer(faults=FaultInjector()) as api:
        result: dict[str, Any] = {}

        async def body(w: World) -> None:
            result["status"] = await _run(w, plan, asyncio.get_running_loop())

        world = scenario(api, body, Script(steps=STEPS))
        return world, result["status"]


@pytest.fixture(scope="module")
def undisturbed_run() -> tuple[KillPlan, dict[str, Any]]:
    plan = KillPlan()
    world, status = _scenario(plan)
    assert plan.seen >= REQUESTS_OF_A_RUN, f"an undisturbed run made only {plan.seen} API requests"
    return plan, comparable(status, world)


@pytest.fixture(scope="module")
def undisturbed(undisturbed_run: tuple[KillPlan, dict[str, Any]]) -> dict[str, Any]:
    return undisturbed_run[1]


def test_the_status_boundaries_are_the_phases_a_run_writes(undisturbed_run: tuple[KillPlan, dict[str, Any]]) -> None:
    """A boundary no pass writes is never reached (a kill planned there never happens)."""
    plan, _ = undisturbed_run
    assert [what for kind, what in BOUNDARIES.values() if kind == "status"] == plan.phases


def _check(plan: KillPlan, undisturbed: dict[str, Any]) -> None:
    world, status = _scenario(plan)
    print(f"\nRESTARTS {plan.boundary or f'seed {plan.seed}'}: killed {plan.killed}x (targets {plan.targets})")
    assert plan.killed == max(plan.kills, 1), f"the operator was not killed as planned ({plan})"
    assert len(world.kuberay.seen_uids) == 1, world.kuberay.seen_uids
    assert world.ray.created == [world.sid(1)], world.ray.created
    assert comparable(status, world) == undisturbed


def test_undisturbed_run_is_what_an_operator_should_write(undisturbed: dict[str, Any]) -> None:
    assert undisturbed["phase"] == "Succeeded" and undisturbed["reason"] == "Completed"
    assert undisturbed["attempts"] == 1 and undisturbed["submissionId"] == "<submission 1>"
    assert undisturbed["progress"]["stepOfTotal"] == f"{STEPS}/{STEPS}"
    assert [r["rank"] for r in undisturbed["ranks"]] == list(range(8))


DEFAULT_BOUNDARIES = ["Provisioning written", "submitted to Ray", "Succeeded written"]


@pytest.mark.parametrize("boundary", DEFAULT_BOUNDARIES)
def test_kill_at_a_phase_boundary(boundary: str, undisturbed: dict[str, Any]) -> None:
    _check(KillPlan(boundary=boundary), undisturbed)


@pytest.mark.parametrize("seed", [101])
def test_kills_at_seeded_random_moments(seed: int, undisturbed: dict[str, Any]) -> None:
    _check(KillPlan(seed=seed, kills=2), undisturbed)


# --- the full set: 7 boundaries + 21 seeds x 2 kills = 49 kills ------------------------------------------


@pytest.mark.faults
@pytest.mark.parametrize("boundary", sorted(set(BOUNDARIES) - set(DEFAULT_BOUNDARIES)))
def test_kill_at_every_other_phase_boundary(boundary: str, undisturbed: dict[str, Any]) -> None:
    _check(KillPlan(boundary=boundary), undisturbed)


@pytest.mark.faults
@pytest.mark.parametrize("seed", range(1, 21))
def test_kills_at_many_seeded_random_moments(seed: int, undisturbed: dict[str, Any]) -> None:
    _check(KillPlan(seed=seed, kills=2), undisturbed)
