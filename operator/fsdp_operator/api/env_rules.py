"""Where a job's environment variables and pods may not go: the operator's own variables, the transport's,
control-plane nodes."""

from __future__ import annotations

from typing import Any

from fsdp_operator.api.fields import Problems, show_key

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
    "FSDP_NOTICE_DIR": "the operator sets where a worker's preStop hook leaves a node's notice for the ranks",
}


# What spec.network.env is for: the collective-communication stack of the ranks (NCCL and its plugins,
# libfabric, the RDMA verbs, gloo, CUDA settings NCCL reads). Compared in upper case.
TRANSPORT_ENV_PREFIXES = ("NCCL_", "TORCH_NCCL_", "FI_", "OFI_NCCL_", "RDMAV_", "IBV_", "MLX5_", "UCX_", "GLOO_",
                          "TP_", "NVSHMEM_", "CUDA_")  # fmt: skip


# Variables no door may set, though the operator does not set them either: the image does, or they would carry
# transport settings past the checks above. Compared in upper case.
IMAGE_ENV: dict[str, str] = {
    "LD_LIBRARY_PATH": "the image sets it so that NCCL finds aws-ofi-nccl (the EFA plugin) and its own libraries; "
    "another value hides them and NCCL silently falls back to sockets",
    "NCCL_CONF_FILE": "NCCL would read settings from that file (NCCL_NET, NCCL_NET_PLUGIN, NCCL_DEBUG, ...) past "
    "the checks of spec.network; set transport variables in spec.network.env",
}


def is_transport_variable(name: str) -> bool:
    """NCCL's, libfabric's, aws-ofi-nccl's and the rest of TRANSPORT_ENV_PREFIXES (compared in upper case)."""
    return name.strip().upper().startswith(TRANSPORT_ENV_PREFIXES)


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
    """Each variable in its one place: spec.env for every Ray process, network.env for the transport only.

    Transport variables go through network.env alone, whatever door a spec tries (spec.env, runtimeEnv.envVars):
    that is where they are checked against the operator's own, and where they reach the ranks and nothing else.
    """
    everywhere: set[str] = set()
    for i, env in enumerate(s["env"]):
        name, where = env["name"], f"{path}.env[{i}].name"
        if _refuse_operator_env(name, where, problems) or _refuse_transport_env(name, where, path, problems):
            continue
        if name in everywhere:
            problems.append(f"{where}: {name} is set twice")
        everywhere.add(name)
    for i, env in enumerate(s["network"]["env"]):
        name, where = env["name"], f"{path}.network.env[{i}].name"
        if _refuse_operator_env(name, where, problems):
            continue
        if not is_transport_variable(name):
            # The job's driver runs on the head and reads the data there: a storage endpoint, a token or a
            # proxy set only on the workers fails in the driver (`Could not resolve host`).
            problems.append(
                f"{where}: {name} is not a transport variable (NCCL_*, FI_*, ...), and network.env reaches the "
                f"workers only; use {path}.env, which reaches every Ray process (the job's driver on the head too)"
            )
    for name in s["runtime_env"]["env_vars"]:
        where = f"{path}.runtimeEnv.envVars.{show_key(name)}"
        if _refuse_operator_env(name, where, problems) or _refuse_transport_env(name, where, path, problems):
            continue
        if name in everywhere:
            problems.append(f"{where}: {name} is also set in {path}.env; set it in one place (spec.env)")


def _refuse_operator_env(name: str, path: str, problems: Problems) -> bool:
    why = operator_owned(name)
    if why is not None:
        problems.append(f"{path}: {name} is set by the operator (transport verification, log collection); {why}")
        return True
    why = IMAGE_ENV.get(name.strip().upper())
    if why is not None:
        problems.append(f"{path}: {name} may not be set by a job: {why}")
    return why is not None


def _refuse_transport_env(name: str, where: str, path: str, problems: Problems) -> bool:
    if not is_transport_variable(name):
        return False
    problems.append(
        f"{where}: {name} is a transport variable (NCCL_*, FI_*, OFI_NCCL_*, ...); set it in {path}.network.env, "
        "where transport settings are checked and reach the training ranks only"
    )
    return True
