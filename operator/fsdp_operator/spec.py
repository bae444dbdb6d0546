"""The typed FSDPTrainingJob: every spec field declared once, with its type, default, bounds and doc.

`parse_job(manifest)` returns a `Job` or raises `SpecError` listing every problem, one line each,
with its field path: ``spec.workers.gpusPerWorker: 5 GPUs requested, g6.12xlarge has 4``; or
`NotAJobError` when the document is not an FSDPTrainingJob at all. It never raises anything else,
whatever the manifest holds.

The dataclasses below are the one source of: the CRD's schema (`schema.crd()`, written out by
`make crds`), the parser (`fields.parse`), the training function's config (`train_config`, a real
`fsdp_train.config.TrainConfig` built while validating, so a job accepted here is never refused by
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

import json
import math
import re
import shlex
from dataclasses import dataclass, field
from typing import Any, Literal

from fsdp_train import catalog
from fsdp_train.config import ConfigError, TrainConfig

from fsdp_operator import fields, formats, model_configs, schema
from fsdp_operator.fields import Problems, Quantity, show, show_key
from fsdp_operator.fields import field as declare
from fsdp_operator.formats import parse_quantity

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
Sharding = Literal["full", "hybrid", "auto"]
Cleanup = Literal["Delete", "Keep"]

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
ANNOTATIONS_MAX_BYTES = 256 * 1024  # Kubernetes' limit on all annotations of an object together
MAX_STEPS = 100_000_000


# The hardware catalog (fsdp_train.catalog) is the one table of instance types; kept importable from here.
INSTANCE_TYPES = catalog.INSTANCE_TYPES
InstanceType = catalog.InstanceType

# The node labels Kubernetes sets from the instance type; a nodeSelector may repeat, never contradict, it.
INSTANCE_TYPE_LABELS = ("node.kubernetes.io/instance-type", "beta.kubernetes.io/instance-type")
# The zone label of every node (the cloud provider sets it); placement.availabilityZone becomes a selector on it.
ZONE_LABEL = "topology.kubernetes.io/zone"


class SpecError(ValueError):
    """The manifest is not a valid FSDPTrainingJob; `problems` holds one line per problem."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


class NotAJobError(ValueError):
    """The document is not an FSDPTrainingJob at all (wrong apiVersion or kind, or not a mapping)."""


# The environment variables the operator sets itself (render.nccl_env, render.submission and the
# downward API): transport verification reads NCCL's log, log collection needs Ray's per-rank lines
# unmerged. A user's value would silently defeat either, so the spec may not set them. A trailing
# `*` is a prefix. The value says what to use instead.
OPERATOR_ENV: dict[str, str] = {
    "NCCL_DEBUG*": "use spec.network.ncclDebug",
    "NCCL_NET": "use spec.network.transport and spec.network.failFast",
    "NCCL_NET_PLUGIN": "use spec.network.transport",
    "NCCL_IB_DISABLE": "use spec.network.transport",
    "NCCL_SOCKET_IFNAME": "use spec.network.socketIfname",
    "FI_*": "use spec.network.transport (the operator selects the libfabric provider)",
    "RAY_DEDUP_LOGS*": "the operator needs every rank's log lines unmerged",
    "RAY_LOG_TO_*": "the operator reads every rank's log lines from the job's log",
    "RAY_LOGGING_*": "the operator reads every rank's log lines in Ray's plain format",
    "RAY_TRAIN_ENABLE_PRINT_PATCH": "the operator needs every rank's log lines printed once",
    "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "the operator sets it so that progress reports are not delayed",
    "PYTHONUNBUFFERED": "the operator needs the ranks' events unbuffered",
    "PYTHONIOENCODING": "the ranks' event lines must reach the log as ASCII (another encoding garbles them)",
    "PYTHONUTF8": "the ranks' event lines must reach the log as ASCII (another encoding garbles them)",
    "FSDP_EVENT_KEY": "the operator hands each attempt its own event-signing key",
    "LD_PRELOAD": "it would replace the libraries NCCL and the transport check rely on",
    "LD_AUDIT": "it would replace the libraries NCCL and the transport check rely on",
    "RAY_AUTH_*": "the operator sets Ray's token authentication (the chart's rayTokenAuth), the token per job",
    "POD_NAME": "the operator sets it from the downward API for the placement report",
    "NODE_NAME": "the operator sets it from the downward API for the placement report",
}


# What spec.network.env is for: the collective-communication stack of the ranks (NCCL and its plugins,
# libfabric, the RDMA verbs, gloo, CUDA settings NCCL reads). Compared in upper case.
TRANSPORT_ENV_PREFIXES = ("NCCL_", "TORCH_NCCL_", "FI_", "OFI_NCCL_", "RDMAV_", "IBV_", "MLX5_", "UCX_", "GLOO_",
                          "TP_", "NVSHMEM_", "CUDA_")  # fmt: skip


def operator_owned(name: str) -> str | None:
    """Why `name` is the operator's to set (and what to use instead), or None when the user may set it.

    Compared in upper case and without surrounding white space: `nccl_debug` is not NCCL's variable, but a
    spec that spells it so means it, and refusing it costs nothing.
    """
    name = name.strip().upper()
    for pattern, why in OPERATOR_ENV.items():
        if name == pattern or (pattern.endswith("*") and name.startswith(pattern[:-1])):
            return why
    return None


# --- declarations: pieces of a PodSpec ----------------------------------------------------------------


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


# --- declarations: the spec -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Model:
    """The model to fine-tune."""

    name: str = declare(
        "Hugging Face model id or a path inside the image.",
        default=schema.DEFAULT_MODEL,
        grammar=formats.MODEL_NAME,
        train="model",
    )
    init: Literal["pretrained", "random"] = declare(
        "pretrained: load the weights; random: build the architecture from its config with random weights "
        "(no download).",
        default="pretrained",
        train="model_init",
    )
    overrides: dict[str, Any] = declare(
        "Model config overrides, e.g. a tiny model for a CPU run: only the config fields of the model's family, "
        "in their types (the table in docs/api.md, 'Model config overrides').",
        factory=dict,
        keys=formats.CONFIG_KEY,
        max_items=64,
        train="model_overrides",
    )

    @staticmethod
    def _rules(v: dict[str, Any], path: str, problems: Problems) -> None:
        # The overrides become keyword arguments of the Hugging Face config: anything else there is a loader
        # option (trust_remote_code, token) or an attribute, so only the family's typed config fields pass.
        v["overrides"] = model_configs.check_overrides(v["name"], v["overrides"], f"{path}.overrides", problems)


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
        "EC2 instance type the workers run on; becomes a node.kubernetes.io/instance-type selector. "
        "Empty: no selector.",
        default="g6.12xlarge",
        grammar=formats.LABEL_VALUE,
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
        "Size of the memory-backed /dev/shm for NCCL and dataloaders; at most memory (it is counted in it).",
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
class Checkpoint:
    """Distributed checkpoints (torch.distributed.checkpoint); resumed from on restart."""

    storage: str = declare(
        "Where to write checkpoints: s3://BUCKET/prefix, gs://BUCKET/prefix, file:///path or an absolute path. "
        "Empty: none.",
        default="",
        grammar=formats.STORAGE_URI,
        train="checkpoint_path",
    )
    interval_steps: int = declare(
        "Steps between checkpoints; 0: only at the end.",
        default=0,
        minimum=0,
        maximum=MAX_STEPS,
        train="checkpoint_interval",
    )


@dataclass(frozen=True, slots=True)
class Data:
    """What to train on: random tokens, or the documents of a data source, tokenized and packed into seqLen."""

    source: str = declare(
        "random: uniform random token ids (smoke tests, benchmarks). Else a file, directory or prefix: s3://, "
        "gs://, file://, an absolute path (a PVC mounted in the image) or hf://datasets/OWNER/NAME. Unreadable or "
        "empty: the job fails with reason DataUnavailable.",
        default="random",
        grammar=formats.DATA_SOURCE,
        train="data",
    )
    format: Literal["jsonl", "parquet", "text", ""] = declare(
        "jsonl, parquet or text (one document per non-empty line). Empty: from the file extension.",
        default="",
        train="data_format",
    )
    field: str = declare(
        "The column holding each document's text (kind text) or its list of {role, content} messages (kind chat).",
        default="text",
        max_length=256,
        train="data_field",
    )
    kind: Literal["text", "chat"] = declare(
        "text: causal LM over packed documents. chat: each row is a conversation, rendered with the tokenizer's "
        "chat template; the loss is on the assistant turns only.",
        default="text",
        train="data_kind",
    )
    tokenizer: str = declare(
        "Hugging Face tokenizer id or directory (s3:// or a path). Empty: the model's own.",
        default="",
        grammar=formats.or_empty(formats.MODEL_NAME),
        train="tokenizer",
    )
    validation_split: float = declare(
        "Fraction of the documents held out for evaluation (chosen with shuffleSeed). 0: none.",
        default=0.0,
        minimum=0,
        maximum=0.5,
        train="validation_split",
    )
    validation_source: str = declare(
        "A second source evaluated instead of a split (same format, field and kind). Empty: none.",
        default="",
        grammar=formats.or_empty(formats.DATA_SOURCE),
        train="validation_data",
    )
    eval_every_steps: int = declare(
        "Evaluate on the validation data (validationSplit or validationSource, one of which it needs) every N "
        "steps, and after the last; 0: after the last step only.",
        default=0,
        minimum=0,
        maximum=MAX_STEPS,
        train="eval_every_steps",
    )
    document_mask: bool = declare(
        "Restart position ids at every document of a packed sequence, so attention stays inside each document "
        "(variable-length flash attention over the document bounds on GPUs, no dense mask: docs/data.md). false: "
        "attention "
        "spans the documents of a sequence, plain causal.",
        default=True,
        train="document_mask",
    )
    shuffle_seed: int = declare(
        "Seed of the order of the packed sequences in each epoch (and of validationSplit).",
        default=0,
        minimum=0,
        maximum=2**32 - 1,
        train="shuffle_seed",
    )
    epochs: int = declare(
        "Passes over the data: training stops after training.steps or after this many epochs, whichever comes "
        "first. 0: no limit (the data repeats, reshuffled).",
        default=0,
        minimum=0,
        maximum=1_000_000,
        train="epochs",
    )


@dataclass(frozen=True, slots=True)
class Output:
    """The trained model, written as a Hugging Face directory (config, safetensors, tokenizer, generation config)."""

    storage: str = declare(
        "Where to write it: s3://BUCKET/prefix, gs://BUCKET/prefix, file:///path or an absolute path. Its path "
        "goes into status.output. Empty: no export (the DCP checkpoints are for resuming only).",
        default="",
        grammar=formats.STORAGE_URI,
        train="output_path",
    )
    every_checkpoint: bool = declare(
        "Also export at each checkpoint, into <storage>/step_NNNNNNNN.", default=False, train="export_every_checkpoint"
    )


@dataclass(frozen=True, slots=True)
class Training:
    """The bundled FSDP training function's parameters."""

    steps: int = declare("Optimizer steps to run.", default=100, minimum=1, maximum=MAX_STEPS, train="steps")
    seq_len: int = declare("Tokens per sequence.", default=2048, minimum=8, maximum=1_048_576, train="seq_len")
    batch_size_per_rank: int = declare(
        "Sequences per rank per micro-batch.", default=1, minimum=1, maximum=65_536, train="batch_size_per_rank"
    )
    gradient_accumulation: int = declare(
        "Micro-batches per optimizer step.", default=1, minimum=1, maximum=65_536, train="grad_accum"
    )
    learning_rate: float = declare(
        "Peak learning rate (AdamW).",
        default=2e-5,
        minimum=0,
        exclusive_minimum=True,
        maximum=1,
        train="learning_rate",
    )
    lr_schedule: Literal["constant", "cosine"] = declare(
        "Learning-rate schedule.", default="constant", train="lr_schedule"
    )
    warmup_steps: int = declare(
        "Linear warm-up steps; fewer than steps.", default=0, minimum=0, maximum=MAX_STEPS, train="warmup_steps"
    )
    sharding: Sharding = declare(
        "full: shard over all ranks; hybrid: shard inside a node, replicate across nodes (HSDP); auto: hybrid when "
        "there is more than one node and the probe's cross-node all-reduce bus bandwidth is below 25 GB/s (any EFA "
        "or TCP link between nodes), else full.",
        default="auto",
        train="sharding",
    )
    mixed_precision: Literal["bf16", "fp32"] = declare(
        "bf16: bf16 compute, fp32 master weights and gradient reduction; fp32: no mixed precision.",
        default="bf16",
        train="mixed_precision",
    )
    activation_checkpointing: bool = declare(
        "Recompute activations in backward to save memory.", default=False, train="activation_checkpointing"
    )
    compile: bool = declare(
        "torch.compile each decoder block (fuses norms, rotary and SwiGLU: +26 % on H200). Set false for CPU runs.",
        default=True,
        train="compile",
    )
    reshard_after_forward: bool = declare(
        "Free each block's gathered weights after forward and gather them again in backward. false keeps them "
        "(one bf16 copy of the model per rank) and saves that all-gather: faster when memory allows (models up to "
        "~3B on a 24 GB L4).",
        default=True,
        train="reshard_after_forward",
    )
    loss_chunk_tokens: int = declare(
        "Compute the lm_head and cross-entropy this many tokens at a time, never materializing the full fp32 "
        "logits over the vocabulary; 0 uses the model's own loss.",
        default=4096,
        minimum=0,
        maximum=16_777_216,
        train="loss_chunk_tokens",
    )
    precision: Literal["bf16", "fp8", "auto"] = declare(
        "Matmul precision of the decoder blocks' linear layers. bf16; fp8: torchao float8 training, for GPUs with "
        "fp8 tensor cores (L4, L40S, H100, H200; on H200 1.13x bf16 tokens/s for Qwen2.5-1.5B, 1.26x for a "
        "7B-shaped model); auto: fp8 where it was measured to win (H100 or H200 and a hidden size of 3584 or "
        "more), else bf16.",
        default="bf16",
        train="precision",
    )
    compile_cache_dir: str = declare(
        "Absolute path of a directory every run of the job can reach (a shared volume) for the compile caches "
        "(Inductor, Triton, and Python's bytecode of what the training function imports): a restart or a second "
        "run reuses the compiled kernels and modules. Empty: each process compiles.",
        default="",
        grammar=formats.or_empty(formats.ABSOLUTE_PATH),
        train="compile_cache_dir",
    )
    seed: int = declare("Random seed for weights and data.", default=0, minimum=0, maximum=2**32 - 1, train="seed")
    probe_size_bytes: int = declare(
        "Buffer size of the collective bandwidth probe before training; 0 skips it.",
        default=64 * 1024 * 1024,
        minimum=0,
        maximum=16 * 2**30,
        train="probe_size_bytes",
    )
    checkpoint: Checkpoint = declare(Checkpoint.__doc__ or "", factory=Checkpoint)


@dataclass(frozen=True, slots=True)
class RuntimeEnv:
    """Additions to the Ray job's runtime environment."""

    pip: list[str] = declare(
        "Extra pip requirements for the job, one requirement specifier each (PEP 508, no pip options).",
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

    backoff_limit: int = declare("Failed attempts to retry with a new submission.", default=0, minimum=0, maximum=100)
    max_worker_restarts: int = declare(
        "Restarts of the worker group within one attempt (a lost worker node, a crashed rank) before the attempt "
        "fails; training resumes from the latest checkpoint. -1: no limit.",
        default=0,
        minimum=-1,
        maximum=100,
    )
    active_deadline_seconds: int | None = declare(
        "Fail the job after this long from its start. Unset: no deadline.", minimum=1, maximum=INT32_MAX
    )
    wait_for_workers_timeout_seconds: int = declare(
        "Fail when not every worker has joined within this long.", default=900, minimum=1, maximum=INT32_MAX
    )
    ttl_seconds_after_finished: int | None = declare(
        "Delete the FSDPTrainingJob this long after it finished. Unset: keep it.", minimum=0, maximum=INT32_MAX
    )
    cleanup: Cleanup = declare(
        "What to do with the RayCluster when the job finishes: Delete it, or Keep it for debugging.", default="Delete"
    )
    suspend: bool = declare("Stop the Ray job and delete the RayCluster; false resumes.", default=False)


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
        "training ranks on the workers ({name, value} or {name, valueFrom: {secretKeyRef: {name, key}}}). Set in "
        "the head and worker containers, so a Secret's value is read by the kubelet and never reaches the "
        "operator or Ray's job API.",
        factory=list,
        shape=EnvVar,
        max_items=128,
    )
    runtime_env: RuntimeEnv = declare(RuntimeEnv.__doc__ or "", factory=RuntimeEnv)
    run_policy: RunPolicy = declare(RunPolicy.__doc__ or "", factory=RunPolicy)

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
        zone, chosen = s["placement"]["availability_zone"], w["node_selector"].get(ZONE_LABEL)
        if zone and chosen is not None and chosen != zone:
            problems.append(
                f"{path}.workers.nodeSelector.{ZONE_LABEL}: {show(chosen)} contradicts "
                f"{path}.placement.availabilityZone ({zone}); choose the zone with placement.availabilityZone"
            )
        for group in ("head", "workers"):
            _refuse_control_plane(s[group], f"{path}.{group}", problems)
        _env_rules(s, path, problems)


# The taints and labels of control-plane nodes (kubeadm's and older clusters'): a job runs arbitrary code,
# as root in the DLC, and has no business next to the API server and etcd (docs/security.md).
CONTROL_PLANE_KEYS = ("node-role.kubernetes.io/control-plane", "node-role.kubernetes.io/master")


def _refuse_control_plane(group: dict[str, Any], path: str, problems: Problems) -> None:
    for key in group["node_selector"]:
        if key in CONTROL_PLANE_KEYS:
            problems.append(f"{path}.nodeSelector.{key}: job pods may not be placed on control-plane nodes")
    for i, toleration in enumerate(group["tolerations"]):
        key, operator = toleration.get("key", ""), toleration.get("operator", "") or "Equal"
        if key in CONTROL_PLANE_KEYS:
            problems.append(f"{path}.tolerations[{i}].key: job pods may not tolerate the control-plane taint {key}")
        elif not key and operator == "Exists":
            problems.append(
                f"{path}.tolerations[{i}]: an empty key with operator Exists tolerates every taint, the "
                "control-plane taints included; name the taints to tolerate"
            )


def _env_rules(s: dict[str, Any], path: str, problems: Problems) -> None:
    """Each variable in its one place: spec.env for every Ray process, network.env for the transport only."""
    everywhere: set[str] = set()
    for i, env in enumerate(s["env"]):
        name = env["name"]
        _refuse_operator_env(name, f"{path}.env[{i}].name", problems)
        if name in everywhere:
            problems.append(f"{path}.env[{i}].name: {name} is set twice")
        everywhere.add(name)
    for i, env in enumerate(s["network"]["env"]):
        name, where = env["name"], f"{path}.network.env[{i}].name"
        if _refuse_operator_env(name, where, problems):
            continue
        if not name.upper().startswith(TRANSPORT_ENV_PREFIXES):
            # The job's driver runs on the head and reads the data there: a storage endpoint, a token or a
            # proxy set only on the workers fails in the driver (`Could not resolve host`).
            problems.append(
                f"{where}: {name} is not a transport variable (NCCL_*, FI_*, ...), and network.env reaches the "
                f"workers only; use {path}.env, which reaches every Ray process (the job's driver on the head too)"
            )
        elif name in everywhere:
            problems.append(f"{where}: {name} is also set in {path}.env; set it in one place")
    for name in s["runtime_env"]["env_vars"]:
        where = f"{path}.runtimeEnv.envVars.{show_key(name)}"
        if not _refuse_operator_env(name, where, problems) and name in everywhere:
            problems.append(f"{where}: {name} is also set in {path}.env; set it in one place (spec.env)")


def _refuse_operator_env(name: str, path: str, problems: Problems) -> bool:
    why = operator_owned(name)
    if why is not None:
        problems.append(f"{path}: {name} is set by the operator (transport verification, log collection); {why}")
    return why is not None


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
        values = fields.parse(Spec, raw_spec, "spec", problems)
        if values is not None:
            spec = fields.build(Spec, values)
            _check_train_config(spec, problems)
    if problems or meta is None or spec is None:
        raise SpecError(problems)
    return Job(
        name=meta["name"],
        namespace=meta["namespace"] or "default",
        uid=meta["uid"],
        generation=meta["generation"],
        spec=spec,
        labels=dict(meta["labels"]),
    )


# TrainConfig fields no spec field sets (yet); a declared field with the same `train=` name wins.
TRAIN_CONSTANTS: dict[str, Any] = {}


def train_config(spec: Spec) -> TrainConfig:
    """The training function's config for `spec` (each field declared with `train=` becomes the named
    TrainConfig field); ConfigError when the training function would refuse it."""
    return TrainConfig.from_dict({**TRAIN_CONSTANTS, **fields.gather(Spec, spec, lambda meta: meta.train)})


def _train_paths() -> dict[str, str]:
    return {d.meta.train: f"spec.{path}" for path, d in fields.leaves(Spec) if d.meta.train}


def _check_train_config(spec: Spec, problems: Problems) -> None:
    try:
        config = train_config(spec)
    except ConfigError as e:
        paths = _train_paths()
        detail = re.sub(r"training\.([a-z_]+)", lambda m: paths.get(m.group(1), m.group(0)), e.detail)
        problems.append(f"{paths.get(e.field, 'spec.training')}: {detail}")
        return
    _check_command_line(spec, config.to_dict(), problems)


# Linux refuses to start a process when one of its arguments or environment strings is longer than
# MAX_ARG_STRLEN (32 pages: 131072 bytes, the closing NUL included; execve(2), "Limits on size of arguments and
# environment"), and when all of them together pass a quarter of the stack limit (2 MiB with the usual 8 MiB).
# Ray runs the entrypoint as `/bin/sh -c ENTRYPOINT`: the training config travels in that one argument
# (render.submission), the runtime environment's variables in the environment.
MAX_ARG_STRLEN = 131072
ENTRYPOINT_OVERHEAD = 8192
"""What the entrypoint holds besides the training config (the command, Ray Train's scaling, the job name and
checkpoint storage, each shell-quoted): room kept for it below MAX_ARG_STRLEN."""
ENVIRONMENT_BUDGET = 1024 * 1024
"""The part of execve's 2 MiB the job's own variables and entrypoint may take (Ray, the image and Kubernetes
set variables of their own)."""


def command_line_bytes(value: Any) -> int:
    """Bytes `value` takes as JSON in the entrypoint, shell-quoted as render.submission quotes it."""
    return len(shlex.quote(json.dumps(value, separators=(",", ":"), sort_keys=True)).encode())


def _check_command_line(spec: Spec, config: dict[str, Any], problems: Problems) -> None:
    size = command_line_bytes(config)
    limit = MAX_ARG_STRLEN - 1 - ENTRYPOINT_OVERHEAD
    if size > limit:
        paths = _train_paths()
        largest = max(config, key=lambda name: command_line_bytes(config[name]))
        problems.append(
            f"{paths.get(largest, 'spec.training')}: the training config would be a {size}-byte command-line "
            f"argument, and Linux starts no process with one over {MAX_ARG_STRLEN} bytes (the entrypoint keeps "
            f"{limit} for it); this field takes {command_line_bytes(config[largest])}: shorten it"
        )
        return
    environment = sum(len(f"{name}={value}".encode()) + 1 for name, value in spec.runtime_env.env_vars.items())
    if environment + size > ENVIRONMENT_BUDGET:
        problems.append(
            f"spec.runtimeEnv.envVars: {environment} bytes of environment next to a {size}-byte training config; "
            f"the job's own may take {ENVIRONMENT_BUDGET} bytes of the 2 MiB Linux allows a process for both"
        )
