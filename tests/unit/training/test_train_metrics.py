"""Unit tests of the FLOPs/MFU formula, bus bandwidth, the LR schedule, sharding choice and topology."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from fsdp_train.watch.metrics import Metrics, StepMetrics, count_params, flops_per_token, mfu, peak_flops

QWEN = SimpleNamespace(
    hidden_size=1536,
    intermediate_size=8960,
    num_hidden_layers=28,
    num_attention_heads=12,
    num_key_value_heads=2,
    vocab_size=151936,
    tie_word_embeddings=True,
)


def test_qwen25_parameter_count() -> None:
    # docs/performance.md: 1,543,714,304 parameters, 1,310,340,608 without the embedding.
    assert count_params(QWEN) == 1_543_714_304
    assert count_params(QWEN) - 151936 * 1536 == 1_310_340_608


def test_qwen25_flops_per_token() -> None:
    assert flops_per_token(QWEN, 2048) / 1e9 == pytest.approx(10.32, abs=0.005)
    assert flops_per_token(QWEN, 4096) / 1e9 == pytest.approx(11.38, abs=0.005)


def test_untied_head_counts_twice() -> None:
    untied = SimpleNamespace(**{**vars(QWEN), "tie_word_embeddings": False})
    assert count_params(untied) - count_params(QWEN) == 151936 * 1536


def test_mfu_leaves_out_an_untied_input_embedding() -> None:
    """PaLM's convention: the input embedding is a lookup, not a matmul; only the lm_head counts."""
    untied = SimpleNamespace(**{**vars(QWEN), "tie_word_embeddings": False})
    assert flops_per_token(untied, 2048) == flops_per_token(QWEN, 2048)
    # Qwen2.5-7B's shape (untied): 6 x 6.53e9 matmul parameters + attention, not 6 x 7.07e9.
    qwen7b = SimpleNamespace(
        hidden_size=3584,
        num_attention_heads=28,
        num_key_value_heads=4,
        intermediate_size=18944,
        num_hidden_layers=28,
        vocab_size=152064,
        tie_word_embeddings=False,
    )
    assert count_params(qwen7b) == 7_615_616_512
    assert flops_per_token(qwen7b, 2048) == 6 * (7_615_616_512 - 152064 * 3584) + 12 * 28 * 3584 * 2048


def test_mfu_from_the_seed_baseline() -> None:
    # docs/performance.md: 36,130 tokens/s/GPU on H200 is 37.7 % MFU.
    peak = peak_flops("NVIDIA H200")
    assert peak == 989e12
    assert mfu(36_130, flops_per_token(QWEN, 2048), peak) == pytest.approx(0.377, abs=0.0005)
    assert peak_flops("NVIDIA L4") == 121e12
    assert peak_flops("cpu") is None
    # Whole model names only: an L40 is no L4, an H20 no H200.
    assert peak_flops("NVIDIA L40") is None
    assert peak_flops("NVIDIA L40S") == pytest.approx(362.05e12)
    assert peak_flops("NVIDIA H20") == 148e12
    assert (peak_flops("NVIDIA A100-SXM4-80GB"), peak_flops("NVIDIA GH200 480GB")) == (312e12, 989e12)
    assert mfu(1000.0, 1e9, None) is None


def test_metrics_summary_leaves_out_the_first_step() -> None:
    metrics = Metrics(rank=0, world_size=2, total_steps=3, flops_per_token=1e9, peak=1e12)
    first = metrics.log(StepMetrics(1, 5.0, 10.0, 1000))
    assert first.tokens_per_second == 100.0
    assert first.tokens_per_second_per_device == 50.0
    assert first.mfu == pytest.approx(50 * 1e9 / 1e12)
    metrics.log(StepMetrics(2, 4.0, 1.0, 1000))
    metrics.log(StepMetrics(3, 3.0, 1.0, 1000))
    assert metrics.first_loss == 5.0
    assert metrics.last is not None and metrics.last.loss == 3.0
    assert metrics.mean_tokens_per_second == 1000.0


def test_bus_bandwidth_formula() -> None:
    from fsdp_train.watch.metrics import bus_bandwidth_gbps

    # 1 GB in 0.1 s over 4 ranks: algbw 10 GB/s; all-reduce x 2·3/4, all-gather x 3/4.
    assert bus_bandwidth_gbps("all_reduce", 10**9, 0.1, 4) == pytest.approx(15.0)
    assert bus_bandwidth_gbps("all_gather", 10**9, 0.1, 4) == pytest.approx(7.5)
    assert bus_bandwidth_gbps("all_reduce", 10**9, 0.1, 1) == 0.0


def test_auto_sharding() -> None:
    from fsdp_train.models.parallelize import resolve_sharding

    assert resolve_sharding("auto", 1, None, 25.0) == "full"
    assert resolve_sharding("auto", 2, None, 25.0) == "hybrid"
    assert resolve_sharding("auto", 2, 3.5, 25.0) == "hybrid"
    assert resolve_sharding("auto", 2, 296.0, 25.0) == "full"
    assert resolve_sharding("full", 2, 3.5, 25.0) == "full"
    assert resolve_sharding("hybrid", 1, None, 25.0) == "hybrid"


def test_topology_from_torchrun_and_fake_nodes() -> None:
    from fsdp_train.models.parallelize import Topology

    env = {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4", "GROUP_RANK": "1"}
    topo = Topology.from_torchrun_env(env)
    assert (topo.local_rank, topo.node_rank, topo.num_nodes, topo.device_index) == (1, 1, 2, 1)
    topo.check_contiguous()
    fake = Topology.from_torchrun_env({**env, "FSDP_TRAIN_RANKS_PER_NODE": "2"})
    assert (fake.local_rank, fake.local_world_size, fake.node_rank, fake.num_nodes) == (1, 2, 2, 4)
    assert fake.device_index == 1  # still the real GPU index
    with pytest.raises(ValueError, match="FSDP_TRAIN_RANKS_PER_NODE=3 must be > 0 and divide"):
        Topology.from_torchrun_env({**env, "FSDP_TRAIN_RANKS_PER_NODE": "3"})
    with pytest.raises(ValueError, match="RANK is not set"):
        Topology.from_torchrun_env({})
    scattered = Topology.from_values(rank=1, world_size=4, local_rank=0, local_world_size=2, node_rank=1, env={})
    with pytest.raises(ValueError, match="hybrid sharding needs rank 2 there"):
        scattered.check_contiguous()


def test_nccl_debug_file_naming(tmp_path: Path) -> None:
    from fsdp_train.watch.report import nccl_debug_path, pod_name, prepare_nccl_debug

    assert nccl_debug_path("/x/nccl.%h.%p.log", hostname="node-a.ec2.internal", pid=42) == "/x/nccl.node-a.42.log"
    env: dict[str, str] = {"FSDP_TRAIN_NCCL_LOG_DIR": str(tmp_path / "nccl")}
    prepare_nccl_debug(env)
    assert env["NCCL_DEBUG"] == "INFO"
    assert env["NCCL_DEBUG_FILE"] == str(tmp_path / "nccl" / "nccl.%h.%p.log")
    assert (tmp_path / "nccl").is_dir()
    kept = {"NCCL_DEBUG": "WARN", "NCCL_DEBUG_FILE": str(tmp_path / "y" / "%p")}
    prepare_nccl_debug(kept)
    assert kept == {"NCCL_DEBUG": "WARN", "NCCL_DEBUG_FILE": str(tmp_path / "y" / "%p")}
    assert (tmp_path / "y").is_dir()
    # NCCL expands %h and %p in the folders too: the folder it will write to is the one to create.
    per_host = {"NCCL_DEBUG_FILE": str(tmp_path / "logs-%h" / "nccl.%p.log")}
    prepare_nccl_debug(per_host)
    assert Path(nccl_debug_path(per_host["NCCL_DEBUG_FILE"])).parent.is_dir()
    assert pod_name({"POD_NAME": "w-1", "HOSTNAME": "h"}) == "w-1"
    assert pod_name({"HOSTNAME": "h"}) == ""
    assert pod_name({"HOSTNAME": "h", "KUBERNETES_SERVICE_HOST": "10.0.0.1"}) == "h"
