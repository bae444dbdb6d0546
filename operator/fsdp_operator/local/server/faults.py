"""Fault injection for the emulated API server: the failures a real API server and the network in front of it show.

`ApiServer(faults=FaultInjector(FaultPlan(rate=0.2, seed=7)))` answers a seeded share of the requests of
the chosen clients (by User-Agent prefix, so a test's own harness can stay undisturbed) with:

- `conflict`: 409 Conflict ("the object has been modified"), on PATCH and PUT only, as an update that
  lost a race does;
- `throttle`: 429 Too Many Requests with `Retry-After` (API Priority and Fairness, max-inflight limits);
- `error`: 500 Internal Server Error (etcd timeouts, a restarting server), before the request takes effect;
- `slow`: the answer comes `slow_seconds` late (an overloaded server; the request itself succeeds);
- `lost`: the request takes effect, then the connection drops before the answer (a proxy or the
  server dying mid-response): the client cannot tell whether its write happened.

and watch requests with:

- `drop`: the stream's connection is cut after a random moment within `drop_within` seconds, mid-stream;
- `expire`: the watch is answered with a `410 Gone` ERROR event (its resourceVersion compacted away),
  which tells the client to list again.

Not reproduced: faults inside one response body (a truncated JSON document), TLS failures, and the
server applying a write twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from aiohttp import web

from fsdp_operator.local.server.store import ApiError

REQUEST_FAULTS = ("conflict", "throttle", "error", "slow", "lost")
WATCH_FAULTS = ("drop", "expire")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Tap = Callable[[web.Request, web.StreamResponse], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class FaultPlan:
    """What to inject, how often, and into whose requests."""

    rate: float = 0.0
    """The share of matching requests (0..1) that get a fault."""
    seed: int = 0
    kinds: tuple[str, ...] = REQUEST_FAULTS
    """Faults for plain requests, taken in turn (from a seeded start) among those that apply to the request:
    every kind shows up once a few faults were injected, which a uniform draw does not promise."""
    watch_kinds: tuple[str, ...] = WATCH_FAULTS
    watch_rate: float | None = None
    """The share of watch requests that get a fault; None: `rate`."""
    clients: tuple[str, ...] = ()
    """User-Agent prefixes whose requests are eligible (e.g. `kopf/`, `fsdp-operator/`); empty: every client."""
    conflict_first: bool = False
    """The first eligible write is answered 409 whatever the draw (then the draws go on as before): a sample with
    few writes still sees a conflict, at the very start of the run."""
    retry_after: int = 1
    """Seconds in the `Retry-After` header of a 429."""
    slow_seconds: float = 0.5
    drop_within: float = 2.0

    def __post_init__(self) -> None:
        unknown = set(self.kinds) - set(REQUEST_FAULTS) | set(self.watch_kinds) - set(WATCH_FAULTS)
        if unknown:
            raise ValueError(f"unknown fault kinds {sorted(unknown)}; known: {REQUEST_FAULTS + WATCH_FAULTS}")
        if not 0.0 <= self.rate <= 1.0 or not 0.0 <= (self.watch_rate or 0.0) <= 1.0:
            raise ValueError("rate and watch_rate must lie between 0 and 1")


class FaultInjector:
    """Wraps the server's request handler; counts what it injected in `injected` (by kind)."""

    def __init__(self, plan: FaultPlan | None = None, *, tap: Tap | None = None) -> None:
        self.plan = plan or FaultPlan()
        self.tap = tap
        """Awaited after every answered request (tests use it to act at an exact moment, e.g. kill a client)."""
        self.fenced: set[str] = set()
        """`Authorization` header values of clients that are dead: see `fence`."""
        self.injected: Counter[str] = Counter()
        self.eligible = 0
        """Requests that were candidates for a fault (matching client)."""
        self._random = random.Random(self.plan.seed)
        self._turns: dict[tuple[str, ...], int] = {}

    def _eligible(self, request: web.Request) -> bool:
        if not self.plan.clients:
            return True
        agent = request.headers.get("User-Agent", "")
        return agent.startswith(self.plan.clients)

    def _choose(self, request: web.Request) -> str:
        """The fault for this request, or '' for none (one draw per eligible request: seeded and replayable)."""
        if not self._eligible(request):
            return ""
        self.eligible += 1
        if request.query.get("watch") in ("true", "1"):
            rate = self.plan.rate if self.plan.watch_rate is None else self.plan.watch_rate
            kinds: tuple[str, ...] = self.plan.watch_kinds
        else:
            rate = self.plan.rate
            writes = request.method in ("PATCH", "PUT")
            kinds = tuple(k for k in self.plan.kinds if k != "conflict" or writes)
        first_conflict = self.plan.conflict_first and "conflict" in kinds and not self.injected["conflict"]
        if not kinds or (self._random.random() >= rate and not first_conflict):
            return ""
        # Writes, the fewest requests, start their turns with the one kind only they get (a conflict).
        kinds = tuple(sorted(kinds, key=lambda k: k != "conflict"))
        start = 0 if "conflict" in kinds else self._random.randrange(len(kinds))
        turn = self._turns.setdefault(kinds, start)
        self._turns[kinds] = turn + 1
        kind = kinds[turn % len(kinds)]
        self.injected[kind] += 1
        return kind

    def fence(self, authorization: str) -> None:
        """From now on, requests with this `Authorization` value are cut off unanswered and take no effect.

        Tests kill an in-process client this way: like a SIGKILLed process, whatever its cancelled tasks
        still try to send never arrives.
        """
        self.fenced.add(authorization)

    async def handle(self, request: web.Request, answer: Handler) -> web.StreamResponse:
        if self.fenced and request.headers.get("Authorization", "") in self.fenced:
            if request.transport is not None:
                request.transport.close()
            return _status(503, "ServiceUnavailable", "fenced client")
        kind = self._choose(request)
        if kind == "conflict":
            return _status(409, "Conflict", "Operation cannot be fulfilled: the object has been modified (injected)")
        if kind == "throttle":
            response = _status(429, "TooManyRequests", "the server has received too many requests (injected)")
            response.headers["Retry-After"] = str(self.plan.retry_after)
            return response
        if kind == "error":
            return _status(500, "InternalError", "an error on the server has prevented the request (injected)")
        if kind == "expire":
            gone = ApiError(410, "Expired", "too old resource version (injected)").status()
            return web.Response(body=json.dumps({"type": "ERROR", "object": gone}).encode() + b"\n",
                                content_type="application/json")  # fmt: skip
        if kind == "slow":
            await asyncio.sleep(self.plan.slow_seconds)
        if kind == "drop":
            asyncio.get_running_loop().call_later(
                self._random.uniform(0.0, self.plan.drop_within), _cut_if_running, request
            )
        answered = await answer(request)
        if self.tap is not None:
            await self.tap(request, answered)
        if kind == "lost" and request.transport is not None:
            # The write happened; the client never hears so (the connection goes before the answer).
            request.transport.close()
        return answered


def _cut_if_running(request: web.Request) -> None:
    """Drop a watch's connection if its stream is still open (never a later request's on a reused connection)."""
    task = request.task
    if task is not None and not task.done() and request.transport is not None:
        with contextlib.suppress(RuntimeError):
            request.transport.close()


def _status(code: int, reason: str, message: str) -> web.Response:
    body = ApiError(code, reason, message).status()
    return web.Response(body=json.dumps(body).encode(), status=code, content_type="application/json")
