"""The Kubernetes-shaped parts of a job's manifest: metadata, tolerations, env vars. Declarations."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

from fsdp_operator.api import formats
from fsdp_operator.api.fields import Problems, Quantity, show
from fsdp_operator.api.fields import field as declare
from fsdp_operator.api.formats import parse_quantity

INT32_MAX = 2**31 - 1


INT64_MAX = 2**63 - 1


ANNOTATIONS_MAX_BYTES = 256 * 1024  # Kubernetes' limit on all annotations of an object together


@dataclass(frozen=True, slots=True)
class Toleration:
    """A toleration, as in a PodSpec, checked the way the API server checks it."""

    key: str = declare(
        "Taint key; empty (with operator Exists) tolerates every taint.",
        default="",
        grammar=formats.or_empty(formats.QUALIFIED_NAME),
    )
    operator: Literal["Exists", "Equal", ""] = declare("Exists or Equal (the default).", default="")
    value: str = declare("Taint value to match (operator Equal).", default="", grammar=formats.LABEL_VALUE)
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute", ""] = declare(
        "Taint effect to match; empty matches every effect.", default=""
    )
    toleration_seconds: int | None = declare(
        "How long a NoExecute taint is tolerated.", minimum=-INT64_MAX - 1, maximum=INT64_MAX
    )

    @staticmethod
    def _rules(v: dict[str, Any], path: str, problems: Problems) -> None:
        operator = v["operator"] or "Equal"
        if not v["key"] and operator != "Exists":
            problems.append(f"{path}.operator: must be Exists when key is empty (that tolerates every taint)")
        if operator == "Exists" and v["value"]:
            problems.append(f"{path}.value: must be empty when operator is Exists")
        if v["toleration_seconds"] is not None and v["effect"] != "NoExecute":
            problems.append(f"{path}.effect: must be NoExecute when tolerationSeconds is set")


@dataclass(frozen=True, slots=True)
class KeySelector:
    """A key of a Secret or ConfigMap in the job's namespace."""

    name: str = declare(
        "Name of the Secret or ConfigMap.", default="", required=True, grammar=formats.DNS1123_SUBDOMAIN
    )
    key: str = declare("The key to read.", default="", required=True, grammar=formats.SECRET_KEY)
    optional: bool | None = declare("Start even when the key does not exist.")


@dataclass(frozen=True, slots=True)
class FieldSelector:
    """A field of the pod (downward API)."""

    field_path: str = declare(
        "Path of the field, e.g. status.podIP.", default="", required=True, grammar=formats.FIELD_PATH
    )
    api_version: str = declare("Version of the schema the path is written in (v1).", default="", max_length=64)

    @staticmethod
    def _rules(v: dict[str, Any], path: str, problems: Problems) -> None:
        field_path = v["field_path"]
        subscripted = ENV_FIELD_PATH_SUBSCRIPT.fullmatch(field_path)
        if subscripted is not None:
            reason = formats.QUALIFIED_NAME.check(subscripted.group(2))
            if reason is not None:
                problems.append(f"{path}.fieldPath: the key {show(subscripted.group(2))} {reason}")
        elif field_path not in ENV_FIELD_PATHS:
            problems.append(
                f"{path}.fieldPath: {show(field_path)} is not a field the API server lets an environment variable "
                f"read; supported: {', '.join(ENV_FIELD_PATHS)}, metadata.labels['KEY'], metadata.annotations['KEY']"
            )
        if v["api_version"] not in (None, "", "v1"):  # shape items keep what the manifest left out as None
            problems.append(f"{path}.apiVersion: {show(v['api_version'])} is not supported; the pod API is v1")


# What an environment variable may read of its pod (Kubernetes pkg/apis/core/validation,
# validEnvDownwardAPIFieldPathExpressions; labels and annotations only one key at a time).
ENV_FIELD_PATHS = (
    "metadata.name",
    "metadata.namespace",
    "metadata.uid",
    "spec.nodeName",
    "spec.serviceAccountName",
    "status.hostIP",
    "status.hostIPs",
    "status.podIP",
    "status.podIPs",
)


ENV_FIELD_PATH_SUBSCRIPT = re.compile(r"metadata\.(labels|annotations)\['(.*)'\]", re.DOTALL)


# The resources an environment variable may read, and the divisors valid for each
# (validContainerResourceFieldPathExpressions, validContainerResourceDivisorForCPU/ForMemory).
_CPU_DIVISORS = ("1m", "1")


_BYTE_DIVISORS = ("1", "1k", "1M", "1G", "1T", "1P", "1E", "1Ki", "1Mi", "1Gi", "1Ti", "1Pi", "1Ei")


ENV_RESOURCE_DIVISORS = {
    f"{kind}.{resource}": _CPU_DIVISORS if resource == "cpu" else _BYTE_DIVISORS
    for kind in ("limits", "requests")
    for resource in ("cpu", "memory", "ephemeral-storage")
}


ENV_HUGEPAGES_PREFIXES = ("limits.hugepages-", "requests.hugepages-")


@dataclass(frozen=True, slots=True)
class ResourceSelector:
    """A resource limit or request of a container (downward API)."""

    resource: str = declare(
        "The resource: limits.cpu, limits.memory, limits.ephemeral-storage or the same under requests.",
        default="",
        required=True,
        max_length=64,
    )
    container_name: str = declare("The container; default: this one.", default="", max_length=63)
    divisor: Quantity = declare(
        "Unit of the value: 1m or 1 for cpu; 1, 1k..1E or 1Ki..1Ei for memory and storage.",
        default="1",
        grammar=formats.POSITIVE_QUANTITY,
    )

    @staticmethod
    def _rules(v: dict[str, Any], path: str, problems: Problems) -> None:
        resource = v["resource"]
        if resource.startswith(ENV_HUGEPAGES_PREFIXES):
            divisors: tuple[str, ...] = _BYTE_DIVISORS
        elif resource in ENV_RESOURCE_DIVISORS:
            divisors = ENV_RESOURCE_DIVISORS[resource]
        else:
            problems.append(
                f"{path}.resource: {show(resource)} is not a resource the API server lets an environment variable "
                f"read; supported: {', '.join(ENV_RESOURCE_DIVISORS)} (extended resources such as nvidia.com/gpu "
                "are not)"
            )
            return
        # The API server compares the canonical form (1000m is 1): compare values.
        divisor = "1" if v["divisor"] is None else v["divisor"]
        if parse_quantity(divisor) not in {parse_quantity(d) for d in divisors}:
            problems.append(
                f"{path}.divisor: {show(divisor)} is not a valid divisor for {resource}; one of {', '.join(divisors)}"
            )


@dataclass(frozen=True, slots=True)
class EnvVarSource:
    """Where an environment variable's value comes from; exactly one source."""

    secret_key_ref: KeySelector | None = declare("A key of a Secret: the way to pass credentials.")
    config_map_key_ref: KeySelector | None = declare("A key of a ConfigMap.")
    field_ref: FieldSelector | None = declare("A field of the pod.")
    resource_field_ref: ResourceSelector | None = declare("A resource of a container.")

    @staticmethod
    def _rules(v: dict[str, Any], path: str, problems: Problems) -> None:
        if sum(value is not None for value in v.values()) != 1:
            problems.append(
                f"{path}: must set exactly one of secretKeyRef, configMapKeyRef, fieldRef, resourceFieldRef"
            )


@dataclass(frozen=True, slots=True)
class EnvVar:
    """An environment variable of a container, as in a PodSpec."""

    name: str = declare("Variable name.", default="", required=True, grammar=formats.ENV_NAME)
    value: str = declare(
        "Plain value. Credentials belong in valueFrom.secretKeyRef.", default="", secret=True, max_length=32768
    )
    value_from: EnvVarSource | None = declare("Where the value comes from instead.")

    @staticmethod
    def _rules(v: dict[str, Any], path: str, problems: Problems) -> None:
        if v["value"] and v["value_from"] is not None:
            problems.append(f"{path}.valueFrom: may not be set together with value")


@dataclass(frozen=True, slots=True)
class OwnerReference:
    """An owner of the job, as the API server checks it (metav1.OwnerReference)."""

    api_version: str = declare("API version of the owner.", default="", required=True, max_length=317)
    kind: str = declare("Kind of the owner.", default="", required=True, max_length=253)
    name: str = declare("Name of the owner.", default="", required=True, max_length=253)
    uid: str = declare("UID of the owner.", default="", required=True, max_length=128)
    controller: bool | None = declare("The owner is the managing controller.")
    block_owner_deletion: bool | None = declare("The owner cannot be deleted before this object.")


@dataclass(frozen=True, slots=True)
class ObjectMeta:
    """The metadata of an FSDPTrainingJob: what the operator reads is checked; the API server's own fields pass."""

    name: str = declare("Name of the job (a DNS-1123 label).", default="", required=True, grammar=formats.DNS1123_LABEL)
    namespace: str = declare("Namespace of the job.", default="default", grammar=formats.DNS1123_LABEL)
    labels: dict[str, str] = declare("Labels.", factory=dict, keys=formats.QUALIFIED_NAME, values=formats.LABEL_VALUE)
    annotations: dict[str, str] = declare(
        "Annotations.",
        factory=dict,
        keys=formats.QUALIFIED_NAME,
        values=formats.ANNOTATION_TEXT,
        secret=True,
        max_length=ANNOTATIONS_MAX_BYTES,
    )
    generation: int = declare("Set by the API server.", default=0, minimum=0, maximum=INT64_MAX)
    uid: str = declare("Set by the API server.", default="", max_length=128)
    generate_name: str = declare("Name prefix.", default="", max_length=253)
    resource_version: str = declare("Set by the API server.", default="", max_length=128)
    self_link: str = declare("Set by the API server.", default="", max_length=1024)
    creation_timestamp: str | None = declare("Set by the API server.", max_length=64)
    deletion_timestamp: str | None = declare("Set by the API server.", max_length=64)
    deletion_grace_period_seconds: int | None = declare("Set by the API server.", minimum=0, maximum=INT64_MAX)
    finalizers: list[str] = declare("Finalizers.", factory=list, grammar=formats.QUALIFIED_NAME, max_items=64)
    owner_references: list[dict[str, Any]] = declare("Owners.", factory=list, shape=OwnerReference, max_items=64)
    managed_fields: list[dict[str, Any]] = declare("Set by the API server.", factory=list, max_items=1024)

    @staticmethod
    def _rules(m: dict[str, Any], path: str, problems: Problems) -> None:
        size = sum(len(f"{k}{v}".encode(errors="replace")) for k, v in m["annotations"].items())
        if size > ANNOTATIONS_MAX_BYTES:
            problems.append(f"{path}.annotations: {size} bytes in total, Kubernetes allows {ANNOTATIONS_MAX_BYTES}")
