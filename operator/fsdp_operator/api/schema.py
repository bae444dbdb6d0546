"""The FSDPTrainingJob's names (group, version, kind), defaults, and the schema of its status.

`generate.py` builds the CRD from these and from the field declarations in `spec.py`, the same ones
the parser uses, so the API server and `fsdpctl validate` can never disagree about a default, an enum
or a bound.
"""

from __future__ import annotations

from typing import Any

from fsdp_train.contract.events import MAX_TEXT, TEXT_LIMITS

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


MESSAGE_LIMIT = 2048
"""Characters of `status.message` and of each condition's message the operator writes at most."""

CONDITION_SCHEMA: Schema = {
    "type": "object",
    "required": ["type", "status"],
    "properties": {
        "type": {
            "type": "string",
            "description": "Condition type; docs/api.md (Conditions) lists every type the operator writes and when "
            "it is True.",
        },
        "status": {"type": "string", "enum": ["True", "False", "Unknown"], "description": "True, False or Unknown."},
        "reason": {"type": "string", "description": "Why, in one CamelCase word."},
        "message": {"type": "string", "description": "Human-readable detail.", "maxLength": MESSAGE_LIMIT},
        "lastTransitionTime": {
            "type": "string",
            "format": "date-time",
            "description": "When status last changed.",
        },
        "observedGeneration": {"type": "integer", "description": "The spec generation this condition is about."},
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

# Fields written from what the ranks print (their bounds are the event parser's, `fsdp_train.contract.events`).
RANK_SCHEMA: Schema = {
    "type": "object",
    "x-kubernetes-preserve-unknown-fields": True,
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
    "x-kubernetes-preserve-unknown-fields": True,
    "description": "Which transport NCCL really used, per rank and in summary, read from each rank's NCCL log.",
    "properties": {
        "requested": {"type": "string"},
        "summary": {"type": "string"},
        "evidence": _text("evidence", "The NCCL log line that decided the verdict."),
        "fallbackRanks": {"type": "array", "items": _INT},
        "ranks": {
            "type": "array",
            "items": {
                "type": "object",
                "x-kubernetes-preserve-unknown-fields": True,
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


def _free(kind: str, description: str) -> Schema:
    """A status field whose inner shape the operator writes freely (documented in docs/operations.md)."""
    if kind == "array":
        return {
            "type": "array",
            "description": description,
            "items": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
        }
    return {"type": "object", "description": description, "x-kubernetes-preserve-unknown-fields": True}


STATUS_SCHEMA: Schema = {
    "type": "object",
    "description": "What the operator observed. Written by the operator only.",
    "x-kubernetes-preserve-unknown-fields": True,
    "properties": {
        "phase": {"type": "string", "description": "Lifecycle phase."},
        "reason": {"type": "string", "description": "Why the job is in this phase (closed set)."},
        "message": {"type": "string", "description": "Human-readable detail.", "maxLength": MESSAGE_LIMIT},
        "workers": {"type": "string", "description": "Ready/desired worker pods, e.g. 2/2."},
        "rayClusterName": {"type": "string", "description": "The RayCluster this job runs on."},
        "submissionId": {"type": "string", "description": "The Ray job submission id of the current attempt."},
        "attempts": {"type": "integer", "description": "Submission ids handed out so far."},
        "failedAttempts": {
            "type": "integer",
            "description": "Attempts that failed and count against runPolicy.backoffLimit.",
        },
        "observedGeneration": {"type": "integer", "description": "The spec generation the status describes."},
        "startTime": {"type": "string", "format": "date-time", "description": "When the job started."},
        "endTime": {"type": "string", "format": "date-time", "description": "When the job finished."},
        "provisioningSince": {
            "type": "string",
            "format": "date-time",
            "description": "When the current wait for workers began.",
        },
        "rayJobStatus": {
            "type": "string",
            "description": "Ray's own job state (PENDING, RUNNING, SUCCEEDED, FAILED, STOPPED).",
        },
        "logOffset": {"type": "integer", "description": "How much of the current submission's log has been read."},
        "skippedEvents": {
            "type": "integer",
            "description": "Event lines skipped: malformed, over-long, or naming a rank the job does not have.",
        },
        "forgedEvents": {
            "type": "integer",
            "description": "Event lines refused by the signature check (not from this attempt's training function); "
            "never folded.",
        },
        "truncated": {
            "type": "string",
            "description": "What was left out of this status to keep it within its size budget (absent: nothing).",
        },
        "rayUnreachableSince": {
            "type": "string",
            "format": "date-time",
            "description": "When Ray's job API stopped answering (the operator fails the job after its timeout).",
        },
        "workerRestarts": {
            "type": "integer",
            "description": "Worker-group restarts by Ray Train in this attempt (runPolicy.maxWorkerRestarts).",
        },
        "workerGroupStartTime": {
            "type": "string",
            "format": "date-time",
            "description": "When rank 0 of the current worker group started (each restart moves it).",
        },
        "placement": {
            "type": "object",
            "description": "For placement.availabilityZone: auto, the zone the operator chose and why.",
            "properties": {
                "availabilityZone": {"type": "string", "description": "The chosen zone; empty: none (unconstrained)."},
                "reason": {"type": "string", "description": "Why this zone, or why none."},
            },
        },
        "dashboardURL": {"type": "string", "description": "Ray's dashboard and job API of the job's RayCluster."},
        "queuedSince": {
            "type": "string",
            "format": "date-time",
            "description": "queueName: when the current wait for Kueue's admission began (absent: not waiting).",
        },
        "queue": {
            "type": "object",
            "description": "queueName: where the job waits in Kueue and how long it waited (docs/kueue.md).",
            "properties": {
                "localQueue": {"type": "string", "description": "The LocalQueue the RayCluster is labelled with."},
                "workload": {"type": "string", "description": "Kueue's Workload of the current RayCluster."},
                "clusterQueue": {"type": "string", "description": "The ClusterQueue that last admitted it."},
                "queuedSeconds": {
                    "type": "integer",
                    "description": "Seconds spent waiting for admission in all, finished waits only.",
                },
                "admissions": {"type": "integer", "description": "How often Kueue admitted the job's RayCluster."},
                "preemptions": {"type": "integer", "description": "How often Kueue evicted it after admission."},
            },
        },
        "conditions": {
            "type": "array",
            "description": "Conditions, in metav1.Condition shape.",
            "items": CONDITION_SCHEMA,
        },
        "ranks": {
            "type": "array",
            "description": "Where each rank ran: rank, local rank, node rank, node IP, pod, device.",
            "items": RANK_SCHEMA,
        },
        "progress": _free(
            "object",
            "Training progress: step, total steps, loss, tokens per second, MFU, and lossHistory "
            "(at most 64 [step, loss] points spanning the run); with a data source also epoch, samplesSeen, "
            "tokensSeen, and evalLoss / evalStep of the last evaluation.",
        ),
        "transport": TRANSPORT_SCHEMA,
        "interconnect": _free("object", "Measured all-reduce and all-gather bus bandwidth against the floor."),
        "probes": _free("array", "The collective bandwidth probes, per scope."),
        "result": _free(
            "object",
            "The finished run: steps, first and final loss, tokens per second, seconds, sharding and precision used.",
        ),
        "checkpoint": {
            "type": "object",
            "description": "The last checkpoint: step, path, seconds.",
            "x-kubernetes-preserve-unknown-fields": True,
            "properties": {"step": _INT, "path": _text("path"), "seconds": {"type": "number", "nullable": True}},
        },
        "output": _free("object", "The exported Hugging Face model (spec.output): path, step, seconds."),
        "timings": _free(
            "object",
            "Time to the first optimizer step (seconds, from rank 0's process start): toFirstStepSeconds, split into "
            "startupSeconds, probeSeconds, buildSeconds (model, sharding, weights) and firstStepSeconds (compilation "
            "included); compileCache: cold or warm when spec.training.compileCacheDir is set.",
        ),
        "tracking": _free(
            "object",
            "spec.tracking: the MLflow run of the job's current generation (runId, url) and, while records do not "
            "reach the tracker, the problem (condition TrackingHealthy).",
        ),
        "failureLog": {
            "type": "string",
            "description": "The end of a failed Ray job's output (the detail behind the one-line message); "
            "fsdpctl status --logs prints it.",
            "maxLength": 4096,
        },
        "interruptions": {
            "type": "array",
            "maxItems": 16,
            "description": "Notices that a worker's node goes away (a drain, a Spot interruption, a node taint), as "
            "the ranks reported them, newest last (16 kept): the attempt, pod and node, the reason, noticeTime, the "
            "step every rank stopped after, whether the checkpoint was saved, checkpointStep (where the next attempt "
            "resumes), stepsLost, secondsToSaved (notice to checkpoint written) or secondsToDecision (a notice too "
            "short for the save), and a message. Such an attempt does not count against backoffLimit.",
            "items": {
                "type": "object",
                "x-kubernetes-preserve-unknown-fields": True,
                "properties": {
                    "attempt": _INT,
                    "pod": _text("pod"),
                    "node": _text("node"),
                    "reason": _text("reason"),
                    "noticeTime": {"type": "string", "format": "date-time"},
                    "step": _INT,
                    "saved": {"type": "boolean"},
                    "checkpointStep": _INT,
                    "stepsLost": _INT,
                    "secondsToSaved": {"type": "number"},
                    "secondsToDecision": {"type": "number"},
                    "message": _text("message"),
                },
            },
        },
        "rankFailures": {
            "type": "array",
            "maxItems": 16,
            "description": "Ranks that reported a failure, with their messages (the last 16).",
            "items": {
                "type": "object",
                "x-kubernetes-preserve-unknown-fields": True,
                "properties": {"rank": _INT, "message": _text("message")},
            },
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
    {
        "name": "Tokens/s",
        "type": "integer",
        "jsonPath": ".status.progress.tokensPerSecond",
        "description": "the last step's tokens per second, all ranks (empty: not reported)",
    },
    {"name": "Eval Loss", "type": "number", "jsonPath": ".status.progress.evalLoss"},
    {"name": "Reason", "type": "string", "jsonPath": ".status.reason", "priority": 1},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]
