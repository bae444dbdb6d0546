"""The training function's typed configuration, built from the job's ``training`` parameters.

Pure Python (no torch): the operator may import it to validate a spec before anything runs.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, ClassVar

DEFAULT_MODEL = "Qwen/Qwen2.5-1.5B"

_CHOICES: dict[str, tuple[str, ...]] = {
    "model_init": ("pretrained", "random"),
    "lr_schedule": ("constant", "cosine"),
    "sharding": ("full", "hybrid", "auto"),
    "mixed_precision": ("bf16", "fp32"),
    "data_format": ("", "jsonl", "parquet", "text"),
    "data_kind": ("text", "chat"),
    "precision": ("bf16", "fp8", "auto"),
    "lora_quantize_base": ("none", "nf4"),
}

RANDOM_DATA = "random"
MIN_VALIDATION_SPLIT = 1e-6
"""The smallest non-zero validation split. Each document is held out with this probability (packing.pack): a
split far below one in a million holds out nothing of all but the largest data sets, and 5e-324 (below the
2**-53 step of the draws) nothing ever; evaluation then has nothing to evaluate."""
STORAGE_SCHEMES = ("s3://", "gs://", "file:///", "/")
"""Where checkpoints and the exported model may go, exactly as they are read (`storage.filesystem`, Ray Train's
storage_path, pyarrow): an object store's scheme in lower case (``S3://b`` is not read as S3: it would be a
relative local path), ``file://`` followed by an absolute path, or an absolute path. The operator refuses the
rest with the same table (fsdp_operator.api.formats.STORAGE_URI), so a job it accepts is never refused here."""
MERGED_DIR = "merged"
"""Where a LoRA run's export puts the merged model, inside the adapter directory (``export_merged``)."""
DATA_SCHEMES = ("s3://", "gs://", "hf://datasets/", "file:///", "/")
"""Where data may come from: STORAGE_SCHEMES, or a data set of the Hugging Face hub."""


class ConfigError(ValueError):
    """A field of the config is refused: ``field`` names it, ``detail`` says why (it may name others
    as ``training.<field>``), so that a caller can say the same in its own field names."""

    def __init__(self, field: str, detail: str) -> None:
        super().__init__(f"{TrainConfig.PREFIX}.{field} {detail}")
        self.field = field
        self.detail = detail


@dataclass(kw_only=True, slots=True)
class TrainConfig:
    """What one training run does; every rank builds the same one."""

    PREFIX: ClassVar[str] = "training"

    model: str = DEFAULT_MODEL
    """A Hugging Face model id or a local directory holding ``config.json`` (and weights)."""
    model_init: str = "random"
    """``pretrained`` loads the weights; ``random`` builds the architecture only, with random init.
    For the ids in ``fsdp_train.contract.known_models.KNOWN_CONFIGS`` the architecture is built without any network
    access."""
    model_overrides: dict[str, Any] = field(default_factory=dict)
    """Hugging Face config fields to override (``{"num_hidden_layers": 2}``)."""
    steps: int = 100
    """Optimizer steps to run in total (a resumed run counts the steps already done)."""
    seq_len: int = 2048
    """Tokens per sample."""
    batch_size_per_rank: int = 1
    """Samples per rank per micro-batch."""
    grad_accum: int = 1
    """Micro-batches per optimizer step."""
    learning_rate: float = 2e-5
    """Peak learning rate of AdamW."""
    lr_schedule: str = "cosine"
    """``constant`` after warm-up, or ``cosine`` decay to zero at ``steps``."""
    warmup_steps: int = 0
    """Steps of linear warm-up from zero to ``learning_rate``."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    max_grad_norm: float = 1.0
    """Clip the global gradient norm to this value; 0 disables clipping."""
    sharding: str = "auto"
    """``full``: shard over every rank. ``hybrid``: shard inside a node, replicate across nodes (HSDP).
    ``auto``: ``hybrid`` when there are two or more nodes and the measured cross-node all-reduce bus
    bandwidth is below ``min_cross_node_gbps`` (or was not measured), else ``full``."""
    mixed_precision: str = "bf16"
    """``bf16``: fp32 master weights, bf16 compute, fp32 gradient reduction. ``fp32``: fp32 throughout."""
    activation_checkpointing: bool = False
    """Recompute each decoder block's activations in the backward pass."""
    compile: bool = False
    """``torch.compile`` each decoder block (and the loss's per-chunk softmax)."""
    loss_chunk_tokens: int = 4096
    """Tokens per chunk of the fused lm_head + cross-entropy (``fsdp_train.models.loss``), which never holds
    more than one chunk of logits; 0: Hugging Face's own loss over the full fp32 logits."""
    reshard_after_forward: bool = True
    """Free each block's gathered parameters after its forward and gather them again in backward
    (FSDP's memory saving). ``false`` keeps them gathered from forward to backward: one all-gather
    per block per micro-batch instead of two, for the memory of the whole bf16 model on every rank."""
    precision: str = "bf16"
    """Matmul precision of the decoder blocks' linear layers: ``bf16``, ``fp8`` (torchao float8 training;
    needs fp8 tensor cores: L4, L40S, H100, H200) or ``auto`` (fp8 only where it was measured to win:
    H100/H200 and a hidden size of at least 3584; ``fsdp_train.models.precision``)."""
    compile_cache_dir: str = ""
    """Directory for Inductor's and Triton's compile caches, shared by the runs of a job (a volume), so a
    restart or a second run reuses the compiled kernels; empty: the default per-process temporary cache."""
    seed: int = 0
    """Seed of the weight init and of the random data."""
    data: str = RANDOM_DATA
    """Where the tokens come from: ``random`` (uniform random token ids, the same for every run with one
    seed), or a file, directory or prefix: ``s3://``, ``gs://``, ``hf://datasets/OWNER/NAME``, a path."""
    data_format: str = ""
    """``jsonl``, ``parquet`` or ``text`` (one document per non-empty line); empty: from the file extension."""
    data_field: str = "text"
    """The column holding each document's text (``kind: text``) or its ``messages`` (``kind: chat``)."""
    data_kind: str = "text"
    """``text``: causal LM over packed documents; ``chat``: the field holds a list of ``{role, content}``
    messages, rendered with the tokenizer's chat template, with the loss on assistant tokens only."""
    tokenizer: str = ""
    """The tokenizer's directory or id; empty: the model's own (``model``)."""
    validation_split: float = 0.0
    """Fraction (0..0.5) of the documents held out for evaluation, chosen with ``shuffle_seed``."""
    validation_data: str = ""
    """A second source evaluated instead of a split (same format, field and kind)."""
    eval_every_steps: int = 0
    """Evaluate every N steps (and after the last); 0: only after the last step."""
    document_mask: bool = True
    """Restart position ids at every document of a packed row and keep attention inside documents (variable-
    length flash attention over the batch's document bounds, ``fsdp_train.models.attention``: no dense mask);
    false: positions run through the row and attention spans its documents (plain causal)."""
    shuffle_seed: int = 0
    """Seed of the per-epoch order of the packed sequences (and of the validation split)."""
    epochs: int = 0
    """Passes over the data; training stops after ``steps`` or after this many epochs, whichever comes
    first. 0: no limit (the data repeats, reshuffled, until ``steps``)."""
    output_path: str = ""
    """Where to write the trained model as a Hugging Face directory (path or ``s3://``); empty: no export."""
    export_every_checkpoint: bool = False
    """Also export the model at each checkpoint (into ``<output_path>/step_NNNNNNNN``)."""
    checkpoint_path: str = ""
    """Directory or fsspec URI for ``torch.distributed.checkpoint`` snapshots; empty: no checkpoints."""
    checkpoint_interval: int = 0
    """Save every N steps; 0: only after the last step."""
    probe_size_bytes: int = 64 * 1024 * 1024
    """Bytes of the all-reduce / all-gather probe before training; 0 skips the probe."""
    min_cross_node_gbps: float = 25.0
    """Cross-node all-reduce bus bandwidth (GB/s) below which ``sharding=auto`` picks ``hybrid``."""
    lora_rank: int = 0
    """LoRA adapters of this rank on ``lora_target_modules`` of a frozen base (``fsdp_train.models.adapters``,
    peft's layers); 0: full fine-tuning."""
    lora_alpha: int = 32
    """LoRA's scale numerator: an adapter's update is ``(alpha / rank) * B @ A``."""
    lora_dropout: float = 0.0
    """Dropout on the adapters' input."""
    lora_target_modules: list[str] = field(default_factory=list)
    """Names of the linear layers inside the decoder blocks that get adapters (``q_proj``, ``down_proj``); empty:
    every linear layer of the blocks (the attention and MLP projections of any family)."""
    lora_quantize_base: str = "none"
    """``nf4``: QLoRA, the frozen base's target layers held as torchao NF4 tensors (``fsdp_train.models.quantize``)."""
    export_merged: bool = False
    """With LoRA: also export the base with the adapters merged in, as a plain Hugging Face model, into
    ``<output_path>/merged`` (``MERGED_DIR``; the adapter directory is ``output_path`` itself)."""

    def __post_init__(self) -> None:
        p = self.PREFIX
        for name, choices in _CHOICES.items():
            value = getattr(self, name)
            if value not in choices:
                raise ConfigError(name, f"must be one of {', '.join(choices)}; got {value!r}.")
        if self.precision == "fp8" and self.mixed_precision != "bf16":
            raise ConfigError("precision", f"fp8 needs {p}.mixed_precision bf16 (got {self.mixed_precision}).")
        if self.compile_cache_dir and not self.compile_cache_dir.startswith("/"):
            raise ConfigError("compile_cache_dir", f"must be an absolute path, got {self.compile_cache_dir!r}.")
        if not self.model:
            raise ConfigError("model", "must not be empty.")
        for name in ("steps", "seq_len", "batch_size_per_rank", "grad_accum"):
            if getattr(self, name) <= 0:
                raise ConfigError(name, "must be greater than 0.")
        for name in (
            "warmup_steps",
            "checkpoint_interval",
            "probe_size_bytes",
            "seed",
            "loss_chunk_tokens",
            "eval_every_steps",
            "shuffle_seed",
            "epochs",
        ):
            if getattr(self, name) < 0:
                raise ConfigError(name, "must be 0 or greater.")
        if self.warmup_steps >= self.steps and self.warmup_steps > 0:
            raise ConfigError("warmup_steps", f"must be less than {p}.steps ({self.warmup_steps} >= {self.steps}).")
        if not (self.learning_rate > 0 and math.isfinite(self.learning_rate)):
            raise ConfigError("learning_rate", "must be greater than 0.")
        for name in ("weight_decay", "max_grad_norm", "min_cross_node_gbps"):
            value = getattr(self, name)
            if not (value >= 0 and math.isfinite(value)):
                raise ConfigError(name, "must be 0 or greater.")

        self._check_data()
        self._check_lora()

    def _check_lora(self) -> None:
        p = self.PREFIX
        if self.lora_rank < 0:
            raise ConfigError("lora_rank", "must be 0 (full fine-tuning) or greater.")
        if self.lora_alpha <= 0:
            raise ConfigError("lora_alpha", "must be greater than 0.")
        if not (0.0 <= self.lora_dropout < 1.0):
            raise ConfigError("lora_dropout", f"must be at least 0 and below 1; got {self.lora_dropout!r}.")
        if any(not name or not name.replace("_", "").isalnum() for name in self.lora_target_modules):
            raise ConfigError(
                "lora_target_modules", f"must be module names (letters, digits, _); got {self.lora_target_modules!r}."
            )
        if not self.lora_rank:
            for name, unset in (("lora_target_modules", []), ("export_merged", False), ("lora_quantize_base", "none")):
                if getattr(self, name) != unset:
                    raise ConfigError(name, f"needs LoRA ({p}.lora_rank of 1 or more).")
            return
        if self.precision == "fp8":
            # torchao's float8 training converts the linear layers it trains; a frozen base's matmuls have no weight
            # gradient to speed up, and peft's rank-r layers are too small for fp8 to pay.
            raise ConfigError(
                "precision",
                f"fp8 is for full fine-tuning; with LoRA ({p}.lora_rank) use bf16 or auto (which picks bf16).",
            )
        if self.lora_quantize_base == "nf4":
            if self.mixed_precision != "bf16":
                raise ConfigError(
                    "lora_quantize_base",
                    f"nf4 needs {p}.mixed_precision bf16: an NF4 weight is dequantized to bf16 for each matmul.",
                )
            if self.sharding == "hybrid":
                # An NF4 weight is quantized whole and cut into row blocks over one mesh dimension (torchtune's way
                # too); a replicated second dimension is not built or tested.
                raise ConfigError(
                    "lora_quantize_base", f"nf4 needs {p}.sharding full or auto (auto picks full with nf4)."
                )
        if self.output_path and self.model_init != "pretrained":
            raise ConfigError(
                "output_path",
                f"with LoRA needs {p}.model_init pretrained: an adapter is loaded onto the base it was trained on, "
                "and a random base cannot be loaded again.",
            )
        if self.export_merged and not self.output_path:
            raise ConfigError("export_merged", f"needs {p}.output_path.")

    def _check_data(self) -> None:
        p = self.PREFIX
        if self.data != RANDOM_DATA and not self.data.startswith(DATA_SCHEMES):
            raise ConfigError(
                "data", f"must be random or a location starting with {', '.join(DATA_SCHEMES)}; got {self.data!r}."
            )
        if self.validation_data and not self.validation_data.startswith(DATA_SCHEMES):
            raise ConfigError(
                "validation_data", f"must start with {', '.join(DATA_SCHEMES)}; got {self.validation_data!r}."
            )
        for name in ("model", "tokenizer", "output_path"):
            value = getattr(self, name)
            if value.startswith("hf://"):
                raise ConfigError(name, "must not be an hf:// location (that is for data sets); use the model's id.")
        for name in ("output_path", "checkpoint_path"):
            value = getattr(self, name)
            if value and not value.startswith(STORAGE_SCHEMES):
                raise ConfigError(name, f"must start with {', '.join(STORAGE_SCHEMES)}; got {value!r}.")
        for name in ("data", "validation_data", "output_path", "checkpoint_path"):
            value = getattr(self, name)
            if value.startswith(("s3://", "gs://")) and not value[5:].split("/", 1)[0]:
                raise ConfigError(name, f"has no bucket ({value[:5]}BUCKET/prefix); got {value!r}.")
        if not (0.0 <= self.validation_split <= 0.5):
            raise ConfigError("validation_split", f"must be between 0 and 0.5; got {self.validation_split}.")
        if 0.0 < self.validation_split < MIN_VALIDATION_SPLIT:
            raise ConfigError(
                "validation_split",
                f"must be 0 (none) or at least {MIN_VALIDATION_SPLIT} (one document in a million held out); got "
                f"{self.validation_split!r}. For a smaller held-out set, use {self.PREFIX}.validation_data.",
            )
        if self.validation_split and self.validation_data:
            raise ConfigError("validation_split", f"and {p}.validation_data exclude each other: set one.")
        if self.data == RANDOM_DATA and (self.validation_split or self.validation_data):
            raise ConfigError("validation_split", "needs a data source other than random.")
        if self.eval_every_steps and not self.has_validation:
            # Accepted, it would silently evaluate nothing: the user asked for an eval loss they never get.
            raise ConfigError(
                "eval_every_steps", f"needs {p}.validation_split or {p}.validation_data: there is nothing to evaluate."
            )
        if self.export_every_checkpoint and not self.output_path:
            raise ConfigError("export_every_checkpoint", f"needs {p}.output_path.")
        if not self.data_field:
            raise ConfigError("data_field", "must not be empty.")

    @property
    def has_validation(self) -> bool:
        return bool(self.validation_split or self.validation_data)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrainConfig:
        """Build from snake_case keys; unknown keys and values of the wrong type raise ``ValueError``."""
        if not isinstance(d, dict):
            raise ValueError(f"{cls.PREFIX} must be a mapping, got {type(d).__name__}.")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - set(known))
        if unknown:
            raise ConfigError(unknown[0], f"is not a known field (known: {', '.join(sorted(known))}).")
        defaults = cls()
        kwargs = {key: _coerce(key, value, getattr(defaults, key)) for key, value in d.items()}
        return cls(**kwargs)

    @classmethod
    def from_json(cls, text: str) -> TrainConfig:
        try:
            d = json.loads(text)
        except ValueError as e:
            raise ValueError(f"{cls.PREFIX} is not valid JSON: {e}") from e
        return cls.from_dict(d)

    @classmethod
    def from_file(cls, path: str | Path) -> TrainConfig:
        return cls.from_json(Path(path).read_text())

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def learning_rate_at(self, step: int) -> float:
        """Learning rate of optimizer step ``step`` (1-based): linear warm-up, then constant or cosine to 0."""
        if self.warmup_steps and step <= self.warmup_steps:
            return self.learning_rate * step / self.warmup_steps
        if self.lr_schedule == "constant":
            return self.learning_rate
        decay_steps = max(1, self.steps - self.warmup_steps)
        progress = min(1.0, (step - self.warmup_steps) / decay_steps)
        return self.learning_rate * 0.5 * (1.0 + math.cos(math.pi * progress))

    @property
    def tokens_per_rank_per_step(self) -> int:
        return self.batch_size_per_rank * self.grad_accum * self.seq_len


def _coerce(name: str, value: Any, default: Any) -> Any:
    """Check ``value`` against the type of the field's default; ints are accepted for floats."""
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise ConfigError(name, f"must be true or false, got {value!r}.")
        return value
    if isinstance(default, int):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(name, f"must be an integer, got {value!r}.")
        return value
    if isinstance(default, float):
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(name, f"must be a number, got {value!r}.")
        return float(value)
    if isinstance(default, str):
        if not isinstance(value, str):
            raise ConfigError(name, f"must be a string, got {value!r}.")
        return value
    if isinstance(default, list):
        if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
            raise ConfigError(name, f"must be a list of strings, got {value!r}.")
        return list(value)
    if isinstance(default, dict):
        if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
            raise ConfigError(name, f"must be a mapping with string keys, got {value!r}.")
        return dict(value)
    raise AssertionError(f"no coercion for {name}")  # a new field type needs a branch above
