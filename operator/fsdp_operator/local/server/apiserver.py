"""An emulated Kubernetes API server over real HTTP on loopback, for `fsdpctl run-local` and the tests.

It serves discovery, OpenAPI v3 (enough for `kubectl apply` with server-side field validation),
built-in kinds and CRD-defined kinds from memory (`store.py` holds the semantics), watch streams,
patches and server-side Tables, so kopf and real kubectl talk to it as to a cluster.

Authentication and RBAC are off unless an `rbac.Access` is given (see `rbac.py` for what they cover);
the OwnerReferencesPermissionEnforcement admission plugin (`admission.py`) is on when given with them.
HTTPS when given a certificate (`tls`). Server-side apply (`apply.py`), Deployment defaulting and
validation (`workloads.py`), protobuf request bodies of Secrets and ConfigMaps (`protobuf.py`).
Not reproduced (a real cluster differs here): admission webhooks and other admission plugins; managedFields
of writes other than apply; protobuf responses; pagination (`limit` and
`continue` are ignored: lists are complete); list/get at an older `resourceVersion` (always the latest);
aggregated discovery and `/openapi/v2` (404, clients fall back); CRD version conversion (one stored
object is served under every version) and CEL rules; strategic merge beyond keyed lists of the common
built-in fields; a watch with a selector does not turn an object leaving the selection into DELETED;
the garbage collector runs at once inside the deleting request unless `gc_delay` makes it
asynchronous or None turns it off (`Store.gc_delay`); pods have no kubelet (a deleted pod goes at once, without a grace
period); core and events.k8s.io events are kept apart; no controllers (Deployments, Services' endpoints,
quotas) and no defaulting of built-in specs other than Deployments'.

What a real server refuses, it refuses (docs/conformance.md lists each rule and its doc section): CRDs
that are not structural or break the OpenAPI subset and `x-kubernetes-*` rules (`structural.py`); custom
objects against their schema after defaulting and pruning (`validation.py`); Pods at creation
(`podvalidation.py`); Deployments' strategy (`workloads.py`). Other built-in kinds are stored as sent.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import socket
import ssl
import threading
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, NamedTuple

import yaml
from aiohttp import web

from fsdp_operator.local.server import admission as admission_plugins
from fsdp_operator.local.server import apply as server_side_apply
from fsdp_operator.local.server import cel_rules, patching, podvalidation, protobuf, rbac, tables, validation, workloads
from fsdp_operator.local.server.faults import FaultInjector
from fsdp_operator.local.server.resources import ALL_VERBS, Obj, ResourceType, json_copy
from fsdp_operator.local.server.selectors import SelectorError, parse_field_selector, parse_label_selector
from fsdp_operator.local.server.store import HISTORY_LENGTH, ApiError, Store, Subscription, WatchEvent, invalid_fields
from fsdp_operator.local.server.structural import FieldError

KUBERNETES_VERSION = {
    "major": "1",
    "minor": "35",
    "gitVersion": "v1.35.0",
    "gitCommit": "emulated",
    "gitTreeState": "clean",
    "buildDate": "2026-01-01T00:00:00Z",
    "goVersion": "go1.25.0",
    "compiler": "gc",
    "platform": "linux/amd64",
}
_JSON = "application/json"
_MERGE = "application/merge-patch+json"
_JSON_PATCH = "application/json-patch+json"
_STRATEGIC = "application/strategic-merge-patch+json"
_APPLY = "application/apply-patch+yaml"
_USER = web.RequestKey("user", rbac.User)


class RequestKey(NamedTuple):
    """What the request counters count: verb (create, get, list, watch, update, patch, delete,
    deletecollection), API group ("" for core), plural and subresource ("" or "status")."""

    verb: str
    group: str
    plural: str
    subresource: str = ""


class _Target(NamedTuple):
    rtype: ResourceType
    version: str
    namespace: str | None
    name: str | None
    subresource: str


class ApiServer:
    """The emulated API server. `async with ApiServer() as api:` serves it on `api.url` until exit."""

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        bookmark_interval: float = 5.0,
        history_length: int = HISTORY_LENGTH,
        access: rbac.Access | None = None,
        faults: FaultInjector | None = None,
        admission: admission_plugins.OwnerReferencesPermissionEnforcement | None = None,
        tls: tuple[Path, Path] | None = None,
        gc_delay: float | None = 0.0,
    ) -> None:
        self.host = host
        self.faults = faults
        """Injects API errors, slow answers and broken watches (`faults.py`); None: a well-behaved server."""
        self.port = port
        self.bookmark_interval = bookmark_interval
        self.store = Store(history_length=history_length, gc_delay=gc_delay)
        """`gc_delay`: the garbage collector's delay in seconds, None for none (`Store.gc_delay`)."""
        for rtype in rbac.rbac_types():
            self.store._register(rtype)
        self.access = access
        """Bearer-token authentication and RBAC authorization; None: every request is allowed."""
        self.admission = admission
        self.tls = tls
        """(certificate, key) PEM files: serve HTTPS. kubectl and helm send a kubeconfig's credentials only
        over TLS (client-go reads the user's auth info only when the server is https)."""
        """Validating admission (`admission.py`), enforced with `access` (it authorizes the request's user)."""
        self.requests: Counter[RequestKey] = Counter()
        self._runner: web.AppRunner | None = None
        self._watch_queues: set[asyncio.Queue[WatchEvent | None]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None

    # ------------------------------------------------------------------ lifecycle

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.host}:{self.port}"

    async def start(self) -> None:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(
            # Cancel a watch's handler when its client goes away, not at its next event.
            app,
            access_log=None,
            shutdown_timeout=1.0,
            handle_signals=False,
            handler_cancellation=True,
        )
        await self._runner.setup()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))
        self.port = sock.getsockname()[1]
        context = None
        if self.tls is not None:
            context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            context.load_cert_chain(*self.tls)
        await web.SockSite(self._runner, sock, ssl_context=context).start()
        self._loop = asyncio.get_running_loop()

    async def stop(self) -> None:
        self.store.stop_collector()
        for queue in list(self._watch_queues):
            queue.put_nowait(None)  # ends every open watch stream
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> ApiServer:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    # ------------------------------------------------------------------ conveniences

    def kubeconfig(self, namespace: str = "default", *, user: Obj | None = None) -> Obj:
        """`user` replaces the credentials (default: the token `local`), e.g. `{"tokenFile": ...}`, `{"exec": ...}`."""
        cluster: Obj = {"server": self.url}
        if self.tls is not None:
            cluster["certificate-authority-data"] = base64.b64encode(self.tls[0].read_bytes()).decode()
        return {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "local", "cluster": cluster}],
            "users": [{"name": "local", "user": user if user is not None else {"token": "local"}}],
            "contexts": [{"name": "local", "context": {"cluster": "local", "user": "local", "namespace": namespace}}],
            "current-context": "local",
            "preferences": {},
        }

    def write_kubeconfig(self, path: str | Path, namespace: str = "default", *, user: Obj | None = None) -> Path:
        """Write a kubeconfig that points kubectl, helm and the `kubernetes` client at this server."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(self.kubeconfig(namespace, user=user), sort_keys=False))
        return path

    def count(self, verb: str, plural: str, group: str | None = None, subresource: str = "") -> int:
        """How many requests of a verb hit a resource (all groups when `group` is None)."""
        return sum(
            n
            for key, n in self.requests.copy().items()  # a copy: the server's thread adds to it meanwhile
            if key.verb == verb
            and key.plural == plural
            and key.subresource == subresource
            and (group is None or key.group == group)
        )

    def apply_crd_file(self, path: str | Path) -> list[Obj]:
        """Create (or replace) every CustomResourceDefinition in a YAML file, in-process."""
        crds = self.store.resource("customresourcedefinitions", "apiextensions.k8s.io")
        created = []
        for doc in yaml.safe_load_all(Path(path).read_text()):
            if not doc or doc.get("kind") != "CustomResourceDefinition":
                continue
            try:
                created.append(self.store.create(crds, doc))
            except ApiError as e:
                if e.code != 409:
                    raise
                created.append(self.store.update(crds, doc["metadata"]["name"], doc))
        return created

    # ------------------------------------------------------------------ HTTP dispatch

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        if self.faults is not None:
            return await self.faults.handle(request, self._answer)
        return await self._answer(request)

    async def _answer(self, request: web.Request) -> web.StreamResponse:
        try:
            if self.access is not None:
                request[_USER] = self.access.authenticate(request.headers.get("Authorization", ""))
            return await self._dispatch(request)
        except ApiError as e:
            return _json_response(e.status(), status=e.code)
        except (SelectorError, patching.PatchError) as e:
            code = e.status if isinstance(e, patching.PatchError) else 400
            error = ApiError(code, "Invalid" if code == 422 else "BadRequest", str(e))
            return _json_response(error.status(), status=code)

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        parts = [p for p in request.path.split("/") if p]
        if not parts:
            return _json_response({"paths": ["/api", "/api/v1", "/apis", "/openapi/v3", "/version", "/healthz"]})
        head = parts[0]
        if head == "version":
            return _json_response(KUBERNETES_VERSION)
        if head in ("healthz", "livez", "readyz"):
            return web.Response(text="ok")
        if head == "openapi":
            return self._openapi(parts[1:])
        if head == "api" and len(parts) == 1:
            return _json_response(
                {
                    "kind": "APIVersions",
                    "versions": ["v1"],
                    "serverAddressByClientCIDRs": [
                        {"clientCIDR": "0.0.0.0/0", "serverAddress": f"{self.host}:{self.port}"}
                    ],
                }
            )
        if head == "api" and len(parts) == 2:
            return self._resource_list("", parts[1])
        if head == "apis" and len(parts) == 1:
            return _json_response(self._group_list())
        if head == "apis" and len(parts) == 2:
            return self._group(parts[1])
        if head == "apis" and len(parts) == 3:
            return self._resource_list(parts[1], parts[2])
        if head in ("api", "apis"):
            target = self._target(parts)
            response = await self._resource_request(request, target)
            if target.rtype.deprecation and not response.prepared:
                response.headers.add("Warning", f'299 - "{target.rtype.deprecation}"')
            return response
        raise ApiError(404, "NotFound", "the server could not find the requested resource")

    def _target(self, parts: list[str]) -> _Target:
        if parts[0] == "api":
            group, version, rest = "", parts[1], parts[2:]
        else:
            group, version, rest = parts[1], parts[2], parts[3:]
        namespace: str | None = None
        # `namespaces/<ns>/<plural>...` is a namespaced path, except the namespace's own subresources.
        if rest[0] == "namespaces" and len(rest) >= 3 and not (group == "" and rest[2] in ("status", "finalize")):
            namespace, rest = rest[1], rest[2:]
        rtype = self.store.lookup(group, version, rest[0])
        if rtype is None or len(rest) > 3:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        if namespace is not None and not rtype.namespaced:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        name = rest[1] if len(rest) > 1 else None
        subresource = rest[2] if len(rest) > 2 else ""
        if subresource and not (subresource == "status" and rtype.status_subresource):
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        if name is not None and rtype.namespaced and namespace is None:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        return _Target(rtype, version, namespace, name, subresource)

    async def _resource_request(self, request: web.Request, target: _Target) -> web.StreamResponse:
        rtype, version, namespace, name, subresource = target
        query = request.query
        dry_run = "dryRun" in query
        method = request.method
        if self.access is not None:
            verb = rbac.verb_of(method, name is not None, query.get("watch") in ("true", "1"))
            named = name or (
                rbac.name_from_field_selector(query.get("fieldSelector", "")) if verb in ("list", "watch") else ""
            )
            attributes = rbac.Attributes(verb, rtype.group, rtype.plural, subresource, namespace or "", named)
            self.access.authorize(self.store, request[_USER], attributes)
        if name is None:
            if method == "GET" and query.get("watch") in ("true", "1"):
                self._count("watch", target)
                return await self._watch(request, target)
            if method == "GET":
                self._count("list", target)
                return self._list(request, target)
            if method == "POST":
                self._count("create", target)
                body = await _read_body(request)
                response = _Response()
                body = self._validate(rtype, version, body, query, request, response)
                if rtype.key == ("", "pods"):
                    # A Pod's spec is checked at creation (and is then mostly immutable); updates go unchecked.
                    pod_errors = _decoded(rtype, version, podvalidation.validate_pod, body)
                    if pod_errors:
                        name = str((body.get("metadata") or {}).get("name") or "")
                        raise invalid_fields(rtype, name, pod_errors)
                    response.warnings.extend(podvalidation.pod_warnings(body))
                self._admit(request, target, body, None)
                created = self.store.create(rtype, body, namespace, dry_run=dry_run, private=True)
                return response.json(self._served(created, rtype, version), status=201)
            if method == "DELETE":
                self._count("deletecollection", target)
                return await self._delete_collection(request, target)
            raise _method_not_allowed(method)
        assert name is not None
        if method == "GET":
            self._count("get", target)
            obj = self._served(self.store.get(rtype, name, namespace), rtype, version)
            if _wants_table(request):
                return _json_response(
                    tables.table(
                        rtype,
                        version,
                        [obj],
                        resource_version=obj["metadata"]["resourceVersion"],
                        include_object=query.get("includeObject", "PartialObjectMetadata"),
                    )
                )
            return _json_response(obj)
        if method == "PUT":
            self._count("update", target)
            response = _Response()
            current = _current(self.store, target)
            body = self._validate(rtype, version, await _read_body(request), query, request, response, current)
            self._admit(request, target, body, current)
            updated = self.store.update(
                rtype,
                name,
                body,
                namespace,
                subresource=subresource,
                require_resource_version=not rtype.builtin,
                dry_run=dry_run,
            )
            return response.json(self._served(updated, rtype, version))
        if method == "PATCH":
            self._count("patch", target)
            response = _Response()
            if request.content_type == _APPLY:
                return await self._apply(request, target, response)
            patch_fn = self._patch_function(request, rtype, version, await request.read(), query, response)

            def admitted(current: Obj) -> Obj:
                result = patch_fn(current)
                self._admit(request, target, result, current)
                return result

            patched = self.store.patch(
                rtype, name, admitted, namespace, subresource=subresource, dry_run=dry_run, private=True
            )
            return response.json(self._served(patched, rtype, version))
        if method == "DELETE":
            self._count("delete", target)
            options = await _read_body(request, optional=True)
            propagation = query.get("propagationPolicy") or options.get("propagationPolicy") or "Background"
            grace = query.get("gracePeriodSeconds", options.get("gracePeriodSeconds"))
            deleted = self.store.delete(
                rtype,
                name,
                namespace,
                propagation=str(propagation),
                preconditions=options.get("preconditions"),
                dry_run=dry_run,
                grace_period=_grace_period(grace),
            )
            return _json_response(self._served(deleted, rtype, version))
        raise _method_not_allowed(method)

    async def _apply(self, request: web.Request, target: _Target, response: _Response) -> web.StreamResponse:
        """Server-side apply (`apply.py`): creates the object when it does not exist."""
        rtype, version, namespace, name, subresource = target
        query = request.query
        manager = query.get("fieldManager", "")
        if not manager:
            raise ApiError(
                422, "Invalid", 'PatchOptions.meta.k8s.io "" is invalid: fieldManager: Required value: is required '
                "for apply patch"
            )  # fmt: skip
        config = await _read_body(request)
        force = query.get("force") in ("true", "1")
        dry_run = "dryRun" in query
        assert name is not None

        def applied(current: Obj | None) -> Obj:
            served = None if current is None else self._served(current, rtype, version)
            result = server_side_apply.apply(served, config, rtype, manager, force=force)
            result = self._validate(rtype, version, result, query, request, response, current)
            self._admit(request, target, result, current)
            return result

        with self.store.lock:  # get-or-create and the merge, atomically
            current = _current(self.store, target)
            if current is None:
                if subresource:
                    raise ApiError(404, "NotFound", f'{rtype.group_resource} "{name}" not found')
                created = self.store.create(rtype, applied(None), namespace, dry_run=dry_run)
                return response.json(self._served(created, rtype, version), status=201)
            patched = self.store.patch(
                rtype, name, applied, namespace, subresource=subresource, dry_run=dry_run, private=True
            )
        return response.json(self._served(patched, rtype, version))

    def _admit(self, request: web.Request, target: _Target, new: Obj, old: Obj | None) -> None:
        if self.admission is None or self.access is None:
            return
        namespace = target.namespace or str((new.get("metadata") or {}).get("namespace") or "")
        self.admission.validate(self.store, request[_USER], target.rtype, target.subresource, namespace, new, old)

    def _count(self, verb: str, target: _Target) -> None:
        self.requests[RequestKey(verb, target.rtype.group, target.rtype.plural, target.subresource)] += 1

    # ------------------------------------------------------------------ verbs

    def _predicate(self, rtype: ResourceType, query: Mapping[str, str]) -> Callable[[Obj], bool]:
        labels = parse_label_selector(query.get("labelSelector", ""))
        fields = parse_field_selector(query.get("fieldSelector", ""), rtype.field_selectors)
        return lambda obj: labels((obj.get("metadata") or {}).get("labels") or {}) and fields(obj)

    def _list(self, request: web.Request, target: _Target) -> web.StreamResponse:
        rtype, version = target.rtype, target.version
        items, resource_version = self.store.list_objects(
            rtype, target.namespace, self._predicate(rtype, request.query)
        )
        items = [self._served(obj, rtype, version) for obj in items]
        if _wants_table(request):
            return _json_response(
                tables.table(
                    rtype,
                    version,
                    items,
                    resource_version=str(resource_version),
                    include_object=request.query.get("includeObject", "PartialObjectMetadata"),
                )
            )
        return _json_response(
            {
                "kind": f"{rtype.kind}List",
                "apiVersion": rtype.api_version(version),
                "metadata": {"resourceVersion": str(resource_version)},
                "items": items,
            }
        )

    async def _delete_collection(self, request: web.Request, target: _Target) -> web.StreamResponse:
        rtype, version = target.rtype, target.version
        items, resource_version = self.store.list_objects(
            rtype, target.namespace, self._predicate(rtype, request.query)
        )
        options = await _read_body(request, optional=True)
        propagation = str(request.query.get("propagationPolicy") or options.get("propagationPolicy") or "Background")
        deleted = []
        for obj in items:
            meta = obj["metadata"]
            with contextlib.suppress(ApiError):  # gone meanwhile (collected as a dependent): fine
                deleted.append(self.store.delete(rtype, meta["name"], meta.get("namespace"), propagation=propagation))
        return _json_response(
            {
                "kind": f"{rtype.kind}List",
                "apiVersion": rtype.api_version(version),
                "metadata": {"resourceVersion": str(resource_version)},
                "items": [self._served(obj, rtype, version) for obj in deleted],
            }
        )

    def _patch_function(
        self,
        request: web.Request,
        rtype: ResourceType,
        version: str,
        raw: bytes,
        query: Mapping[str, str],
        response: _Response,
    ) -> Callable[[Obj], Obj]:
        content_type = request.content_type
        try:
            patch = json.loads(raw or b"null")
        except ValueError as e:
            raise ApiError(400, "BadRequest", f"error decoding patch: {e}") from e
        if content_type == _MERGE:
            apply: Callable[[Obj, Any], Any] = patching.merge_patch
        elif content_type == _JSON_PATCH:
            apply = patching.json_patch
        elif content_type == _STRATEGIC and rtype.builtin:
            apply = patching.strategic_merge_patch
        else:
            accepted = [_JSON_PATCH, _MERGE] + ([_STRATEGIC] if rtype.builtin else [])
            raise ApiError(
                415,
                "UnsupportedMediaType",
                f"the body of the request was in an unknown format - accepted media types include: "
                f"{', '.join(accepted)}",
            )
        if content_type != _JSON_PATCH and not isinstance(patch, dict):
            raise ApiError(400, "BadRequest", "a merge patch must be a JSON object")

        def patch_fn(current: Obj) -> Obj:
            served = self._served(current, rtype, version)
            result = apply(served, patch)
            if not isinstance(result, dict):
                raise ApiError(422, "Invalid", "the patch turned the object into a non-object")
            return self._validate(rtype, version, result, query, request, response, current)

        return patch_fn

    def _validate(
        self,
        rtype: ResourceType,
        version: str,
        body: Obj,
        query: Mapping[str, str],
        request: web.Request,
        response: _Response,
        old: Obj | None = None,
    ) -> Obj:
        """Default, prune unknown fields of and validate custom resources, with `fieldValidation`, like the real
        server; an update's errors on fields it leaves as `old` has them do not count (`validation.validate`)."""
        schema = rtype.schemas.get(version)
        if schema is None:
            return workloads.default_and_validate(rtype, body)
        pruned, unknown = validation.default_and_prune(body, schema)
        name = str((body.get("metadata") or {}).get("name", ""))
        mode = query.get("fieldValidation", "Warn")  # the real server's default since v1.27
        if unknown and mode == "Strict":
            detail = ", ".join(f'unknown field "{path}"' for path in unknown)
            raise ApiError(
                400,
                "BadRequest",
                f'{rtype.kind} in version "{version}" cannot be handled as a '
                f"{rtype.kind}: strict decoding error: {detail}",
            )
        if unknown and mode == "Warn":
            response.warnings.extend(f'unknown field "{path}"' for path in unknown)
        errors = validation.validate(pruned, schema, old) + cel_rules.violations(schema, pruned, old)
        if errors:
            causes = [{"reason": _cause_reason(message), "message": message, "field": path} for path, message in errors]
            summary = ", ".join(f"{path}: {message}" for path, message in errors)
            raise ApiError(
                422,
                "Invalid",
                f'{rtype.kind}.{rtype.group} "{name}" is invalid: {summary}',
                details={"name": name, "group": rtype.group, "kind": rtype.kind},
                causes=causes,
            )
        return pruned

    def _served(self, obj: Obj, rtype: ResourceType, version: str) -> Obj:
        """The object as a client of `version` sees it (stored once, served in every version)."""
        rest = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind")}
        return {"apiVersion": rtype.api_version(version), "kind": rtype.kind, **rest}

    # ------------------------------------------------------------------ watch

    async def _watch(self, request: web.Request, target: _Target) -> web.StreamResponse:
        rtype, version = target.rtype, target.version
        query = request.query
        predicate = self._predicate(rtype, query)
        bookmarks = query.get("allowWatchBookmarks") == "true"
        send_initial = query.get("sendInitialEvents") == "true"
        as_table = _wants_table(request)
        include_object = query.get("includeObject", "PartialObjectMetadata")
        since_text = query.get("resourceVersion", "")
        since: int | None = None
        if since_text not in ("", "0") and not send_initial:
            try:
                since = int(since_text)
            except ValueError as e:
                raise ApiError(400, "BadRequest", f"invalid resource version {since_text!r}") from e
        timeout = float(query["timeoutSeconds"]) if query.get("timeoutSeconds") else None

        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[WatchEvent | None] = asyncio.Queue()

        def deliver(event: WatchEvent) -> None:
            with contextlib.suppress(RuntimeError):  # the loop closed under a late commit: nothing to tell
                loop.call_soon_threadsafe(queue.put_nowait, event)

        response = web.StreamResponse(headers={"Content-Type": _JSON})
        response.enable_chunked_encoding()
        subscription: Subscription | None = None
        try:
            try:
                subscription, backlog = self.store.subscribe(rtype, target.namespace, since, deliver)
            except ApiError as e:
                if e.code != 410:
                    raise
                await response.prepare(request)
                await response.write(_line({"type": "ERROR", "object": e.status()}))
                return response
            self._watch_queues.add(queue)
            snapshot = self.store.resource_version
            await response.prepare(request)
            headers_sent = False
            last_sent = since or 0

            async def send(event_type: str, obj: Obj) -> None:
                nonlocal headers_sent
                obj = self._served(obj, rtype, version)
                if as_table and event_type != "BOOKMARK":
                    obj = tables.table(
                        rtype,
                        version,
                        [obj],
                        resource_version=obj["metadata"]["resourceVersion"],
                        include_object=include_object,
                        headers=not headers_sent,
                    )
                    headers_sent = True
                await response.write(_line({"type": event_type, "object": obj}))

            def bookmark(resource_version: int, initial_end: bool = False) -> Obj:
                meta: Obj = {"resourceVersion": str(resource_version)}
                if initial_end:
                    meta["annotations"] = {"k8s.io/initial-events-end": "true"}
                return {"kind": rtype.kind, "apiVersion": rtype.api_version(version), "metadata": meta}

            for event in backlog:
                if predicate(event.object):
                    await send(event.type, event.object)
                last_sent = max(last_sent, event.resource_version)
            if send_initial:
                last_sent = max(last_sent, snapshot)
                if bookmarks:
                    await send("BOOKMARK", bookmark(snapshot, initial_end=True))
            deadline = None if timeout is None else loop.time() + timeout
            next_bookmark = loop.time() + self.bookmark_interval
            while True:
                now = loop.time()
                if deadline is not None and now >= deadline:
                    break
                wakeups = [t for t in (deadline, next_bookmark if bookmarks else None) if t is not None]
                try:
                    item = await asyncio.wait_for(queue.get(), min(wakeups) - now if wakeups else None)
                except TimeoutError:
                    if bookmarks and loop.time() >= next_bookmark:
                        next_bookmark = loop.time() + self.bookmark_interval
                        if last_sent:
                            await send("BOOKMARK", bookmark(last_sent))
                    continue
                if item is None:
                    break
                last_sent = item.resource_version
                if predicate(item.object):
                    await send(item.type, item.object)
        except (ConnectionResetError, asyncio.CancelledError):
            pass  # the client went away, or the server stops
        finally:
            self._watch_queues.discard(queue)
            if subscription is not None:
                self.store.unsubscribe(subscription)
        with contextlib.suppress(ConnectionResetError, RuntimeError):
            await response.write_eof()
        return response

    # ------------------------------------------------------------------ discovery

    def _resource_list(self, group: str, version: str) -> web.StreamResponse:
        with self.store.lock:
            rtypes = [t for t in self.store.types.values() if t.group == group and version in t.versions]
        if not rtypes:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        resources: list[Obj] = []
        for rtype in sorted(rtypes, key=lambda t: t.plural):
            entry: Obj = {
                "name": rtype.plural,
                "singularName": rtype.singular,
                "namespaced": rtype.namespaced,
                "kind": rtype.kind,
                "verbs": list(ALL_VERBS),
                "storageVersionHash": hashlib.sha256(rtype.group_resource.encode()).hexdigest()[:12],
            }
            if rtype.short_names:
                entry["shortNames"] = list(rtype.short_names)
            if rtype.categories:
                entry["categories"] = list(rtype.categories)
            resources.append(entry)
            if rtype.status_subresource:
                resources.append(
                    {
                        "name": f"{rtype.plural}/status",
                        "singularName": "",
                        "namespaced": rtype.namespaced,
                        "kind": rtype.kind,
                        "verbs": ["get", "patch", "update"],
                    }
                )
        return _json_response(
            {
                "kind": "APIResourceList",
                "apiVersion": "v1",
                "groupVersion": f"{group}/{version}" if group else version,
                "resources": resources,
            }
        )

    def _group_entry(self, group: str, versions: list[str]) -> Obj:
        entries = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
        return {"name": group, "versions": entries, "preferredVersion": entries[0]}

    def _group_list(self) -> Obj:
        groups = [self._group_entry(g, v) for g, v in sorted(self.store.group_versions().items()) if g]
        return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}

    def _group(self, group: str) -> web.StreamResponse:
        versions = self.store.group_versions().get(group)
        if not versions:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        return _json_response({"kind": "APIGroup", "apiVersion": "v1", **self._group_entry(group, versions)})

    # ------------------------------------------------------------------ OpenAPI v3

    def _openapi(self, parts: list[str]) -> web.StreamResponse:
        if parts[:1] != ["v3"]:
            # No /openapi/v2: kubectl and helm prefer v3 and fall back to built-in knowledge.
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        group_versions = self.store.group_versions()
        if len(parts) == 1:
            paths = {}
            for group, versions in group_versions.items():
                for version in versions:
                    gv_path = f"apis/{group}/{version}" if group else f"api/{version}"
                    digest = (
                        hashlib.sha256(json.dumps(self._openapi_document(group, version), sort_keys=True).encode())
                        .hexdigest()[:16]
                        .upper()
                    )
                    paths[gv_path] = {"serverRelativeURL": f"/openapi/v3/{gv_path}?hash={digest}"}
            return _json_response({"paths": paths})
        rest = parts[1:]
        if rest[0] == "api" and len(rest) == 2:
            group, version = "", rest[1]
        elif rest[0] == "apis" and len(rest) == 3:
            group, version = rest[1], rest[2]
        else:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        if version not in group_versions.get(group, []):
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        return _json_response(self._openapi_document(group, version))

    def _openapi_document(self, group: str, version: str) -> Obj:
        """Paths with the query parameters kubectl checks for (`fieldValidation` on PATCH), and the
        CRDs' schemas as components tagged with their group/version/kind."""
        with self.store.lock:
            rtypes = [t for t in self.store.types.values() if t.group == group and version in t.versions]
        prefix = f"/apis/{group}/{version}" if group else f"/api/{version}"
        parameters = [
            {"name": name, "in": "query", "schema": {"type": "string", "uniqueItems": True}}
            for name in ("dryRun", "fieldManager", "fieldValidation")
        ]
        paths: Obj = {}
        schemas: Obj = {}
        for rtype in rtypes:
            gvk = [{"group": group, "version": version, "kind": rtype.kind}]
            schema_name = (
                ".".join(reversed(group.split("."))) + f".{version}.{rtype.kind}"
                if group
                else (f"io.k8s.api.core.{version}.{rtype.kind}")
            )
            schema = dict(
                rtype.schemas.get(version) or {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
            )
            schema["x-kubernetes-group-version-kind"] = gvk
            schemas[schema_name] = schema
            reference = {"$ref": f"#/components/schemas/{schema_name}"}
            base = (
                f"{prefix}/namespaces/{{namespace}}/{rtype.plural}" if rtype.namespaced else f"{prefix}/{rtype.plural}"
            )
            for path, verbs in ((base, ("get", "post")), (f"{base}/{{name}}", ("get", "put", "patch", "delete"))):
                operations: Obj = {}
                for verb in verbs:
                    operations[verb] = {
                        "operationId": f"{verb}{rtype.kind}",
                        "parameters": parameters,
                        "responses": {"200": {"content": {_JSON: {"schema": reference}}}},
                        "x-kubernetes-action": verb,
                        "x-kubernetes-group-version-kind": gvk[0],
                    }
                operations["parameters"] = parameters
                paths[path] = operations
        return {
            "openapi": "3.0.0",
            "info": {"title": "Kubernetes", "version": KUBERNETES_VERSION["gitVersion"]},
            "paths": paths,
            "components": {"schemas": schemas},
        }


class ThreadedApiServer:
    """The emulator on its own event loop in a background thread, for synchronous code."""

    def __init__(self, **kwargs: Any) -> None:
        self.server = ApiServer(**kwargs)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="apiserver", daemon=True)

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def store(self) -> Store:
        return self.server.store

    def start(self) -> ThreadedApiServer:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self.server.start(), self._loop).result(timeout=30)
        return self

    def stop(self) -> None:
        if not self._thread.is_alive():
            return
        asyncio.run_coroutine_threadsafe(self.server.stop(), self._loop).result(timeout=30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)
        self._loop.close()

    def write_kubeconfig(self, path: str | Path, namespace: str = "default", *, user: Obj | None = None) -> Path:
        return self.server.write_kubeconfig(path, namespace, user=user)

    def count(self, verb: str, plural: str, group: str | None = None, subresource: str = "") -> int:
        return self.server.count(verb, plural, group, subresource)

    def __enter__(self) -> ThreadedApiServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def _cause_reason(message: str) -> str:
    return "FieldValueForbidden" if message.startswith("Forbidden: ") else "FieldValueInvalid"


class _Response:
    """Collects `Warning` headers while a request is processed."""

    def __init__(self) -> None:
        self.warnings: list[str] = []

    def json(self, body: Obj, status: int = 200) -> web.Response:
        response = _json_response(body, status=status)
        for warning in dict.fromkeys(self.warnings):
            response.headers.add("Warning", f'299 - "{warning}"')
        return response


def _current(store: Store, target: _Target) -> Obj | None:
    """The stored object a PUT replaces (None: the PUT will answer 404)."""
    try:
        return store.get(target.rtype, target.name or "", target.namespace)
    except ApiError:
        return None


def _decoded(
    rtype: ResourceType, version: str, check: Callable[[Obj], list[FieldError]], body: Obj
) -> list[FieldError]:
    """Run a check that assumes the object's declared shape; a field of the wrong JSON type is the real
    server's decoding error (400), not a crash."""
    try:
        return check(body)
    except (AttributeError, TypeError, ValueError, KeyError) as e:
        raise ApiError(
            400,
            "BadRequest",
            f'{rtype.kind} in version "{version}" cannot be handled as a {rtype.kind}: a field has the wrong type '
            f"({type(e).__name__}: {e})",
        ) from e


def _json_response(body: Any, status: int = 200) -> web.Response:
    return web.Response(body=json.dumps(body).encode(), status=status, content_type=_JSON)


def _line(event: Obj) -> bytes:
    return json.dumps(event).encode() + b"\n"


def _wants_table(request: web.Request) -> bool:
    return any("as=Table" in part for part in request.headers.get("Accept", "").split(","))


def _method_not_allowed(method: str) -> ApiError:
    return ApiError(
        405, "MethodNotAllowed", f"the server does not allow this method on the requested resource: {method}"
    )


async def _read_body(request: web.Request, *, optional: bool = False) -> Obj:
    raw = await request.read()
    if not raw.strip():
        if optional:
            return {}
        raise ApiError(400, "BadRequest", "the request body is empty")
    if "protobuf" in request.content_type:
        try:
            return protobuf.decode(raw)
        except protobuf.ProtobufError as e:
            message = f"the emulated API server reads this body only as JSON: {e}"
            raise ApiError(415, "UnsupportedMediaType", message) from e
    try:
        # YAML's aliases share one dict or list between places; the copy makes them two, as JSON always has them, so
        # that a body can be stored as it is (`Store.create`'s `private`).
        body = json_copy(yaml.safe_load(raw)) if "yaml" in request.content_type else json.loads(raw)
    except (ValueError, yaml.YAMLError) as e:
        raise ApiError(400, "BadRequest", f"error decoding the request body: {e}") from e
    if not isinstance(body, dict):
        raise ApiError(400, "BadRequest", "the request body must be an object")
    return body


def _grace_period(value: Any) -> int | None:
    """DeleteOptions.gracePeriodSeconds from the query or the body; None when absent. A value that is not a whole
    number of seconds is refused as the real server refuses it."""
    if value is None:
        return None
    try:
        period = int(value)
    except (TypeError, ValueError):
        raise ApiError(400, "BadRequest", f"invalid gracePeriodSeconds: {str(value)[:40]!r}") from None
    if isinstance(value, bool) or period < 0:
        message = f"DeleteOptions.meta.k8s.io is invalid: gracePeriodSeconds: Invalid value: {period}: must be >= 0"
        raise ApiError(422, "Invalid", message)
    return period
