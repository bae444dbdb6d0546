"""The FSDPTrainingJob CRD, built in code: the one source of `crds/fsdptrainingjob.yaml` and the chart's copy.

`spec.py` reads the same schema to apply defaults and check fields, so the API server and
`fsdpctl validate` can never disagree about a default or an enum.
"""

from __future__ import annotations

from typing import Any

from fsdp_train.events import MAX_TEXT, TEXT_LIMITS

GROUP = "fsdp.dev"
VERSION = "v1alpha1"
KIND = "FSDPTrainingJob"
PLURAL = "fsdptrainingjobs"
SINGULAR = "fsdptrainingjob"
SHORT_NAMES = ["trainingjob", "trainingjobs", "ftj"]
API_VERSION = f"{GROUP}/{VERSION}"

DEFAULT_IMAGE = "public.ecr.aws/deep-learning-containers/ray:train-ml-cuda-v1.1"
DEFAULT_RAY_VERSION = "2.58.0"
DEFAULT_MODEL = "Qwen/Qwen2.5-1.5B"

Schema = dict[str, Any]


def _field(kind: str, description: str, **extra: Any) -> Schema:
    return {"type": kind, "description": description, **{k: v for k, v in extra.items() if v is not None}}


def string(
    description: str,
    *,
    default: str | None = None,
    enum: list[str] | None = None,
    pattern: str | None = None,
    max_length: int | None = None,
) -> Schema:
    return _field("string", description, default=default, enum=enum, pattern=pattern, maxLength=max_length)


def integer(
    description: str, *, default: int | None = None, minimum: int | None = None, maximum: int | None = None
) -> Schema:
    return _field("integer", description, default=default, minimum=minimum, maximum=maximum)


def number(
    description: str,
    *,
    default: float | None = None,
    minimum: float | None = None,
    exclusive_minimum: bool | None = None,
) -> Schema:
    return _field("number", description, default=default, minimum=minimum, exclusiveMinimum=exclusive_minimum)


def boolean(description: str, *, default: bool | None = None) -> Schema:
    return _field("boolean", description, default=default)


def obj(description: str, properties: dict[str, Schema], *, required: list[str] | None = None) -> Schema:
    # `default: {}` lets the API server descend and fill nested defaults when a group is omitted.
    return _field("object", description, properties=properties, required=required, default={})


def string_map(description: str) -> Schema:
    return _field("object", description, additionalProperties={"type": "string"})


def quantity(description: str, *, default: str) -> Schema:
    # Kubernetes' own int-or-string quantity; spec.py parses it and names the field when it does not.
    return {
        "description": description,
        "default": default,
        "x-kubernetes-int-or-string": True,
        "anyOf": [{"type": "integer"}, {"type": "string"}],
    }


def free_list(description: str) -> Schema:
    # Passed through to the pod spec verbatim (Kubernetes validates it there).
    return {
        "type": "array",
        "description": description,
        "items": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
    }


TOLERATIONS = free_list("Tolerations for these pods, as in a PodSpec.")

SPEC_SCHEMA: Schema = obj(
    "What to train and on what. Every field has a default that reproduces the reference setup.",
    {
        "image": string(
            "Container image for head and workers, used unmodified (the Ray Train DLC).",
            default=DEFAULT_IMAGE,
        ),
        "imagePullPolicy": string(
            "Image pull policy for head and workers.",
            default="IfNotPresent",
            enum=["Always", "IfNotPresent", "Never"],
        ),
        "rayVersion": string("Ray version inside the image (KubeRay's spec.rayVersion).", default=DEFAULT_RAY_VERSION),
        "model": obj(
            "The model to fine-tune.",
            {
                "name": string("Hugging Face model id or a path inside the image.", default=DEFAULT_MODEL),
                "init": string(
                    "pretrained: load the weights; random: build the architecture from its config with random "
                    "weights (no download).",
                    default="pretrained",
                    enum=["pretrained", "random"],
                ),
                "overrides": _field(
                    "object",
                    "Model config overrides (Hugging Face config keys), e.g. a tiny model for a CPU run.",
                    additionalProperties={
                        "x-kubernetes-int-or-string": True,
                        "anyOf": [{"type": "integer"}, {"type": "string"}],
                    },
                ),
            },
        ),
        "head": obj(
            "The Ray head pod. It schedules work and serves the job API; it gets no GPU.",
            {
                "cpu": quantity("CPU for the head container (request = limit).", default="2"),
                "memory": quantity("Memory for the head container (request = limit).", default="8Gi"),
                "nodeSelector": string_map("Node labels the head must run on."),
                "tolerations": TOLERATIONS,
            },
        ),
        "workers": obj(
            "The GPU worker pods: one Ray node each, one training rank per GPU.",
            {
                "replicas": integer("Number of worker pods (Ray nodes).", default=2, minimum=1, maximum=512),
                "instanceType": string(
                    "EC2 instance type the workers run on; becomes a node.kubernetes.io/instance-type selector. "
                    "Empty: no selector.",
                    default="g6.12xlarge",
                ),
                "gpusPerWorker": integer("GPUs per worker pod (nvidia.com/gpu).", default=4, minimum=0),
                "efaPerWorker": integer("EFA interfaces per worker pod (vpc.amazonaws.com/efa).", default=1, minimum=0),
                "ranksPerWorker": integer(
                    "Training ranks per worker pod. Defaults to gpusPerWorker; required when gpusPerWorker is 0 "
                    "(CPU training).",
                    minimum=1,
                ),
                "cpu": quantity("CPU per worker container (request = limit).", default="40"),
                "memory": quantity("Memory per worker container (request = limit).", default="160Gi"),
                "sharedMemory": quantity(
                    "Size of the memory-backed /dev/shm for NCCL and dataloaders.", default="32Gi"
                ),
                "nodeSelector": string_map("Extra node labels the workers must run on."),
                "tolerations": TOLERATIONS,
            },
        ),
        "network": obj(
            "How ranks talk to each other, and what the operator verifies about it.",
            {
                "transport": string(
                    "efa: request EFA and expect NCCL to use it; socket: plain TCP; auto: request EFA when the "
                    "instance type has it, accept whatever NCCL picks.",
                    default="efa",
                    enum=["efa", "socket", "auto"],
                ),
                "requireEFA": boolean(
                    "Fail the job as soon as any rank reports that NCCL did not use EFA. Defaults to true when "
                    "transport is efa."
                ),
                "failFast": boolean(
                    "Also set NCCL_NET=Libfabric so NCCL refuses to start without EFA (single-node debug runs "
                    "then fail too).",
                    default=False,
                ),
                "socketIfname": string("NCCL_SOCKET_IFNAME for bootstrap and socket traffic.", default="eth0"),
                "ncclDebug": string(
                    "NCCL_DEBUG level; INFO is what transport verification reads.",
                    default="INFO",
                    enum=["VERSION", "WARN", "INFO", "TRACE"],
                ),
                "minCrossNodeBandwidthGBps": number(
                    "Cross-node all-reduce bus bandwidth (GB/s) below which InterconnectHealthy is False. "
                    "Default: from the instance type's network (g6.12xlarge: 5).",
                    minimum=0,
                ),
                "env": free_list("Extra environment variables for the workers ({name, value})."),
            },
        ),
        "training": obj(
            "The bundled FSDP training function's parameters.",
            {
                "steps": integer("Optimizer steps to run.", default=100, minimum=1),
                "seqLen": integer("Tokens per sequence.", default=2048, minimum=8),
                "batchSizePerRank": integer("Sequences per rank per micro-batch.", default=1, minimum=1),
                "gradientAccumulation": integer("Micro-batches per optimizer step.", default=1, minimum=1),
                "learningRate": number("Peak learning rate (AdamW).", default=2e-5, minimum=0, exclusive_minimum=True),
                "lrSchedule": string("Learning-rate schedule.", default="constant", enum=["constant", "cosine"]),
                "warmupSteps": integer("Linear warm-up steps.", default=0, minimum=0),
                "sharding": string(
                    "full: shard over all ranks; hybrid: shard inside a node, replicate across nodes (HSDP); "
                    "auto: hybrid when there is more than one node and the probe's cross-node all-reduce bus "
                    "bandwidth is below 25 GB/s (any EFA or TCP link between nodes), else full.",
                    default="auto",
                    enum=["full", "hybrid", "auto"],
                ),
                "mixedPrecision": string(
                    "bf16: bf16 compute, fp32 master weights and gradient reduction; fp32: no mixed precision.",
                    default="bf16",
                    enum=["bf16", "fp32"],
                ),
                "activationCheckpointing": boolean("Recompute activations in backward to save memory.", default=False),
                "compile": boolean(
                    "torch.compile each decoder block (fuses norms, rotary and SwiGLU: +26 % on H200). "
                    "Set false for CPU runs.",
                    default=True,
                ),
                "reshardAfterForward": boolean(
                    "Free each block's gathered weights after forward and gather them again in backward. false "
                    "keeps them (one bf16 copy of the model per rank) and saves that all-gather: faster when "
                    "memory allows (models up to ~3B on a 24 GB L4).",
                    default=True,
                ),
                "lossChunkTokens": integer(
                    "Compute the lm_head and cross-entropy this many tokens at a time, never materializing the "
                    "full fp32 logits over the vocabulary; 0 uses the model's own loss.",
                    default=4096,
                    minimum=0,
                ),
                "seed": integer("Random seed for weights and data.", default=0, minimum=0),
                "probeSizeBytes": integer(
                    "Buffer size of the collective bandwidth probe before training; 0 skips it.",
                    default=64 * 1024 * 1024,
                    minimum=0,
                ),
                "checkpoint": obj(
                    "Distributed checkpoints (torch.distributed.checkpoint); resumed from on restart.",
                    {
                        "storage": string(
                            "Where to write checkpoints: s3://, gs://, file:// or an absolute path. Empty: none.",
                            default="",
                        ),
                        "intervalSteps": integer(
                            "Steps between checkpoints; 0: only at the end.", default=0, minimum=0
                        ),
                    },
                ),
            },
        ),
        "runtimeEnv": obj(
            "Additions to the Ray job's runtime environment.",
            {
                "pip": {
                    "type": "array",
                    "description": "Extra pip requirements for the job.",
                    "items": {"type": "string"},
                },
                "envVars": string_map("Extra environment variables for every training process."),
            },
        ),
        "runPolicy": obj(
            "Deadlines, retries, suspension and cleanup.",
            {
                "backoffLimit": integer("Failed attempts to retry with a new submission.", default=0, minimum=0),
                "activeDeadlineSeconds": integer(
                    "Fail the job after this long from its start. Unset: no deadline.", minimum=1
                ),
                "waitForWorkersTimeoutSeconds": integer(
                    "Fail when not every worker has joined within this long.", default=900, minimum=1
                ),
                "ttlSecondsAfterFinished": integer(
                    "Delete the FSDPTrainingJob this long after it finished. Unset: keep it.", minimum=0
                ),
                "cleanup": string(
                    "What to do with the RayCluster when the job finishes: Delete it, or Keep it for debugging.",
                    default="Delete",
                    enum=["Delete", "Keep"],
                ),
                "suspend": boolean("Stop the Ray job and delete the RayCluster; false resumes.", default=False),
            },
        ),
    },
)

MESSAGE_LIMIT = 2048
"""Characters of `status.message` and of each condition's message the operator writes at most."""

CONDITION_SCHEMA: Schema = {
    "type": "object",
    "required": ["type", "status"],
    "properties": {
        "type": {"type": "string"},
        "status": {"type": "string", "enum": ["True", "False", "Unknown"]},
        "reason": {"type": "string"},
        "message": {"type": "string", "maxLength": MESSAGE_LIMIT},
        "lastTransitionTime": {"type": "string", "format": "date-time"},
        "observedGeneration": {"type": "integer"},
    },
}


def _text(field: str, description: str = "") -> Schema:
    """A string read back from the job log: as long as the event parser lets it be, no longer."""
    return {
        "type": "string",
        "maxLength": TEXT_LIMITS.get(field, MAX_TEXT),
        **({"description": description} if description else {}),
    }


_INT: Schema = {"type": "integer"}

# Fields written from what the ranks print (their bounds are the event parser's, `fsdp_train.events`).
RANK_SCHEMA: Schema = {
    "type": "object",
    "properties": {
        "rank": _INT,
        "localRank": _INT,
        "nodeRank": _INT,
        "nodeIP": _text("node_ip"),
        "pod": _text("pod"),
        "hostname": _text("hostname"),
        "device": _text("device"),
        "deviceUUID": _text("device_uuid"),
        "transport": _text("transport"),
    },
}
TRANSPORT_SCHEMA: Schema = {
    "type": "object",
    "description": "Which network transport NCCL used, per rank, read from each rank's NCCL log.",
    "properties": {
        "requested": {"type": "string"},
        "summary": {"type": "string"},
        "evidence": _text("evidence", "The NCCL log line that decided the verdict."),
        "fallbackRanks": {"type": "array", "items": _INT},
        "ranks": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "rank": _INT,
                    "transport": _text("transport"),
                    "plugin": _text("plugin"),
                    "provider": _text("provider"),
                    "evidence": _text("evidence"),
                },
            },
        },
    },
}

STATUS_SCHEMA: Schema = {
    "type": "object",
    "description": "What the operator observed. Written by the operator only.",
    "x-kubernetes-preserve-unknown-fields": True,
    "properties": {
        "phase": {"type": "string", "description": "Lifecycle phase."},
        "reason": {"type": "string", "description": "Why the job is in this phase (closed set)."},
        "message": {"type": "string", "description": "Human-readable detail.", "maxLength": MESSAGE_LIMIT},
        "workers": {"type": "string", "description": "Ready/desired worker pods, e.g. 2/2."},
        "rayClusterName": {"type": "string"},
        "submissionId": {"type": "string"},
        "attempts": {"type": "integer"},
        "observedGeneration": {"type": "integer"},
        "startTime": {"type": "string", "format": "date-time"},
        "endTime": {"type": "string", "format": "date-time"},
        "conditions": {"type": "array", "items": CONDITION_SCHEMA},
        "logOffset": {"type": "integer", "description": "Characters of the Ray job log read so far."},
        "skippedEvents": {
            "type": "integer",
            "description": "Event lines skipped: malformed, over-long, or naming a rank the job does not have.",
        },
        "truncated": {
            "type": "string",
            "description": "What was left out of this status to keep it within its size budget (absent: nothing).",
        },
        "ranks": {"type": "array", "description": "Where each rank ran.", "items": RANK_SCHEMA},
        "transport": TRANSPORT_SCHEMA,
        "checkpoint": {
            "type": "object",
            "properties": {"step": _INT, "path": _text("path"), "seconds": {"type": "number", "nullable": True}},
        },
        "rankFailures": {
            "type": "array",
            "maxItems": 16,
            "description": "The last failures the ranks reported.",
            "items": {"type": "object", "properties": {"rank": _INT, "message": _text("message")}},
        },
    },
}

PRINTER_COLUMNS: list[Schema] = [
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
    {
        "name": "Workers",
        "type": "string",
        "jsonPath": ".status.workers",
        "description": "ready/desired worker pods",
    },
    {"name": "Transport", "type": "string", "jsonPath": ".status.transport.summary"},
    {"name": "Step", "type": "string", "jsonPath": ".status.progress.stepOfTotal"},
    {"name": "Tokens/s", "type": "integer", "jsonPath": ".status.progress.tokensPerSecond"},
    {"name": "Reason", "type": "string", "jsonPath": ".status.reason", "priority": 1},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


def crd() -> Schema:
    """The CustomResourceDefinition manifest."""
    spec_schema = dict(SPEC_SCHEMA)
    spec_schema.pop("default")
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PLURAL}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": SINGULAR,
                "shortNames": SHORT_NAMES,
                "categories": ["all", "ray"],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "description": "An FSDP training run on a KubeRay RayCluster.",
                            "properties": {
                                "apiVersion": {"type": "string"},
                                "kind": {"type": "string"},
                                "metadata": {"type": "object"},
                                "spec": spec_schema,
                                "status": STATUS_SCHEMA,
                            },
                            "required": ["spec"],
                        }
                    },
                }
            ],
        },
    }
