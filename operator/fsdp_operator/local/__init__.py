"""Local stand-ins that run on one machine: the emulated Kubernetes API server (and, next to it, KubeRay)."""

from fsdp_operator.local.apiserver import ApiServer, RequestKey, ThreadedApiServer
from fsdp_operator.local.store import ApiError, Store

__all__ = ["ApiError", "ApiServer", "RequestKey", "Store", "ThreadedApiServer"]
