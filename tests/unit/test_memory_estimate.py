"""The per-rank memory estimate: its arithmetic on small shapes against values worked out by hand, its totals against
the peaks measured on one H100, and the operator's refusal of a job that cannot fit, with what would make it fit."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from fsdp_operator.api import memory_rules, schema
from fsdp_operator.api.spec import SpecError, parse_job, train_config
from fsdp_operator.cli.main import main
from fsdp_operator.decide.observed import Observed
from fsdp_operator.decide.reconcile import reconcile
from fsdp_operator.decide.status import JobStatus, Phase, Reason
from fsdp_train.contract.known_models import KNOWN_SHAPES, QWEN25_1_5B
from fsdp_train.contract.memory import GIB, ModelShape, Settings, estimate, gib

# --- the arithmetic, by hand ---------------------------------------------------------------------------------

# hidden 64, intermediate 128, 2 blocks, 4 heads (head_dim 16), 2 KV heads (kv_dim 32), vocabulary 1000, tied, Qwen2's
# q/k/v biases. A block's linears: q 64*64 + k 64*32 + v 64*32 + o 64*64 + gate, up, down 3 * 64*128 = 36,864; its
# norms 2*64 and biases 64+32+32: 37,120. The root: embedding 1000*64 + final norm 64 = 64,064. All: 138,304.
TINY = ModelShape(hidden=64, intermediate=128, layers=2, heads=4, kv_heads=2, vocab=1000, tied=True, qkv_bias=True)


def test_the_tiny_shape_counts_its_parameters() -> None:
    assert (TINY.block_linear_params, TINY.block_params, TINY.root_params, TINY.params) == (
        36_864,
        37_120,
        64_064,
        138_304,
    )


def test_full_fine_tuning_by_hand() -> None:
    """Two ranks, 2 x 16 tokens, compiled, 8-token loss chunks."""
    e = estimate(TINY, Settings(seq_len=16, batch_size_per_rank=2, shard_ranks=2, loss_chunk_tokens=8))
    assert e.weights == 4 * 138_304 // 2 == 276_608  # fp32 master weights, half on each rank
    assert e.optimizer == 8 * 138_304 // 2 == 553_216  # AdamW's two fp32 states
    assert e.gradients == 276_608 + 4 * 64_064 == 532_864  # fp32 shard + the root's unsharded fp32 gradient
    # a token keeps 2 bytes x (4*64 + 2*64 + 2*32 + 3*128 = 832) in each of 2 blocks; 32 tokens
    assert e.activations == 32 * 2 * 2 * 832 == 106_496
    assert e.loss == 8 * 1000 * 8 + 4 * 1000 * 64 == 320_000  # one chunk of logits + the lm_head's fp32 gradient
    assert e.gathered == 2 * 64_064 + 2 * 2 * 37_120 == 276_608  # bf16 root + two bf16 blocks
    live = 276_608 + 553_216 + 532_864 + 106_496 + 320_000 + 276_608
    assert e.allocator == round(0.05 * live) == 103_290
    assert e.total == live + 103_290 + GIB and e.reserved == live + 103_290


def test_lora_on_two_layers_eager_checkpointed_whole_logits_by_hand() -> None:
    """Rank-4 adapters on q_proj and v_proj, one rank, 16 tokens, activation checkpointing, no compile, no chunks."""
    s = Settings(
        seq_len=16,
        activation_checkpointing=True,
        compile=False,
        loss_chunk_tokens=0,
        lora_rank=4,
        lora_target_modules=("q_proj", "v_proj"),
    )
    e = estimate(TINY, s)
    adapters = 2 * (4 * (64 + 64) + 4 * (64 + 32))  # A and B of q (64 -> 64) and v (64 -> 32), in 2 blocks: 1,792
    assert e.weights == 2 * 138_304 + 4 * adapters == 283_776  # the whole base in bf16, the adapters fp32
    assert (e.optimizer, e.gradients) == (8 * 1_792, 4 * 1_792)
    # each block keeps its bf16 input (2*64 bytes a token); one block is recomputed at a time (1,664); eager: x1.5
    assert e.activations == 16 * (2 * 2 * 64 + 1_664) * 3 // 2 == 46_080
    assert e.loss == 16 * 1000 * 12 == 192_000  # the batch's bf16 logits with their fp32 upcast and log-softmax
    assert e.gathered == 276_608
    assert e.allocator == round(0.05 * (283_776 + 14_336 + 7_168 + 46_080 + 192_000 + 276_608)) == 40_998


def test_qlora_by_hand() -> None:
    """Rank-2 adapters on every linear, the targets in NF4 (0.5 + 1/64 + 4/(64*256) bytes a weight)."""
    s = Settings(seq_len=16, activation_checkpointing=True, loss_chunk_tokens=8, lora_rank=2, lora_quantize_base="nf4")
    e = estimate(TINY, s)
    # NF4 of the 2 * 36,864 linear weights: 36,864 + 1,152 + 18 = 38,034 bytes; the rest (64,576) in bf16
    adapters = 2 * 2 * (128 + 96 + 96 + 128 + 192 + 192 + 192)  # 4,096
    assert e.weights == 2 * 64_576 + 38_034 + 4 * adapters == 183_570
    assert e.activations == 16 * (2 * 2 * 64 + 1_664) == 30_720
    assert e.loss == 8 * 1000 * 8 == 64_000  # a frozen lm_head has no weight gradient
    # the bf16 root; two blocks gathered in NF4 (19,017 bytes of linears + 512 of norms and biases); the largest
    # linear (64 x 128) dequantized to bf16 while it runs
    assert e.gathered == 128_128 + 2 * (19_017 + 512) + 2 * 64 * 128 == 183_570


# --- against the measured peaks ---------------------------------------------------------------------------

QWEN_7B = ModelShape.from_config(KNOWN_SHAPES["Qwen/Qwen2.5-7B"])
QWEN_14B = ModelShape.from_config(KNOWN_SHAPES["Qwen/Qwen2.5-14B"])
QWEN_1_5B = ModelShape.from_config(QWEN25_1_5B)
ROUND_15 = "measured on one H100, docs/performance.md round fifteen"
ROUND_16 = "measured on one H100, docs/performance.md round sixteen"
LORA = {"lora_rank": 16}
LORA_AC = {"lora_rank": 16, "activation_checkpointing": True, "loss_chunk_tokens": 1024}
QLORA_AC = {**LORA_AC, "lora_quantize_base": "nf4"}

# (shape, settings on top of world size 1, seq 2048, batch 1, compile; peak reserved GiB; where it was measured)
MEASURED: list[tuple[str, dict[str, Any], float, str]] = [
    ("1.5B", {"loss_chunk_tokens": 4096, "reshard_after_forward": False}, 32.8, f"{ROUND_15}, ours-final"),
    ("1.5B", LORA, 10.9, f"{ROUND_15}, ours-lora"),
    ("1.5B", LORA_AC, 5.7, f"{ROUND_15}, ours-lora-ac"),
    ("7B", LORA_AC, 19.4, f"{ROUND_15}, ours-lora-ac"),
    ("7B", LORA, 28.9, f"{ROUND_15}, ours-lora"),
    ("7B", {**LORA_AC, "batch_size_per_rank": 2}, 20.1, f"{ROUND_15}, ours-lora-ac@b2"),
    ("1.5B", {**LORA, "lora_quantize_base": "nf4"}, 11.4, f"{ROUND_16}, ours-qlora"),
    ("1.5B", QLORA_AC, 3.8, f"{ROUND_16}, ours-qlora-ac"),
    ("7B", {**LORA_AC}, 19.7, f"{ROUND_16}, ours-lora-ac"),
    ("7B", QLORA_AC, 10.8, f"{ROUND_16}, ours-qlora-ac"),
    ("14B", QLORA_AC, 17.7, f"{ROUND_16}, ours-qlora-ac"),
]


def test_the_known_shapes_count_what_peft_counted() -> None:
    """The base parameters of the 7B and 14B shapes: peft's count of the measured models less their adapters."""
    assert QWEN_7B is not None and QWEN_14B is not None and QWEN_1_5B is not None
    assert QWEN_7B.params == 7_655_986_688 - 40_370_176
    assert QWEN_14B.params == 14_838_846_464 - 68_812_800
    assert QWEN_1_5B.params == 1_543_714_304


@pytest.mark.parametrize(("shape", "settings", "reserved_gib", "source"), MEASURED)
def test_the_estimate_is_within_15_percent_of_each_measured_peak(
    shape: str, settings: dict[str, Any], reserved_gib: float, source: str
) -> None:
    model = {"1.5B": QWEN_1_5B, "7B": QWEN_7B, "14B": QWEN_14B}[shape]
    assert model is not None
    predicted = gib(estimate(model, Settings(**settings)).reserved)
    assert abs(predicted / reserved_gib - 1) <= 0.15, f"{shape} {settings}: {predicted:.2f} GiB, {source}"


# --- the operator: the line validate prints, the refusal and its levers -------------------------------------

ONE_L4 = {
    "workers": {"replicas": 1, "instanceType": "g6.12xlarge", "gpusPerWorker": 1, "efaPerWorker": 0},
    "network": {"transport": "socket"},
}


def job(training: dict[str, Any], model: str = "Qwen/Qwen2.5-7B", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": schema.API_VERSION,
        "kind": schema.KIND,
        "metadata": {"name": "job"},
        "spec": {**ONE_L4, "model": {"name": model, "init": "random"}, "training": training, **spec},
    }


def refusal(manifest: dict[str, Any]) -> str:
    with pytest.raises(SpecError) as info:
        parse_job(manifest)
    (problem,) = [p for p in info.value.problems if "GiB" in p]
    return problem


def test_a_7b_lora_without_checkpointing_is_refused_on_an_l4_with_the_levers() -> None:
    problem = refusal(job({"lora": {}, "lossChunkTokens": 1024}))
    assert problem.startswith("spec.training: a rank needs about ")
    assert "more than the 22.4 GiB (L4, g6.12xlarge) its GPU has" in problem
    assert "it would fit with spec.training.activationCheckpointing: true (~" in problem
    assert "spec.training.seqLen: " in problem
    # Not QLoRA alone: without checkpointing each block keeps its NF4 layers' dequantized bf16 weights.
    assert "quantizeBase" not in problem


def test_the_job_status_says_it_too() -> None:
    """The operator's own reading of the job: failed validation, the same sentence, nothing created."""
    manifest = job({"lora": {}, "lossChunkTokens": 1024})
    manifest["metadata"] |= {"namespace": "ml", "uid": "u-1", "generation": 1}
    d = reconcile(manifest, JobStatus(), Observed(now=datetime.now(UTC)), training_package="/opt/fsdp_train")
    assert (d.status.phase, d.status.reason) == (Phase.FAILED, Reason.VALIDATION_FAILED)
    assert d.status.message.startswith("invalid spec: spec.training: a rank needs about ")
    assert "spec.training.activationCheckpointing: true" in d.status.message


def test_full_fine_tuning_of_a_7b_model_on_one_l4_fits_only_as_lora_with_checkpointing() -> None:
    problem = refusal(job({}))
    assert problem.endswith(
        "its GPU has; it would fit with all of spec.training.activationCheckpointing: true, "
        "spec.training.lossChunkTokens: 1024, spec.training.lora (rank 16 adapters) (~21.5 GiB)"
    )


def test_levers_that_fit_only_together_are_named_together() -> None:
    problem = refusal(job({"lora": {}, "batchSizePerRank": 4, "lossChunkTokens": 0}))
    assert problem.endswith(
        "it would fit with all of spec.training.activationCheckpointing: true, spec.training.lora.quantizeBase: nf4 "
        "(~16.1 GiB) or spec.training.seqLen: 512 with "
        "spec.training.batchSizePerRank: 1 (~22.0 GiB)"
    )


def test_a_lever_says_what_else_its_setting_needs() -> None:
    """LoRA is refused with fp8, NF4 with hybrid sharding (TrainConfig): the lever names the setting to change too."""
    assert "spec.training.lora (rank 16 adapters) with spec.training.precision: bf16 (~" in refusal(
        job({"precision": "fp8"})
    )
    two_nodes = {"replicas": 2, "gpusPerWorker": 1, "efaPerWorker": 0}
    lora_ac = {"lora": {}, "sharding": "hybrid", "lossChunkTokens": 1024, "activationCheckpointing": True}
    hybrid = refusal(job(lora_ac, model="Qwen/Qwen2.5-14B", workers=two_nodes))
    assert "spec.training.lora.quantizeBase: nf4 with spec.training.sharding: full (~" in hybrid


def test_nothing_fits_a_32b_model_on_one_l4() -> None:
    problem = refusal(job({"lora": {"quantizeBase": "nf4"}}, model="Qwen/Qwen2.5-32B"))
    assert "no setting of spec.training makes it fit" in problem and "spec.workers.instanceType" in problem


def test_the_same_job_with_checkpointing_is_accepted() -> None:
    parsed = parse_job(job({"lora": {}, "lossChunkTokens": 1024, "activationCheckpointing": True}))
    line = memory_rules.describe(memory_rules.judge(parsed.spec, train_config(parsed.spec)))
    assert line.startswith("memory per GPU: ~") and "of 22.4 GiB (L4, g6.12xlarge): weights 14.3" in line


def test_an_unknown_model_is_not_estimated_and_not_refused() -> None:
    parsed = parse_job(job({}, model="someone/Unknown-70B"))
    judged = memory_rules.judge(parsed.spec, train_config(parsed.spec))
    assert isinstance(judged, str) and judged.startswith("estimate unavailable: the operator does not know")


def test_overrides_change_the_shape_judged() -> None:
    """The bench's way to a 7B model: Qwen2.5-1.5B's config with the 7B numbers as overrides."""
    shape = memory_rules.model_shape("Qwen/Qwen2.5-1.5B", {**KNOWN_SHAPES["Qwen/Qwen2.5-7B"]})
    assert shape == QWEN_7B


def test_validate_prints_the_estimate(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(
        "apiVersion: fsdp.dev/v1alpha1\nkind: FSDPTrainingJob\nmetadata: {name: j}\n"
        "spec: {workers: {replicas: 1, gpusPerWorker: 1, efaPerWorker: 0}, network: {transport: socket},\n"
        "       model: {name: Qwen/Qwen2.5-1.5B, init: random}, training: {lora: {}}}\n"
    )
    assert main(["validate", "-f", str(path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1].startswith("memory per GPU: ~") and "GiB of 22.4 GiB (L4, g6.12xlarge): weights 2.9" in out[1]
