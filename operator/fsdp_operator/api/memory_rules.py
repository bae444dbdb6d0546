"""Will a rank fit its GPU? The per-rank memory estimate (fsdp_train.contract.memory) for a spec, the line
`fsdpctl validate` prints, and the refusal of a job that cannot fit, with what would make it fit.

Judged only where every number is known: the bundled training function (not a user's trainFunction), GPU workers
of an instance type in the catalog, and a model whose architecture the operator knows (fsdp_train.contract.
known_models.KNOWN_SHAPES, with spec.model.overrides applied). Anything else is said to be unestimated, never
guessed and never refused.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from fsdp_train.contract import catalog
from fsdp_train.contract.known_models import KNOWN_SHAPES
from fsdp_train.contract.memory import MemoryEstimate, ModelShape, Settings, estimate, gib

from fsdp_operator.api.fields import Problems

LORA_RANK = 16
"""The rank a lever proposes when the job has no LoRA yet (spec.training.lora's default)."""
LOSS_CHUNK = 1024
"""The loss chunk a lever proposes: a 152k-vocabulary chunk of 1,024 tokens holds about 1.2 GiB."""
MIN_SEQ_LEN = 256
"""The shortest sequence a lever proposes; below it, fewer tokens stop being a useful way to fit."""


@dataclass(frozen=True, slots=True)
class Judged:
    """A spec's estimate on its GPU, with what it was judged on."""

    estimate: MemoryEstimate
    settings: Settings
    shape: ModelShape
    gpu_bytes: int
    instance_type: catalog.InstanceType
    also: dict[str, str]
    """What a lever to LoRA (`lora`) or to QLoRA (`nf4`) must also set for TrainConfig to accept it."""

    @property
    def fits(self) -> bool:
        return self.estimate.total <= self.gpu_bytes

    @property
    def gpu(self) -> str:
        return f"{gib(self.gpu_bytes):.1f} GiB ({self.instance_type.gpu.name}, {self.instance_type.name})"


def model_shape(model: str, overrides: dict[str, Any]) -> ModelShape | None:
    """The shape of `model` with its overrides applied; None when the operator does not know the model."""
    known = KNOWN_SHAPES.get(model)
    return None if known is None else ModelShape.from_config({**known, **overrides})


def judge(spec: Any, config: Any) -> Judged | str:
    """The estimate for `spec` (whose TrainConfig is `config`), or why there is none."""
    if spec.train_function is not None:
        return "not estimated: spec.trainFunction runs the user's own training code"
    workers = spec.workers
    if workers.gpus_per_worker == 0:
        return "not estimated: no GPUs (spec.workers.gpusPerWorker is 0)"
    known = catalog.instance_type(workers.instance_type)
    if known is None:
        return f"not estimated: instance type {workers.instance_type or '(none)'} is not in the catalog"
    shape = model_shape(config.model, config.model_overrides)
    if shape is None:
        return (
            f"estimate unavailable: the operator does not know {config.model}'s architecture "
            f"(it knows {', '.join(sorted(KNOWN_SHAPES))})"
        )
    # sharding auto is judged as full (the least memory a rank can need): it picks hybrid only on a slow fabric
    hybrid = config.sharding == "hybrid"
    shard_ranks = workers.ranks_per_worker if hybrid else workers.world_size
    settings = Settings.of(config, shard_ranks=max(1, shard_ranks))
    # LoRA refuses fp8 and NF4 refuses hybrid sharding (TrainConfig._check_lora): a lever says what else to set
    lora = " with spec.training.precision: bf16" if config.precision == "fp8" else ""
    nf4 = lora + (" with spec.training.sharding: full" if hybrid else "")
    also = {"lora": lora, "nf4": nf4}
    return Judged(estimate(shape, settings), settings, shape, known.gpu_memory_mib * 2**20, known, also)


def describe(judged: Judged | str) -> str:
    """`memory per GPU: ~19.6 GiB of 22.4 GiB (L4, g6.12xlarge): weights 14.3, ...`."""
    if isinstance(judged, str):
        return f"memory per GPU: {judged}"
    e = judged.estimate
    return f"memory per GPU: ~{gib(e.total):.1f} GiB of {judged.gpu}: {e.describe()} (estimate, docs/lora.md)"


def check(spec: Any, config: Any, problems: Problems) -> None:
    """A job whose ranks cannot fit their GPU is refused, with the estimate and the settings that would fit."""
    judged = judge(spec, config)
    if isinstance(judged, str) or judged.fits:
        return
    e = judged.estimate
    problems.append(
        f"spec.training: a rank needs about {gib(e.total):.1f} GiB ({e.describe()}), more than the {judged.gpu} "
        f"its GPU has; {_levers(judged)}"
    )


def _levers(judged: Judged) -> str:
    """The settings that would make the job fit, each with its estimate: each that fits alone, else those that fit
    together, and the most tokens per rank that fit."""
    s, shape, room = judged.settings, judged.shape, judged.gpu_bytes
    single = _single_levers(s, judged.also)
    offers = [
        f"{name} (~{gib(t):.1f} GiB)" for name, changed in single if (t := estimate(shape, changed).total) <= room
    ]
    if not offers:
        together = _together(s, single, shape, room)
        if together:
            total = estimate(shape, _combine(s, together)).total
            offers.append(f"all of {', '.join(name for name, _ in together)} (~{gib(total):.1f} GiB)")
    fewer = _fewer_tokens(s, shape, room)
    if fewer is not None:
        offers.append(f"{fewer[0]} (~{gib(estimate(shape, fewer[1]).total):.1f} GiB)")
    if offers:
        return "it would fit with " + " or ".join(offers)
    return (
        "no setting of spec.training makes it fit: choose an instance type with more GPU memory (spec.workers."
        "instanceType), or more workers to shard the weights over (spec.workers.replicas)"
    )


def _together(
    s: Settings, levers: list[tuple[str, Settings]], shape: ModelShape, room: int
) -> list[tuple[str, Settings]]:
    """The levers, in order, until together they fit, less each that the others do without; [] when all do not."""

    def fits(chosen: list[tuple[str, Settings]]) -> bool:
        return estimate(shape, _combine(s, chosen)).total <= room

    chosen = next((levers[:n] for n in range(1, len(levers) + 1) if fits(levers[:n])), [])
    for lever in list(chosen[:-1]):
        if fits([other for other in chosen if other is not lever]):
            chosen.remove(lever)
    return chosen


def _combine(base: Settings, levers: list[tuple[str, Settings]]) -> Settings:
    """`base` with the fields each lever changed from it."""
    combined = base
    for _, changed in levers:
        updates = {
            name: getattr(changed, name)
            for name in Settings.__dataclass_fields__
            if getattr(changed, name) != getattr(base, name)
        }
        combined = replace(combined, **updates)
    return combined


def _single_levers(s: Settings, also: dict[str, str]) -> list[tuple[str, Settings]]:
    """Each setting that lowers the estimate, alone (fewer tokens aside): (what to set, the settings with it)."""
    levers: list[tuple[str, Settings]] = []
    if not s.activation_checkpointing:
        levers.append(("spec.training.activationCheckpointing: true", replace(s, activation_checkpointing=True)))
    if s.loss_chunk_tokens == 0 or min(s.loss_chunk_tokens, s.tokens) > LOSS_CHUNK:
        levers.append((f"spec.training.lossChunkTokens: {LOSS_CHUNK}", replace(s, loss_chunk_tokens=LOSS_CHUNK)))
    if s.lora_rank == 0:
        name = f"spec.training.lora (rank {LORA_RANK} adapters){also['lora']}"
        levers.append((name, replace(s, lora_rank=LORA_RANK)))
    if s.lora_quantize_base != "nf4" and s.mixed_precision == "bf16":
        name = "spec.training.lora.quantizeBase: nf4" if s.lora_rank else "spec.training.lora with quantizeBase: nf4"
        levers.append((name + also["nf4"], replace(s, lora_rank=s.lora_rank or LORA_RANK, lora_quantize_base="nf4")))
    return levers


def _fewer_tokens(s: Settings, shape: ModelShape, room: int) -> tuple[str, Settings] | None:
    """The most tokens per rank that fit (batch 1, then the longest power-of-two sequence), when fewer help."""
    one = replace(s, batch_size_per_rank=1)
    if s.batch_size_per_rank > 1 and estimate(shape, one).total <= room:
        return "spec.training.batchSizePerRank: 1", one
    also = " with spec.training.batchSizePerRank: 1" if s.batch_size_per_rank > 1 else ""
    seq = 1 << max(0, (s.seq_len - 1).bit_length() - 1)  # the largest power of two below seqLen
    while seq >= MIN_SEQ_LEN:
        shorter = replace(one, seq_len=seq)
        if estimate(shape, shorter).total <= room:
            return f"spec.training.seqLen: {seq}{also}", shorter
        seq //= 2
    return None
