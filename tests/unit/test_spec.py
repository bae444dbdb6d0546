"""The typed spec: defaults from the CRD schema and every validation rule, one field-path line each."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from fsdp_operator.api import generate, schema
from fsdp_operator.api.spec import NotAJobError, SpecError, parse_job, parse_quantity


def manifest(spec: dict[str, Any] | None = None, name: str = "job") -> dict[str, Any]:
    return {
        "apiVersion": schema.API_VERSION,
        "kind": schema.KIND,
        "metadata": {"name": name},
        "spec": spec or {},
    }


def problems(spec: dict[str, Any], name: str = "job") -> list[str]:
    with pytest.raises(SpecError) as info:
        parse_job(manifest(spec, name))
    return info.value.problems


def test_defaults_reproduce_the_reference_setup() -> None:
    spec = parse_job(manifest()).spec
    assert spec.image == "public.ecr.aws/deep-learning-containers/ray:train-ml-cuda-v1.1"
    assert spec.ray_version == "2.58.0"
    assert spec.model.name == "Qwen/Qwen2.5-1.5B"
    w = spec.workers
    assert (w.replicas, w.instance_type, w.gpus_per_worker, w.efa_per_worker) == (2, "g6.12xlarge", 4, 1)
    assert w.ranks_per_worker == 4 and w.world_size == 8
    assert spec.network.transport == "efa" and spec.network.require_efa is True
    assert spec.network.min_cross_node_gbps == 5.0  # 40 Gbps line rate
    assert spec.efa_requested
    assert spec.run_policy.cleanup == "Delete" and spec.run_policy.active_deadline_seconds is None


def test_defaults_do_not_leak_between_parses() -> None:
    first = parse_job(manifest({"network": {"env": [{"name": "NCCL_ALGO", "value": "1"}]}}))
    second = parse_job(manifest())
    assert first.spec.network.env and not second.spec.network.env


def test_require_efa_defaults_false_for_socket_and_auto() -> None:
    for transport in ("socket", "auto"):
        spec = parse_job(manifest({"network": {"transport": transport}})).spec
        assert spec.network.require_efa is False
    assert not parse_job(manifest({"network": {"transport": "socket"}})).spec.efa_requested


def test_more_gpus_than_the_instance_type_has() -> None:
    assert problems({"workers": {"gpusPerWorker": 5}}) == [
        "spec.workers.gpusPerWorker: 5 GPUs requested, g6.12xlarge has 4"
    ]


def test_efa_on_a_type_without_efa() -> None:
    # EC2: the g5 sizes below 8xlarge have no EFA (g5.12xlarge has one interface).
    found = problems({"workers": {"instanceType": "g5.4xlarge", "gpusPerWorker": 1, "cpu": 8, "memory": "32Gi"}})
    assert found == ["spec.workers.efaPerWorker: g5.4xlarge does not support EFA"]


def test_more_efa_interfaces_than_the_type_has() -> None:
    found = problems({"workers": {"efaPerWorker": 2}})
    assert found == ["spec.workers.efaPerWorker: 2 EFA interfaces requested, g6.12xlarge has 1"]


def test_efa_on_an_unknown_type_is_named() -> None:
    found = problems({"workers": {"instanceType": "x9.huge"}})
    assert found[0].startswith("spec.workers.efaPerWorker: unknown instance type 'x9.huge'")


def test_require_efa_contradicts_socket() -> None:
    found = problems({"network": {"transport": "socket", "requireEFA": True}})
    assert "spec.network.requireEFA: true contradicts transport: socket" in found


def test_efa_transport_without_efa_interfaces() -> None:
    found = problems({"workers": {"efaPerWorker": 0}})
    assert "spec.network.transport: efa needs spec.workers.efaPerWorker >= 1" in found


def test_hybrid_sharding_with_one_worker() -> None:
    found = problems({"workers": {"replicas": 1}, "training": {"sharding": "hybrid"}})
    assert found == ["spec.training.sharding: hybrid needs at least 2 workers (it replicates across nodes)"]


def test_unknown_fields_are_named_with_their_path() -> None:
    found = problems({"workers": {"replica": 3}, "trainig": {}})
    assert any(p.startswith("spec.workers.replica: unknown field") for p in found)
    assert any(p.startswith("spec.trainig: unknown field") for p in found)


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({"workers": {"memory": "lots"}}, "spec.workers.memory: 'lots' is not a Kubernetes quantity"),
        ({"head": {"cpu": "2 cores"}}, "spec.head.cpu: '2 cores' is not a Kubernetes quantity"),
        ({"workers": {"sharedMemory": "0"}}, "spec.workers.sharedMemory: '0' must be positive"),
    ],
)
def test_quantities_that_do_not_parse(spec: dict[str, Any], expected: str) -> None:
    assert any(p.startswith(expected) for p in problems(spec))


@pytest.mark.parametrize("storage", ["http://host/ckpt", "ftp://x", "relative/path"])
def test_unsupported_checkpoint_storage(storage: str) -> None:
    found = problems({"training": {"checkpoint": {"storage": storage}}})
    assert found[0] == (
        f"spec.training.checkpoint.storage: {storage!r} has an unsupported scheme "
        "(use s3://, gs://, file:// or an absolute path)"
    )


@pytest.mark.parametrize("storage", ["s3://bucket/run", "gs://bkt/p", "file:///mnt/ckpt", "/mnt/fsx/ckpt"])
def test_supported_checkpoint_storage(storage: str) -> None:
    # A local path is shared by the workers only on a shared volume (tests/unit/test_refused_up_front.py).
    volume = {"claimName": "fsx", "mountPath": "/mnt"}
    checkpoint = {"storage": storage, "intervalSteps": 10}
    job = parse_job(manifest({"training": {"checkpoint": checkpoint}, "sharedVolume": volume}))
    assert job.spec.training.checkpoint.storage == storage


def test_types_enums_and_bounds_come_from_the_schema() -> None:
    found = problems(
        {
            "workers": {"replicas": 0, "gpusPerWorker": "four"},
            "network": {"transport": "infiniband"},
            "training": {"learningRate": 0, "steps": 2.5},
        }
    )
    assert "spec.workers.replicas: must be at least 1, got 0" in found
    assert "spec.workers.gpusPerWorker: expected integer, got string 'four'" in found
    assert "spec.network.transport: 'infiniband' is not one of efa, socket, auto" in found
    assert "spec.training.learningRate: must be greater than 0, got 0" in found
    assert "spec.training.steps: expected integer, got number 2.5" in found


def test_cpu_training_needs_ranks_per_worker() -> None:
    found = problems(
        {"workers": {"gpusPerWorker": 0, "efaPerWorker": 0, "instanceType": ""}, "network": {"transport": "socket"}}
    )
    assert found == ["spec.workers.ranksPerWorker: required when gpusPerWorker is 0 (CPU training)"]


def test_one_rank_per_gpu() -> None:
    found = problems({"workers": {"ranksPerWorker": 2}})
    assert found == ["spec.workers.ranksPerWorker: must equal gpusPerWorker (4): one rank per GPU"]


def test_every_problem_is_reported_at_once() -> None:
    # Malformed fields are all named together; rules across fields (here: one per group, and the
    # training function's own) all together once every field is well-formed.
    found = problems({"workers": {"replicas": 0, "memory": "x"}, "training": {"steps": -1}})
    assert len(found) == 3
    found = problems(
        {
            "workers": {"gpusPerWorker": 5},
            "network": {"transport": "socket", "requireEFA": True},
            "training": {"warmupSteps": 100},
        }
    )
    assert found == [
        "spec.workers.gpusPerWorker: 5 GPUs requested, g6.12xlarge has 4",
        "spec.network.requireEFA: true contradicts transport: socket",
        "spec.training.warmupSteps: must be less than spec.training.steps (100 >= 100).",
    ]


def test_bad_metadata_name() -> None:
    assert problems({}, name="Bad_Name")[0].startswith("metadata.name: 'Bad_Name' must be a DNS-1123 label")
    assert problems({}, name="x" * 64)[0].startswith("metadata.name:")


def test_not_a_job() -> None:
    for doc in (["a", "list"], {"apiVersion": "v1", "kind": "Pod"}):
        with pytest.raises(NotAJobError):
            parse_job(doc)


def test_the_input_manifest_is_not_modified() -> None:
    original = manifest({"workers": {"replicas": 3}})
    before = copy.deepcopy(original)
    parse_job(original)
    assert original == before


@pytest.mark.parametrize(
    ("text", "value"),
    [("2", 2), ("500m", 0.5), ("8Gi", 8 * 2**30), ("1.5G", 1.5e9), (40, 40), ("1e3", 1000)],
)
def test_parse_quantity(text: str | int, value: float) -> None:
    assert float(parse_quantity(text)) == value


def test_every_schema_field_is_described_and_typed() -> None:
    def walk(node: dict[str, Any], path: str) -> None:
        assert node.get("description"), f"{path} has no description"
        assert "type" in node or "anyOf" in node, f"{path} has no type"
        if node.get("type") == "integer" or node.get("type") == "number":
            assert "minimum" in node and "maximum" in node, f"{path} is unbounded"
        if node.get("type") == "string" and "enum" not in node:
            assert "maxLength" in node, f"{path} has no length bound"
        for key, sub in node.get("properties", {}).items():
            walk(sub, f"{path}.{key}")
        items = node.get("items", {})
        for key, sub in items.get("properties", {}).items():
            walk(sub, f"{path}[].{key}")

    walk(generate.spec_schema(), "spec")
