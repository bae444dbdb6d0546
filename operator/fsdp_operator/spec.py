"""The typed FSDPTrainingJob spec: defaults from the CRD schema, then checks a schema cannot express.

`parse_job(manifest)` returns a `Job` or raises `SpecError` listing every problem, one line each,
with its field path: ``spec.workers.gpusPerWorker: 5 GPUs requested, g6.12xlarge has 4``.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any, Literal, cast

from fsdp_train import catalog

from fsdp_operator import schema

Transport = Literal["efa", "socket", "auto"]
Sharding = Literal["full", "hybrid", "auto"]
Cleanup = Literal["Delete", "Keep"]

DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
CHECKPOINT_SCHEMES = ("s3://", "gs://", "file://", "/")


class SpecError(ValueError):
    """The manifest is not a valid FSDPTrainingJob; `problems` holds one line per problem."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


class NotAJobError(ValueError):
    """The document is not an FSDPTrainingJob at all (wrong apiVersion or kind, or not a mapping)."""


@dataclass(frozen=True, slots=True)
class Model:
    name: str
    init: Literal["pretrained", "random"]
    overrides: dict[str, int | str]


@dataclass(frozen=True, slots=True)
class Head:
    cpu: str
    memory: str
    node_selector: dict[str, str]
    tolerations: list[dict[str, Any]]


@dataclass(frozen=True, slots=True)
class Workers:
    replicas: int
    instance_type: str
    gpus_per_worker: int
    efa_per_worker: int
    ranks_per_worker: int
    cpu: str
    memory: str
    shared_memory: str
    node_selector: dict[str, str]
    tolerations: list[dict[str, Any]]

    @property
    def world_size(self) -> int:
        return self.replicas * self.ranks_per_worker


@dataclass(frozen=True, slots=True)
class Network:
    transport: Transport
    require_efa: bool
    fail_fast: bool
    socket_ifname: str
    nccl_debug: str
    min_cross_node_gbps: float
    env: list[dict[str, Any]]


@dataclass(frozen=True, slots=True)
class Checkpoint:
    storage: str
    interval_steps: int


@dataclass(frozen=True, slots=True)
class Training:
    steps: int
    seq_len: int
    batch_size_per_rank: int
    gradient_accumulation: int
    learning_rate: float
    lr_schedule: Literal["constant", "cosine"]
    warmup_steps: int
    sharding: Sharding
    mixed_precision: Literal["bf16", "fp32"]
    activation_checkpointing: bool
    compile: bool
    reshard_after_forward: bool
    loss_chunk_tokens: int
    seed: int
    probe_size_bytes: int
    checkpoint: Checkpoint


@dataclass(frozen=True, slots=True)
class RuntimeEnv:
    pip: list[str]
    env_vars: dict[str, str]


@dataclass(frozen=True, slots=True)
class RunPolicy:
    backoff_limit: int
    active_deadline_seconds: int | None
    wait_for_workers_timeout_seconds: int
    ttl_seconds_after_finished: int | None
    cleanup: Cleanup
    suspend: bool


@dataclass(frozen=True, slots=True)
class Spec:
    image: str
    image_pull_policy: str
    ray_version: str
    model: Model
    head: Head
    workers: Workers
    network: Network
    training: Training
    runtime_env: RuntimeEnv
    run_policy: RunPolicy

    @property
    def efa_requested(self) -> bool:
        return self.workers.efa_per_worker > 0 and self.network.transport != "socket"


@dataclass(frozen=True, slots=True)
class Job:
    """A parsed FSDPTrainingJob: identity plus typed spec."""

    name: str
    namespace: str
    uid: str
    generation: int
    spec: Spec
    labels: dict[str, str] = field(default_factory=dict)


# --- schema walk: defaults, types, enums, bounds, unknown fields -------------------------------------


def _type_name(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return "null" if value is None else type(value).__name__


def _type_ok(expected: str, value: Any) -> bool:
    actual = _type_name(value)
    return actual == expected or (expected == "number" and actual == "integer")


def _walk(node: dict[str, Any], value: Any, path: str, problems: list[str]) -> Any:
    """Check `value` against `node` and return it with defaults filled in (like the API server does)."""
    if "anyOf" in node:  # int-or-string quantity
        if not isinstance(value, int | str) or isinstance(value, bool):
            problems.append(f"{path}: expected a quantity (integer or string), got {_type_name(value)}")
        return value
    if node.get("x-kubernetes-preserve-unknown-fields"):
        return value
    expected = node["type"]
    if not _type_ok(expected, value):
        problems.append(f"{path}: expected {expected}, got {_type_name(value)} {value!r}")
        return value
    if expected == "object":
        props: dict[str, Any] | None = node.get("properties")
        if props is None:  # a map
            item = node.get("additionalProperties")
            if isinstance(item, dict):
                for key, sub in value.items():
                    _walk(item, sub, f"{path}.{key}", problems)
            return value
        result = dict(value)
        for key in value:
            if key not in props:
                known = ", ".join(sorted(props))
                problems.append(f"{path}.{key}: unknown field (known fields: {known})")
        for key, sub in props.items():
            if key in result:
                result[key] = _walk(sub, result[key], f"{path}.{key}", problems)
            elif "default" in sub:
                result[key] = _walk(sub, copy.deepcopy(sub["default"]), f"{path}.{key}", problems)
        return result
    if expected == "array":
        items = node.get("items", {})
        return [_walk(items, item, f"{path}[{i}]", problems) for i, item in enumerate(value)]
    if "enum" in node and value not in node["enum"]:
        problems.append(f"{path}: {value!r} is not one of {', '.join(map(str, node['enum']))}")
    if "minimum" in node:
        if node.get("exclusiveMinimum") and value <= node["minimum"]:
            problems.append(f"{path}: must be greater than {node['minimum']}, got {value}")
        elif value < node["minimum"]:
            problems.append(f"{path}: must be at least {node['minimum']}, got {value}")
    if "maximum" in node and value > node["maximum"]:
        problems.append(f"{path}: must be at most {node['maximum']}, got {value}")
    if "maxLength" in node and len(value) > node["maxLength"]:
        problems.append(f"{path}: longer than {node['maxLength']} characters")
    return value


# --- Kubernetes quantities ------------------------------------------------------------------------

_SUFFIXES = {
    "": Decimal(1),
    "m": Decimal("0.001"),
    "k": Decimal(10) ** 3,
    "M": Decimal(10) ** 6,
    "G": Decimal(10) ** 9,
    "T": Decimal(10) ** 12,
    "P": Decimal(10) ** 15,
    "E": Decimal(10) ** 18,
    "Ki": Decimal(2) ** 10,
    "Mi": Decimal(2) ** 20,
    "Gi": Decimal(2) ** 30,
    "Ti": Decimal(2) ** 40,
    "Pi": Decimal(2) ** 50,
    "Ei": Decimal(2) ** 60,
}
_QUANTITY = re.compile(r"^([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)([a-zA-Z]*)$")


def parse_quantity(value: int | str) -> Decimal:
    """A Kubernetes quantity (``40``, ``500m``, ``160Gi``) as a number; ValueError when it does not parse."""
    match = _QUANTITY.match(str(value).strip())
    if not match or match.group(2) not in _SUFFIXES:
        raise ValueError(f"{value!r} is not a Kubernetes quantity (examples: 2, 500m, 8Gi)")
    try:
        number = Decimal(match.group(1))
    except InvalidOperation as e:
        raise ValueError(f"{value!r} is not a Kubernetes quantity (examples: 2, 500m, 8Gi)") from e
    return number * _SUFFIXES[match.group(2)]


def _quantity(spec: dict[str, Any], path: str, key: str, problems: list[str]) -> str:
    value = spec[key]
    try:
        if parse_quantity(value) <= 0:
            problems.append(f"{path}.{key}: must be positive, got {value!r}")
    except ValueError as e:
        problems.append(f"{path}.{key}: {e}")
    return str(value)


# --- the typed spec and the cross-field rules -------------------------------------------------------


def default_interconnect_floor_gbps(instance_type: str) -> float:
    """Cross-node bus bandwidth floor in GB/s: the catalog's line rate of the type (40 Gbps -> 5 GB/s)."""
    return catalog.interconnect_floor_gbps(instance_type)


def _fits_instance(known: catalog.InstanceType, cpu: str, memory: str) -> list[str]:
    """A worker pod larger than its instance type can never be scheduled: say so before anything is created."""
    problems: list[str] = []
    if parse_quantity(cpu) > known.vcpus:
        problems.append(f"spec.workers.cpu: {cpu} CPUs requested, {known.name} has {known.vcpus} vCPUs")
    if parse_quantity(memory) > known.memory_mib * 2**20:
        problems.append(f"spec.workers.memory: {memory} requested, {known.name} has {known.memory_mib // 1024}Gi")
    return problems


def parse_spec(raw: dict[str, Any]) -> Spec:
    """Typed spec from the `spec` mapping; raises SpecError naming every bad field."""
    problems: list[str] = []
    s = _walk(schema.SPEC_SCHEMA, raw, "spec", problems)
    if problems:
        raise SpecError(problems)

    w, n, t, rp = s["workers"], s["network"], s["training"], s["runPolicy"]
    known = catalog.instance_type(w["instanceType"])
    gpus, efa = w["gpusPerWorker"], w["efaPerWorker"]
    if known is not None:
        if gpus > known.gpus:
            problems.append(f"spec.workers.gpusPerWorker: {gpus} GPUs requested, {w['instanceType']} has {known.gpus}")
        if efa > known.efa_interfaces:
            if known.efa_interfaces == 0:
                problems.append(f"spec.workers.efaPerWorker: {w['instanceType']} does not support EFA")
            else:
                problems.append(
                    f"spec.workers.efaPerWorker: {efa} EFA interfaces requested, "
                    f"{w['instanceType']} has {known.efa_interfaces}"
                )
    elif w["instanceType"] and efa > 0:
        problems.append(
            f"spec.workers.efaPerWorker: unknown instance type {w['instanceType']!r}; EFA can only be checked on "
            f"known types ({', '.join(catalog.INSTANCE_TYPES)}); set efaPerWorker: 0 or use a known type"
        )

    ranks = w.get("ranksPerWorker")
    if ranks is None:
        if gpus == 0:
            problems.append("spec.workers.ranksPerWorker: required when gpusPerWorker is 0 (CPU training)")
        ranks = gpus
    elif gpus > 0 and ranks != gpus:
        problems.append(f"spec.workers.ranksPerWorker: must equal gpusPerWorker ({gpus}): one rank per GPU")

    transport = n["transport"]
    require_efa = n.get("requireEFA")
    if require_efa is None:
        require_efa = transport == "efa"
    if require_efa and transport == "socket":
        problems.append("spec.network.requireEFA: true contradicts transport: socket")
    if require_efa and efa == 0:
        problems.append("spec.network.requireEFA: EFA is required but spec.workers.efaPerWorker is 0")
    if transport == "efa" and efa == 0:
        problems.append("spec.network.transport: efa needs spec.workers.efaPerWorker >= 1")
    if n["failFast"] and not require_efa:
        problems.append("spec.network.failFast: only makes sense with requireEFA (NCCL_NET=Libfabric)")
    for i, item in enumerate(n.get("env", [])):
        if not isinstance(item.get("name"), str) or not item["name"]:
            problems.append(f"spec.network.env[{i}].name: required")

    if t["sharding"] == "hybrid" and w["replicas"] < 2:
        problems.append("spec.training.sharding: hybrid needs at least 2 workers (it replicates across nodes)")
    if t["warmupSteps"] > t["steps"]:
        problems.append(f"spec.training.warmupSteps: {t['warmupSteps']} is more than steps ({t['steps']})")
    storage = t["checkpoint"]["storage"]
    if storage and not storage.startswith(CHECKPOINT_SCHEMES):
        problems.append(
            f"spec.training.checkpoint.storage: unsupported location {storage!r} "
            "(use s3://, gs://, file:// or an absolute path)"
        )
    if t["checkpoint"]["intervalSteps"] and not storage:
        problems.append("spec.training.checkpoint.intervalSteps: set, but checkpoint.storage is empty")

    head_cpu = _quantity(s["head"], "spec.head", "cpu", problems)
    head_memory = _quantity(s["head"], "spec.head", "memory", problems)
    cpu = _quantity(w, "spec.workers", "cpu", problems)
    memory = _quantity(w, "spec.workers", "memory", problems)
    shm = _quantity(w, "spec.workers", "sharedMemory", problems)
    if problems:
        raise SpecError(problems)
    if known is not None:
        problems += _fits_instance(known, cpu, memory)
        if problems:
            raise SpecError(problems)

    floor = n.get("minCrossNodeBandwidthGBps")
    return Spec(
        image=s["image"],
        image_pull_policy=s["imagePullPolicy"],
        ray_version=s["rayVersion"],
        model=Model(name=s["model"]["name"], init=s["model"]["init"], overrides=dict(s["model"].get("overrides", {}))),
        head=Head(
            cpu=head_cpu,
            memory=head_memory,
            node_selector=dict(s["head"].get("nodeSelector", {})),
            tolerations=list(s["head"].get("tolerations", [])),
        ),
        workers=Workers(
            replicas=w["replicas"],
            instance_type=w["instanceType"],
            gpus_per_worker=gpus,
            efa_per_worker=efa,
            ranks_per_worker=ranks,
            cpu=cpu,
            memory=memory,
            shared_memory=shm,
            node_selector=dict(w.get("nodeSelector", {})),
            tolerations=list(w.get("tolerations", [])),
        ),
        network=Network(
            transport=cast(Transport, transport),
            require_efa=bool(require_efa),
            fail_fast=n["failFast"],
            socket_ifname=n["socketIfname"],
            nccl_debug=n["ncclDebug"],
            min_cross_node_gbps=float(floor)
            if floor is not None
            else default_interconnect_floor_gbps(w["instanceType"]),
            env=list(n.get("env", [])),
        ),
        training=Training(
            steps=t["steps"],
            seq_len=t["seqLen"],
            batch_size_per_rank=t["batchSizePerRank"],
            gradient_accumulation=t["gradientAccumulation"],
            learning_rate=float(t["learningRate"]),
            lr_schedule=t["lrSchedule"],
            warmup_steps=t["warmupSteps"],
            sharding=t["sharding"],
            mixed_precision=t["mixedPrecision"],
            activation_checkpointing=t["activationCheckpointing"],
            compile=t["compile"],
            reshard_after_forward=t["reshardAfterForward"],
            loss_chunk_tokens=t["lossChunkTokens"],
            seed=t["seed"],
            probe_size_bytes=t["probeSizeBytes"],
            checkpoint=Checkpoint(storage=storage, interval_steps=t["checkpoint"]["intervalSteps"]),
        ),
        runtime_env=RuntimeEnv(
            pip=list(s["runtimeEnv"].get("pip", [])), env_vars=dict(s["runtimeEnv"].get("envVars", {}))
        ),
        run_policy=RunPolicy(
            backoff_limit=rp["backoffLimit"],
            active_deadline_seconds=rp.get("activeDeadlineSeconds"),
            wait_for_workers_timeout_seconds=rp["waitForWorkersTimeoutSeconds"],
            ttl_seconds_after_finished=rp.get("ttlSecondsAfterFinished"),
            cleanup=rp["cleanup"],
            suspend=rp["suspend"],
        ),
    )


def check_kind(manifest: Any) -> dict[str, Any]:
    """The manifest as a mapping, or NotAJobError saying what it is instead."""
    if not isinstance(manifest, dict):
        raise NotAJobError(f"expected a mapping (an FSDPTrainingJob), got {_type_name(manifest)}")
    api_version, kind = manifest.get("apiVersion"), manifest.get("kind")
    if (api_version, kind) != (schema.API_VERSION, schema.KIND):
        raise NotAJobError(
            f"expected apiVersion: {schema.API_VERSION} and kind: {schema.KIND}, got apiVersion: {api_version} "
            f"and kind: {kind}"
        )
    return manifest


def parse_job(manifest: Any) -> Job:
    """A typed Job from a manifest dict (as applied, or as kopf hands it over)."""
    manifest = check_kind(manifest)
    meta = manifest.get("metadata") or {}
    problems: list[str] = []
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        problems.append("metadata.name: required")
        name = ""
    elif len(name) > 63 or not DNS1123_LABEL.match(name):
        problems.append(
            f"metadata.name: {name!r} must be a DNS-1123 label: at most 63 lowercase letters, digits and '-', "
            "starting and ending with a letter or digit"
        )
    raw_spec = manifest.get("spec", {})
    if raw_spec is None:
        raw_spec = {}
    try:
        spec = parse_spec(raw_spec)
    except SpecError as e:
        raise SpecError(problems + e.problems) from None
    if problems:
        raise SpecError(problems)
    return Job(
        name=name,
        namespace=str(meta.get("namespace") or "default"),
        uid=str(meta.get("uid") or ""),
        generation=int(meta.get("generation") or 0),
        spec=spec,
        labels=dict(meta.get("labels") or {}),
    )
