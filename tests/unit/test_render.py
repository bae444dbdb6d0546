"""The RayCluster renderer: every property of the reference manifest, decided in one place, and valid for KubeRay."""

from __future__ import annotations

import functools
import json
import shlex
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from fsdp_operator.api import render, schema
from fsdp_operator.api.spec import Job, SpecError, parse_job

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT.parent / "shared"
KUBERAY_VERSIONS = ["kuberay-v1.4.0", "kuberay-v1.7.0"]


def job(spec: dict[str, Any] | None = None, name: str = "qwen") -> Job:
    manifest = {
        "apiVersion": schema.API_VERSION,
        "kind": schema.KIND,
        "metadata": {"name": name},
        "spec": spec or {},
    }
    parsed = parse_job(manifest)
    return Job(parsed.name, "ml", "0b8a2b5e-1111-2222-3333-444455556666", 1, parsed.spec)


def head(rc: dict[str, Any]) -> dict[str, Any]:
    return rc["spec"]["headGroupSpec"]


def group(rc: dict[str, Any]) -> dict[str, Any]:
    (only,) = rc["spec"]["workerGroupSpecs"]
    return only


def container(pod_template: dict[str, Any]) -> dict[str, Any]:
    (only,) = pod_template["spec"]["containers"]
    return only


def env(c: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c["env"]}


def kuberay_schema(version: str) -> dict[str, Any]:
    path = SHARED / "crds" / version / "ray.io_rayclusters.yaml"
    if not path.exists():
        pytest.skip(f"KubeRay CRDs not found at {path} (they live in ../shared, outside the project)")
    return _load_openapi(path)


@functools.cache
def _load_openapi(path: Path) -> dict[str, Any]:
    crd = yaml.load(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    (v1,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    return v1["schema"]["openAPIV3Schema"]


def unknown_fields(node: dict[str, Any], value: Any, path: str = "") -> list[str]:
    """Fields the API server would prune silently: a structural schema drops what it does not declare."""
    if node.get("x-kubernetes-preserve-unknown-fields") or not isinstance(value, dict | list):
        return []
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in unknown_fields(node.get("items", {}), v, f"{path}[{i}]")]
    props = node.get("properties")
    if props is None:
        return []
    found = [f"{path}.{k}" for k in value if k not in props]
    return found + [p for k, v in value.items() if k in props for p in unknown_fields(props[k], v, f"{path}.{k}")]


SPECS = {
    "default": {},
    "socket": {"network": {"transport": "socket"}},
    "cpu": {
        "workers": {"gpusPerWorker": 0, "efaPerWorker": 0, "instanceType": "", "ranksPerWorker": 2},
        "network": {"transport": "socket"},
    },
    "fail-fast": {
        "network": {"failFast": True},
        "workers": {"tolerations": [{"key": "a", "operator": "Exists"}]},
    },
    "service-account": {"serviceAccountName": "trainer", "runAsUser": 1000},
    "queued": {"queueName": "team-a"},  # spec.suspend and Kueue's label (docs/kueue.md)
}


@pytest.mark.parametrize("version", KUBERAY_VERSIONS)
@pytest.mark.parametrize("case", sorted(SPECS))
def test_validates_against_kuberay_crd(version: str, case: str) -> None:
    openapi = kuberay_schema(version)
    rc = render.raycluster(job(SPECS[case]))
    errors = [e.message for e in jsonschema.Draft7Validator(openapi).iter_errors(rc)]
    assert errors == []
    assert unknown_fields(openapi, rc) == []


def test_unknown_field_check_can_fail() -> None:
    openapi = kuberay_schema(KUBERAY_VERSIONS[-1])
    rc = render.raycluster(job())
    rc["spec"]["headGroupSpec"]["rayStartParam"] = {}
    assert unknown_fields(openapi, rc) == [".spec.headGroupSpec.rayStartParam"]


def test_head_has_no_gpu_and_the_reference_ports() -> None:
    h = head(render.raycluster(job()))
    assert h["rayStartParams"]["num-gpus"] == "0"
    assert h["rayStartParams"]["dashboard-host"] == "0.0.0.0"
    c = container(h["template"])
    assert env(c)["NVIDIA_VISIBLE_DEVICES"] == "void"
    assert {p["containerPort"] for p in c["ports"]} == {6379, 8265, 10001}
    assert render.GPU_RESOURCE not in c["resources"]["limits"]


def test_one_fixed_size_worker_group() -> None:
    g = group(render.raycluster(job({"workers": {"replicas": 3}})))
    assert g["replicas"] == g["minReplicas"] == g["maxReplicas"] == 3


@pytest.mark.parametrize("gpus", [1, 2, 4])
def test_num_gpus_and_gpu_limit_come_from_one_value(gpus: int) -> None:
    g = group(render.raycluster(job({"workers": {"gpusPerWorker": gpus}})))
    limits = container(g["template"])["resources"]["limits"]
    assert g["rayStartParams"]["num-gpus"] == limits[render.GPU_RESOURCE] == str(gpus)


def test_efa_is_requested_with_the_reference_environment() -> None:
    c = container(group(render.raycluster(job()))["template"])
    assert c["resources"]["limits"][render.EFA_RESOURCE] == "1"
    e = env(c)
    assert (e["NCCL_DEBUG"], e["NCCL_SOCKET_IFNAME"], e["FI_PROVIDER"], e["NCCL_NET_PLUGIN"]) == (
        "INFO",
        "eth0",
        "efa",
        "ofi",
    )
    assert "NCCL_NET" not in e  # fallback stays possible unless failFast


def test_fail_fast_forbids_the_socket_fallback() -> None:
    e = env(container(group(render.raycluster(job({"network": {"failFast": True}})))["template"]))
    assert e["NCCL_NET"] == "Libfabric"


def test_socket_transport_requests_no_efa() -> None:
    c = container(group(render.raycluster(job({"network": {"transport": "socket"}})))["template"])
    assert render.EFA_RESOURCE not in c["resources"]["limits"]
    e = env(c)
    assert e["NCCL_NET"] == "Socket" and "FI_PROVIDER" not in e and e["NCCL_DEBUG"] == "INFO"


@pytest.mark.parametrize("case", sorted(SPECS))
def test_requests_equal_limits_everywhere(case: str) -> None:
    rc = render.raycluster(job(SPECS[case]))
    for template in (head(rc)["template"], group(rc)["template"]):
        resources = container(template)["resources"]
        assert resources["requests"] == resources["limits"]


def test_instance_type_selector_and_user_selector() -> None:
    g = group(render.raycluster(job({"workers": {"nodeSelector": {"pool": "train"}}})))
    assert g["template"]["spec"]["nodeSelector"] == {
        "pool": "train",
        render.INSTANCE_TYPE_LABEL: "g6.12xlarge",
    }


def test_shm_and_ray_logs_volumes_and_prestop() -> None:
    rc = render.raycluster(job({"workers": {"sharedMemory": "48Gi"}}))
    for template, size in ((head(rc)["template"], "2Gi"), (group(rc)["template"], "48Gi")):
        volumes = {v["name"]: v["emptyDir"] for v in template["spec"]["volumes"]}
        assert volumes["dshm"] == {"medium": "Memory", "sizeLimit": size}
        mounts = {m["mountPath"] for m in container(template)["volumeMounts"]}
        assert mounts == {"/dev/shm", "/tmp/ray"}
        assert container(template)["lifecycle"]["preStop"]["exec"]["command"][-1].endswith("ray stop")
    # The worker's hook first leaves the notice for its ranks and waits for their save, bounded by the grace period.
    worker = container(group(rc)["template"])
    hook = worker["lifecycle"]["preStop"]["exec"]["command"]
    assert hook[:2] == ["/bin/sh", "-c"] and 'echo "$t 120 preStop"' in hook[2]
    assert '[ "$i" -lt 120 ]' in hook[2]
    assert group(rc)["template"]["spec"]["terminationGracePeriodSeconds"] == 120
    assert {"name": "FSDP_NOTICE_DIR", "value": "/tmp/ray/fsdp-notice"} in worker["env"]
    assert "terminationGracePeriodSeconds" not in head(rc)["template"]["spec"]


def test_children_are_tied_to_their_job() -> None:
    j = job()
    rc = render.raycluster(j)
    assert rc["metadata"]["labels"][render.LABEL_JOB] == "qwen"
    assert rc["metadata"]["labels"][render.LABEL_MANAGED_BY] == "fsdp-operator"
    (owner,) = rc["metadata"]["ownerReferences"]
    assert owner == {
        "apiVersion": "fsdp.dev/v1alpha1",
        "kind": "FSDPTrainingJob",
        "name": "qwen",
        "uid": j.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }
    assert rc["metadata"]["namespace"] == "ml"
    for template in (head(rc)["template"], group(rc)["template"]):
        assert template["metadata"]["labels"][render.LABEL_JOB] == "qwen"


@pytest.mark.parametrize("name", ["a", "qwen", "x" * 63, "9lives", "a" * 40 + "-" + "b" * 22])
def test_names_are_deterministic_dns_labels(name: str) -> None:
    import re

    cluster = render.raycluster_name(name)
    assert cluster == render.raycluster_name(name)
    assert len(cluster) <= render.MAX_CLUSTER_NAME
    assert re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", cluster)
    # KubeRay's derived names stay within a 63-character label.
    assert len(f"{cluster}-{render.WORKER_GROUP_GPU}-worker-abcde") <= 63
    sid = render.submission_id(name, "uid-1", 1)
    assert sid == render.submission_id(name, "uid-1", 1) != render.submission_id(name, "uid-2", 1)
    assert render.submission_id(name, "uid-1", 2).endswith("-2")


def test_long_names_do_not_collide() -> None:
    a, b = "x" * 50 + "a", "x" * 50 + "b"
    assert render.raycluster_name(a) != render.raycluster_name(b)


def test_short_names_stay_readable() -> None:
    assert render.raycluster_name("qwen") == "qwen-ray"


def test_renderer_is_pure() -> None:
    j = job()
    assert render.raycluster(j) == render.raycluster(j)
    first = render.raycluster(j)
    first["spec"]["workerGroupSpecs"][0]["replicas"] = 99
    assert group(render.raycluster(j))["replicas"] == 2


def test_reference_manifest_properties_are_all_present() -> None:
    """Every setting of the reference sample's worker and head appears in the default rendering."""
    path = SHARED / "reference" / "aws-sample-raycluster.yaml"
    if not path.exists():
        pytest.skip(f"reference manifest not found at {path} (it lives in ../shared)")
    reference = yaml.safe_load(path.read_text())
    rc = render.raycluster(job())
    ref_worker = reference["spec"]["workerGroupSpecs"][0]
    ref_env = {e["name"]: e["value"] for e in ref_worker["template"]["spec"]["containers"][0]["env"]}
    assert ref_env.items() <= env(container(group(rc)["template"])).items()
    ref_head_env = {
        e["name"]: e["value"] for e in reference["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert ref_head_env.items() <= env(container(head(rc)["template"])).items()
    assert reference["spec"]["headGroupSpec"]["rayStartParams"].items() <= head(rc)["rayStartParams"].items()
    ref_limits = set(ref_worker["template"]["spec"]["containers"][0]["resources"]["limits"])
    assert ref_limits <= set(container(group(rc)["template"])["resources"]["limits"])


def test_submission_carries_the_training_parameters() -> None:
    j = job({"training": {"steps": 7, "seqLen": 512, "sharding": "hybrid"}, "runtimeEnv": {"envVars": {"X": "1"}}})
    sub = render.submission(j, "sid-1", "/opt/pkg/fsdp_train")
    assert sub.submission_id == "sid-1"
    argv = shlex.split(sub.entrypoint)
    assert argv[:4] == ["python", "-m", "fsdp_train.run.ray_entry", "--config-json"]
    config = json.loads(argv[4])
    assert config == sub.config
    assert (
        config["train"]["steps"] == 7 and config["train"]["seq_len"] == 512 and config["train"]["sharding"] == "hybrid"
    )
    assert config["scaling"] == {
        "num_workers": 8,
        "use_gpu": True,
        "resources_per_worker": {"CPU": 1, "GPU": 1},
    }
    assert config["max_failures"] == 0  # Ray Train restarts nothing unless runPolicy.maxWorkerRestarts says so
    restarting = job({"runPolicy": {"maxWorkerRestarts": 3}})
    assert render.submission(restarting, "sid-1", "/opt/pkg/fsdp_train").config["max_failures"] == 3
    assert sub.runtime_env["py_modules"] == ["/opt/pkg/fsdp_train"]
    env_vars = sub.runtime_env["env_vars"]
    assert env_vars["RAY_DEDUP_LOGS"] == "0" and env_vars["RAY_TRAIN_ENABLE_PRINT_PATCH"] == "0"
    assert env_vars["X"] == "1"
    assert env_vars["NCCL_DEBUG_FILE"].endswith("nccl.%h.%p.log")
    assert "pip" not in sub.runtime_env


def test_cpu_submission_asks_for_cpus() -> None:
    sub = render.submission(job(SPECS["cpu"]), "sid", "/p")
    assert sub.config["scaling"] == {"num_workers": 4, "use_gpu": False, "resources_per_worker": {"CPU": 1}}


# --- locked-down pods -------------------------------------------------------------------------------------


def pods(rc: dict[str, Any]) -> list[dict[str, Any]]:
    return [head(rc)["template"]["spec"], group(rc)["template"]["spec"]]


@pytest.mark.parametrize("case", sorted(SPECS))
def test_no_container_can_gain_privileges(case: str) -> None:
    """Ray pods ran as the image's root with every default capability and no seccomp profile."""
    rc = render.raycluster(job(SPECS[case]))
    for pod in pods(rc):
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        (c,) = pod["containers"]
        assert c["securityContext"]["allowPrivilegeEscalation"] is False
        assert c["securityContext"]["privileged"] is False
        assert c["securityContext"]["capabilities"]["drop"] == ["ALL"]


def test_only_efa_workers_keep_ipc_lock() -> None:
    """EFA pins the buffers it sends from (RLIMIT_MEMLOCK); nothing else needs a capability."""
    efa = render.raycluster(job())
    assert container(group(efa)["template"])["securityContext"]["capabilities"]["add"] == ["IPC_LOCK"]
    assert "add" not in container(head(efa)["template"])["securityContext"]["capabilities"]
    for case in ("socket", "cpu"):
        rc = render.raycluster(job(SPECS[case]))
        assert all("add" not in p["containers"][0]["securityContext"]["capabilities"] for p in pods(rc))


def test_no_service_account_token_unless_one_is_named() -> None:
    for pod in pods(render.raycluster(job())):
        assert pod["automountServiceAccountToken"] is False and "serviceAccountName" not in pod
    for pod in pods(render.raycluster(job({"serviceAccountName": "trainer"}))):
        assert pod["serviceAccountName"] == "trainer" and "automountServiceAccountToken" not in pod


@pytest.mark.parametrize(("user", "expected"), [(None, {}), (1000, {"runAsUser": 1000, "runAsNonRoot": True}),
                                                 (0, {"runAsUser": 0, "runAsNonRoot": False})])  # fmt: skip
def test_the_user_is_the_images_unless_the_spec_names_one(user: int | None, expected: dict[str, Any]) -> None:
    spec = {} if user is None else {"runAsUser": user}
    for pod in pods(render.raycluster(job(spec))):
        assert {k: v for k, v in pod["securityContext"].items() if k != "seccompProfile"} == expected


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        ({"head": {"nodeSelector": {"node-role.kubernetes.io/control-plane": ""}}},
         "spec.head.nodeSelector.node-role.kubernetes.io/control-plane: job pods may not be placed on control-plane"),
        ({"head": {"tolerations": [{"key": "node-role.kubernetes.io/control-plane", "operator": "Exists"}]}},
         "spec.head.tolerations[0].key: job pods may not tolerate the control-plane taint"),
        ({"workers": {"tolerations": [{"key": "node-role.kubernetes.io/master", "effect": "NoSchedule",
                                       "operator": "Exists"}]}},
         "spec.workers.tolerations[0].key: job pods may not tolerate the control-plane taint"),
        ({"head": {"tolerations": [{"operator": "Exists"}]}},
         "spec.head.tolerations[0]: an empty key with operator Exists tolerates every taint"),
        ({"serviceAccountName": "Not_A_Name"}, "spec.serviceAccountName: 'Not_A_Name' must be a DNS-1123 subdomain"),
        ({"runAsUser": -1}, "spec.runAsUser: must be at least 0"),
    ],
)  # fmt: skip
def test_pods_stay_off_control_plane_nodes(spec: dict[str, Any], problem: str) -> None:
    with pytest.raises(SpecError) as refused:
        job(spec)
    assert any(line.strip().startswith(problem) for line in str(refused.value).splitlines()), str(refused.value)


@pytest.mark.parametrize("ranks_said_done", [True, False])
def test_the_notice_hook_gives_the_log_monitor_its_flush_time_only_after_done(
    tmp_path: Path, ranks_said_done: bool
) -> None:
    """The hook run by a real sh, with `sleep` and `ray` stand-ins that log their calls: after the ranks' `done`, the
    hook waits LOG_FLUSH_SECONDS before `ray stop` (their report is forwarded first); without `done`, at once."""
    import os
    import subprocess

    notices, bin_dir, calls = tmp_path / "notice", tmp_path / "bin", tmp_path / "calls"
    bin_dir.mkdir()
    for name in ("ray", "sleep"):
        (bin_dir / name).write_text(f'#!/bin/sh\necho "{name} $*" >> {calls}\n')
        (bin_dir / name).chmod(0o755)
    if ranks_said_done:
        notices.mkdir()
        (notices / "done").write_text("1 5 1\n")
    command = render.worker_notice_hook(30)["preStop"]["exec"]["command"]
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "FSDP_NOTICE_DIR": str(notices)}
    subprocess.run(command, env=env, check=True, timeout=120)
    flush = [f"sleep {render.LOG_FLUSH_SECONDS}"] if ranks_said_done else []
    assert calls.read_text().splitlines() == [*flush, "ray stop"] and (notices / "notice").exists()
