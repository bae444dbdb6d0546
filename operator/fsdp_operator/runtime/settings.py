"""The operator's own knobs (`OperatorConfig`) and kopf's settings, applied in the one startup handler."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import fsdp_train
import kopf

from fsdp_operator.api import render

FINALIZER = "fsdp.dev/finalizer"
ANNOTATION_PREFIX = "fsdp.dev"


def default_training_package() -> str:
    """The local path of the `fsdp_train` package, shipped with each job as a runtime_env py_module."""
    return str(Path(fsdp_train.__file__).parent)


@dataclass(frozen=True, slots=True)
class OperatorConfig:
    interval: float = 5.0
    """A live job is re-observed at least this often (seconds); child watches wake it sooner."""
    progress_write_interval: float = 5.0
    """At most one progress-only status write per job per this many seconds."""
    error_backoff: float = 5.0
    """Pause after a pass that could not reach the Kubernetes API."""
    first_pass_priority: float = 2.0
    """While some job's loop has not finished its first pass (which creates its RayCluster), other loops wait
    up to this long (seconds) before their next pass: many jobs created at once get their clusters first."""
    watch_recheck: float = 30.0
    """A job loop reads its job and RayCluster as the operator's watches delivered them, and from the API server
    when the watch has said nothing of one for this long (seconds): a deletion a restarted watch missed (it re-lists
    what exists, it does not report what went), or a watch that stopped delivering, is seen within it."""
    ray_timeout: float = 20.0
    """Bound on each call to Ray's job API or dashboard."""
    ray_unreachable_timeout: float = 300.0
    """A submitted job whose Ray job API does not answer for this long fails (reason RayUnreachable)."""
    kube_timeout: float = 30.0
    """Bound on each call to the Kubernetes API."""
    zone_advice_timeout: float = 60.0
    """For `availabilityZone: auto`: how long AWS may take to advise a zone before the job runs unconstrained."""
    finalize_timeout: float = 20.0
    """On delete: how long to try to stop the Ray job when Ray does not answer, before going on."""
    daemon_cancellation_timeout: float = 10.0
    training_package: str = field(default_factory=default_training_package)
    peering: str | None = None
    """kopf peering object shared by the replicas (one runs, the others pause); None: standalone."""
    finalizer: str = FINALIZER
    annotation_prefix: str = ANNOTATION_PREFIX
    security: render.Security = field(default_factory=render.Security)
    """Ray token authentication and the per-job NetworkPolicy (both on unless the environment says otherwise)."""
    node_notices: bool = False
    """Delete a running job's worker pods on nodes with a termination taint, so that they checkpoint first
    (`runtime/nodes.py`; the chart's `nodeNotices.enabled` grants the pod delete it needs)."""

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, *, peering: str | None = None) -> OperatorConfig:
        """The defaults (and `peering`), with the security settings the chart passes as environment variables:

        - `FSDP_RAY_TOKEN_AUTH` (`true`/`false`): Ray's token authentication for every job's cluster;
        - `FSDP_JOB_NETWORK_POLICY` (`true`/`false`): a NetworkPolicy per job (off without a policy engine);
        - `FSDP_OPERATOR_NAMESPACE`: the operator's namespace, admitted by each job's NetworkPolicy;
        - `FSDP_OPERATOR_POD_LABELS` (`k=v,k2=v2`): the labels of the operator's pods;
        - `FSDP_NODE_NOTICES` (`true`/`false`, default false): act on nodes' termination taints (`node_notices`).
        """
        env = os.environ if environ is None else environ
        labels = dict(item.split("=", 1) for item in env.get("FSDP_OPERATOR_POD_LABELS", "").split(",") if "=" in item)
        security = render.Security(
            token_auth=_flag(env.get("FSDP_RAY_TOKEN_AUTH"), default=True),
            network_policy=_flag(env.get("FSDP_JOB_NETWORK_POLICY"), default=True),
            operator_namespace=env.get("FSDP_OPERATOR_NAMESPACE", ""),
            **({"operator_pod_labels": labels} if labels else {}),
        )
        return cls(security=security, peering=peering, node_notices=_flag(env.get("FSDP_NODE_NOTICES"), default=False))


def _flag(value: str | None, *, default: bool) -> bool:
    if value is None or not value.strip():
        return default
    if value.strip().lower() in ("1", "true", "yes", "on"):
        return True
    if value.strip().lower() in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"expected true or false, got {value!r}")


class NoDiffBase(kopf.DiffBaseStorage):
    """A diff base that is never stored or read: every change looks new to kopf, which has no handler for it."""

    def build(self, *, body: kopf.Body, extra_fields: Iterable[Any] | None = None) -> kopf.BodyEssence:
        return kopf.BodyEssence()

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        return None

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        return None


def configure_kopf(settings: kopf.OperatorSettings, config: OperatorConfig) -> None:
    """Everything the operator changes in kopf's settings (called from the startup handler)."""
    settings.persistence.finalizer = config.finalizer
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=config.annotation_prefix)
    # No create/update/resume handlers read a diff (the job loop re-reads the spec each pass), so the
    # last-handled-configuration annotation kopf would write on each job is not kept: one PATCH per job, and
    # the watch event it causes, fewer (the delete handler needs no diff base).
    settings.persistence.diffbase_storage = NoDiffBase()
    # Watches that hang silently behind proxies and load balancers never recover by themselves; a
    # server-side timeout makes the API server end them, and kopf reconnects (kopf issue #585).
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.watching.connect_timeout = 30
    # aiohttp's default (5 minutes) would let a hung request stall a handler for that long.
    settings.networking.request_timeout = config.kube_timeout
    # Kubernetes Events for handler errors and warnings; our own transition events are posted by the controller.
    settings.posting.level = logging.WARNING
    # A job loop exits within a moment of being signalled (it waits on the stop flag): give it that moment
    # instead of re-checking only after the cancellation backoff, which would delay every deletion.
    settings.background.instant_exit_timeout = 1.0
    # Replicas elect one active operator through a kopf peering object (the chart ships its CRD and the
    # object); a single replica runs standalone and needs neither.
    settings.peering.standalone = config.peering is None
    if config.peering is not None:
        settings.peering.name = config.peering
        settings.peering.mandatory = True
    # Only the children we made are watched (server-side selectors; pods can be many).
    managed = f"{render.LABEL_MANAGED_BY}={render.MANAGED_BY}"
    settings.watching.label_selectors["ray.io", "rayclusters"] = managed
    settings.watching.label_selectors["v1", "pods"] = managed
