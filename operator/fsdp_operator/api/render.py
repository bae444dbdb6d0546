"""Pure builders: the RayCluster manifest and the Ray job submission for a job. No I/O here.

Every pod-level decision of the reference setup (EFA request, NCCL environment, Guaranteed QoS,
/dev/shm, ray stop on preStop) and of locking the pods down (security contexts, the ServiceAccount token,
the NetworkPolicy; docs/security.md) is made in this one module, from the typed spec.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
from dataclasses import dataclass, field
from typing import Any

from fsdp_operator.api import cluster_rules, queueing, schema, tracking_entry
from fsdp_operator.api import spec as spec_mod
from fsdp_operator.api.spec import Job, Spec

MANAGED_BY = "fsdp-operator"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_JOB = "fsdp.dev/job"
LABEL_NAME = "app.kubernetes.io/name"
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
# Karpenter's label on nodes it launched into an On-Demand Capacity Reservation (declared with the placement rules).
CAPACITY_RESERVATION_LABEL = cluster_rules.CAPACITY_RESERVATION_LABEL
GPU_RESOURCE = "nvidia.com/gpu"
EFA_RESOURCE = "vpc.amazonaws.com/efa"
HEAD_PORTS = (("gcs-server", 6379), ("dashboard", 8265), ("client", 10001))
DASHBOARD_PORT = 8265
# KubeRay derives pod and service names from the cluster name (`<name>-head-svc`,
# `<name>-<group>-worker-<5 chars>`); capping it keeps every derived name a valid 63-char label.
MAX_CLUSTER_NAME = 38
WORKER_GROUP_GPU = "gpu-workers"
WORKER_GROUP_CPU = "cpu-workers"
RAY_LOGS = "/tmp/ray"
AUTH_TOKEN_KEY = "token"
"""The key of the per-job Secret that holds Ray's auth token."""
EVENTS_KEY_KEY = "events-key"
"""The key of the per-job Secret that holds the job's event-signing key (each attempt's key derives from it)."""
RAY_CLUSTER_LABEL = "ray.io/cluster"


@dataclass(frozen=True, slots=True)
class Security:
    """How the operator closes each job's Ray cluster: operator settings (the chart's), not spec fields."""

    token_auth: bool = True
    """Ray's token authentication (Ray >= 2.52): `RAY_AUTH_MODE=token`, the token in a per-job Secret."""
    network_policy: bool = True
    """A per-job NetworkPolicy; off for clusters without a policy engine (the chart's `jobNetworkPolicy`)."""
    operator_namespace: str = ""
    """The operator's namespace; empty: the operator's pods are matched by their labels in any namespace."""
    operator_pod_labels: dict[str, str] = field(default_factory=lambda: {LABEL_NAME: MANAGED_BY})
    """Labels of the operator's pods (the chart's selector labels)."""


def _digest(*parts: str, length: int = 8) -> str:
    return hashlib.sha256("/".join(parts).encode()).hexdigest()[:length]


def _dns_label(stem: str, suffix: str, limit: int) -> str:
    """`stem-suffix` as a DNS-1035 label of at most `limit` characters (letter first)."""
    clean = re.sub(r"[^a-z0-9-]", "-", stem.lower()).strip("-") or "job"
    if not clean[0].isalpha():
        clean = "j" + clean
    room = limit - len(suffix) - 1
    return f"{clean[:room].rstrip('-')}-{suffix}"


def raycluster_name(job_name: str) -> str:
    """Deterministic RayCluster name for a job: `<job>-ray`, or a truncated name plus a hash when long."""
    plain = _dns_label(job_name, "ray", MAX_CLUSTER_NAME)
    if plain == f"{job_name}-ray":
        return plain
    return _dns_label(job_name, _digest(job_name), MAX_CLUSTER_NAME)


def submission_id(job_name: str, uid: str, attempt: int) -> str:
    """Deterministic Ray submission id: the same job, uid and attempt always give the same id."""
    return f"{_dns_label(job_name, _digest(job_name, uid), 48)}-{attempt}"


def labels(job: Job) -> dict[str, str]:
    return {LABEL_MANAGED_BY: MANAGED_BY, LABEL_NAME: "fsdp-training", LABEL_JOB: job.name}


def owner_reference(job: Job) -> dict[str, Any]:
    return {
        "apiVersion": schema.API_VERSION,
        "kind": schema.KIND,
        "name": job.name,
        "uid": job.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def auth_secret_name(job_name: str) -> str:
    """The per-job Secret with Ray's auth token: `<raycluster name>-auth`."""
    return f"{raycluster_name(job_name)}-auth"


def network_policy_name(job_name: str) -> str:
    """The per-job NetworkPolicy: `<raycluster name>-ports`."""
    return f"{raycluster_name(job_name)}-ports"


def auth_secret(job: Job) -> dict[str, Any]:
    """The job's Secret, without its data: the controller draws Ray's token and the event-signing key into it."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": auth_secret_name(job.name),
            "namespace": job.namespace,
            "labels": labels(job),
            "ownerReferences": [owner_reference(job)],
        },
        "type": "Opaque",
    }


def _auth_env(job: Job) -> list[dict[str, Any]]:
    # Ray reads both on every node; the token never appears in the RayCluster, only the reference to it.
    ref = {"secretKeyRef": {"name": auth_secret_name(job.name), "key": AUTH_TOKEN_KEY}}
    return [{"name": "RAY_AUTH_MODE", "value": "token"}, {"name": "RAY_AUTH_TOKEN", "valueFrom": ref}]


# Egress of a job's pods (docs/security.md). A policy cannot name S3 or the Hugging Face Hub, so HTTPS goes
# anywhere but link-local addresses, where the instance metadata service (IMDS) and EKS Pod Identity's agent
# answer with the node's or a role's credentials. EFA traffic bypasses the kernel's IP stack: no policy sees it.
LINK_LOCAL = ("169.254.0.0/16", "fe80::/10")
INSTANCE_METADATA = ("169.254.169.254/32", "fd00:ec2::254/128")
POD_IDENTITY_AGENT = ("169.254.170.23/32", "fd00:ec2::23/128")
"""EKS Pod Identity's node agent (its documented addresses), reached over HTTP port 80."""


def _egress(job: Job, own_pods: dict[str, Any]) -> list[dict[str, Any]]:
    """DNS anywhere (NodeLocal DNSCache listens on a link-local address), the job's own pods on any port,
    HTTPS to anything but link-local addresses; IMDS when the job opts in, Pod Identity's agent when it names
    a ServiceAccount (whose credentials it serves)."""

    def blocks(*cidrs: str) -> list[dict[str, Any]]:
        return [{"ipBlock": {"cidr": cidr}} for cidr in cidrs]

    http = [{"protocol": "TCP", "port": 80}]
    anywhere = [
        {"ipBlock": {"cidr": "0.0.0.0/0", "except": [LINK_LOCAL[0]]}},
        {"ipBlock": {"cidr": "::/0", "except": [LINK_LOCAL[1], INSTANCE_METADATA[1], POD_IDENTITY_AGENT[1]]}},
    ]
    rules: list[dict[str, Any]] = [
        {"ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]},
        {"to": [own_pods]},
        {"to": anywhere, "ports": [{"protocol": "TCP", "port": 443}]},
        *tracking_entry.egress(job, anywhere),  # the tracking server's own port (spec.tracking)
    ]
    if job.spec.network.allow_instance_metadata:
        rules.append({"to": blocks(*INSTANCE_METADATA), "ports": http})
    if job.spec.service_account_name:
        rules.append({"to": blocks(*POD_IDENTITY_AGENT), "ports": http})
    return rules


def network_policy(job: Job, security: Security) -> dict[str, Any]:
    """Ingress to the job's Ray pods only from the job's own pods (any port) and from the operator (Ray's ports);
    egress only to DNS, the job's own pods and HTTPS outside link-local addresses (`_egress`).

    The head's GCS (6379), dashboard and job API (8265) and Ray client (10001) accept arbitrary code from
    anyone who reaches them; without this, any pod in the cluster could run code on the GPU workers. The
    job's code in turn must not reach the node's credentials (instance metadata) or other services on
    their own ports.
    """
    own_pods = {"podSelector": {"matchLabels": {RAY_CLUSTER_LABEL: raycluster_name(job.name)}}}
    namespaces: dict[str, Any] = (
        {"matchLabels": {"kubernetes.io/metadata.name": security.operator_namespace}}
        if security.operator_namespace
        else {}
    )
    operator = {"namespaceSelector": namespaces, "podSelector": {"matchLabels": dict(security.operator_pod_labels)}}
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {
            "name": network_policy_name(job.name),
            "namespace": job.namespace,
            "labels": labels(job),
            "ownerReferences": [owner_reference(job)],
        },
        "spec": {
            "podSelector": {"matchLabels": {RAY_CLUSTER_LABEL: raycluster_name(job.name)}},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [
                {"from": [own_pods]},
                {"from": [operator], "ports": [{"protocol": "TCP", "port": port} for _, port in HEAD_PORTS]},
            ],
            "egress": _egress(job, own_pods),
        },
    }


def nccl_env(spec: Spec) -> list[dict[str, str]]:
    """The NCCL/EFA variables for the workers: the reference four for EFA, a plain-TCP set for sockets."""
    env = [
        {"name": "NCCL_DEBUG", "value": spec.network.nccl_debug},
        {"name": "NCCL_SOCKET_IFNAME", "value": spec.network.socket_ifname},
    ]
    if spec.efa_requested:
        env += [{"name": "FI_PROVIDER", "value": "efa"}, {"name": "NCCL_NET_PLUGIN", "value": "ofi"}]
        if spec.network.fail_fast:
            # Without this NCCL silently falls back to sockets; with it, it refuses to start.
            env.append({"name": "NCCL_NET", "value": "Libfabric"})
    else:
        env += [{"name": "NCCL_IB_DISABLE", "value": "1"}, {"name": "NCCL_NET", "value": "Socket"}]
    return env


def _downward_env() -> list[dict[str, Any]]:
    # The training ranks report their pod and node; no API credentials needed.
    return [
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
    ]


def _resources(cpu: str, memory: str, extra: dict[str, str]) -> dict[str, Any]:
    amounts = {"cpu": cpu, "memory": memory, **extra}
    # Requests equal limits: Guaranteed QoS, so the kubelet never evicts a rank under memory pressure.
    return {"requests": dict(amounts), "limits": dict(amounts)}


# EFA registers (pins) the buffers NCCL sends from; pinned memory counts against RLIMIT_MEMLOCK unless the
# process holds CAP_IPC_LOCK (mlock(2), libfabric's efa provider). Nothing else the DLC runs needs a capability.
EFA_CAPABILITIES = ("IPC_LOCK",)


def container_security(*, efa: bool) -> dict[str, Any]:
    """A container that cannot gain privileges: every capability dropped but IPC_LOCK for EFA workers."""
    capabilities: dict[str, Any] = {"drop": ["ALL"]}
    if efa:
        capabilities["add"] = list(EFA_CAPABILITIES)
    return {"allowPrivilegeEscalation": False, "privileged": False, "capabilities": capabilities}


def pod_security(spec: Spec) -> dict[str, Any]:
    """The pod's securityContext: the runtime's default seccomp profile; the user when the spec names one."""
    context: dict[str, Any] = {"seccompProfile": {"type": "RuntimeDefault"}}
    if spec.run_as_user is not None:
        context["runAsUser"] = spec.run_as_user
        context["runAsNonRoot"] = spec.run_as_user != 0
    return context


def _pod_identity(spec: Spec) -> dict[str, Any]:
    """The named ServiceAccount and its token, or no token at all (Ray never talks to the API server)."""
    if spec.service_account_name:
        return {"serviceAccountName": spec.service_account_name}
    return {"automountServiceAccountToken": False}


def _container(
    name: str, spec: Spec, resources: dict[str, Any], env: list[dict[str, Any]], *, efa: bool = False
) -> dict[str, Any]:
    return {
        "name": name,
        "image": spec.image,
        "imagePullPolicy": spec.image_pull_policy,
        "securityContext": container_security(efa=efa),
        "env": env,
        "resources": resources,
        "volumeMounts": [
            {"name": "ray-logs", "mountPath": RAY_LOGS},
            {"name": "dshm", "mountPath": "/dev/shm"},
        ],
        "lifecycle": {"preStop": {"exec": {"command": ["/bin/sh", "-c", "ray stop"]}}},
    }


NOTICE_DIR = f"{RAY_LOGS}/fsdp-notice"
"""Where a worker's preStop hook leaves its notice for the ranks (``fsdp_train.watch.notice``): the pod's own Ray
volume."""
# The worker's preStop hook (fsdp_train.watch.notice says the other side): write the notice (time, grace, reason) for
# the
# ranks of this pod, then wait until they say `done`, while one of them lives, at most the grace period; then, when
# they said it, give Ray's log monitor LOG_FLUSH_SECONDS to forward their last lines (the report of the save) to the
# driver, and stop Ray as the head's hook does. POSIX sh only: the image is used unmodified.
LOG_FLUSH_SECONDS = 3
_NOTICE_HOOK = (
    # Sub-second time where date has %N (GNU), whole seconds elsewhere (busybox prints the N).
    'd="$FSDP_NOTICE_DIR"; t=$(date +%s.%N); case "$t" in *[!0-9.]*) t=$(date +%s);; esac; '
    'mkdir -p "$d" && echo "$t {grace} preStop" > "$d/.notice" && '
    'mv "$d/.notice" "$d/notice"; alive() {{ for f in "$d"/rank.*; do [ -e "$f" ] && kill -0 "$(cat "$f")" '
    '2>/dev/null && return 0; done; return 1; }}; i=0; while [ ! -e "$d/done" ] && [ "$i" -lt {grace} ] && alive; '
    "do sleep 1; i=$((i+1)); done; "
    f'if [ -e "$d/done" ]; then sleep {LOG_FLUSH_SECONDS}; fi; ray stop'
)


def worker_notice_hook(grace_seconds: int) -> dict[str, Any]:
    """The worker container's lifecycle: the notice hook, bounded by the pod's grace period."""
    return {"preStop": {"exec": {"command": ["/bin/sh", "-c", _NOTICE_HOOK.format(grace=grace_seconds)]}}}


def _volumes(shm_size: str) -> list[dict[str, Any]]:
    return [
        {"name": "ray-logs", "emptyDir": {}},
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": shm_size}},
    ]


def worker_zone(spec: Spec, chosen: str = "") -> str:
    """The zone the workers are constrained to: the spec's, or for `auto` the one the operator chose ('' none)."""
    zone = spec.placement.availability_zone
    return chosen if zone == "auto" else zone


def raycluster(job: Job, security: Security | None = None, *, chosen_zone: str = "") -> dict[str, Any]:
    """The RayCluster that runs `job`: a GPU-less head and one fixed-size worker group requesting EFA.

    `chosen_zone` is the zone the operator picked for `placement.availabilityZone: auto` (recorded in
    status); the workers of one job land in one zone because EFA traffic does not cross zones.
    """
    spec, workers = job.spec, job.spec.workers
    security = security or Security()
    name = raycluster_name(job.name)
    common_labels = labels(job)

    auth = security.token_auth
    head_env = [
        {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"},
        *_downward_env(),
        *(_auth_env(job) if auth else []),
        *spec.env,  # the job's driver runs here: it reads the data
    ]
    head = _container("ray-head", spec, _resources(spec.head.cpu, spec.head.memory, {}), head_env)
    head["ports"] = [{"containerPort": port, "name": port_name} for port_name, port in HEAD_PORTS]

    gpus = str(workers.gpus_per_worker)
    extra: dict[str, str] = {}
    if workers.gpus_per_worker:
        extra[GPU_RESOURCE] = gpus
    if spec.efa_requested:
        extra[EFA_RESOURCE] = str(workers.efa_per_worker)
    worker_env = [*nccl_env(spec), *_downward_env(), *(_auth_env(job) if auth else []), *spec.env, *spec.network.env]
    worker_env.append({"name": "FSDP_NOTICE_DIR", "value": NOTICE_DIR})
    worker = _container(
        "ray-worker", spec, _resources(workers.cpu, workers.memory, extra), worker_env, efa=spec.efa_requested
    )

    selector = dict(workers.node_selector)
    if workers.instance_type:
        selector[INSTANCE_TYPE_LABEL] = workers.instance_type
    if zone := worker_zone(spec, chosen_zone):
        selector[spec_mod.ZONE_LABEL] = zone
    if spec.placement.capacity_reservation_id:
        selector[CAPACITY_RESERVATION_LABEL] = spec.placement.capacity_reservation_id
    tolerations = list(workers.tolerations)
    if workers.gpus_per_worker:
        tolerations.append({"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"})
    if spec.efa_requested:
        tolerations.append({"key": EFA_RESOURCE, "operator": "Exists", "effect": "NoSchedule"})

    grace = spec.training.checkpoint.grace_period_seconds
    worker["lifecycle"] = worker_notice_hook(grace)
    worker_pod: dict[str, Any] = {
        **_pod_identity(spec),
        "securityContext": pod_security(spec),
        "terminationGracePeriodSeconds": grace,
        "containers": [worker],
        "volumes": _volumes(workers.shared_memory),
    }
    if selector:
        worker_pod["nodeSelector"] = selector
    if tolerations:
        worker_pod["tolerations"] = tolerations
    head_pod: dict[str, Any] = {
        **_pod_identity(spec),
        "securityContext": pod_security(spec),
        "containers": [head],
        "volumes": _volumes("2Gi"),
    }
    if spec.shared_volume is not None:
        # One filesystem for every Ray process: where local checkpoint and output paths lie with several workers.
        for pod in (head_pod, worker_pod):
            pod["volumes"].append(
                {"name": "shared", "persistentVolumeClaim": {"claimName": spec.shared_volume.claim_name}}
            )
            # First: a mount at a parent of /tmp/ray (run-local's example mounts /tmp) must not hide Ray's logs.
            mount = {"name": "shared", "mountPath": spec.shared_volume.mount_path}
            pod["containers"][0]["volumeMounts"].insert(0, mount)
    if spec.head.node_selector:
        head_pod["nodeSelector"] = dict(spec.head.node_selector)
    if spec.head.tolerations:
        head_pod["tolerations"] = list(spec.head.tolerations)

    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": {
            "name": name,
            "namespace": job.namespace,
            # Kueue's queue and priority labels go on the RayCluster only (the pods are its to admit, not to label).
            "labels": {**common_labels, **queueing.cluster_labels(spec.queue_name, job.labels)},
            "ownerReferences": [owner_reference(job)],
        },
        "spec": {
            # Queued: created suspended, and Kueue admits it as one gang by setting suspend: false (docs/kueue.md).
            **({"suspend": True} if queueing.queue_name(spec.queue_name, job.labels) else {}),
            "rayVersion": spec.ray_version,
            "enableInTreeAutoscaling": False,
            "headGroupSpec": {
                # num-cpus 0: training ranks never land on the head, which serves the job API.
                "rayStartParams": {"dashboard-host": "0.0.0.0", "num-gpus": "0", "num-cpus": "0"},
                "template": {"metadata": {"labels": dict(common_labels)}, "spec": head_pod},
            },
            "workerGroupSpecs": [
                {
                    "groupName": WORKER_GROUP_GPU if workers.gpus_per_worker else WORKER_GROUP_CPU,
                    "replicas": workers.replicas,
                    "minReplicas": workers.replicas,
                    "maxReplicas": workers.replicas,
                    # The same value as the nvidia.com/gpu limit: Ray never sees more GPUs than the pod has.
                    "rayStartParams": {"num-gpus": gpus},
                    "template": {"metadata": {"labels": dict(common_labels)}, "spec": worker_pod},
                }
            ],
        },
    }


@dataclass(frozen=True, slots=True)
class Submission:
    """What the operator hands to Ray's job API for one attempt."""

    submission_id: str
    entrypoint: str
    runtime_env: dict[str, Any]
    metadata: dict[str, str]
    config: dict[str, Any]


def train_config(job: Job) -> dict[str, Any]:
    """The training function's config (`fsdp_train.contract.config.TrainConfig.from_dict`) for this job.

    The same TrainConfig that `parse_job` built and checked when it accepted the job.
    """
    return spec_mod.train_config(job.spec).to_dict()


def user_function(spec: Spec) -> dict[str, Any]:
    """The entrypoint's `function` (`fsdp_train.run.user_function.FunctionConfig`) for spec.trainFunction.

    A remote `code` goes to Ray's runtime environment (`working_dir`), a local directory to the wrapper's path.
    """
    function = spec.train_function
    assert function is not None
    remote = function.code.startswith(("s3://", "gs://"))
    return {
        "callable": function.callable,
        "code": "" if remote else function.code,
        "config": function.config,
        "probe_size_bytes": spec.training.probe_size_bytes,
    }


DEFAULT_JOB_ENV = {
    # The flight recorder of each process group (NCCL's, and gloo's): a stalled rank's report names its last
    # collectives (docs/health.md). A default, not the operator's: runtimeEnv.envVars may set another size, or 0.
    "TORCH_FR_BUFFER_SIZE": "2000",
}
"""What the job's runtime environment sets unless spec.runtimeEnv.envVars says otherwise."""


def submission(job: Job, submission_id: str, training_package: str) -> Submission:
    """The Ray job for one attempt; `training_package` is the local path of `fsdp_train` to ship."""
    spec, workers = job.spec, job.spec.workers
    use_gpu = workers.gpus_per_worker > 0
    config = {
        "train": train_config(job),
        "scaling": {
            "num_workers": workers.world_size,
            "use_gpu": use_gpu,
            "resources_per_worker": {"CPU": 1, "GPU": 1} if use_gpu else {"CPU": 1},
        },
        # Ray Train restarts the worker group in place (from the latest checkpoint) this often; beyond that the
        # attempt fails, and retries are the operator's (runPolicy.backoffLimit), each with a fresh submission id.
        "max_failures": spec.run_policy.max_worker_restarts,
        "storage_path": spec.training.checkpoint.storage or None,
        "name": job.name,
        "health": spec.health.for_ranks(),
    }
    if spec.train_function is not None:
        config["function"] = user_function(spec)
    if (tracking := tracking_entry.entry(job, submission_id)) is not None:
        config["tracking"] = tracking
    entrypoint = "python -m fsdp_train.run.ray_entry --config-json " + shlex.quote(
        json.dumps(config, separators=(",", ":"), sort_keys=True)
    )
    env_vars = {
        **DEFAULT_JOB_ENV,  # first, so that runtimeEnv.envVars may set another value
        **spec.runtime_env.env_vars,
        # Last, so that these win even over a value the spec check missed: the event channel depends on them.
        # Per-rank lines must reach the job log unmerged and printed once (see docs/operations.md).
        "RAY_DEDUP_LOGS": "0",
        "RAY_TRAIN_ENABLE_PRINT_PATCH": "0",
        "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.1",
        "PYTHONUNBUFFERED": "1",
        # Each rank reads its own NCCL log back to report the transport; set here, before Ray Train
        # creates the process group, so no NCCL call can precede it. /tmp/ray is the pods' Ray volume.
        "NCCL_DEBUG_FILE": f"{RAY_LOGS}/nccl.%h.%p.log",
        "PYTHONIOENCODING": "utf-8",
    }
    runtime_env: dict[str, Any] = {"py_modules": [training_package], "env_vars": env_vars}
    if spec.runtime_env.pip:
        runtime_env["pip"] = list(spec.runtime_env.pip)
    if spec.train_function is not None and spec.train_function.code.startswith(("s3://", "gs://")):
        runtime_env["working_dir"] = spec.train_function.code  # Ray fetches and unpacks the .zip on every node
    return Submission(
        submission_id=submission_id,
        entrypoint=entrypoint,
        runtime_env=runtime_env,
        metadata={"fsdp.dev/job": job.name, "fsdp.dev/namespace": job.namespace},
        config=config,
    )
