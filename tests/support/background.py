"""A test double's loop in the background: one step every `tick` seconds until the block exits."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable


@contextlib.asynccontextmanager
async def every(tick: float, step: Callable[[], Awaitable[None]], name: str) -> AsyncIterator[None]:
    async def loop() -> None:
        while True:
            await step()
            await asyncio.sleep(tick)

    task = asyncio.create_task(loop(), name=name)
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
