"""The hardware catalog: its figures against EC2's instance-type data (as moto ships it), and its readers."""

from __future__ import annotations

import re
import subprocess
import sys
from typing import Any

import pytest

boto3 = pytest.importorskip("boto3")
moto = pytest.importorskip("moto")

from fsdp_operator.api import render, schema  # noqa: E402
from fsdp_operator.api.spec import Job, Spec, SpecError, parse_job  # noqa: E402
from fsdp_train.contract import catalog  # noqa: E402
from fsdp_train.watch.metrics import peak_flops  # noqa: E402


def parse_spec(spec: dict[str, Any]) -> Spec:
    return parse_job(
        {"apiVersion": schema.API_VERSION, "kind": schema.KIND, "metadata": {"name": "j"}, "spec": spec}
    ).spec


@pytest.fixture(scope="module")
def ec2_instance_types() -> dict[str, dict[str, object]]:
    """`DescribeInstanceTypes` for every catalog entry, answered by moto from EC2's published data."""
    with pytest.MonkeyPatch.context() as patch:
        # moto's thousands of public AMIs cost seconds and nothing here needs them.
        patch.setenv("MOTO_EC2_LOAD_DEFAULT_AMIS", "false")
        with moto.mock_aws():
            ec2 = boto3.client("ec2", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
            answer = ec2.describe_instance_types(InstanceTypes=sorted(catalog.INSTANCE_TYPES))
    return {item["InstanceType"]: item for item in answer["InstanceTypes"]}


def _gbps(performance: str) -> float:
    """EC2's `NetworkPerformance` text as Gbit/s: "Up to 10 Gigabit" -> 10, "4x 100 Gigabit" -> 400."""
    match = re.fullmatch(r"(?:(\d+)x )?(?:Up to )?([\d.]+) Gigabit", performance)
    assert match, performance
    return float(match.group(2)) * int(match.group(1) or 1)


@pytest.mark.parametrize("name", sorted(catalog.INSTANCE_TYPES))
def test_each_entry_agrees_with_ec2(name: str, ec2_instance_types: dict[str, dict[str, object]]) -> None:
    entry = catalog.INSTANCE_TYPES[name]
    ec2 = ec2_instance_types[name]
    gpus = ec2["GpuInfo"]["Gpus"]  # type: ignore[index]
    assert len(gpus) == 1
    assert (entry.gpu.name, entry.gpus, entry.gpu_memory_mib) == (
        gpus[0]["Name"],
        gpus[0]["Count"],
        gpus[0]["MemoryInfo"]["SizeInMiB"],
    )
    assert entry.vcpus == ec2["VCpuInfo"]["DefaultVCpus"]  # type: ignore[index]
    assert entry.memory_mib == ec2["MemoryInfo"]["SizeInMiB"]  # type: ignore[index]
    network = ec2["NetworkInfo"]
    efa = network["EfaInfo"]["MaximumEfaInterfaces"] if network["EfaSupported"] else 0  # type: ignore[index]
    assert entry.efa_interfaces == efa
    performance = str(network["NetworkPerformance"])  # type: ignore[index]
    if performance.startswith("Up to"):
        # Burstable: the sustained rate is the (single) network card's baseline.
        assert entry.burst_gbps == _gbps(performance)
        assert entry.network_gbps == network["NetworkCards"][0]["BaselineBandwidthInGbps"]  # type: ignore[index]
    else:
        assert entry.burst_gbps is None
        assert entry.network_gbps == _gbps(performance)


@pytest.mark.parametrize("name", sorted(catalog.INSTANCE_TYPES))
def test_max_pods_is_what_the_vpc_cni_gives_on_ec2s_network_data(
    name: str, ec2_instance_types: dict[str, dict[str, object]]
) -> None:
    """amazon-eks-ami's eni-max-pods.txt formula: ENIs of network card 0 * (IPv4 per ENI - 1) + 2."""
    network: Any = ec2_instance_types[name]["NetworkInfo"]
    (card0,) = [card for card in network["NetworkCards"] if card["NetworkCardIndex"] == 0]
    expected = card0["MaximumNetworkInterfaces"] * (network["Ipv4AddressesPerInterface"] - 1) + 2
    assert catalog.INSTANCE_TYPES[name].max_pods == expected


def test_allocatable_follows_the_eks_ami_reservations() -> None:
    # amazon-eks-ami: kube-reserved cpu 6% + 1% + 2 * 0.5% + 0.25% per further core; t3.xlarge (4) keeps 80m.
    assert [catalog.eks_reserved_millicpu(n) for n in (1, 2, 4, 48, 192)] == [60, 70, 80, 190, 550]
    # kube-reserved memory 11Mi per pod + 255Mi, and the 100Mi hard eviction threshold.
    assert catalog.eks_reserved_memory_mib(234) == 11 * 234 + 255 + 100
    g6 = catalog.INSTANCE_TYPES["g6.12xlarge"]
    assert (g6.allocatable_millicpu, g6.allocatable_memory_mib) == (47810, 196608 - 2929)


def test_a_worker_asking_for_the_raw_capacity_is_refused_with_the_allocatable() -> None:
    with pytest.raises(SpecError) as e:
        parse_spec({"workers": {"instanceType": "g6.12xlarge", "memory": "192Gi", "cpu": 48}})
    assert e.value.problems == [
        "spec.workers.cpu: 48 CPUs requested, a g6.12xlarge node leaves 47810m allocatable to pods (48 vCPUs less "
        "190m kube-reserved on EKS AMIs)",
        "spec.workers.memory: 192Gi requested, a g6.12xlarge node leaves 193679Mi allocatable to pods (196608Mi "
        "less 2929Mi kube-reserved and eviction threshold for 234 pods on EKS AMIs)",
    ]
    parse_spec({"workers": {"instanceType": "g6.12xlarge", "memory": "193679Mi", "cpu": "47810m"}})


def test_covers_the_training_families_in_several_sizes() -> None:
    families: dict[str, int] = {}
    for entry in catalog.INSTANCE_TYPES.values():
        families[entry.family] = families.get(entry.family, 0) + 1
    for family in ("g5", "g6", "g6e"):
        assert families[family] >= 4, family
    for family in ("p4d", "p5", "p5e", "p5en"):
        assert families[family] >= 1, family


def test_gpu_peaks_and_fp8_support() -> None:
    # NVIDIA data sheets, dense: L4 121 / 242.5, L40S 362.05 / 733, H100 and H200 989 / 1979 TFLOP/s.
    assert (catalog.L4.bf16_tflops, catalog.L4.fp8_tflops) == (121.0, 242.5)
    assert (catalog.L40S.bf16_tflops, catalog.L40S.fp8_tflops) == (362.05, 733.0)
    assert (catalog.H100.fp8_tflops, catalog.H200.fp8_tflops) == (1979.0, 1979.0)
    # Ampere has no fp8 tensor cores.
    assert not catalog.A10G.supports_fp8 and catalog.A10G.fp8_flops is None
    assert not catalog.A100.supports_fp8
    assert catalog.INSTANCE_TYPES["p5en.48xlarge"].gpu.supports_fp8
    assert catalog.INSTANCE_TYPES["g6.12xlarge"].gpu.bf16_flops == 121e12


def test_cuda_device_names_find_their_gpu() -> None:
    assert catalog.gpu_for_device("NVIDIA A100-SXM4-80GB") is catalog.A100
    assert catalog.gpu_for_device("NVIDIA H100 80GB HBM3") is catalog.H100
    assert catalog.gpu_for_device("NVIDIA L40S") is catalog.L40S
    assert catalog.gpu_for_device("NVIDIA L4") is catalog.L4
    assert catalog.gpu_for_device("NVIDIA GH200 480GB") is catalog.GH200
    assert catalog.gpu_for_device("NVIDIA L40") is None
    assert catalog.gpu_for_device("cpu") is None
    # The MFU code reads the same table.
    assert peak_flops("NVIDIA H200") == 989e12


def test_quota_of_each_family() -> None:
    assert catalog.on_demand_quota("g6.12xlarge") is catalog.G_AND_VT
    assert catalog.G_AND_VT.code == "L-DB2E81BA"
    assert catalog.on_demand_quota("gr6.4xlarge") is catalog.G_AND_VT
    assert catalog.on_demand_quota("vt1.3xlarge") is catalog.G_AND_VT
    assert catalog.on_demand_quota("p5en.48xlarge") is catalog.P_INSTANCES
    assert catalog.on_demand_quota("p6-b200.48xlarge") is catalog.P_INSTANCES
    assert catalog.P_INSTANCES.code == "L-417A185B"
    assert catalog.on_demand_quota("m5.large") is None
    assert catalog.on_demand_quota("inf2.xlarge") is None


def test_interconnect_floor_from_the_line_rate() -> None:
    assert catalog.interconnect_floor_gbps("g6.12xlarge") == 5.0
    assert catalog.interconnect_floor_gbps("p5.48xlarge") == 400.0
    assert catalog.interconnect_floor_gbps("g5.xlarge") == 2.5 / 8  # the baseline, not the burst
    assert catalog.interconnect_floor_gbps("x9.unknown") == 0.0
    spec = parse_spec({"workers": {"instanceType": "g6e.48xlarge", "gpusPerWorker": 8, "efaPerWorker": 4}})
    assert spec.network.min_cross_node_gbps == 50.0


def test_validation_reads_the_catalog() -> None:
    with pytest.raises(SpecError) as e:
        parse_spec(
            {
                "workers": {"instanceType": "g6.xlarge", "gpusPerWorker": 1, "efaPerWorker": 0},
                "network": {"transport": "socket"},
            }
        )
    assert e.value.problems == [
        "spec.workers.cpu: 40 CPUs requested, a g6.xlarge node leaves 3920m allocatable to pods (4 vCPUs less 80m "
        "kube-reserved on EKS AMIs)",
        "spec.workers.memory: 160Gi requested, a g6.xlarge node leaves 15391Mi allocatable to pods (16384Mi less "
        "993Mi kube-reserved and eviction threshold for 58 pods on EKS AMIs)",
    ]
    with pytest.raises(SpecError) as e:
        parse_spec({"workers": {"instanceType": "p5en.48xlarge", "gpusPerWorker": 9, "efaPerWorker": 17}})
    assert e.value.problems == [
        "spec.workers.gpusPerWorker: 9 GPUs requested, p5en.48xlarge has 8",
        "spec.workers.efaPerWorker: 17 EFA interfaces requested, p5en.48xlarge has 16",
    ]
    # A type the catalog does not know stays usable with explicit counts and sockets.
    spec = parse_spec(
        {
            "workers": {"instanceType": "g7.future", "gpusPerWorker": 2, "efaPerWorker": 0},
            "network": {"transport": "socket"},
        }
    )
    assert (spec.workers.gpus_per_worker, spec.network.min_cross_node_gbps) == (2, 0.0)


def test_the_catalog_imports_no_torch() -> None:
    code = "import sys, fsdp_train.contract.catalog; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "False\n"


def test_transport_auto_requests_efa_only_where_the_catalog_has_it() -> None:
    small = {"instanceType": "g5.4xlarge", "gpusPerWorker": 1, "cpu": 8, "memory": "32Gi"}  # no EFA on EC2
    for transport, problems in (("efa", ["spec.workers.efaPerWorker: g5.4xlarge does not support EFA"]), ("auto", [])):
        try:
            spec = parse_spec({"workers": small, "network": {"transport": transport}})
            found: list[str] = []
        except SpecError as e:
            found = e.problems
        assert found == problems, transport
    job = Job("j", "ml", "uid", 1, spec)
    (workers,) = render.raycluster(job)["spec"]["workerGroupSpecs"]
    (container,) = workers["template"]["spec"]["containers"]
    assert "vpc.amazonaws.com/efa" not in container["resources"]["limits"]
    assert {e["name"]: e.get("value") for e in container["env"]}["NCCL_NET"] == "Socket"
    # The same spec on a type with EFA requests it.
    job = Job("j", "ml", "uid", 1, parse_spec({"network": {"transport": "auto"}}))
    (workers,) = render.raycluster(job)["spec"]["workerGroupSpecs"]
    (container,) = workers["template"]["spec"]["containers"]
    assert container["resources"]["limits"]["vpc.amazonaws.com/efa"] == "1"
