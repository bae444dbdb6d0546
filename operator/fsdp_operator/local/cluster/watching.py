"""List then watch one collection of the emulated API server, as a controller's informer does.

The local KubeRay stand-in (RayClusters) and its kubelet (pods) both follow the API concepts' pattern
(https://kubernetes.io/docs/reference/using-api/api-concepts/#efficient-detection-of-changes): list once, take the
list's `resourceVersion`, watch from it, carry the last event's `resourceVersion` across reconnects, and list again
when the server answers 410 Gone (the version is too old). Hand-written rather than kopf's or kubernetes_asyncio's
watcher: the stand-ins talk to the emulator with the same aiohttp session they use for their writes, and need
nothing but these twenty lines.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Collection
from typing import Any

import aiohttp

log = logging.getLogger(__name__)

Obj = dict[str, Any]

RETRY_SECONDS = 0.5
"""Pause before reconnecting after a broken watch or a failed listing."""


async def list_then_watch(
    session: aiohttp.ClientSession,
    api_url: str,
    path: str,
    get: Callable[[str, str], Awaitable[Obj]],
    on_event: Callable[[str, Obj], None],
    kinds: Collection[str],
) -> None:
    """Call `on_event(type, object)` for every listed object (as ADDED) and every watch event of `kinds`.

    `get("GET", path)` lists (raising RuntimeError for an error status); runs until cancelled.
    """
    resource_version = ""
    while True:
        try:
            if not resource_version:
                listing = await get("GET", path)
                resource_version = listing["metadata"]["resourceVersion"]
                for item in listing.get("items", []):
                    on_event("ADDED", item)
            url = f"{api_url}{path}?watch=true&resourceVersion={resource_version}"
            async with session.get(url) as response:
                if response.status == 410:  # too old: list again
                    resource_version = ""
                    continue
                async for raw in response.content:
                    if not raw.strip():
                        continue
                    event = json.loads(raw)
                    obj = event.get("object", {})
                    resource_version = obj.get("metadata", {}).get("resourceVersion", resource_version)
                    if event.get("type") in kinds:
                        on_event(event["type"], obj)
        except (TimeoutError, aiohttp.ClientError, RuntimeError) as e:
            log.debug("watch of %s interrupted: %s", path, e)
            await asyncio.sleep(RETRY_SECONDS)
