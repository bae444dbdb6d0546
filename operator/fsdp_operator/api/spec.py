"""The typed FSDPTrainingJob: every spec field declared once, with its type, default, bounds and doc.

`parse_job(manifest)` returns a `Job` or raises `SpecError` listing every problem, one line each,
with its field path: ``spec.workers.gpusPerWorker: 5 GPUs requested, g6.12xlarge has 4``; or
`NotAJobError` when the document is not an FSDPTrainingJob at all. It never raises anything else,
whatever the manifest holds.

The dataclasses below are the one source of: the CRD's schema (`generate.crd()`, written out by
`make crds`), the parser (`fields.parse`), the training function's config (`train_config`, a real
`fsdp_train.contract.config.TrainConfig` built while validating, so a job accepted here is never refused by
the training function later) and the field reference docs/api.md.

Adding a field
--------------
1. Add an attribute to the dataclass of its group, made with ``declare("What it does.",
   default=..., minimum=..., maximum=..., grammar=formats.SOMETHING)``. The manifest key is the
   attribute's name in camelCase (``key="..."`` when it is not). Integers and numbers need both
   bounds; strings get a grammar or a ``max_length``. A new group is a new frozen dataclass, added
   to its parent as ``group: Group = declare("doc", factory=Group)``. (`declare` is `fields.field`.)
2. If the training function reads it: add the field to `TrainConfig` and declare
   ``train="its_trainconfig_name"`` here; `train_config` passes it on, and TrainConfig's own
   refusals come back naming the spec field.
3. A rule that spans several fields goes into ``_rules`` of the smallest dataclass that holds them
   (`Workers._rules`, `Spec._rules`); it runs once every field is well-formed.
4. Run ``make crds``: it regenerates crds/, the chart's copy and docs/api.md (tests check all three).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Literal

from fsdp_train.contract import catalog
from fsdp_train.contract.config import ConfigError, TrainConfig

from fsdp_operator.api import cluster_rules, command_line, fields, formats, memo, memory_rules, queueing, schema
from fsdp_operator.api.env_rules import _env_rules, _refuse_control_plane
from fsdp_operator.api.fields import Problems, Quantity, show, show_key
from fsdp_operator.api.fields import field as declare
from fsdp_operator.api.formats import parse_quantity
from fsdp_operator.api.health_spec import Health
from fsdp_operator.api.kube_types import INT32_MAX, EnvVar, ObjectMeta, Toleration
from fsdp_operator.api.tracking_spec import Tracking, tracking_rules
from fsdp_operator.api.train_function import (
    TrainFunction,
    bundled_fields_despite_a_malformed_function,
    check_bundled_fields_unset,
)
from fsdp_operator.api.training_spec import Data, Model, Output, SharedVolume, Training

__all__ = [
    "INSTANCE_TYPES",
    "InstanceType",
    "Job",
    "NotAJobError",
    "Spec",
    "SpecError",
    "parse_job",
    "parse_quantity",
    "train_config",
]

Transport = Literal["efa", "socket", "auto"]
Cleanup = Literal["Delete", "Keep"]


# The hardware catalog (fsdp_train.contract.catalog) is the one table of instance types; kept importable from here.
INSTANCE_TYPES = catalog.INSTANCE_TYPES
InstanceType = catalog.InstanceType

# The node labels Kubernetes sets from the instance type; a nodeSelector may repeat, never contradict, it.
INSTANCE_TYPE_LABELS = ("node.kubernetes.io/instance-type", "beta.kubernetes.io/instance-type")
ZONE_LABEL = cluster_rules.ZONE_LABEL


class SpecError(ValueError):
    """The manifest is not a valid FSDPTrainingJob; `problems` holds one line per problem."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


class NotAJobError(ValueError):
    """The document is not an FSDPTrainingJob at all (wrong apiVersion or kind, or not a mapping)."""


# --- declarations: the spec -----------------------------------------------------------------------------


DEFAULT_SHARED_MEMORY = "32Gi"
_NODE_SELECTOR = {"keys": formats.QUALIFIED_NAME, "values": formats.LABEL_VALUE, "max_items": 64}
_TOLERATIONS = {"shape": Toleration, "max_items": 64}


@dataclass(frozen=True, slots=True)
class Head:
    """The Ray head pod. It schedules work and serves the job API; it gets no GPU."""

    cpu: Quantity = declare(
        "CPU for the head container (request = limit).", default=Quantity("2"), grammar=formats.CPU_QUANTITY
    )
    memory: Quantity = declare(
        "Memory for the head container (request = limit).", default=Quantity("8Gi"), grammar=formats.BYTE_QUANTITY
    )
    node_selector: dict[str, str] = declare("Node labels the head must run on.", factory=dict, **_NODE_SELECTOR)
    tolerations: list[dict[str, Any]] = declare(
        "Tolerations for the head pod, as in a PodSpec.", factory=list, **_TOLERATIONS
    )


@dataclass(frozen=True, slots=True)
class Workers:
    """The GPU worker pods: one Ray node each, one training rank per GPU."""

    replicas: int = declare("Number of worker pods (Ray nodes).", default=2, minimum=1, maximum=512)
    instance_type: str = declare(
        "EC2 instance type the workers run on, as EC2 spells it (g6.12xlarge); becomes a "
        "node.kubernetes.io/instance-type selector. Empty: no selector.",
        default="g6.12xlarge",
        grammar=formats.or_empty(formats.INSTANCE_TYPE),
    )
    gpus_per_worker: int = declare("GPUs per worker pod (nvidia.com/gpu).", default=4, minimum=0, maximum=16)
    efa_per_worker: int = declare(
        "EFA interfaces per worker pod (vpc.amazonaws.com/efa).", default=1, minimum=0, maximum=32
    )
    ranks_per_worker: int = declare(
        "Training ranks per worker pod; must equal gpusPerWorker when there are GPUs.",
        default=0,
        minimum=1,
        maximum=256,
        unset="gpusPerWorker; required when gpusPerWorker is 0 (CPU training)",
    )
    cpu: Quantity = declare(
        "CPU per worker container (request = limit); at most the instance type's allocatable CPU.",
        default=Quantity("40"),
        grammar=formats.CPU_QUANTITY,
    )
    memory: Quantity = declare(
        "Memory per worker container (request = limit); at most the instance type's allocatable memory.",
        default=Quantity("160Gi"),
        grammar=formats.BYTE_QUANTITY,
    )
    shared_memory: Quantity = declare(
        "Size of the memory-backed /dev/shm for NCCL and dataloaders; at most memory (it is counted in it), at least "
        f"{cluster_rules.MIN_SHARED_MEMORY_GPU} with GPUs ({cluster_rules.MIN_SHARED_MEMORY_CPU} without).",
        default=Quantity(DEFAULT_SHARED_MEMORY),
        grammar=formats.BYTE_QUANTITY,
        unset=f"{DEFAULT_SHARED_MEMORY}, or memory when that is less",
    )
    node_selector: dict[str, str] = declare(
        "Extra node labels the workers must run on (the instance-type label comes from instanceType).",
        factory=dict,
        **_NODE_SELECTOR,
    )
    tolerations: list[dict[str, Any]] = declare(
        "Tolerations for the worker pods, as in a PodSpec.", factory=list, **_TOLERATIONS
    )

    @property
    def world_size(self) -> int:
        return self.replicas * self.ranks_per_worker

    @staticmethod
    def _rules(w: dict[str, Any], path: str, problems: Problems) -> None:
        instance_type, gpus, efa = w["instance_type"], w["gpus_per_worker"], w["efa_per_worker"]
        known = catalog.instance_type(instance_type)
        if known is not None:
            _fits_instance(known, w, path, problems)
            if gpus > known.gpus:
                problems.append(f"{path}.gpusPerWorker: {gpus} GPUs requested, {instance_type} has {known.gpus}")
            # A type without EFA is Spec._rules' to judge: that depends on the transport.
            if efa > known.efa_interfaces > 0:
                problems.append(
                    f"{path}.efaPerWorker: {efa} EFA interfaces requested, {instance_type} has {known.efa_interfaces}"
                )
        elif instance_type and efa > 0:
            problems.append(
                f"{path}.efaPerWorker: unknown instance type {show(instance_type)}; EFA can only be checked on known "
                f"types ({', '.join(catalog.INSTANCE_TYPES)}); set efaPerWorker: 0 or use a known type"
            )
        if w["shared_memory"] is None:
            smaller = parse_quantity(w["memory"]) < parse_quantity(DEFAULT_SHARED_MEMORY)
            w["shared_memory"] = w["memory"] if smaller else DEFAULT_SHARED_MEMORY
        elif parse_quantity(w["shared_memory"]) > parse_quantity(w["memory"]):
            # /dev/shm is memory-backed and counted against the container's memory: it can never fill up.
            problems.append(
                f"{path}.sharedMemory: {w['shared_memory']} is more than {path}.memory ({w['memory']}), "
                "which it is counted in"
            )
        else:
            cluster_rules.shared_memory_floor(w["shared_memory"], gpus, path, problems)
        if w["ranks_per_worker"] is None:
            if gpus == 0:
                problems.append(f"{path}.ranksPerWorker: required when gpusPerWorker is 0 (CPU training)")
            w["ranks_per_worker"] = gpus
        elif gpus > 0 and w["ranks_per_worker"] != gpus:
            problems.append(f"{path}.ranksPerWorker: must equal gpusPerWorker ({gpus}): one rank per GPU")
        ranks = w["ranks_per_worker"]
        if ranks and math.ceil(parse_quantity(w["cpu"])) < ranks:
            # Each rank asks Ray for one CPU, and KubeRay gives the Ray node ceil(cpu) of them: fewer never start.
            problems.append(
                f"{path}.cpu: {w['cpu']} CPUs for {ranks} ranks per worker; each rank needs one CPU "
                "(Ray Train would wait for them forever)"
            )
        for label in INSTANCE_TYPE_LABELS:
            chosen = w["node_selector"].get(label)
            if instance_type and chosen is not None and chosen != instance_type:
                problems.append(
                    f"{path}.nodeSelector.{label}: {show(chosen)} contradicts {path}.instanceType ({instance_type}); "
                    "choose the instance type with instanceType"
                )


@dataclass(frozen=True, slots=True)
class Network:
    """How ranks talk to each other, and what the operator verifies about it."""

    transport: Transport = declare(
        "efa: request EFA and expect NCCL to use it; socket: plain TCP; auto: request EFA when the instance type "
        "has it, accept whatever NCCL picks.",
        default="efa",
    )
    require_efa: bool = declare(
        "Fail the job as soon as any rank reports that NCCL did not use EFA.",
        key="requireEFA",
        default=False,
        unset="true when transport is efa",
    )
    fail_fast: bool = declare(
        "Also set NCCL_NET=Libfabric so NCCL refuses to start without EFA (single-node debug runs then fail too).",
        default=False,
    )
    socket_ifname: str = declare(
        "NCCL_SOCKET_IFNAME for bootstrap and socket traffic.", default="eth0", grammar=formats.INTERFACE_NAMES
    )
    nccl_debug: Literal["VERSION", "WARN", "INFO", "TRACE"] = declare(
        "NCCL_DEBUG level; INFO is what transport verification reads.", default="INFO"
    )
    min_cross_node_gbps: float = declare(
        "Cross-node all-reduce bus bandwidth (GB/s) below which InterconnectHealthy is False.",
        key="minCrossNodeBandwidthGBps",
        default=0.0,
        minimum=0,
        maximum=10_000,
        unset="from the instance type's network line rate (g6.12xlarge: 5)",
    )
    env: list[dict[str, Any]] = declare(
        "Transport variables for the workers only (NCCL_*, FI_*, ...; {name, value} or {name, valueFrom}). "
        "Anything else, e.g. storage endpoints and credentials, goes in spec.env.",
        factory=list,
        shape=EnvVar,
        max_items=128,
    )
    allow_instance_metadata: bool = declare(
        "Let the job's pods reach the EC2 instance metadata service (169.254.169.254, fd00:ec2::254), and with it "
        "the node's IAM role. false: the job's NetworkPolicy leaves it out (docs/security.md).",
        default=False,
    )


@dataclass(frozen=True, slots=True)
class Placement:
    """Where the workers run. EFA traffic does not cross Availability Zones: all workers belong in one zone."""

    availability_zone: str = declare(
        "The Availability Zone of every worker (a topology.kubernetes.io/zone selector), e.g. us-east-1b. auto: "
        "the operator picks the best zone where the cluster has nodes of the instance type (offered, quota room, "
        "Spot placement score; it needs AWS credentials such as IRSA) and records it and why in status.placement; "
        "without credentials the workers run unconstrained and the ZonePlaced condition says so. Empty: no zone "
        "constraint.",
        default="",
        grammar=formats.or_empty(formats.ZONE_OR_AUTO),
    )
    capacity_reservation_id: str = declare(
        "An EC2 On-Demand Capacity Reservation (cr-...) for the workers: they are constrained to nodes launched "
        "into it, as Karpenter labels them (karpenter.k8s.aws/capacity-reservation-id). Empty: none.",
        default="",
        grammar=formats.or_empty(formats.CAPACITY_RESERVATION_ID),
    )


@dataclass(frozen=True, slots=True)
class RuntimeEnv:
    """Additions to the Ray job's runtime environment."""

    pip: list[str] = declare(
        "Extra pip requirements for the job, one requirement specifier each (PEP 508, no pip options, no comment, "
        "no backslash).",
        factory=list,
        grammar=formats.PIP_REQUIREMENT,
        max_items=128,
    )
    env_vars: dict[str, str] = declare(
        "Deprecated: use spec.env. Extra environment variables of the Ray job; its values are stored in plain "
        "text in the job's submission, readable through Ray's job API.",
        factory=dict,
        keys=formats.ENV_NAME,
        values=formats.TEXT,
        secret=True,
        max_items=256,
    )


@dataclass(frozen=True, slots=True)
class RunPolicy:
    """Deadlines, retries, suspension and cleanup."""

    backoff_limit: int = declare(
        "Failed attempts to retry with a new submission.", default=0, minimum=0, maximum=100, mutable=True
    )
    max_worker_restarts: int = declare(
        "Restarts of the worker group within one attempt (a lost worker node, a crashed rank) before the attempt "
        "fails; training resumes from the latest checkpoint. -1: no limit.",
        default=0,
        minimum=-1,
        maximum=100,
    )
    active_deadline_seconds: int | None = declare(
        "Fail the job after this long from its start. Unset: no deadline.", minimum=1, maximum=INT32_MAX, mutable=True
    )
    wait_for_workers_timeout_seconds: int = declare(
        "Fail when not every worker has joined within this long.",
        default=900,
        minimum=1,
        maximum=INT32_MAX,
        mutable=True,
    )
    ttl_seconds_after_finished: int | None = declare(
        "Delete the FSDPTrainingJob this long after it finished. Unset: keep it.",
        minimum=0,
        maximum=INT32_MAX,
        mutable=True,
    )
    cleanup: Cleanup = declare(
        "What to do with the RayCluster when the job finishes: Delete it, or Keep it for debugging.",
        default="Delete",
        mutable=True,
    )
    suspend: bool = declare("Stop the Ray job and delete the RayCluster; false resumes.", default=False, mutable=True)


@dataclass(frozen=True, slots=True)
class Spec:
    """What to train and on what. Every field has a default that reproduces the reference setup."""

    image: str = declare(
        "Container image for head and workers, used unmodified (the Ray Train DLC).",
        default=schema.DEFAULT_IMAGE,
        grammar=formats.IMAGE_REFERENCE,
    )
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = declare(
        "Image pull policy for head and workers.", default="IfNotPresent"
    )
    ray_version: str = declare(
        "Ray version inside the image (KubeRay's spec.rayVersion).",
        default=schema.DEFAULT_RAY_VERSION,
        grammar=formats.RAY_VERSION,
    )
    service_account_name: str = declare(
        "The ServiceAccount of the Ray pods (for cloud credentials: IRSA or EKS Pod Identity); its token is "
        "mounted. Empty: the namespace's default ServiceAccount, with no token mounted.",
        default="",
        grammar=formats.or_empty(formats.DNS1123_SUBDOMAIN),
    )
    run_as_user: int | None = declare(
        "The user id the Ray containers run as; other than 0 it also sets runAsNonRoot. Unset: the image's own "
        "user (root in the Ray Train DLC; docs/security.md).",
        minimum=0,
        maximum=INT32_MAX,
    )
    model: Model = declare(Model.__doc__ or "", factory=Model)
    head: Head = declare(Head.__doc__ or "", factory=Head)
    workers: Workers = declare(Workers.__doc__ or "", factory=Workers)
    network: Network = declare(Network.__doc__ or "", factory=Network)
    placement: Placement = declare(Placement.__doc__ or "", factory=Placement)
    training: Training = declare(Training.__doc__ or "", factory=Training)
    data: Data = declare(Data.__doc__ or "", factory=Data)
    output: Output = declare(Output.__doc__ or "", factory=Output)
    env: list[dict[str, Any]] = declare(
        "Environment variables of every Ray process: the job's driver on the head (which reads the data) and the "
        "training ranks on the workers ({name, value} or {name, valueFrom: {secretKeyRef: {name, key}}}); transport "
        "variables (NCCL_*, FI_*, OFI_NCCL_*, ...) go in network.env. Set in "
        "the head and worker containers, so a Secret's value is read by the kubelet and never reaches the "
        "operator or Ray's job API.",
        factory=list,
        shape=EnvVar,
        max_items=128,
    )
    shared_volume: SharedVolume | None = declare(SharedVolume.__doc__ or "")
    runtime_env: RuntimeEnv = declare(RuntimeEnv.__doc__ or "", factory=RuntimeEnv)
    train_function: TrainFunction | None = declare(TrainFunction.__doc__ or "")
    run_policy: RunPolicy = declare(RunPolicy.__doc__ or "", factory=RunPolicy)
    health: Health = declare(Health.__doc__ or "", factory=Health)
    tracking: Tracking = declare(Tracking.__doc__ or "", factory=Tracking)
    queue_name: str = declare(queueing.QUEUE_NAME_DOC, default="", grammar=formats.or_empty(queueing.QUEUE_NAME))

    @property
    def efa_requested(self) -> bool:
        """EFA goes into the worker pods: asked for, not `socket`, and (for `auto`) the type has EFA."""
        if self.workers.efa_per_worker == 0 or self.network.transport == "socket":
            return False
        return self.network.transport == "efa" or _has_efa(self.workers.instance_type)

    @staticmethod
    def _rules(s: dict[str, Any], path: str, problems: Problems) -> None:
        w, n, t = s["workers"], s["network"], s["training"]
        efa, transport = w["efa_per_worker"], n["transport"]
        if n["require_efa"] is None:
            n["require_efa"] = transport == "efa"
        if efa > 0 and (transport == "efa" or n["require_efa"]) and not _has_efa(w["instance_type"]):
            # transport: auto on such a type simply runs without EFA; socket never asks for it.
            problems.append(f"{path}.workers.efaPerWorker: {w['instance_type']} does not support EFA")
        if n["require_efa"] and transport == "socket":
            problems.append(f"{path}.network.requireEFA: true contradicts transport: socket")
        if n["require_efa"] and efa == 0:
            problems.append(f"{path}.network.requireEFA: EFA is required but {path}.workers.efaPerWorker is 0")
        if transport == "efa" and efa == 0:
            problems.append(f"{path}.network.transport: efa needs {path}.workers.efaPerWorker >= 1")
        if n["fail_fast"] and not n["require_efa"]:
            problems.append(f"{path}.network.failFast: only makes sense with requireEFA (NCCL_NET=Libfabric)")
        if n["min_cross_node_gbps"] is None:
            n["min_cross_node_gbps"] = default_interconnect_floor_gbps(w["instance_type"])
        if t["sharding"] == "hybrid" and w["replicas"] < 2:
            problems.append(f"{path}.training.sharding: hybrid needs at least 2 workers (it replicates across nodes)")
        known = catalog.instance_type(w["instance_type"])
        if t["precision"] == "fp8" and w["gpus_per_worker"] == 0:
            problems.append(f"{path}.training.precision: fp8 needs GPUs; gpusPerWorker is 0 (use bf16 or auto)")
        elif t["precision"] == "fp8" and known is not None and not known.gpu.supports_fp8:
            problems.append(
                f"{path}.training.precision: fp8 needs fp8 tensor cores; {known.name}'s {known.gpu.name} has none "
                "(use bf16 or auto)"
            )
        if t["checkpoint"]["interval_steps"] and not t["checkpoint"]["storage"]:
            problems.append(f"{path}.training.checkpoint.intervalSteps: set, but checkpoint.storage is empty")
        cluster_rules.placement_rules(s["placement"], w, path, problems)
        cluster_rules.local_storage_rules(s, path, problems)
        for group in ("head", "workers"):
            _refuse_control_plane(s[group], f"{path}.{group}", problems)
        _env_rules(s, path, problems)
        tracking_rules(s, path, problems)
        check_bundled_fields_unset(s, Spec, path, problems)


def _has_efa(instance_type: str) -> bool:
    """False only for a type the catalog knows to have no EFA (an unknown type is taken at its word)."""
    known = catalog.instance_type(instance_type)
    return known is None or known.efa_interfaces > 0


def default_interconnect_floor_gbps(instance_type: str) -> float:
    """Cross-node bus bandwidth floor in GB/s: the catalog's line rate of the type (40 Gbps -> 5 GB/s); 0 unknown."""
    return catalog.interconnect_floor_gbps(instance_type)


def _fits_instance(known: catalog.InstanceType, w: dict[str, Any], path: str, problems: Problems) -> None:
    """A worker pod larger than what its node leaves to pods (the allocatable: capacity less the kubelet's and
    the system's reservations) can never be scheduled: say so before anything is created."""
    if parse_quantity(w["cpu"]) * 1000 > known.allocatable_millicpu:
        problems.append(
            f"{path}.cpu: {w['cpu']} CPUs requested, a {known.name} node leaves {known.allocatable_millicpu}m "
            f"allocatable to pods ({known.vcpus} vCPUs less {catalog.eks_reserved_millicpu(known.vcpus)}m "
            "kube-reserved on EKS AMIs)"
        )
    if parse_quantity(w["memory"]) > known.allocatable_memory_mib * 2**20:
        problems.append(
            f"{path}.memory: {w['memory']} requested, a {known.name} node leaves {known.allocatable_memory_mib}Mi "
            f"allocatable to pods ({known.memory_mib}Mi less {catalog.eks_reserved_memory_mib(known.max_pods)}Mi "
            f"kube-reserved and eviction threshold for {known.max_pods} pods on EKS AMIs)"
        )


# --- the object around the spec ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Job:
    """A parsed FSDPTrainingJob: identity plus typed spec."""

    name: str
    namespace: str
    uid: str
    generation: int
    spec: Spec
    labels: dict[str, str] = field(default_factory=dict)


TOP_LEVEL_FIELDS = ("apiVersion", "kind", "metadata", "spec", "status")


def check_kind(manifest: Any) -> dict[str, Any]:
    """The manifest as a mapping, or NotAJobError saying what it is instead."""
    if not isinstance(manifest, dict):
        raise NotAJobError(f"expected a mapping (an FSDPTrainingJob), got {fields.type_name(manifest)}")
    api_version, kind = manifest.get("apiVersion"), manifest.get("kind")
    if (api_version, kind) != (schema.API_VERSION, schema.KIND):
        raise NotAJobError(
            f"expected apiVersion: {schema.API_VERSION} and kind: {schema.KIND}, got apiVersion: "
            f"{_named(api_version)} and kind: {_named(kind)}"
        )
    return manifest


def _named(value: Any) -> str:
    return "(missing)" if value is None else show_key(value)


def parse_job(manifest: Any) -> Job:
    """A typed Job from a manifest dict (as applied, or as kopf hands it over); SpecError names every problem."""
    manifest = check_kind(manifest)
    problems: list[str] = []
    for key in manifest:
        if key not in TOP_LEVEL_FIELDS:
            problems.append(f"{show_key(key)}: unknown field (known fields: {', '.join(TOP_LEVEL_FIELDS)})")
    raw_meta = manifest.get("metadata")
    meta = fields.parse(ObjectMeta, {} if raw_meta is None else raw_meta, "metadata", problems)
    raw_spec = manifest.get("spec")
    spec: Spec | None = None
    if raw_spec is None:
        problems.append("spec: required (`spec: {}` takes every default)")
    else:
        spec, spec_problems = _parsed_spec(raw_spec)
        problems.extend(spec_problems)
    if meta is not None and spec is not None:
        queueing.check_labels(meta["labels"], spec.queue_name, problems)
    if problems or meta is None or spec is None:
        raise SpecError(problems)
    job = Job(
        name=meta["name"],
        namespace=meta["namespace"] or "default",
        uid=meta["uid"],
        generation=meta["generation"],
        spec=spec,
        labels=dict(meta["labels"]),
    )
    cluster_rules.check_cluster_size(job.spec, job.labels, problems)
    if problems:
        raise SpecError(problems)
    return job


def _parse_spec(raw_spec: Any) -> tuple[Spec | None, tuple[str, ...]]:
    """The Spec (None when a field is malformed) and every problem of `spec` alone, as parse_job reports them."""
    problems: Problems = []
    values = fields.parse(Spec, raw_spec, "spec", problems)
    if values is None:
        if isinstance(raw_spec, dict) and isinstance(raw_spec.get("trainFunction"), dict):
            bundled_fields_despite_a_malformed_function(raw_spec, Spec, problems)
        return None, tuple(problems)
    spec = fields.build(Spec, values)
    _check_train_config(spec, problems)
    return spec, tuple(problems)


# A spec's parse is a pure function of its JSON (Spec is frozen): 1,024 specs of at most 64 KiB each remembered.
_parsed_spec = memo.JsonMemo(_parse_spec, max_entries=1024, max_key_chars=64 * 1024)


# TrainConfig fields no spec field sets (yet); a declared field with the same `train=` name wins.
TRAIN_CONSTANTS: dict[str, Any] = {}


def train_config(spec: Spec) -> TrainConfig:
    """The training function's config for `spec` (each field declared with `train=` becomes the named
    TrainConfig field); ConfigError when the training function would refuse it."""
    return TrainConfig.from_dict({**TRAIN_CONSTANTS, **fields.gather(Spec, spec, lambda meta: meta.train)})


def _train_paths() -> dict[str, str]:
    return {d.meta.train: f"spec.{path}" for path, d in fields.leaves(Spec) if d.meta.train}


def train_field_paths() -> dict[str, str]:
    """Each `TrainConfig` field a spec field sets, and that field's path under spec (`seq_len`: `training.seqLen`)."""
    return {train: path.removeprefix("spec.") for train, path in _train_paths().items()}


def _check_train_config(spec: Spec, problems: Problems) -> None:
    try:
        config = train_config(spec)
    except ConfigError as e:
        paths = _train_paths()
        detail = re.sub(r"training\.([a-z_]+)", lambda m: paths.get(m.group(1), m.group(0)), e.detail)
        problems.append(f"{paths.get(e.field, 'spec.training')}: {detail}")
        return

    def spec_path(name: str) -> str:  # the field a refusal names, computed for a refusal only
        return _train_paths().get(name, "spec.training")

    command_line.check(config.to_dict(), spec.runtime_env.env_vars, spec_path, problems)
    memory_rules.check(spec, config, problems)
