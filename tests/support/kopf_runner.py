"""Run a kopf registry in-process against the emulated API server, in the caller's event loop.

    registry = kopf.OperatorRegistry()
    @kopf.on.create("fsdp.dev", "v1alpha1", "fsdptrainingjobs", registry=registry) ...
    async with kopf_operator(registry, api.url):
        ...  # act through HTTP, assert on api.store

Run the API server in its own thread (`ThreadedApiServer`), not in this loop: kopf's `run_tasks`
waits for and then cancels every task of its loop that it did not see at startup, the server's
connection handlers included. Tasks the test starts before entering the context are left alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections.abc import AsyncIterator, Callable, Collection
from typing import Any

import kopf

DEFAULT_FINALIZER = "test.fsdp.dev/finalizer"

# The login handler is registered once per registry; it reads the URL of the current run from here,
# so one registry can be started, stopped and started again (operator restarts).
_servers: weakref.WeakKeyDictionary[kopf.OperatorRegistry, dict[str, str]] = weakref.WeakKeyDictionary()


def _ensure_login(registry: kopf.OperatorRegistry, url: str, token: str | None) -> None:
    holder = _servers.get(registry)
    if holder is None:
        holder = _servers[registry] = {}

        @kopf.on.login(registry=registry)
        def _login(**_: Any) -> kopf.ConnectionInfo:
            return kopf.ConnectionInfo(server=holder["url"], insecure=True, token=holder.get("token") or None)

    holder["url"] = url
    holder["token"] = token or ""


def operator_settings(finalizer: str = DEFAULT_FINALIZER) -> kopf.OperatorSettings:
    """Settings for a fast, isolated in-process operator: own finalizer and annotation prefix."""
    settings = kopf.OperatorSettings()
    settings.persistence.finalizer = finalizer
    prefix = finalizer.split("/", 1)[0]
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=prefix)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=prefix, key="last-handled-configuration"
    )
    settings.watching.reconnect_backoff = 0.1
    settings.watching.connect_timeout = 5
    settings.networking.request_timeout = 10
    settings.queueing.exit_timeout = 2
    return settings


@contextlib.asynccontextmanager
async def kopf_operator(
    registry: kopf.OperatorRegistry,
    url: str,
    *,
    namespaces: Collection[str] | None = None,
    settings: kopf.OperatorSettings | None = None,
    configure: Callable[[kopf.OperatorSettings], None] | None = None,
    memo: object | None = None,
    startup_timeout: float = 60,
    stop_timeout: float = 15,
    token: str | None = None,
    login: bool = True,
    liveness_endpoint: str | None = None,
) -> AsyncIterator[None]:
    """Run the registry's handlers against `url` until the block exits (clusterwide unless namespaces).

    `token`: the bearer token kopf sends (for an API server that enforces RBAC). Without `login`, the
    registry brings its own login handler (the operator's real one) and `url` is not used for it.
    """
    if login:
        _ensure_login(registry, url, token)
    settings = settings or operator_settings()
    if configure is not None:
        configure(settings)
    ready = asyncio.Event()
    stop = asyncio.Event()
    ignored = asyncio.all_tasks()
    tasks = await kopf.spawn_tasks(
        registry=registry,
        settings=settings,
        standalone=True,
        clusterwide=namespaces is None,
        namespaces=list(namespaces or ()),
        ready_flag=ready,
        stop_flag=stop,
        memo=memo,
        liveness_endpoint=liveness_endpoint,
    )
    runner = asyncio.create_task(kopf.run_tasks(tasks, ignored=ignored), name="kopf operator")
    try:
        ready_waiter = asyncio.create_task(ready.wait())
        done, _ = await asyncio.wait(
            {ready_waiter, runner}, timeout=startup_timeout, return_when=asyncio.FIRST_COMPLETED
        )
        if runner in done:
            ready_waiter.cancel()
            runner.result()  # raises what stopped the operator
            raise RuntimeError("the operator exited during startup")
        if ready_waiter not in done:
            ready_waiter.cancel()
            raise TimeoutError(f"the operator was not ready within {startup_timeout} s")
        yield
    finally:
        stop.set()
        await asyncio.wait_for(runner, stop_timeout)


async def eventually(
    condition: Callable[[], Any], *, timeout: float = 60, interval: float = 0.02, message: str = ""
) -> Any:
    """Poll until `condition()` is truthy and return its value (for assertions on asynchronous effects)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        value = condition()
        if value:
            return value
        if loop.time() > deadline:
            raise AssertionError(message or f"condition not met within {timeout} s")
        await asyncio.sleep(interval)


class Stopped:
    """kopf's daemon stop flag (`DaemonStopped`) as `JobLoop.run` uses it: false until `flag` is set, and a wait for
    it bounded by `timeout`."""

    def __init__(self) -> None:
        self.flag = asyncio.Event()

    def __bool__(self) -> bool:
        return self.flag.is_set()

    async def wait(self, timeout: float | None = None) -> bool:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.flag.wait(), timeout)
        return self.flag.is_set()
