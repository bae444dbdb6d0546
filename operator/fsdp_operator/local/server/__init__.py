"""The emulated Kubernetes API server: real HTTP(S) on loopback, for ``fsdpctl run-local`` and the tests.

The server (``apiserver``) over its object store (``store``, with the patch kinds of ``patching`` and
server-side ``apply``); the resource types it knows (``resources``) and what it checks before storing an object:
CRD schemas (``structural``), custom objects (``validation``, ``cel_rules``), pods (``podvalidation``), built-in
workloads (``workloads``), admission (``admission``) and RBAC (``rbac``); selectors, tables and protobuf bodies
as clients ask for them (``selectors``, ``tables``, ``protobuf``); and the faults a real server shows (``faults``).

Imports no other room of ``local`` and nothing of the operator above ``api``: what runs against it (the operator,
kubectl, helm, the emulated cluster) reaches it over HTTP only.
"""

from fsdp_operator.local.server.apiserver import ApiServer, RequestKey, ThreadedApiServer
from fsdp_operator.local.server.store import ApiError, Store

__all__ = ["ApiError", "ApiServer", "RequestKey", "Store", "ThreadedApiServer"]
