"""The hardware catalog: per EC2 instance type its GPUs, EFA, network, vCPUs and memory; per GPU its peaks.

Torch-free and import-free, so both sides read the same table: the operator's validation, rendering,
interconnect floor and `fsdpctl capacity`, and the training function's MFU. Adding an instance type
is one `InstanceType(...)` line in `INSTANCE_TYPES`; the figures are EC2's own
(`aws ec2 describe-instance-types`), and `tests/unit/test_catalog.py` checks them against the EC2
instance-type data that moto ships.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class GpuModel:
    """A GPU as EC2 names it, with NVIDIA's published dense (non-sparse) tensor-core peaks per GPU."""

    name: str
    """EC2's name (`GpuInfo.Gpus[].Name`), also a whole word of CUDA's device name ("NVIDIA L4")."""
    bf16_tflops: float
    """Dense bf16 peak in TFLOP/s: the denominator of MFU."""
    fp8_tflops: float | None
    """Dense fp8 peak in TFLOP/s; None for GPUs without fp8 tensor cores (Ampere: A10G, A100)."""

    @property
    def bf16_flops(self) -> float:
        return self.bf16_tflops * 1e12

    @property
    def fp8_flops(self) -> float | None:
        return self.fp8_tflops * 1e12 if self.fp8_tflops else None

    @property
    def supports_fp8(self) -> bool:
        return bool(self.fp8_tflops)


# NVIDIA's data sheets, dense figures (the sparse ones are twice these). H100 and H200 are the SXM parts
# that p5/p5e/p5en carry; B200 is the HGX part of p6-b200.
A10G = GpuModel("A10G", 125.0, None)
L4 = GpuModel("L4", 121.0, 242.5)
L40S = GpuModel("L40S", 362.05, 733.0)
A100 = GpuModel("A100", 312.0, None)
H100 = GpuModel("H100", 989.0, 1979.0)
H200 = GpuModel("H200", 989.0, 1979.0)
B200 = GpuModel("B200", 2250.0, 4500.0)
# Not in any EC2 type listed below, but CUDA device names the training function may meet elsewhere.
GH200 = GpuModel("GH200", 989.0, 1979.0)
H20 = GpuModel("H20", 148.0, 296.0)

GPU_MODELS: dict[str, GpuModel] = {gpu.name: gpu for gpu in (A10G, L4, L40S, A100, H100, H200, B200, GH200, H20)}


@dataclass(frozen=True, slots=True)
class InstanceType:
    """One EC2 GPU instance type, as `describe-instance-types` reports it."""

    name: str
    gpu: GpuModel
    gpus: int
    gpu_memory_mib: int
    """Memory per GPU as EC2 reports it (`GpuInfo.Gpus[].MemoryInfo.SizeInMiB`)."""
    vcpus: int
    memory_mib: int
    efa_interfaces: int
    """`EfaInfo.MaximumEfaInterfaces`; 0 when the type does not support EFA."""
    network_gbps: float
    """Sustained network bandwidth per instance in Gbit/s: the basis of the default interconnect floor."""
    burst_gbps: float | None = None
    """For "Up to N Gigabit" types, N: reached only in bursts (`network_gbps` is the baseline)."""

    @property
    def family(self) -> str:
        """`g6` for `g6.12xlarge`, `p6-b200` for `p6-b200.48xlarge`."""
        return self.name.split(".", 1)[0]

    @property
    def on_demand_quota(self) -> OnDemandQuota | None:
        return on_demand_quota(self.name)

    @property
    def max_pods(self) -> int:
        """The kubelet's maxPods on an EKS AMI: what the VPC CNI can give pods (`EKS_MAX_PODS`)."""
        return EKS_MAX_PODS[self.name]

    @property
    def allocatable_millicpu(self) -> int:
        """CPU left to pods on an EKS AMI node in millicores: the vCPUs less kube-reserved (`eks_reserved_millicpu`)."""
        return self.vcpus * 1000 - eks_reserved_millicpu(self.vcpus)

    @property
    def allocatable_memory_mib(self) -> int:
        """Memory left to pods on an EKS AMI node, in MiB: EC2's figure less kube-reserved and the hard eviction
        threshold (`eks_reserved_memory_mib`). An upper bound: the kernel keeps some of EC2's figure too."""
        return self.memory_mib - eks_reserved_memory_mib(self.max_pods)


# fmt: off
# name, GPU model, GPUs, MiB per GPU, vCPUs, memory MiB, EFA interfaces, Gbit/s sustained[, Gbit/s burst]
INSTANCE_TYPES: dict[str, InstanceType] = {t.name: t for t in (
    InstanceType("g5.xlarge",        A10G, 1, 22888,   4,   16384, 0,   2.5, 10),
    InstanceType("g5.2xlarge",       A10G, 1, 22888,   8,   32768, 0,   5,   10),
    InstanceType("g5.4xlarge",       A10G, 1, 22888,  16,   65536, 0,  10,   25),
    InstanceType("g5.8xlarge",       A10G, 1, 22888,  32,  131072, 1,  25),
    InstanceType("g5.12xlarge",      A10G, 4, 22888,  48,  196608, 1,  40),
    InstanceType("g5.16xlarge",      A10G, 1, 22888,  64,  262144, 1,  25),
    InstanceType("g5.24xlarge",      A10G, 4, 22888,  96,  393216, 1,  50),
    InstanceType("g5.48xlarge",      A10G, 8, 22888, 192,  786432, 1, 100),
    InstanceType("g6.xlarge",        L4,   1, 22888,   4,   16384, 0,   2.5, 10),
    InstanceType("g6.2xlarge",       L4,   1, 22888,   8,   32768, 0,   5,   10),
    InstanceType("g6.4xlarge",       L4,   1, 22888,  16,   65536, 0,  10,   25),
    InstanceType("g6.8xlarge",       L4,   1, 22888,  32,  131072, 1,  25),
    InstanceType("g6.12xlarge",      L4,   4, 22888,  48,  196608, 1,  40),
    InstanceType("g6.16xlarge",      L4,   1, 22888,  64,  262144, 1,  25),
    InstanceType("g6.24xlarge",      L4,   4, 22888,  96,  393216, 1,  50),
    InstanceType("g6.48xlarge",      L4,   8, 22888, 192,  786432, 1, 100),
    InstanceType("g6e.xlarge",       L40S, 1, 45776,   4,   32768, 0,   2.5, 20),
    InstanceType("g6e.2xlarge",      L40S, 1, 45776,   8,   65536, 0,   5,   20),
    InstanceType("g6e.4xlarge",      L40S, 1, 45776,  16,  131072, 0,  20),
    InstanceType("g6e.8xlarge",      L40S, 1, 45776,  32,  262144, 1,  25),
    InstanceType("g6e.12xlarge",     L40S, 4, 45776,  48,  393216, 1, 100),
    InstanceType("g6e.16xlarge",     L40S, 1, 45776,  64,  524288, 1,  35),
    InstanceType("g6e.24xlarge",     L40S, 4, 45776,  96,  786432, 2, 200),
    InstanceType("g6e.48xlarge",     L40S, 8, 45776, 192, 1572864, 4, 400),
    InstanceType("p4d.24xlarge",     A100, 8, 40960,  96, 1179648, 4, 400),
    InstanceType("p4de.24xlarge",    A100, 8, 81920,  96, 1179648, 4, 400),
    InstanceType("p5.4xlarge",       H100, 1, 81920,  16,  262144, 1, 100),
    InstanceType("p5.48xlarge",      H100, 8, 81920, 192, 2097152, 32, 3200),
    InstanceType("p5e.48xlarge",     H200, 8, 144384, 192, 2097152, 32, 3200),
    InstanceType("p5en.48xlarge",    H200, 8, 144384, 192, 2097152, 16, 3200),
    InstanceType("p6-b200.48xlarge", B200, 8, 183359, 192, 2097152, 8, 3200),
)}
# fmt: on

# maxPods per type as the EKS AMIs set it (amazon-eks-ami, nodeadm/internal/kubelet/eni-max-pods.txt):
# ENIs of network card 0 * (IPv4 addresses per ENI - 1) + 2 host-network pods (the VPC CNI and kube-proxy).
# tests/unit/test_catalog.py recomputes each from EC2's data.
# fmt: off
EKS_MAX_PODS: dict[str, int] = {
    "g5.xlarge": 58, "g5.2xlarge": 58, "g5.4xlarge": 234, "g5.8xlarge": 234,
    "g5.12xlarge": 737, "g5.16xlarge": 234, "g5.24xlarge": 737, "g5.48xlarge": 345,
    "g6.xlarge": 58, "g6.2xlarge": 58, "g6.4xlarge": 234, "g6.8xlarge": 234,
    "g6.12xlarge": 234, "g6.16xlarge": 737, "g6.24xlarge": 737, "g6.48xlarge": 737,
    "g6e.xlarge": 58, "g6e.2xlarge": 58, "g6e.4xlarge": 234, "g6e.8xlarge": 234,
    "g6e.12xlarge": 292, "g6e.16xlarge": 737, "g6e.24xlarge": 492, "g6e.48xlarge": 492,
    "p4d.24xlarge": 737, "p4de.24xlarge": 737, "p5.4xlarge": 118, "p5.48xlarge": 100,
    "p5e.48xlarge": 100, "p5en.48xlarge": 198, "p6-b200.48xlarge": 198,
}
# fmt: on

# The hard eviction threshold EKS AMIs give the kubelet (evictionHard memory.available): never allocatable.
EKS_EVICTION_HARD_MEMORY_MIB = 100


def eks_reserved_memory_mib(max_pods: int) -> int:
    """Memory an EKS AMI node keeps from pods, in MiB: kube-reserved (11 MiB per pod + 255 MiB,
    amazon-eks-ami `getMemoryMebibytesToReserve`) plus the hard eviction threshold."""
    return 11 * max_pods + 255 + EKS_EVICTION_HARD_MEMORY_MIB


def eks_reserved_millicpu(vcpus: int) -> int:
    """CPU an EKS AMI node keeps from pods (kube-reserved), in millicores: 6% of the first core, 1% of the
    second, 0.5% of the third and fourth, 0.25% of every further one (amazon-eks-ami
    `getCPUMillicoresToReserve`, after GKE's node-allocatable tiers)."""
    total = vcpus * 1000
    tiers = ((0, 1000, 600), (1000, 2000, 100), (2000, 4000, 50), (4000, total, 25))
    return sum((min(total, end) - start) * basis_points // 10000 for start, end, basis_points in tiers if total > start)


def instance_type(name: str) -> InstanceType | None:
    """The catalog entry for an instance type, or None when the catalog does not know it."""
    return INSTANCE_TYPES.get(name)


def gpu_for_device(device_name: str) -> GpuModel | None:
    """The GPU model whose name is a whole word of a CUDA device name ("NVIDIA A100-SXM4-80GB" -> A100).

    Whole words keep "L4" from matching "L40S" and "H200" from matching "GH200". None for a CPU or a
    GPU the catalog does not know (then no MFU is reported).
    """
    for gpu in GPU_MODELS.values():
        if re.search(rf"\b{re.escape(gpu.name)}\b", device_name):
            return gpu
    return None


def interconnect_floor_gbps(name: str) -> float:
    """Default cross-node bus bandwidth floor in GB/s: the sustained line rate (40 Gbit/s -> 5 GB/s); 0 unknown."""
    known = INSTANCE_TYPES.get(name)
    return known.network_gbps / 8 if known else 0.0


@dataclass(frozen=True, slots=True)
class OnDemandQuota:
    """The Service Quotas entry (service `ec2`, counted in vCPUs) that limits On-Demand instances of a family."""

    code: str
    name: str
    families: tuple[str, ...]
    """The leading letters of the instance families whose running instances count against it."""


# EC2's vCPU-based On-Demand quotas for the accelerated families (Service Quotas, service code `ec2`).
G_AND_VT = OnDemandQuota("L-DB2E81BA", "Running On-Demand G and VT instances", ("g", "vt"))
P_INSTANCES = OnDemandQuota("L-417A185B", "Running On-Demand P instances", ("p",))
ON_DEMAND_QUOTAS = (G_AND_VT, P_INSTANCES)


def on_demand_quota(name: str) -> OnDemandQuota | None:
    """The On-Demand vCPU quota that instances of type `name` count against; None outside G, VT and P."""
    letters = re.match(r"[a-z]+", name.lower())
    prefix = letters.group(0) if letters else ""
    for quota in ON_DEMAND_QUOTAS:
        # `gr6` is a G type, `vt1` a VT type, `p6-b200` a P type.
        if any(prefix == f or (prefix.startswith(f) and f == "g") for f in quota.families):
            return quota
    return None
