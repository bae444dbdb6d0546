"""Kubernetes access behind a small protocol: the job, its RayCluster, pods, events. aiohttp over HTTP(S).

The operator uses the same credentials kopf logged in with (`AioKube.from_connection_info`), so the
API server, token and CA come from one place. Credentials rotate (a service-account token file the
kubelet refreshes, an exec plugin's token that expires every 15 minutes): on a 401 the client asks its
`refresh` source for new ones and repeats the request once, as kopf does for its own requests; kopf's
re-login hands them over too (`use_credentials`). Creates treat 409 as "already there"; deletes treat
404 as "already gone": every call is safe to repeat after a restart. A 404 means "no such object" only when its
Status names the object, as the API server's own NotFound does (`details.name`); one that does not (a resource
type not served at the moment, a proxy in front of the server) is an error, so that no pass reads a cluster as
deleted from it.

Every request is one of the calls of `calls.py` (verb, group, resource), the table the chart's RBAC is held to.

Hand-written rather than `kubernetes_asyncio` or `kr8s`: the few calls of that table fit in this file,
with timeouts and typed errors the state machine relies on, and credentials shared with kopf's login
instead of a second configuration loader with its own refresh logic.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import ssl
import tempfile
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime
from typing import Any, Protocol
from urllib.parse import urlencode

import aiohttp

from fsdp_operator.api import formats, schema
from fsdp_operator.runtime import calls

Obj = dict[str, Any]

RAYCLUSTER_GROUP, RAYCLUSTER_VERSION, RAYCLUSTER_PLURAL = "ray.io", "v1", "rayclusters"
EVENT_SOURCE = "fsdp-operator"
USER_AGENT = "fsdp-operator/0.1.0"
"""Names the operator's own requests in the API server's audit log (kopf's own say `kopf/<version>`)."""
THROTTLE_RETRIES = 3
"""A 429 is retried this often after its `Retry-After` (as client-go does) before the pass gives up."""
MAX_RETRY_AFTER = 10.0


class KubeError(RuntimeError):
    """An unexpected answer from the API server."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status

    @property
    def transient(self) -> bool:
        """Worth repeating as it was: no answer (the request may have taken effect), a server error, throttling, a
        conflict, or the object gone (the next pass finds out). Other 4xx refuse the request itself."""
        return not 400 <= self.status < 500 or self.status in (404, 409, 429)


class Kube(Protocol):
    """What the operator asks of the Kubernetes API."""

    async def get_job(self, namespace: str, name: str) -> Obj | None: ...

    async def patch_job_status(self, namespace: str, name: str, status_patch: Obj) -> Obj:
        """Merge-patch `status` (the status subresource)."""
        ...

    async def delete_job(self, namespace: str, name: str) -> bool: ...

    async def get_raycluster(self, namespace: str, name: str) -> Obj | None: ...

    async def create_raycluster(self, manifest: Obj) -> bool:
        """True when created, False when one of that name already exists (409)."""
        ...

    async def delete_raycluster(self, namespace: str, name: str) -> bool:
        """True when a delete was issued, False when there was nothing to delete (404)."""
        ...

    async def create_secret(self, manifest: Obj) -> bool:
        """True when created, False when a Secret of that name already exists (409)."""
        ...

    async def get_secret(self, namespace: str, name: str) -> Obj | None: ...

    async def create_network_policy(self, manifest: Obj) -> bool:
        """True when created, False when one of that name already exists (409)."""
        ...

    async def get_network_policy(self, namespace: str, name: str) -> Obj | None: ...

    async def delete_owned(self, kind: str, namespace: str, name: str, uid: str) -> bool:
        """Delete the `kind` (Secret, NetworkPolicy, RayCluster) of that name only while it is the object `uid`
        (a precondition): True when a delete was issued, False when it is gone or another object by now."""
        ...

    async def list_pods(self, namespace: str, label_selector: str) -> list[Obj]: ...

    async def delete_pod(self, namespace: str, name: str, uid: str) -> bool:
        """Delete a pod gracefully (its own grace period) while it is the pod `uid`: True when a delete was issued."""
        ...

    async def list_events(self, namespace: str, field_selector: str) -> list[Obj]: ...

    async def list_workloads(self, namespace: str, label_selector: str) -> list[Obj] | None:
        """Kueue's Workloads (kueue.x-k8s.io/v1beta1); None when the API server does not serve them (no Kueue)."""
        ...

    async def list_nodes(self, label_selector: str) -> list[Obj]:
        """Nodes (cluster-scoped): where nodes of an instance type are, for `availabilityZone: auto`."""
        ...

    async def post_event(self, involved: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
        """A core/v1 Event about `involved` (an object with apiVersion, kind, metadata)."""
        ...

    async def close(self) -> None: ...


def _names(payload: Mapping[str, Any], name: str) -> bool:
    """The Status of a 404 says that this very object does not exist (`reason: NotFound`, `details.name`)."""
    details = payload.get("details")
    return payload.get("reason") == "NotFound" and isinstance(details, Mapping) and details.get("name") == name


def _seconds(retry_after: str) -> float:
    """`Retry-After` in seconds (the API server sends whole seconds); 1 when absent or unreadable."""
    try:
        return max(float(retry_after), 0.0)
    except ValueError:
        return 1.0


def _as_file(data: bytes | str | None, name: str) -> str | None:
    """Inline kubeconfig credentials as a private file: `ssl` loads client certificates from files only."""
    if not data:
        return None
    folder = tempfile.mkdtemp(prefix="fsdp-operator-")
    path = os.path.join(folder, name)
    with open(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600), "wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)
    return path


CredentialSource = Callable[[], Awaitable[Any]]
"""Returns fresh credentials as a `kopf.ConnectionInfo` (or None when there are none)."""


def _authorization(info: Any) -> dict[str, str]:
    """The `Authorization` header a `kopf.ConnectionInfo` asks for (none for client certificates)."""
    if info.token:
        return {"Authorization": f"{info.scheme or 'Bearer'} {info.token}"}
    if info.username and info.password:
        pair = base64.b64encode(f"{info.username}:{info.password}".encode()).decode()
        return {"Authorization": f"Basic {pair}"}
    return {}


class AioKube:
    """The real client: plain HTTP calls with aiohttp, one session per operator process."""

    def __init__(
        self,
        server: str,
        *,
        headers: Mapping[str, str] | None = None,
        ssl_context: ssl.SSLContext | bool = True,
        timeout: float = 30.0,
        refresh: CredentialSource | None = None,
    ) -> None:
        self.server = server.rstrip("/")
        self.headers = dict(headers or {})
        self.ssl_context = ssl_context
        self.timeout = timeout
        self.refresh = refresh
        self.refreshes = 0
        """How often new credentials were taken (after a 401 or from kopf's re-login)."""
        self._session: aiohttp.ClientSession | None = None

    def use_credentials(self, info: Any) -> None:
        """Take the token or password of a newer `kopf.ConnectionInfo` (kopf logged in again)."""
        fresh = _authorization(info)
        if fresh and fresh != {k: v for k, v in self.headers.items() if k == "Authorization"}:
            self.headers.update(fresh)
            self.refreshes += 1

    @classmethod
    def from_connection_info(
        cls, info: Any, *, timeout: float = 30.0, refresh: CredentialSource | None = None
    ) -> AioKube:
        """From a `kopf.ConnectionInfo` (what the operator's login handler returned)."""
        headers = _authorization(info)
        context: ssl.SSLContext | bool = True
        if info.insecure:
            context = False
        elif info.ca_path or info.ca_data or info.certificate_path or info.certificate_data:
            ca_data = info.ca_data.decode() if isinstance(info.ca_data, bytes) else info.ca_data
            context = ssl.create_default_context(cafile=info.ca_path, cadata=ca_data)
            certificate = info.certificate_path or _as_file(info.certificate_data, "client.crt")
            key = info.private_key_path or _as_file(info.private_key_data, "client.key")
            if certificate and key:
                context.load_cert_chain(certificate, key)
        return cls(str(info.server), headers=headers, ssl_context=context, timeout=timeout, refresh=refresh)

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout))
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _request(
        self,
        call: calls.Call,
        namespace: str = "",
        name: str = "",
        *,
        body: Any = None,
        content_type: str = "application/json",
        query: Mapping[str, str] | None = None,
        allow: tuple[int, ...] = (),
        answer: bool = True,
    ) -> tuple[int, Obj]:
        """One request of the call table (`calls.py`): its method and path come from `call`, nothing else.

        Without `answer` a success's body is not parsed (an empty object is returned): a create's answer is the whole
        object back (a RayCluster's with every default the API server added), and no caller of a create, a delete or
        an event reads it."""
        method, path = call.method, call.path(namespace, name)
        url = self.server + path + (f"?{urlencode(query)}" if query else "")
        data = None if body is None else json.dumps(body)
        status, text = await self._send(method, url, path, data, content_type)
        if status == 401 and self.refresh is not None:
            # The token may have rotated under us: take fresh credentials and try once more.
            info = await self.refresh()
            if info is not None:
                self.use_credentials(info)
                status, text = await self._send(method, url, path, data, content_type)
        if status < 400 and not answer:
            return status, {}
        try:
            payload = json.loads(text) if text else {}
        except ValueError:
            payload = {"message": text}
        if status >= 400 and status not in allow:
            raise KubeError(status, f"{method} {path}: {payload.get('message', text)[:500]}")
        return status, payload

    async def _send(self, method: str, url: str, path: str, data: str | None, content_type: str) -> tuple[int, str]:
        headers = {**self.headers, "Content-Type": content_type, "Accept": "application/json", "User-Agent": USER_AGENT}
        for attempt in range(THROTTLE_RETRIES + 1):
            try:
                async with self._client().request(method, url, data=data, headers=headers, ssl=self.ssl_context) as r:
                    status, text, retry_after = r.status, await r.text(), r.headers.get("Retry-After", "")
            except (aiohttp.ClientError, TimeoutError) as e:
                raise KubeError(0, f"{method} {path}: {e}") from e
            # Throttled (API Priority and Fairness): the request was not processed, so even a POST is safe to repeat.
            if status != 429 or attempt == THROTTLE_RETRIES:
                break
            await asyncio.sleep(min(_seconds(retry_after), MAX_RETRY_AFTER))
        return status, text

    async def _on_object(self, call: calls.Call, namespace: str, name: str) -> Obj | None:
        """GET or DELETE one object: its answer, or None when the server said that object does not exist."""
        status, payload = await self._request(call, namespace, name, allow=(404,))
        if status != 404:
            return payload
        if not _names(payload, name):
            what = f"{call.method} {call.path(namespace, name)}"
            raise KubeError(404, f"{what}: a 404 that does not name {name!r}: {payload.get('message', '')}")
        return None

    async def _create(self, call: calls.Call, manifest: Obj) -> bool:
        namespace = str(manifest["metadata"].get("namespace", "default"))
        status, _ = await self._request(call, namespace, body=manifest, allow=(409,), answer=False)
        return status != 409

    async def get_job(self, namespace: str, name: str) -> Obj | None:
        return await self._on_object(calls.GET_JOB, namespace, name)

    async def patch_job_status(self, namespace: str, name: str, status_patch: Obj) -> Obj:
        _, obj = await self._request(
            calls.PATCH_JOB_STATUS,
            namespace,
            name,
            body={"status": status_patch},
            content_type="application/merge-patch+json",
        )
        return obj

    async def delete_job(self, namespace: str, name: str) -> bool:
        return await self._on_object(calls.DELETE_JOB, namespace, name) is not None

    async def get_raycluster(self, namespace: str, name: str) -> Obj | None:
        return await self._on_object(calls.GET_CLUSTER, namespace, name)

    async def create_raycluster(self, manifest: Obj) -> bool:
        return await self._create(calls.CREATE_CLUSTER, manifest)

    async def delete_raycluster(self, namespace: str, name: str) -> bool:
        return await self._on_object(calls.DELETE_CLUSTER, namespace, name) is not None

    async def create_secret(self, manifest: Obj) -> bool:
        return await self._create(calls.CREATE_SECRET, manifest)

    async def get_secret(self, namespace: str, name: str) -> Obj | None:
        return await self._on_object(calls.GET_SECRET, namespace, name)

    async def create_network_policy(self, manifest: Obj) -> bool:
        return await self._create(calls.CREATE_POLICY, manifest)

    async def get_network_policy(self, namespace: str, name: str) -> Obj | None:
        return await self._on_object(calls.GET_POLICY, namespace, name)

    async def delete_owned(self, kind: str, namespace: str, name: str, uid: str) -> bool:
        call = {"Secret": calls.DELETE_SECRET, "NetworkPolicy": calls.DELETE_POLICY, "RayCluster": calls.DELETE_CLUSTER}
        # Background propagation, as kubectl's default; the uid precondition answers 409 for a newer object.
        body = {"kind": "DeleteOptions", "apiVersion": "v1", "preconditions": {"uid": uid}}
        status, _ = await self._request(call[kind], namespace, name, body=body, allow=(404, 409), answer=False)
        return status not in (404, 409)

    async def delete_pod(self, namespace: str, name: str, uid: str) -> bool:
        body = {"kind": "DeleteOptions", "apiVersion": "v1", "preconditions": {"uid": uid}}
        status, _ = await self._request(calls.DELETE_POD, namespace, name, body=body, allow=(404, 409), answer=False)
        return status not in (404, 409)

    async def list_pods(self, namespace: str, label_selector: str) -> list[Obj]:
        _, listing = await self._request(calls.LIST_PODS, namespace, query={"labelSelector": label_selector})
        return list(listing.get("items") or [])

    async def list_workloads(self, namespace: str, label_selector: str) -> list[Obj] | None:
        query = {"labelSelector": label_selector}
        status, listing = await self._request(calls.LIST_WORKLOADS, namespace, query=query, allow=(404,))
        if status == 404:
            return None  # a collection is never "not found": the resource itself is not served
        return list(listing.get("items") or [])

    async def list_nodes(self, label_selector: str) -> list[Obj]:
        _, listing = await self._request(calls.LIST_NODES, query={"labelSelector": label_selector})
        return list(listing.get("items") or [])

    async def list_events(self, namespace: str, field_selector: str) -> list[Obj]:
        _, listing = await self._request(calls.LIST_EVENTS, namespace, query={"fieldSelector": field_selector})
        return list(listing.get("items") or [])

    async def post_event(self, involved: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
        meta = involved.get("metadata") or {}
        namespace = str(meta.get("namespace") or "default")
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{meta.get('name', 'job')}.", "namespace": namespace},
            "involvedObject": {
                "apiVersion": involved.get("apiVersion", schema.API_VERSION),
                "kind": involved.get("kind", schema.KIND),
                "name": meta.get("name", ""),
                "namespace": namespace,
                "uid": meta.get("uid", ""),
            },
            "type": type_,
            "reason": reason,
            # The API server caps an Event's message at 1 KiB. Control and format characters (a U+202E in a
            # rank's error) are shown as escapes, as in status.
            "message": formats.visible(message)[:1024],
            "source": {"component": EVENT_SOURCE},
            "reportingComponent": EVENT_SOURCE,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        await self._request(calls.CREATE_EVENT, namespace, body=event, answer=False)
