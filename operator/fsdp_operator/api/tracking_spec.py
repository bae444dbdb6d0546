"""spec.tracking: where a job's runs are recorded (MLflow). The declaration, its grammars and its rules.

The training side (`fsdp_train.watch.tracking`) logs from rank 0 in the background; nothing here reaches a tracker. A
tracking URI is checked like the storage URIs (formats.STORAGE_URI): no credentials in it, no query, no `..`, no
hidden characters, and no link-local host (the instance metadata service lives there: the job's NetworkPolicy
opens egress to the tracker's port, docs/tracking.md). Credentials come only by reference, through spec.env's
secretKeyRef: the MLflow variables that carry them are refused as plain values.
"""

from __future__ import annotations

import functools
import ipaddress
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from fsdp_operator.api import formats
from fsdp_operator.api.fields import Problems, show
from fsdp_operator.api.fields import field as declare
from fsdp_operator.api.formats import Grammar

_CONTROL = re.compile(r"[\x00-\x20\x7f-\xa0\u1680\u180e\u2000-\u200f\u2028-\u202f\u205f-\u2064\u3000\ufeff]")
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOST_NAME = re.compile(rf"(?=.{{1,253}}$){_LABEL}(?:\.{_LABEL})*\.?")
TRACKING_SCHEMES = ("http", "https")
# The IPv6 addresses of the instance metadata service and EKS Pod Identity's agent (not link-local addresses).
_EC2_IPV6_SERVICES = (ipaddress.ip_address("fd00:ec2::254"), ipaddress.ip_address("fd00:ec2::23"))


def _tracking_uri(value: str) -> str | None:
    """http(s)://HOST[:PORT][/path], file:///abs/path or /abs/path (an MLflow file store)."""
    if _CONTROL.search(value):
        return "must not contain white space or control characters"
    if value.startswith("/") or value.startswith("file:"):
        if value.startswith("file:") and not value.startswith("file:///"):
            return "file: must be followed by an absolute path (file:///path)"
        return formats.WRITABLE_PATH.check(value.removeprefix("file://"))
    try:
        parts = urlsplit(value)
        port = parts.port  # a port out of range or not a number raises here
    except ValueError:
        return "is not a well-formed URI (http(s)://HOST[:PORT][/path])"
    written = value.split(":", 1)[0]
    if parts.scheme not in TRACKING_SCHEMES or written != parts.scheme:
        return "must start with http://, https:// (a tracking server), file:/// or / (a file store)"
    if not value.startswith(f"{parts.scheme}://") or not parts.hostname:
        return f"has no host ({parts.scheme}://HOST[:PORT])"
    if "@" in parts.netloc:
        return "must not carry credentials (user info); give MLFLOW_TRACKING_TOKEN through spec.env's secretKeyRef"
    if parts.query or parts.fragment or "?" in value or "#" in value:
        return "must not have a query or fragment"
    if port == 0:
        return "has port 0"
    if formats._dot_dot(parts.path):
        return "must not contain '..' segments"
    return _host(parts.hostname)


def _host(host: str) -> str | None:
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        if not _HOST_NAME.fullmatch(host):
            return "has a host that is neither a DNS name nor an IP address"
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped  # ::ffff:169.254.169.254 reaches 169.254.169.254
    if address.is_link_local or address in _EC2_IPV6_SERVICES:
        # The instance metadata service and EKS Pod Identity's agent: the node's and roles' credentials.
        return "has a link-local host (where the instance metadata service answers); name the tracking server"
    if address.is_unspecified or address.is_multicast:
        return "has an unspecified or multicast host address"
    return None


def _name_problem(value: str, refused: str = "") -> str | None:
    if value != value.strip() or not value:
        return "must not be empty or start or end with white space"
    if formats.hidden_character(value) or "\n" in value or "\r" in value or "\t" in value:
        return "must be one line without control or invisible characters"
    if bad := [c for c in refused if c in value]:
        return f"must not contain {bad[0]!r} (MLflow refuses {', '.join(repr(c) for c in refused)} in it)"
    return None


def _name(limit: int, refused: str = "") -> Grammar:
    """One line of visible text, as MLflow names it (experiment, run, registered model), at most `limit`. The check
    is a function of the module, not a closure made here: what runs at each validation, not once at import."""
    return Grammar(
        f"MLflow name (at most {limit} characters)", functools.partial(_name_problem, refused=refused), limit
    )


TRACKING_URI = Grammar("tracking URI", _tracking_uri, 1024)
EXPERIMENT_NAME = _name(500)
RUN_NAME = _name(250)
MODEL_NAME = _name(250, refused="/:")

# Variables the MLflow client reads credentials from: only ever by reference (a Secret), never in the manifest.
CREDENTIAL_ENV = ("MLFLOW_TRACKING_TOKEN", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_CLIENT_CERT_PATH")
# What spec.tracking.mlflow itself says: set elsewhere it would contradict it (or point another run at the job).
OWNED_ENV = ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME", "MLFLOW_EXPERIMENT_ID", "MLFLOW_RUN_ID",
             "MLFLOW_REGISTRY_URI")  # fmt: skip


@dataclass(frozen=True, slots=True)
class MLflow:
    """An MLflow tracking server (or file store) every attempt of the job logs to (docs/tracking.md)."""

    tracking_uri: str = declare(
        "The tracking server, http(s)://HOST[:PORT][/path], or an MLflow file store, file:///path or /path (with "
        "more than one worker, or a trainFunction: under sharedVolume.mountPath). No credentials in it: give "
        "MLFLOW_TRACKING_TOKEN (or _USERNAME and _PASSWORD) in spec.env through secretKeyRef.",
        required=True,
        grammar=TRACKING_URI,
    )
    experiment: str = declare(
        "The experiment the runs go into; created when missing. Empty: the job's namespace.",
        default="",
        grammar=formats.or_empty(EXPERIMENT_NAME),
    )
    run_name: str = declare(
        "The run's name. The attempts of one generation of the job continue one run; a changed job (a new "
        "generation) is a new run. Empty: NAMESPACE/NAME attempt N, N the attempt that began the run.",
        default="",
        grammar=formats.or_empty(RUN_NAME),
    )
    registered_model: str = declare(
        "Register the export (spec.output) as a new version of this registered model. Empty: none.",
        default="",
        grammar=formats.or_empty(MODEL_NAME),
    )


@dataclass(frozen=True, slots=True)
class Tracking:
    """Experiment tracking: each step's figures, the settings and the model, logged from rank 0 in the background."""

    mlflow: MLflow | None = declare(MLflow.__doc__ or "")


def tracking_rules(s: dict[str, Any], path: str, problems: Problems) -> None:
    """What spans spec.tracking and the rest of the spec: credentials by reference, one place for each setting,
    an export to register, a file store every process sees."""
    for i, env in enumerate(s["env"]):
        name = str(env.get("name", "")).strip().upper()
        if name in CREDENTIAL_ENV and "value" in env:
            problems.append(
                f"{path}.env[{i}].value: {name} is a credential; give it by reference (valueFrom.secretKeyRef), "
                "never as a value in the manifest"
            )
    for name in s["runtime_env"]["env_vars"]:
        if str(name).strip().upper() in CREDENTIAL_ENV:
            problems.append(
                f"{path}.runtimeEnv.envVars.{show(name)}: a credential, readable in Ray's job API there; set it in "
                f"{path}.env through valueFrom.secretKeyRef"
            )
    mlflow = (s.get("tracking") or {}).get("mlflow")
    if mlflow is None:
        return
    here = f"{path}.tracking.mlflow"
    env_names = [(f"{path}.env", e.get("name", "")) for e in s["env"]]
    env_names += [(f"{path}.runtimeEnv.envVars", name) for name in s["runtime_env"]["env_vars"]]
    for where, name in env_names:
        if str(name).strip().upper() in OWNED_ENV:
            problems.append(f"{where}: {show(name)} contradicts {here}; set the tracker there only")
    if mlflow["registered_model"] and not s["output"]["storage"] and s.get("train_function") is None:
        problems.append(f"{here}.registeredModel: set, but {path}.output.storage is empty (there is no export)")
    if mlflow["registered_model"] and s.get("train_function") is not None:
        problems.append(f"{here}.registeredModel: a trainFunction's model is its own; register it from the function")
    local = formats.local_path(mlflow["tracking_uri"]) if not mlflow["tracking_uri"].startswith("http") else None
    if local is not None and (s["workers"]["replicas"] > 1 or s.get("train_function") is not None):
        volume = s["shared_volume"]
        mount = volume["mount_path"].rstrip("/") if volume else None
        if mount is None or not (local == mount or local.startswith(mount + "/")):
            problems.append(
                f"{here}.trackingUri: {show(mlflow['tracking_uri'])} is a file store on one pod's own disk, and rank 0 "
                f"and the attempts after a restart may run on others; put it under {path}.sharedVolume.mountPath "
                "or use a tracking server (http(s)://)"
            )


def tracking_port(uri: str) -> int | None:
    """The TCP port the job's pods reach the tracking server on; None for a file store."""
    parts = urlsplit(uri)
    if parts.scheme not in TRACKING_SCHEMES:
        return None
    return parts.port or (443 if parts.scheme == "https" else 80)


def tracking_host(uri: str) -> str:
    return urlsplit(uri).hostname or ""
