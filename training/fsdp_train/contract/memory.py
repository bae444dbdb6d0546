"""Per-rank GPU memory of a training run, estimated from the model's shape and the training settings.

Pure arithmetic (no torch): the operator refuses a job that cannot fit its instance type's GPU with it
(fsdp_operator.api.memory_rules), `fsdpctl validate` prints it, and a bench script can call `estimate` with the
numbers of a shape to set a prediction beside a measured peak. Every term is what the bundled path keeps (FSDP2
per block, fp32 master weights or a frozen bf16 / NF4 base, the chunked loss); docs/lora.md says how the terms
compare with the peaks measured in docs/performance.md (tests/unit/test_memory_estimate.py holds them within 15 %).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

GIB = 2**30

LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""The linear layers of a Llama-style decoder block (what LoRA targets when no names are given)."""

# torchao's NF4 (what QLoRA's base uses): 4 bits a weight, one 8-bit scale per block of 64 weights, and those scales
# quantized again in blocks of 256 with an fp32 factor each (double quantization): 0.516 bytes a weight.
NF4_BYTES_PER_PARAM = 0.5 + 1 / 64 + 4 / (64 * 256)

# Bytes a token keeps per element of its logits row while the chunked loss works on its chunk (round fifteen's
# peaks fit them): compiled, the bf16 logits, the fp32 probabilities and the bf16 logit gradient (2 + 4 + 2);
# eager, the fp32 upcast and exp besides (16: measured 1.2 GiB more than compiled at 1,024 tokens x 152k).
LOSS_BYTES_CHUNKED = {True: 8, False: 16}
# Without chunks (lossChunkTokens 0) the whole batch's logits live from forward to backward: compiled, in bf16 with
# the fp32 upcast fused into the softmax (about 3 bytes: round eleven measured 2.1 GiB over 4,096-token chunks at
# 16k tokens on the 1.5B shape); eager, Hugging Face's loss keeps the bf16 logits and their fp32 upcast and
# log-softmax (2 + 4 + 4), and its fp32 gradient comes in backward.
LOSS_BYTES_WHOLE = {True: 3, False: 12}

# Eager blocks keep what a compiled block fuses away (the norms' fp32 intermediates, SiLU's output, rotary's
# halves). Not measured without checkpointing: an allowance, so that turning compile off never looks cheaper.
EAGER_ACTIVATION_FACTOR = 1.5

ALLOCATOR_SLACK = 0.05
"""What the caching allocator reserves beyond the sum of live tensors (2 MiB blocks, split segments): 1.5-9 % in
the measured runs."""

RUNTIME_BYTES = 1 * GIB
"""Outside the allocator: the CUDA context and its loaded kernels (about 0.5 GiB on an H100), NCCL's buffers and
Triton's autotuning. `torch.cuda.max_memory_reserved` does not count it; the GPU must hold it."""


@dataclass(frozen=True, slots=True)
class ModelShape:
    """The numbers of a Llama-style decoder that its memory depends on."""

    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    vocab: int
    tied: bool
    head_dim: int = 0
    """0: hidden / heads."""
    qkv_bias: bool = False
    """Qwen2's q/k/v projections carry biases."""

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * (self.head_dim or self.hidden // self.heads)

    @property
    def q_dim(self) -> int:
        return self.heads * (self.head_dim or self.hidden // self.heads)

    def linear_shapes(self) -> dict[str, tuple[int, int]]:
        """(in, out) features of each linear layer of a block."""
        h, i = self.hidden, self.intermediate
        return {
            "q_proj": (h, self.q_dim),
            "k_proj": (h, self.kv_dim),
            "v_proj": (h, self.kv_dim),
            "o_proj": (self.q_dim, h),
            "gate_proj": (h, i),
            "up_proj": (h, i),
            "down_proj": (i, h),
        }

    @property
    def block_linear_params(self) -> int:
        return sum(a * b for a, b in self.linear_shapes().values())

    @property
    def block_params(self) -> int:
        """A decoder block: its linear layers, two norms and (Qwen2) the q/k/v biases."""
        bias = self.q_dim + 2 * self.kv_dim if self.qkv_bias else 0
        return self.block_linear_params + 2 * self.hidden + bias

    @property
    def root_params(self) -> int:
        """The embedding, the final norm and an untied lm_head: FSDP2's root unit."""
        return self.vocab * self.hidden * (1 if self.tied else 2) + self.hidden

    @property
    def params(self) -> int:
        return self.layers * self.block_params + self.root_params

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> ModelShape | None:
        """The shape of a Hugging Face config (a dict of its fields); None when a number it needs is missing."""
        names = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size")
        if not all(_positive_int(config.get(name)) for name in names):
            return None
        kv = config.get("num_key_value_heads") or config["num_attention_heads"]
        head_dim = config.get("head_dim") or 0
        if not _positive_int(kv) or not isinstance(head_dim, int) or isinstance(head_dim, bool):
            return None
        if not head_dim and config["hidden_size"] % config["num_attention_heads"]:
            return None
        return cls(
            hidden=config["hidden_size"],
            intermediate=config["intermediate_size"],
            layers=config["num_hidden_layers"],
            heads=config["num_attention_heads"],
            kv_heads=kv,
            vocab=config["vocab_size"],
            tied=bool(config.get("tie_word_embeddings", False)),
            head_dim=head_dim,
            qkv_bias=config.get("model_type") == "qwen2" or bool(config.get("attention_bias", False)),
        )


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


@dataclass(frozen=True, slots=True)
class Settings:
    """What a run does that its memory depends on (the TrainConfig fields of the same names)."""

    seq_len: int = 2048
    batch_size_per_rank: int = 1
    shard_ranks: int = 1
    """The ranks one copy of the weights is sharded over: the world size, or the ranks of a node with hybrid."""
    mixed_precision: str = "bf16"
    activation_checkpointing: bool = False
    compile: bool = True
    loss_chunk_tokens: int = 4096
    reshard_after_forward: bool = True
    lora_rank: int = 0
    """0: full fine-tuning."""
    lora_target_modules: tuple[str, ...] = ()
    """Empty: every linear layer of the blocks."""
    lora_quantize_base: str = "none"

    @property
    def tokens(self) -> int:
        """Tokens of one micro-batch on one rank."""
        return self.seq_len * self.batch_size_per_rank

    @classmethod
    def of(cls, config: Any, shard_ranks: int) -> Settings:
        """From a TrainConfig (or anything with its field names)."""
        values = {f.name: getattr(config, f.name) for f in fields(cls) if f.name != "shard_ranks"}
        values["lora_target_modules"] = tuple(values["lora_target_modules"])
        return cls(**values, shard_ranks=shard_ranks)


@dataclass(frozen=True, slots=True)
class MemoryEstimate:
    """One rank's GPU memory at its peak, in bytes, by what holds it; `total` is what the GPU must have."""

    weights: int
    """The rank's shard of what stays between steps: fp32 master weights, or the frozen base and the adapters."""
    gradients: int
    """The fp32 sharded gradients, and the unsharded gradient of the root unit on its way to the reduce-scatter."""
    optimizer: int
    """AdamW's two fp32 states per trained parameter, sharded."""
    activations: int
    """What the decoder blocks keep from forward for backward."""
    loss: int
    """The logits and their gradient (one chunk of tokens, or the whole micro-batch), and with a trained lm_head its
    fp32 weight gradient accumulated during forward."""
    gathered: int
    """Unsharded bf16 weights: the root unit (kept from forward to backward) and the blocks gathered at once."""
    allocator: int
    """The caching allocator's reserve beyond the live tensors."""
    runtime: int
    """The CUDA context, NCCL and Triton: outside the allocator."""

    @property
    def reserved(self) -> int:
        """What `torch.cuda.max_memory_reserved` would report at the peak: all but the runtime."""
        return self.total - self.runtime

    @property
    def total(self) -> int:
        return sum(getattr(self, f.name) for f in fields(self))

    def parts(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def describe(self) -> str:
        """`weights 14.4, gradients 0.2, ...` in GiB, the terms over 0.05 GiB."""
        return ", ".join(f"{name} {gib(value):.1f}" for name, value in self.parts().items() if value >= 0.05 * GIB)


def gib(value: float) -> float:
    return value / GIB


def _lora_params(shape: ModelShape, rank: int, targets: tuple[str, ...]) -> tuple[int, int]:
    """(adapter parameters, base parameters under adapters) of the whole model."""
    linears = shape.linear_shapes()
    chosen = [linears[name] for name in (targets or LINEARS) if name in linears]
    adapters = sum(rank * (a + b) for a, b in chosen)  # A: rank x in, B: out x rank
    return shape.layers * adapters, shape.layers * sum(a * b for a, b in chosen)


def estimate(shape: ModelShape, s: Settings) -> MemoryEstimate:
    """One rank's peak memory for `shape` trained with `s` (bytes by term; see MemoryEstimate)."""
    d = max(1, s.shard_ranks)
    compute = 4 if s.mixed_precision == "fp32" else 2  # the dtype blocks compute in (and gather their weights in)
    total_params = shape.params
    lora = s.lora_rank > 0
    nf4 = lora and s.lora_quantize_base == "nf4"
    if lora:
        trained, targeted = _lora_params(shape, s.lora_rank, s.lora_target_modules)
        # The frozen base stays in bf16 (never an fp32 master copy), its target layers in NF4 with QLoRA; the
        # adapters are fp32. All of it sharded over the ranks.
        base_bytes = 2 * (total_params - targeted) + (NF4_BYTES_PER_PARAM if nf4 else 2) * targeted
        weights = (base_bytes + 4 * trained) / d
    else:
        trained, targeted = total_params, 0
        weights = 4 * total_params / d  # fp32 master weights (bf16 compute copies are gathered per block)
    optimizer = 8 * trained / d  # AdamW's exp_avg and exp_avg_sq, fp32
    # fp32 sharded gradients. They are made by the reduce-scatter on its own stream, so the blocks the forward's
    # transients freed on the compute stream cannot hold them: they add to the forward's peak rather than reuse it
    # (the measured full fine-tuning peaks: reserved = persistent + forward transients + gradients).
    gradients = 4 * trained / d
    if not lora:
        gradients += 4 * shape.root_params  # the root unit's unsharded gradient, fp32 before its reduce-scatter

    tokens = s.tokens
    if s.activation_checkpointing:
        # Each block keeps its input; one block's activations are recomputed at a time in backward.
        kept = compute * shape.hidden * shape.layers + _block_activations(shape, compute)
    else:
        kept = _block_activations(shape, compute) * shape.layers
    activations = tokens * kept * (1.0 if s.compile else EAGER_ACTIVATION_FACTOR)
    if nf4 and not s.activation_checkpointing:
        # Without checkpointing, every block keeps its NF4 layers' dequantized bf16 weights for backward (whole:
        # dequantized after the gather), as much as LoRA's bf16 base (1.5B: 11.4 GiB reserved against LoRA's 10.9,
        # docs/performance.md round sixteen). Checkpointing recomputes them with the block.
        activations += 2 * targeted

    if s.loss_chunk_tokens:
        loss = min(s.loss_chunk_tokens, tokens) * shape.vocab * LOSS_BYTES_CHUNKED[s.compile]
    else:
        loss = tokens * shape.vocab * LOSS_BYTES_WHOLE[s.compile]
    if not lora:
        loss += 4 * shape.vocab * shape.hidden  # the lm_head's fp32 weight gradient, accumulated in forward

    # Unsharded compute-dtype weights: the root unit stays gathered from forward to backward; each block is
    # gathered while it runs and the next is prefetched (the last block is never resharded), or every block stays
    # gathered with reshardAfterForward false. NF4 layers are gathered in NF4 and dequantized one at a time.
    blocks_gathered = shape.layers if not s.reshard_after_forward else min(2, shape.layers)
    block_bytes: float = compute * shape.block_params
    if nf4:
        per_block_targeted = targeted // shape.layers
        block_bytes = 2 * (shape.block_params - per_block_targeted) + NF4_BYTES_PER_PARAM * per_block_targeted
    gathered = compute * shape.root_params + blocks_gathered * block_bytes
    if nf4:
        gathered += 2 * max(a * b for a, b in shape.linear_shapes().values())

    live = weights + optimizer + gradients + activations + loss + gathered
    allocator = ALLOCATOR_SLACK * live
    return MemoryEstimate(
        weights=round(weights),
        gradients=round(gradients),
        optimizer=round(optimizer),
        activations=round(activations),
        loss=round(loss),
        gathered=round(gathered),
        allocator=round(allocator),
        runtime=RUNTIME_BYTES,
    )


def _block_activations(shape: ModelShape, compute: int) -> int:
    """Bytes one token keeps in one block for backward (compiled, no checkpointing): the block's input and the
    attention's normed input (for the norm and q/k/v), q, k and v after rotary and the attention's output (for the
    attention's backward and o_proj), the residual sum and its normed copy (for the second norm and gate/up), and
    the MLP's gate, up and their SiLU product (for SwiGLU's backward and down_proj). Adapters' rank-r outputs are
    too small to count."""
    h, q, kv, i = shape.hidden, shape.q_dim, shape.kv_dim, shape.intermediate
    return compute * (4 * h + 2 * q + 2 * kv + 3 * i)
