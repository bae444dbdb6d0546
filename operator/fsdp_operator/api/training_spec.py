"""The training sections of the spec: model, data, training, checkpoint, output. Declarations."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from fsdp_operator.api import formats, model_configs, schema
from fsdp_operator.api.fields import Problems, show
from fsdp_operator.api.fields import field as declare

Sharding = Literal["full", "hybrid", "auto"]


MAX_STEPS = 100_000_000


@dataclass(frozen=True, slots=True)
class Model:
    """The model to fine-tune."""

    name: str = declare(
        "Hugging Face model id or a path inside the image.",
        default=schema.DEFAULT_MODEL,
        grammar=formats.MODEL_NAME,
        train="model",
    )
    init: Literal["pretrained", "random"] = declare(
        "pretrained: load the weights; random: build the architecture from its config with random weights "
        "(no download).",
        default="pretrained",
        train="model_init",
    )
    overrides: dict[str, Any] = declare(
        "Model config overrides, e.g. a tiny model for a CPU run: only the config fields of the model's family, "
        "in their types (the table in docs/api.md, 'Model config overrides').",
        factory=dict,
        keys=formats.CONFIG_KEY,
        max_items=64,
        train="model_overrides",
    )

    @staticmethod
    def _rules(v: dict[str, Any], path: str, problems: Problems) -> None:
        # The overrides become keyword arguments of the Hugging Face config: anything else there is a loader
        # option (trust_remote_code, token) or an attribute, so only the family's typed config fields pass.
        v["overrides"] = model_configs.check_overrides(v["name"], v["overrides"], f"{path}.overrides", problems)


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """Distributed checkpoints (torch.distributed.checkpoint); resumed from on restart."""

    storage: str = declare(
        "Where to write checkpoints: s3://BUCKET/prefix, gs://BUCKET/prefix, file:///path or an absolute path (with "
        "more than one worker: under sharedVolume.mountPath). Empty: none.",
        default="",
        grammar=formats.STORAGE_DESTINATION,
        train="checkpoint_path",
    )
    interval_steps: int = declare(
        "Steps between checkpoints; 0: only at the end.",
        default=0,
        minimum=0,
        maximum=MAX_STEPS,
        train="checkpoint_interval",
    )
    grace_period_seconds: int = declare(
        "The worker pods' terminationGracePeriodSeconds: how long a worker being deleted (a drain, a Spot "
        "interruption, a node taint) gives its ranks to finish the step and save a checkpoint before it goes "
        "(docs/reliability.md, 'A node that goes away'). Size it from the save time status.checkpoint reports.",
        default=120,
        minimum=1,
        maximum=3600,
    )


@dataclass(frozen=True, slots=True)
class Data:
    """What to train on: random tokens, or the documents of a data source, tokenized and packed into seqLen."""

    source: str = declare(
        "random: uniform random token ids (smoke tests, benchmarks). Else a file, directory or prefix: s3://, "
        "gs://, file://, an absolute path (a PVC mounted in the image) or hf://datasets/OWNER/NAME. Unreadable or "
        "empty: the job fails with reason DataUnavailable.",
        default="random",
        grammar=formats.DATA_SOURCE,
        train="data",
    )
    format: Literal["jsonl", "parquet", "text", ""] = declare(
        "jsonl, parquet or text (one document per non-empty line). Empty: from the file extension.",
        default="",
        train="data_format",
    )
    field: str = declare(
        "The column holding each document's text (kind text) or its list of {role, content} messages (kind chat).",
        default="text",
        max_length=256,
        train="data_field",
    )
    kind: Literal["text", "chat"] = declare(
        "text: causal LM over packed documents. chat: each row is a conversation, rendered with the tokenizer's "
        "chat template; the loss is on the assistant turns only.",
        default="text",
        train="data_kind",
    )
    tokenizer: str = declare(
        "Hugging Face tokenizer id or directory (s3:// or a path). Empty: the model's own.",
        default="",
        grammar=formats.or_empty(formats.MODEL_NAME),
        train="tokenizer",
    )
    validation_split: float = declare(
        "Fraction of the documents held out for evaluation (chosen with shuffleSeed): 0 (none), or at least 1e-06.",
        default=0.0,
        minimum=0,
        maximum=0.5,
        train="validation_split",
    )
    validation_source: str = declare(
        "A second source evaluated instead of a split (same format, field and kind). Empty: none.",
        default="",
        grammar=formats.or_empty(formats.DATA_SOURCE),
        train="validation_data",
    )
    eval_every_steps: int = declare(
        "Evaluate on the validation data (validationSplit or validationSource, one of which it needs) every N "
        "steps, and after the last; 0: after the last step only.",
        default=0,
        minimum=0,
        maximum=MAX_STEPS,
        train="eval_every_steps",
    )
    document_mask: bool = declare(
        "Restart position ids at every document of a packed sequence, so attention stays inside each document "
        "(variable-length flash attention over the document bounds on GPUs, no dense mask: docs/data.md). false: "
        "attention "
        "spans the documents of a sequence, plain causal.",
        default=True,
        train="document_mask",
    )
    shuffle_seed: int = declare(
        "Seed of the order of the packed sequences in each epoch (and of validationSplit).",
        default=0,
        minimum=0,
        maximum=2**32 - 1,
        train="shuffle_seed",
    )
    epochs: int = declare(
        "Passes over the data: training stops after training.steps or after this many epochs, whichever comes "
        "first. 0: no limit (the data repeats, reshuffled).",
        default=0,
        minimum=0,
        maximum=1_000_000,
        train="epochs",
    )


@dataclass(frozen=True, slots=True)
class Output:
    """The trained model, written as a Hugging Face directory (config, safetensors, tokenizer, generation config)."""

    storage: str = declare(
        "Where to write it: s3://BUCKET/prefix, gs://BUCKET/prefix, file:///path or an absolute path (with more than "
        "one worker: under sharedVolume.mountPath). Its path goes into status.output. Empty: no export (the DCP "
        "checkpoints are for resuming only).",
        default="",
        grammar=formats.STORAGE_DESTINATION,
        train="output_path",
    )
    every_checkpoint: bool = declare(
        "Also export at each checkpoint, into <storage>/step_NNNNNNNN.", default=False, train="export_every_checkpoint"
    )
    merge: bool = declare(
        "With training.lora: also write the base with the adapters merged in, a plain Hugging Face model that "
        "AutoModelForCausalLM.from_pretrained loads, into <storage>/merged (storage itself holds the adapter "
        "directory that peft.PeftModel.from_pretrained(base, storage) loads).",
        default=False,
        train="export_merged",
    )


@dataclass(frozen=True, slots=True)
class Lora:
    """LoRA: train low-rank adapters (peft's layers, saved in peft's format) on a frozen bf16 base instead of every
    weight; QLoRA with quantizeBase nf4. Only the adapters are trained, checkpointed and exported."""

    rank: int = declare("The adapters' rank.", default=16, minimum=1, maximum=4096, train="lora_rank")
    alpha: int = declare(
        "Scale numerator: an adapter adds (alpha / rank) x B A to its layer's output.",
        default=32,
        minimum=1,
        maximum=65_536,
        train="lora_alpha",
    )
    dropout: float = declare(
        "Dropout on the adapters' input.", default=0.0, minimum=0, maximum=0.9, train="lora_dropout"
    )
    target_modules: list[str] = declare(
        "The linear layers of the decoder blocks that get adapters, by name (q_proj, k_proj, v_proj, o_proj, "
        "gate_proj, up_proj, down_proj in Llama-style families). Empty: every linear layer of the blocks. A name "
        "the model's blocks do not have fails the job at its start, naming the layers they have.",
        factory=list,
        grammar=formats.MODULE_NAME,
        max_items=64,
        train="lora_target_modules",
    )
    quantize_base: Literal["none", "nf4"] = declare(
        "QLoRA: nf4 keeps the frozen base's target layers in 4-bit NormalFloat (torchao's NF4, dequantized to bf16 "
        "for each matmul), about a quarter of their bf16 memory; the adapters, embeddings and norms stay as with "
        "LoRA. Needs mixedPrecision bf16 and sharding over one dimension (full; auto picks it).",
        default="none",
        train="lora_quantize_base",
    )


@dataclass(frozen=True, slots=True)
class Training:
    """The bundled FSDP training function's parameters."""

    steps: int = declare("Optimizer steps to run.", default=100, minimum=1, maximum=MAX_STEPS, train="steps")
    seq_len: int = declare("Tokens per sequence.", default=2048, minimum=8, maximum=1_048_576, train="seq_len")
    batch_size_per_rank: int = declare(
        "Sequences per rank per micro-batch.", default=1, minimum=1, maximum=65_536, train="batch_size_per_rank"
    )
    gradient_accumulation: int = declare(
        "Micro-batches per optimizer step.", default=1, minimum=1, maximum=65_536, train="grad_accum"
    )
    learning_rate: float = declare(
        "Peak learning rate (AdamW).",
        default=2e-5,
        minimum=0,
        exclusive_minimum=True,
        maximum=1,
        train="learning_rate",
    )
    lr_schedule: Literal["constant", "cosine"] = declare(
        "Learning-rate schedule.", default="constant", train="lr_schedule"
    )
    warmup_steps: int = declare(
        "Linear warm-up steps; fewer than steps.", default=0, minimum=0, maximum=MAX_STEPS, train="warmup_steps"
    )
    sharding: Sharding = declare(
        "full: shard over all ranks; hybrid: shard inside a node, replicate across nodes (HSDP); auto: hybrid when "
        "there is more than one node and the probe's cross-node all-reduce bus bandwidth is below 25 GB/s (any EFA "
        "or TCP link between nodes), else full.",
        default="auto",
        train="sharding",
    )
    mixed_precision: Literal["bf16", "fp32"] = declare(
        "bf16: bf16 compute, fp32 master weights and gradient reduction; fp32: no mixed precision.",
        default="bf16",
        train="mixed_precision",
    )
    activation_checkpointing: bool = declare(
        "Recompute activations in backward to save memory.", default=False, train="activation_checkpointing"
    )
    compile: bool = declare(
        "torch.compile each decoder block (fuses norms, rotary and SwiGLU: +26 % on H200). Set false for CPU runs.",
        default=True,
        train="compile",
    )
    reshard_after_forward: bool = declare(
        "Free each block's gathered weights after forward and gather them again in backward. false keeps them "
        "(one bf16 copy of the model per rank) and saves that all-gather: faster when memory allows (models up to "
        "~3B on a 24 GB L4).",
        default=True,
        train="reshard_after_forward",
    )
    loss_chunk_tokens: int = declare(
        "Compute the lm_head and cross-entropy this many tokens at a time, never materializing the full fp32 "
        "logits over the vocabulary. 0: the whole batch's logits at once (tokens x vocabulary x 4 bytes with their "
        "gradient): with compile on, a compiled cross-entropy (2.8 % faster than 4096 for Qwen2.5-1.5B on one H200 "
        "at 16,384 tokens per GPU, 2.1 GiB more peak memory); with compile off, the model's own loss.",
        default=4096,
        minimum=0,
        maximum=16_777_216,
        train="loss_chunk_tokens",
    )
    precision: Literal["bf16", "fp8", "auto"] = declare(
        "Matmul precision of the decoder blocks' linear layers. bf16; fp8: torchao float8 training, for GPUs with "
        "fp8 tensor cores (L4, L40S, H100, H200; on H200 1.12x bf16 tokens/s for Qwen2.5-1.5B at 16,384 tokens a "
        "GPU's micro-batch but 0.90x at 8,192, 1.26x for a 7B-shaped model); auto: fp8 where it was measured to win "
        "(H100 or H200, and a hidden size of 3584 or more, or of 1536 or more with batchSizePerRank x seqLen of at "
        "least 16,384), else bf16.",
        default="bf16",
        train="precision",
    )
    compile_cache_dir: str = declare(
        "Absolute path of a directory every run of the job can reach (a shared volume) for the compile caches "
        "(Inductor, Triton, and Python's bytecode of what the training function imports): a restart or a second "
        "run reuses the compiled kernels and modules. Empty: each process compiles.",
        default="",
        grammar=formats.or_empty(formats.WRITABLE_PATH),
        train="compile_cache_dir",
    )
    seed: int = declare("Random seed for weights and data.", default=0, minimum=0, maximum=2**32 - 1, train="seed")
    probe_size_bytes: int = declare(
        "Buffer size of the collective bandwidth probe before training; 0 skips it.",
        default=64 * 1024 * 1024,
        minimum=0,
        maximum=16 * 2**30,
        train="probe_size_bytes",
    )
    checkpoint: Checkpoint = declare(Checkpoint.__doc__ or "", factory=Checkpoint)
    lora: Lora | None = declare(Lora.__doc__ or "")


@dataclass(frozen=True, slots=True)
class SharedVolume:
    """A PersistentVolumeClaim every Ray container mounts (ReadWriteMany: EFS, FSx for Lustre, NFS): one filesystem
    for all workers, where local checkpoint and output paths may lie when there is more than one worker."""

    claim_name: str = declare(
        "The PersistentVolumeClaim, in the job's namespace; it must allow ReadWriteMany.",
        grammar=formats.DNS1123_SUBDOMAIN,
        required=True,
    )
    mount_path: str = declare(
        "Where it is mounted in the head and in every worker, e.g. /shared.",
        grammar=formats.WRITABLE_PATH,
        required=True,
    )

    @staticmethod
    def _rules(v: dict[str, Any], path: str, problems: Problems) -> None:
        mount = v["mount_path"].rstrip("/")
        for taken in RESERVED_MOUNTS:
            if mount == taken or mount.startswith(taken + "/"):
                problems.append(f"{path}.mountPath: {show(mount)} is in {taken}, which the operator mounts itself")


# What the operator mounts in every Ray container itself (render._container): Ray's logs and /dev/shm.
RESERVED_MOUNTS = ("/tmp/ray", "/dev/shm")
