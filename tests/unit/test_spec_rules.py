"""The spec boundary: Kubernetes' own grammars, operator-owned settings, one contract with TrainConfig,
and the same judgement as the CRD schema the API server applies."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from fsdp_operator.api import generate, render, schema
from fsdp_operator.api.env_rules import OPERATOR_ENV, operator_owned
from fsdp_operator.api.formats import parse_quantity
from fsdp_operator.api.spec import SpecError, parse_job, train_config
from fsdp_operator.cli.main import main
from fsdp_operator.local.server import validation
from fsdp_train.contract.config import TrainConfig

ROOT = Path(__file__).resolve().parents[2]


def manifest(spec: dict[str, Any] | None = None, **metadata: Any) -> dict[str, Any]:
    return {
        "apiVersion": schema.API_VERSION,
        "kind": schema.KIND,
        "metadata": {"name": "job", **metadata},
        "spec": {} if spec is None else spec,
    }


def problems(spec: dict[str, Any] | None = None, **metadata: Any) -> list[str]:
    with pytest.raises(SpecError) as info:
        parse_job(manifest(spec, **metadata))
    return info.value.problems


CPU = {
    "workers": {"gpusPerWorker": 0, "efaPerWorker": 0, "instanceType": "", "ranksPerWorker": 2},
    "network": {"transport": "socket"},
}


# --- operator-owned settings ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "instead"),
    [
        ("NCCL_DEBUG", "use spec.network.ncclDebug"),
        ("NCCL_DEBUG_SUBSYS", "use spec.network.ncclDebug"),
        ("NCCL_DEBUG_FILE", "use spec.network.ncclDebug"),
        ("NCCL_NET", "use spec.network.transport and spec.network.failFast"),
        ("FI_PROVIDER", "use spec.network.transport (the operator selects the libfabric provider)"),
        ("FI_EFA_USE_DEVICE_RDMA", "use spec.network.transport (the operator selects the libfabric provider)"),
        ("NCCL_SOCKET_IFNAME", "use spec.network.socketIfname"),
        ("LD_PRELOAD", "it would replace the libraries NCCL and the transport check rely on"),
        ("RAY_DEDUP_LOGS", "the operator needs every rank's log lines unmerged"),
    ],
)
def test_operator_owned_environment_is_refused_in_every_place(name: str, instead: str) -> None:
    found = problems({"network": {"env": [{"name": "NCCL_ALGO", "value": "1"}, {"name": name, "value": "x"}]}})
    assert found == [
        f"spec.network.env[1].name: {name} is set by the operator (transport verification, log collection); {instead}"
    ]
    found = problems({"env": [{"name": "OK_VAR", "value": "1"}, {"name": name, "value": "x"}]})
    assert found == [
        f"spec.env[1].name: {name} is set by the operator (transport verification, log collection); {instead}"
    ]
    found = problems({"runtimeEnv": {"envVars": {name: "x"}}})
    assert found == [
        f"spec.runtimeEnv.envVars.{name}: {name} is set by the operator (transport verification, log collection); "
        f"{instead}"
    ]


def test_every_variable_the_renderer_sets_is_operator_owned() -> None:
    """The table and the renderer cannot drift apart: whatever render sets, a user may not."""
    for spec in ({}, {"network": {"failFast": True}}, CPU):
        job = parse_job(manifest(spec))
        rc = render.raycluster(job)
        pod_env = [
            e["name"]
            for group in (rc["spec"]["headGroupSpec"], *rc["spec"]["workerGroupSpecs"])
            for e in group["template"]["spec"]["containers"][0]["env"]
        ]
        job_env = list(render.submission(job, "sid", "/pkg").runtime_env["env_vars"])
        for name in pod_env + job_env:
            # The head's own device setting, and the defaults a spec may change (render.DEFAULT_JOB_ENV).
            if name != "NVIDIA_VISIBLE_DEVICES" and name not in render.DEFAULT_JOB_ENV:
                assert operator_owned(name) is not None, f"{name} is set by the operator but a spec may set it"
    assert "LD_PRELOAD" in OPERATOR_ENV


def test_user_variables_that_are_not_the_operators_pass_through() -> None:
    job = parse_job(
        manifest(
            {
                "network": {"env": [{"name": "NCCL_ALGO", "value": "Ring"}]},
                "runtimeEnv": {"envVars": {"HF_HOME": "/cache", "MY_SETTING": "8388608"}},
            }
        )
    )
    worker = render.raycluster(job)["spec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]
    assert {"name": "NCCL_ALGO", "value": "Ring"} in worker["env"]
    assert render.submission(job, "sid", "/pkg").runtime_env["env_vars"]["HF_HOME"] == "/cache"


def test_spec_env_reaches_head_and_workers_and_secrets_stay_out_of_the_ray_job() -> None:
    """The job's driver reads the data on the head: a storage endpoint or a token must be there too."""
    ref = {"name": "AWS_SECRET_ACCESS_KEY", "valueFrom": {"secretKeyRef": {"name": "aws", "key": "secret"}}}
    endpoint = {"name": "AWS_ENDPOINT_URL", "value": "http://minio.storage:9000"}
    job = parse_job(manifest({"env": [endpoint, ref]}))
    rc = render.raycluster(job)
    for group in (rc["spec"]["headGroupSpec"], *rc["spec"]["workerGroupSpecs"]):
        env = group["template"]["spec"]["containers"][0]["env"]
        assert ref in env and endpoint in env
    # Ray's job API shows a job's runtime environment to anyone who can list jobs: no value from spec.env there.
    submitted = json.dumps(render.submission(job, "sid", "/pkg").runtime_env)
    assert "AWS_SECRET_ACCESS_KEY" not in submitted and "minio" not in submitted


@pytest.mark.parametrize(
    "name", ["AWS_ENDPOINT_URL", "HF_TOKEN", "HTTPS_PROXY", "aws_access_key_id", "MY_SETTING", "SSL_CERT_FILE"]
)
def test_a_variable_the_driver_needs_is_refused_in_network_env_with_the_way_to_pass_it(name: str) -> None:
    (found,) = problems({"network": {"env": [{"name": name, "value": "x"}]}})
    assert found == (
        f"spec.network.env[0].name: {name} is not a transport variable (NCCL_*, FI_*, ...), and network.env "
        "reaches the workers only; use spec.env, which reaches every Ray process (the job's driver on the head too)"
    )


def test_transport_variables_stay_in_network_env_on_the_workers_only() -> None:
    names = ["NCCL_ALGO", "nccl_buffsize", "TORCH_NCCL_ASYNC_ERROR_HANDLING", "OFI_NCCL_PROTOCOL", "GLOO_SOCKET_IFNAME",
             "CUDA_DEVICE_MAX_CONNECTIONS"]  # fmt: skip
    job = parse_job(manifest({"network": {"env": [{"name": n, "value": "1"} for n in names]}}))
    rc = render.raycluster(job)
    head = {e["name"] for e in rc["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["env"]}
    worker = {e["name"] for e in rc["spec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]["env"]}
    assert set(names) <= worker and not set(names) & head


def test_one_variable_is_set_in_one_place() -> None:
    assert problems({"env": [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]}) == [
        "spec.env[1].name: A is set twice"
    ]
    assert problems({"env": [{"name": "HF_HOME", "value": "/a"}], "runtimeEnv": {"envVars": {"HF_HOME": "/b"}}}) == [
        "spec.runtimeEnv.envVars.HF_HOME: HF_HOME is also set in spec.env; set it in one place (spec.env)"
    ]


TRANSPORT_NAMES = ["NCCL_ALGO", "nccl_buffsize", "NCCL_IB_HCA", "TORCH_NCCL_ASYNC_ERROR_HANDLING", "OFI_NCCL_PROTOCOL",
                   "OFI_NCCL_NIC_DUP_CONNS", "GLOO_SOCKET_IFNAME", "CUDA_DEVICE_MAX_CONNECTIONS", "RDMAV_FORK_SAFE",
                   "UCX_TLS", "NVSHMEM_REMOTE_TRANSPORT", " Nccl_Proto "]  # fmt: skip


@pytest.mark.parametrize("name", TRANSPORT_NAMES)
def test_transport_variables_are_refused_through_every_door_but_network_env(name: str) -> None:
    """spec.env and runtimeEnv.envVars would carry NCCL's or the EFA plugin's settings past network.env's checks."""
    found = problems({"env": [{"name": "OK", "value": "1"}, {"name": name.strip(), "value": "1"}]})
    assert found == [
        f"spec.env[1].name: {name.strip()} is a transport variable (NCCL_*, FI_*, OFI_NCCL_*, ...); set it in "
        "spec.network.env, where transport settings are checked and reach the training ranks only"
    ]
    (found,) = problems({"runtimeEnv": {"envVars": {name.strip(): "1"}}})
    assert found.startswith(f"spec.runtimeEnv.envVars.{name.strip()}: {name.strip()} is a transport variable")
    parse_job(manifest({"network": {"env": [{"name": name.strip(), "value": "1"}]}}))


@pytest.mark.parametrize("name", ["LD_LIBRARY_PATH", "ld_library_path", "NCCL_CONF_FILE"])
@pytest.mark.parametrize("door", ["env", "network.env", "runtimeEnv.envVars"])
def test_library_path_and_nccl_config_file_are_refused_through_every_door(name: str, door: str) -> None:
    """LD_LIBRARY_PATH hides the DLC's aws-ofi-nccl; NCCL_CONF_FILE sets NCCL_NET and the rest from a file."""
    if door == "runtimeEnv.envVars":
        spec: dict[str, Any] = {"runtimeEnv": {"envVars": {name: "/x"}}}
        where = f"spec.runtimeEnv.envVars.{name}"
    else:
        item = [{"name": name, "value": "/x"}]
        spec = {"env": item} if door == "env" else {"network": {"env": item}}
        where = f"spec.{door}[0].name"
    (found,) = problems(spec)
    assert found.startswith(f"{where}: {name} may not be set by a job: "), found
    assert ("aws-ofi-nccl" if name.upper() == "LD_LIBRARY_PATH" else "spec.network.env") in found


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"name": "1BAD"}, "spec.env[0].name: '1BAD' must be an environment variable name"),
        ({"name": "A=B", "value": "x"}, "spec.env[0].name: 'A=B' must be an environment variable name"),
        ({"value": "x"}, "spec.env[0].name: required"),
        ({"name": "A", "valueFrom": {}}, "spec.env[0].valueFrom: must set exactly one of secretKeyRef"),
    ],
)
def test_spec_env_entries_follow_the_pod_spec(env: dict[str, Any], expected: str) -> None:
    assert problems({"env": [env]})[0].startswith(expected)


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"name": "1BAD"}, "spec.network.env[0].name: '1BAD' must be an environment variable name"),
        ({"value": "x"}, "spec.network.env[0].name: required"),
        (
            {"name": "A", "value": "x", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
            "spec.network.env[0].valueFrom: may not be set together with value",
        ),
        (
            {"name": "A", "valueFrom": {}},
            "spec.network.env[0].valueFrom: must set exactly one of secretKeyRef, configMapKeyRef",
        ),
        (
            {"name": "A", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k", "extra": 1}}},
            "spec.network.env[0].valueFrom.secretKeyRef.extra: unknown field",
        ),
    ],
)
def test_env_entries_follow_the_pod_spec(env: dict[str, Any], expected: str) -> None:
    assert problems({"network": {"env": [env]}})[0].startswith(expected)


@pytest.mark.parametrize(
    ("requirement", "expected"),
    [
        ("--index-url https://evil.example/simple", "must be a requirement specifier, not a pip option"),
        ("-e git+https://x/y", "must be a requirement specifier, not a pip option"),
        ("pandas\n--extra-index-url x", "must be one requirement specifier on one line"),
        ("pandas >= 2 ; python_version <", "is not a requirement specifier (PEP 508"),
        ("pkg @ https://user:tok3n@host/x.whl", "must not carry credentials in its URL"),
    ],
)
def test_pip_entries_are_requirement_specifiers_only(requirement: str, expected: str) -> None:
    (found,) = problems({"runtimeEnv": {"pip": ["pandas>=2.2", requirement]}})
    assert found.startswith("spec.runtimeEnv.pip[1]: ") and expected in found
    assert "tok3n" not in found


def test_pip_requirement_specifiers_are_accepted() -> None:
    job = parse_job(manifest({"runtimeEnv": {"pip": ["pandas>=2.2", "torchao==0.9.0; python_version >= '3.10'"]}}))
    assert render.submission(job, "sid", "/pkg").runtime_env["pip"] == job.spec.runtime_env.pip


@pytest.mark.parametrize("label", ["node.kubernetes.io/instance-type", "beta.kubernetes.io/instance-type"])
def test_node_selector_that_contradicts_the_instance_type(label: str) -> None:
    found = problems({"workers": {"nodeSelector": {label: "p5.48xlarge", "pool": "train"}}})
    assert found == [
        f"spec.workers.nodeSelector.{label}: 'p5.48xlarge' contradicts spec.workers.instanceType (g6.12xlarge); "
        "choose the instance type with instanceType"
    ]


def test_node_selector_may_repeat_the_instance_type() -> None:
    job = parse_job(manifest({"workers": {"nodeSelector": {"node.kubernetes.io/instance-type": "g6.12xlarge"}}}))
    selector = render.raycluster(job)["spec"]["workerGroupSpecs"][0]["template"]["spec"]["nodeSelector"]
    assert selector == {"node.kubernetes.io/instance-type": "g6.12xlarge"}


# --- one contract with the training function ----------------------------------------------------------


def test_warmup_equal_to_steps_is_refused_by_the_one_rule() -> None:
    found = problems({"training": {"steps": 10, "warmupSteps": 10}})
    assert found == ["spec.training.warmupSteps: must be less than spec.training.steps (10 >= 10)."]
    with pytest.raises(ValueError, match=r"training\.warmup_steps must be less than training\.steps"):
        TrainConfig.from_dict({"steps": 10, "warmup_steps": 10})
    assert parse_job(manifest({"training": {"steps": 10, "warmupSteps": 9}})).spec.training.warmup_steps == 9


def test_the_training_function_gets_the_config_validation_built() -> None:
    job = parse_job(manifest({**CPU, "training": {"steps": 7, "gradientAccumulation": 3, "learningRate": 1e-3}}))
    handed = render.submission(job, "sid", "/pkg").config["train"]
    cfg = TrainConfig.from_dict(json.loads(json.dumps(handed)))  # as ray_entry reads it from the entrypoint
    assert cfg == train_config(job.spec)
    assert (cfg.steps, cfg.grad_accum, cfg.learning_rate, cfg.data) == (7, 3, 1e-3, "random")
    assert (cfg.lr_schedule, cfg.compile, cfg.model_init) == ("constant", True, "pretrained")


# --- Kubernetes grammars --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "value"),
    [("1.5Ki", 1536), ("100m", 0.1), ("+1", 1), ("1.", 1), (".5", 0.5), ("1E", 10**18), ("2e-3", 0.002), ("7n", 7e-9)],
)
def test_quantities_kubernetes_accepts(text: str, value: float) -> None:
    assert float(parse_quantity(text)) == pytest.approx(value)


@pytest.mark.parametrize(
    "text", [" 1", "1 ", "1\n", "1e3Gi", "1Ki2", "1K", "1.5.5", "", ".", "1e", "١", "0x10", "1e1.5"]
)
def test_quantities_kubernetes_refuses(text: str) -> None:
    with pytest.raises(ValueError, match="is not a Kubernetes quantity"):
        parse_quantity(text)


@pytest.mark.parametrize(
    ("image", "ok"),
    [
        ("rayproject/ray:2.58.0-py311-cpu", True),
        ("localhost:5000/team/ray@sha256:" + "a" * 64, True),
        ("[::1]:5000/ray:latest", True),
        ("Ray/Ray:1", False),
        ("ray:", False),
        ("ray:tag with space", False),
        ("ray@sha256:abc", False),
        ("-ray", False),
        ("registry.example.com/" + "a" * 300, False),
    ],
)
def test_image_references_follow_the_oci_grammar(image: str, ok: bool) -> None:
    if ok:
        assert parse_job(manifest({"image": image})).spec.image == image
    else:
        assert problems({"image": image})[0].startswith("spec.image: ")


@pytest.mark.parametrize(
    ("storage", "reason"),
    [
        ("s3://", "has no bucket (s3://BUCKET/prefix)"),
        ("s3:///prefix", "has no bucket (s3://BUCKET/prefix)"),
        ("s3://bucket/a/../b", "must not contain '..' segments"),
        ("/mnt/../etc", "must not contain '..' segments"),
        ("s3://AKIA:s3cr3t@bucket/x", "must not carry credentials in the URI"),
        ("s3://bucket/x?versionId=1", "must not have a query or fragment"),
        ("file://host/path", "file:// must be followed by an absolute path"),
        ("s3://bucket/with space", "must not contain white space or control characters"),
    ],
)
def test_checkpoint_uris_are_well_formed(storage: str, reason: str) -> None:
    (found,) = problems({"training": {"checkpoint": {"storage": storage}}})
    assert found.startswith("spec.training.checkpoint.storage: ") and reason in found
    assert "s3cr3t" not in found


@pytest.mark.parametrize(
    ("metadata", "expected"),
    [
        ({"name": "a" * 64}, "metadata.name: "),
        ({"name": "Job"}, "metadata.name: 'Job' must be a DNS-1123 label"),
        ({"namespace": "Prod"}, "metadata.namespace: 'Prod' must be a DNS-1123 label"),
        ({"labels": {"app": ["x"]}}, "metadata.labels.app: expected string, got array"),
        ({"labels": {"-bad": "x"}}, "metadata.labels: key '-bad' must be a qualified name"),
        ({"labels": {"a/b/c": "x"}}, "metadata.labels: key 'a/b/c' has a prefix that is not a DNS-1123 subdomain"),
        ({"labels": {"app": "x" * 64}}, "metadata.labels.app: longer than 63 characters"),
        ({"annotations": {"note": 5}}, "metadata.annotations.note: expected string, got integer (value hidden)"),
        ({"annotations": {"n": "x" * 262_144}}, "metadata.annotations: 262145 bytes in total, Kubernetes allows"),
        ({"generation": "1"}, "metadata.generation: expected integer, got string '1'"),
        ({"generation": -1}, "metadata.generation: must be at least 0, got -1"),
        ({"selfLinkk": "x"}, "metadata.selfLinkk: unknown field"),
    ],
)
def test_metadata_follows_kubernetes_rules(metadata: dict[str, Any], expected: str) -> None:
    assert problems(None, **metadata)[0].startswith(expected)


def test_metadata_as_kopf_hands_it_over_is_accepted() -> None:
    job = parse_job(
        manifest(
            None,
            namespace="ml",
            uid="0b8a2b5e-1111-2222-3333-444455556666",
            generation=3,
            resourceVersion="12345",
            creationTimestamp="2026-12-01T07:00:00Z",
            finalizers=["kopf.zalando.org/KopfFinalizerMarker"],
            managedFields=[{"manager": "kubectl", "fieldsV1": {"f:spec": {}}}],
            annotations={"kopf.zalando.org/last-handled-configuration": json.dumps({"spec": {}})},
            labels={"team": "ml"},
        )
    )
    assert (job.namespace, job.generation, job.labels) == ("ml", 3, {"team": "ml"})


def test_tolerations_are_checked_like_a_pod_spec() -> None:
    assert problems({"workers": {"tolerations": [{"operator": "Equal", "value": "x"}]}}) == [
        "spec.workers.tolerations[0].operator: must be Exists when key is empty (that tolerates every taint)"
    ]
    assert problems({"head": {"tolerations": [{"key": "a", "operator": "Exists", "value": "v"}]}}) == [
        "spec.head.tolerations[0].value: must be empty when operator is Exists"
    ]
    assert problems({"head": {"tolerations": [{"key": "a", "tolerationSeconds": 5}]}}) == [
        "spec.head.tolerations[0].effect: must be NoExecute when tolerationSeconds is set"
    ]
    assert problems({"head": {"tolerations": [{"key": "a", "operatr": "Exists"}]}})[0].startswith(
        "spec.head.tolerations[0].operatr: unknown field "
        "(known fields: effect, key, operator, tolerationSeconds, value)"
    )
    given = [{"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}]
    job = parse_job(manifest({"workers": {"tolerations": given}}))
    assert render.raycluster(job)["spec"]["workerGroupSpecs"][0]["template"]["spec"]["tolerations"][0] == given[0]


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({"training": {"learningRate": float("nan")}}, "spec.training.learningRate: must be a finite number, got nan"),
        ({"training": {"learningRate": float("inf")}}, "spec.training.learningRate: must be a finite number, got inf"),
        ({"training": {"steps": float("inf")}}, "spec.training.steps: expected integer, got number inf"),
        ({"training": {"seed": 2**32}}, "spec.training.seed: must be at most 4294967295, got 4294967296"),
        ({"training": {"steps": 10**30}}, "spec.training.steps: must be at most 100000000, got a 100-bit integer"),
        ({"workers": {"replicas": True}}, "spec.workers.replicas: expected integer, got boolean true"),
        ({"runPolicy": {"activeDeadlineSeconds": 2**31}}, "spec.runPolicy.activeDeadlineSeconds: must be at most"),
        ({"network": {"minCrossNodeBandwidthGBps": 10**400}}, "spec.network.minCrossNodeBandwidthGBps: must be at"),
        ({"workers": {"cpu": 10**5000}}, "spec.workers.cpu: a 16610-bit integer is out of range"),
    ],
)
def test_numbers_are_finite_and_bounded(spec: dict[str, Any], expected: str) -> None:
    assert problems(spec)[0].startswith(expected)


def test_long_values_are_truncated_in_messages() -> None:
    (found,) = problems({"workers": {"memory": "9" * 10_000 + "Gi"}})
    assert found == "spec.workers.memory: longer than 64 characters"
    (found,) = problems({"network": {"transport": "x" * 10_000}})
    assert len(found) < 200 and found.startswith("spec.network.transport: 'xxxxxxxx")


def test_missing_spec_and_unknown_top_level_fields() -> None:
    m = manifest()
    del m["spec"]
    m["sepc"] = {}
    with pytest.raises(SpecError) as info:
        parse_job(m)
    assert info.value.problems == [
        "sepc: unknown field (known fields: apiVersion, kind, metadata, spec, status)",
        "spec: required (`spec: {}` takes every default)",
    ]


# --- the same judgement as the CRD the API server applies ----------------------------------------------


def crd_schema() -> dict[str, Any]:
    (version,) = generate.crd()["spec"]["versions"]
    openapi: dict[str, Any] = version["schema"]["openAPIV3Schema"]
    return openapi


@pytest.mark.parametrize(
    "spec",
    [
        {"workers": {"replicas": 513}},
        {"workers": {"gpusPerWorker": -1}},
        {"training": {"learningRate": 0}},
        {"training": {"seqLen": 4}},
        {"workers": {"cpu": "1e3Gi"}},
        {"workers": {"cpu": " 1"}},
        {"network": {"transport": "ib"}},
        {"workers": {"tolerations": [{"key": "a", "bogus": 1}]}},
        {"runtimeEnv": {"envVars": {"A": 1}}},
        {"workers": {"nodeSelector": {"a": "x" * 64}}},
    ],
)
def test_what_the_crd_refuses_validate_refuses(spec: dict[str, Any]) -> None:
    m = manifest(spec)
    pruned, unknown = validation.prune(m, crd_schema())
    assert unknown or validation.validate(pruned, crd_schema()), "the CRD accepts it"
    with pytest.raises(SpecError):
        parse_job(m)


def test_yaml_numbers_are_read_as_kubectl_reads_them(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(
        "apiVersion: fsdp.dev/v1alpha1\nkind: FSDPTrainingJob\nmetadata: {name: j}\n"
        "spec:\n  training: {learningRate: 1e-4, steps: 1e3, seed: 0o17}\n  workers: {memory: 1e11}\n"
    )
    assert main(["validate", "-f", str(path)]) == 0
    from fsdp_operator.api.manifest_yaml import decode, load_all

    (doc,) = load_all(decode(path.read_bytes()))
    assert doc["spec"]["training"] == {"learningRate": 1e-4, "steps": 1000.0, "seed": 15}
    job = parse_job(doc)
    assert (job.spec.training.learning_rate, job.spec.training.steps) == (1e-4, 1000)
    assert job.spec.workers.memory == "100000000000"
    capsys.readouterr()


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1e-4", 1e-4),
        ("1_000", 1000),
        ("0x1F", 31),
        ("017", 15),
        ("0b101", 5),
        ("09", 9.0),
        ("1:30", "1:30"),
        ("y", True),
        ("off", False),
        ("2001-12-14", "2001-12-14"),
        ("1e400", "1e400"),
        (".5", 0.5),
        ("~", None),
    ],
)
def test_plain_scalars_resolve_as_go_yaml_v2(text: str, value: Any) -> None:
    from fsdp_operator.api.manifest_yaml import load_all

    (doc,) = load_all(f"v: {text}\n")
    assert doc["v"] == value and type(doc["v"]) is type(value)


def test_the_examples_in_the_docs_validate() -> None:
    for example in sorted((ROOT / "examples").glob("*.yaml")):
        job = parse_job(yaml.safe_load(example.read_text()))
        assert TrainConfig.from_dict(render.train_config(job)) == train_config(job.spec)


# --- precision and the compile cache ----------------------------------------------------------------------


def test_fp8_is_refused_on_gpus_without_fp8_tensor_cores() -> None:
    a10g = {"workers": {"instanceType": "g5.12xlarge", "efaPerWorker": 0}, "network": {"transport": "socket"}}
    assert problems({**a10g, "training": {"precision": "fp8"}}) == [
        "spec.training.precision: fp8 needs fp8 tensor cores; g5.12xlarge's A10G has none (use bf16 or auto)"
    ]
    assert parse_job(manifest({**a10g, "training": {"precision": "auto"}})).spec.training.precision == "auto"
    l4 = parse_job(manifest({"training": {"precision": "fp8"}}))  # the default g6.12xlarge: L4
    assert train_config(l4.spec).precision == "fp8"


def test_compile_cache_dir_reaches_the_training_function_and_must_be_absolute() -> None:
    job = parse_job(manifest({"training": {"compileCacheDir": "/mnt/shared/compile-cache"}}))
    assert train_config(job.spec).compile_cache_dir == "/mnt/shared/compile-cache"
    assert problems({"training": {"compileCacheDir": "cache"}}) == [
        "spec.training.compileCacheDir: 'cache' must be an absolute path"
    ]


def _env_from(source: dict[str, Any]) -> list[str]:
    return problems({"env": [{"name": "A", "valueFrom": source}]})


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ({"fieldRef": {"fieldPath": "metadata.labels"}}, "spec.env[0].valueFrom.fieldRef.fieldPath: "),
        ({"fieldRef": {"fieldPath": "spec.containers"}}, "spec.env[0].valueFrom.fieldRef.fieldPath: "),
        ({"fieldRef": {"fieldPath": "metadata.labels['-bad']"}}, "spec.env[0].valueFrom.fieldRef.fieldPath: "),
        (
            {"fieldRef": {"fieldPath": "metadata.name", "apiVersion": "v9"}},
            "spec.env[0].valueFrom.fieldRef.apiVersion: 'v9' is not supported",
        ),
        (
            {"resourceFieldRef": {"resource": "limits.nvidia.com/gpu"}},
            "spec.env[0].valueFrom.resourceFieldRef.resource: 'limits.nvidia.com/gpu' is not a resource",
        ),
        (
            {"resourceFieldRef": {"resource": "limits.cpu", "divisor": "3"}},
            "spec.env[0].valueFrom.resourceFieldRef.divisor: '3' is not a valid divisor for limits.cpu",
        ),
        (
            {"resourceFieldRef": {"resource": "requests.memory", "divisor": "1m"}},
            "spec.env[0].valueFrom.resourceFieldRef.divisor: '1m' is not a valid divisor for requests.memory",
        ),
    ],
)
def test_env_references_a_real_api_server_refuses_are_refused(source: dict[str, Any], expected: str) -> None:
    (found,) = _env_from(source)
    assert found.startswith(expected)


@pytest.mark.parametrize(
    "source",
    [
        {"fieldRef": {"fieldPath": path}}
        for path in ("metadata.name", "status.podIPs", "spec.nodeName", "metadata.labels['app.kubernetes.io/name']")
    ]
    + [{"fieldRef": {"fieldPath": "metadata.annotations['a/b']", "apiVersion": "v1"}}]
    + [
        {"resourceFieldRef": {"resource": resource, "divisor": divisor}}
        for resource, divisor in [
            ("limits.cpu", "1m"),
            ("requests.cpu", 1),
            ("limits.cpu", "1000m"),
            ("limits.memory", "1Mi"),
            ("requests.ephemeral-storage", "1G"),
            ("limits.hugepages-2Mi", "1Ki"),
        ]
    ],
)
def test_env_references_a_real_api_server_accepts_pass(source: dict[str, Any]) -> None:
    parse_job(manifest({"env": [{"name": "A", "valueFrom": source}]}))


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({"workers": {"memory": "160m"}}, "spec.workers.memory: '160m' is not a whole number of bytes"),
        ({"head": {"memory": "0.5"}}, "spec.head.memory: '0.5' is not a whole number of bytes"),
        ({"workers": {"sharedMemory": "1.5"}}, "spec.workers.sharedMemory: '1.5' is not a whole number of bytes"),
        ({"head": {"cpu": "1n"}}, "spec.head.cpu: '1n' is finer than 1m"),
        ({"workers": {"cpu": "40.0001"}}, "spec.workers.cpu: '40.0001' is finer than 1m"),
        (
            {"workers": {"memory": "64Gi", "sharedMemory": "65Gi"}},
            "spec.workers.sharedMemory: 65Gi is more than spec.workers.memory (64Gi), which it is counted in",
        ),
    ],
)
def test_resources_no_node_can_give_are_refused(spec: dict[str, Any], expected: str) -> None:
    (found,) = problems(spec)
    assert found.startswith(expected)


def test_resources_at_whole_units_pass() -> None:
    workers = {"cpu": "40.5", "sharedMemory": 2**30}
    job = parse_job(manifest({"head": {"cpu": "1m", "memory": "1e9"}, "workers": workers}))
    assert (job.spec.head.cpu, job.spec.workers.cpu) == ("1m", "40.5")
    # Left out, /dev/shm is the default or the whole memory when that is less, never more than memory.
    assert parse_job(manifest({"workers": {"memory": "12Gi"}})).spec.workers.shared_memory == "12Gi"
    assert parse_job(manifest()).spec.workers.shared_memory == "32Gi"


# --- the command line Ray starts ----------------------------------------------------------------------------


def _overrides(quotes_each: int) -> dict[str, Any]:
    # A `'` costs five bytes once shell-quoted ('"'"'): the most a value can grow in the entrypoint.
    return {"model": {"overrides": {f"key_{i}": "'" * quotes_each for i in range(64)}}}


def test_a_training_config_longer_than_one_argument_may_be_is_refused() -> None:
    """64 overrides of 1 KiB quotes made a 329 KB entrypoint; `/bin/sh -c` then fails: Argument list too long.
    Overrides are config fields of the model's class now, so the manifest is refused key by key."""
    found = problems(_overrides(1024))
    assert len(found) == 64 and all(p.startswith("spec.model.overrides.key_") for p in found), found[:2]


def test_a_config_over_one_argument_is_refused_naming_its_largest_field() -> None:
    from fsdp_operator.api import command_line
    from fsdp_operator.api.spec import _train_paths

    job = parse_job(manifest({}))
    found: list[str] = []
    command_line.check({"data": "'" * 30000}, job.spec.runtime_env.env_vars, lambda n: _train_paths()[n], found)
    (message,) = found
    assert message.startswith("spec.data.source: the training config would be a 15")
    assert "Linux starts no process with one over 131072 bytes" in message


def test_the_longest_accepted_strings_still_fit_one_argument() -> None:
    from fsdp_operator.api.command_line import MAX_ARG_STRLEN

    longest = "s3://" + "b" * 63 + "/" + "p" * 900
    spec = {
        "training": {"checkpoint": {"storage": longest}},
        "data": {"source": longest, "validationSource": longest, "tokenizer": longest[:256]},
        "output": {"storage": longest},
    }
    entrypoint = render.submission(parse_job(manifest(spec, name="j" * 63)), "sid", "/pkg").entrypoint
    assert len(entrypoint.encode()) < MAX_ARG_STRLEN


def test_an_environment_larger_than_a_process_may_have_is_refused() -> None:
    env = {f"VAR_{i}": "x" * 32768 for i in range(40)}
    (found,) = problems({"runtimeEnv": {"envVars": env}})
    assert found.startswith("spec.runtimeEnv.envVars: 1311")


def test_the_environment_budget_counts_the_training_config_beside_the_variables_at_its_boundary() -> None:
    """The job's variables and its entrypoint's training config share ENVIRONMENT_BUDGET: exactly at it is
    accepted, one byte more is refused naming spec.runtimeEnv.envVars (without the config's own size, an entrypoint
    over the limit was accepted)."""
    from fsdp_operator.api.command_line import ENVIRONMENT_BUDGET, check, command_line_bytes

    config = {"steps": 10, "data": "x" * 5000}
    size = command_line_bytes(config)
    for extra, refused in ((0, False), (1, True)):
        value = "v" * (ENVIRONMENT_BUDGET - size - len("BIG=") - 1 + extra)  # each variable: NAME=VALUE and a NUL
        found: list[str] = []
        check(config, {"BIG": value}, lambda name: f"spec.training.{name}", found)
        assert bool(found) is refused, found
        assert all(problem.startswith("spec.runtimeEnv.envVars: ") for problem in found)
