"""What a job's spec.tracking becomes: the entrypoint's `tracking` config and the NetworkPolicy's egress to the tracker.

The training side reads the config (`fsdp_train.watch.tracking.Settings`); the egress rule lets the job's pods reach a
tracking server on a port other than HTTPS's 443, which the policy allows anywhere already (docs/tracking.md).
"""

from __future__ import annotations

import ipaddress
from importlib import metadata
from typing import Any

from fsdp_operator.api.spec import Job, train_field_paths
from fsdp_operator.api.tracking_spec import tracking_host, tracking_port


def operator_version() -> str:
    try:
        return metadata.version("fsdp-operator")
    except metadata.PackageNotFoundError:  # run from a source tree without installing it
        return "unknown"


def entry(job: Job, submission_id: str) -> dict[str, Any] | None:
    """The entrypoint's `tracking` config for one attempt, or None when the job names no tracker."""
    mlflow = job.spec.tracking.mlflow
    if mlflow is None:
        return None
    # render.submission_id ends with the attempt's number.
    attempt = submission_id.rsplit("-", 1)[-1]
    attempt = attempt if attempt.isdigit() else "1"
    return {
        "uri": mlflow.tracking_uri,
        "experiment": mlflow.experiment or job.namespace,
        "run_name": mlflow.run_name or f"{job.namespace}/{job.name} attempt {attempt}",
        "registered_model": mlflow.registered_model,
        "job": f"{job.namespace}/{job.name}",
        "uid": job.uid,
        "generation": job.generation,
        "attempt": int(attempt),
        "instance_type": job.spec.workers.instance_type,
        "operator_version": operator_version(),
        # The run's parameters are named as in the spec (`training.seqLen`), not as the training function's fields.
        "param_names": train_field_paths(),
    }


def egress(job: Job, anywhere: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The egress rule to the tracking server: its port, to its address when the URI names one, else to
    `anywhere` (the peers HTTPS may reach: all but link-local addresses; a NetworkPolicy cannot name a host).
    None needed for 443 (HTTPS is allowed already) or a file store."""
    mlflow = job.spec.tracking.mlflow
    port = tracking_port(mlflow.tracking_uri) if mlflow is not None else None
    if mlflow is None or port is None or port == 443:
        return []
    ports = [{"protocol": "TCP", "port": port}]
    host = tracking_host(mlflow.tracking_uri)
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return [{"to": anywhere, "ports": ports}]
    return [{"to": [{"ipBlock": {"cidr": f"{address}/{address.max_prefixlen}"}}], "ports": ports}]
