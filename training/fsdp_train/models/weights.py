"""Hugging Face model directories in and out: fetch one to the node, load it into the sharded model,
and write the trained model back as a directory that ``AutoModelForCausalLM.from_pretrained`` loads.

Loading reads the safetensors straight into each rank's shards with torch.distributed.checkpoint's
``HuggingFaceStorageReader``: every rank reads only the slices it owns, and no rank ever holds the
full model. Directories without safetensors fall back to a full load on rank 0 and a broadcast.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch
import torch.distributed as dist
from torch import nn

from fsdp_train.contract.config import MERGED_DIR, TrainConfig
from fsdp_train.models.model import (
    canonical_name,
    fill_parameter,
    rebuild_buffers,
    to_empty_keeping_ties,
    unwrapped_name,
)
from fsdp_train.models.quantize import dequantized, is_nf4
from fsdp_train.state.storage import is_remote

GENERIC_TOKENIZER_CLASSES = ("TokenizersBackend", "PreTrainedTokenizerFast")
"""Tokenizers loaded from a bare ``tokenizer.json``: no model family of their own."""
EXPORT_LOSS_TOLERANCE = 0.01
"""The self-check's bound on |export loss - training loss| / training loss on the same rows."""


def has_safetensors(directory: str) -> bool:
    return any(Path(directory).glob("*.safetensors"))


def tied_names(model: nn.Module) -> set[str]:
    """Parameter names that share their tensor with an earlier one (a tied lm_head)."""
    seen: dict[int, str] = {}
    tied = set()
    for name, param in model.named_parameters(remove_duplicate=False):
        if id(param) in seen:
            tied.add(name)
        else:
            seen[id(param)] = name
    return tied


def load_sharded(model: nn.Module, directory: str) -> float:
    """Fill the (FSDP-sharded, materialized) model from a directory of safetensors; return seconds taken.

    Tied parameters are left out of the request: their owner's tensor is the same storage, so the
    tie survives (and a checkpoint without ``lm_head.weight``, as Hugging Face saves tied models, loads).
    """
    from torch.distributed.checkpoint.hf_storage import HuggingFaceStorageReader
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        set_model_state_dict,
    )
    from torch.distributed.checkpoint.state_dict_loader import load as dcp_load

    started = time.perf_counter()
    quantized = nf4_parameters(model)
    state = get_model_state_dict(model)
    tied = {canonical_name(n) for n in tied_names(model)} | set(quantized)
    # The files' names: a layer wrapped with a LoRA adapter keeps its weight under base_layer; the adapters
    # (fsdp_train.models.adapters) are not in the files. Same tensors, so DCP loads into the model's own shards.
    wanted = {canonical_name(k): v for k, v in state.items() if "lora_" not in k and canonical_name(k) not in tied}
    # DCP raises for a requested name the files lack, so strict=False only lets the tied names through.
    dcp_load(wanted, storage_reader=HuggingFaceStorageReader(directory))
    set_model_state_dict(model, state, options=StateDictOptions(strict=False))
    fill_from_safetensors(quantized, directory)
    return time.perf_counter() - started


def nf4_parameters(model: nn.Module) -> dict[str, nn.Parameter]:
    """The NF4 weights by their name in the plain model's files (a DTensor's shard or, on one rank, the tensor)."""
    return {
        canonical_name(name): param
        for name, param in model.named_parameters()
        if is_nf4(getattr(param, "_local_tensor", param))
    }


def fill_from_safetensors(params: dict[str, nn.Parameter], directory: str) -> None:
    """Each NF4 weight from the files, read whole (memory-mapped) on every rank and quantized there (``fill_nf4``).

    DCP's reader fills shards of plain tensors only; an NF4 shard must come from its whole tensor.
    """
    from safetensors import safe_open

    index = Path(directory) / "model.safetensors.index.json"
    files = json.loads(index.read_text())["weight_map"] if index.exists() else {}
    by_file: dict[str, list[str]] = {}
    for name in params:
        by_file.setdefault(files.get(name, "model.safetensors"), []).append(name)
    for file, names in by_file.items():  # each file opened once
        with safe_open(str(Path(directory) / file), framework="pt") as f:
            for name in names:
                fill_parameter(params[name], f.get_tensor(name))


def dequantized_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter's full value under its state-dict name, on rank 0's CPU (empty elsewhere), the NF4 weights
    dequantized: the base the adapters were trained on. Collective: every rank gathers each parameter in turn.

    Written here because DCP's ``get_model_state_dict`` gathers a sharded NF4 weight as NF4, which nothing downstream
    (peft's merge, safetensors) takes.
    """
    import torch.distributed as dist
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor

    for module in model.modules():  # a unit left gathered (the last block, the root) shows its bf16 compute copies
        if isinstance(module, FSDPModule):
            module.reshard()
    full: dict[str, torch.Tensor] = {}
    gathered: dict[int, torch.Tensor] = {}  # a tied lm_head is its embedding: gathered once, named twice
    for name, param in model.named_parameters(remove_duplicate=False):
        if id(param) in gathered:
            if dist.get_rank() == 0:
                full[unwrapped_name(name)] = gathered[id(param)]
            continue
        local = getattr(param, "_local_tensor", param)
        value = dequantized(local).detach()
        if isinstance(param, DTensor):
            value = DTensor.from_local(
                value, param.device_mesh, param.placements, run_check=False, shape=param.shape, stride=param.stride()
            ).full_tensor()
        if dist.get_rank() == 0:
            full[unwrapped_name(name)] = gathered[id(param)] = value.cpu()
    return full


def load_broadcast(model: nn.Module, directory: str, overrides: dict[str, Any]) -> None:
    """Full load on rank 0 and a broadcast into the shards: for weights that are not safetensors."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
    from transformers import AutoModelForCausalLM

    full: dict[str, Any] = {}
    if dist.get_rank() == 0:
        loaded = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32, **overrides)
        # Under the model's own names (a layer wrapped with a LoRA adapter holds its weight under base_layer).
        names = {canonical_name(name): unwrapped_name(name) for name, _ in model.named_parameters()}
        full = {names.get(key, key): value for key, value in loaded.state_dict().items()}
    set_model_state_dict(
        model, full, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True, strict=False)
    )


def export(
    model: nn.Module,
    config: Any,
    destination: str,
    *,
    tokenizer_dir: str | None,
    generation_source: str | None,
    dtype: torch.dtype = torch.bfloat16,
    check: Callable[[Path], ExportCheck] | None = None,
) -> ExportCheck | None:
    """Write the trained model as a Hugging Face directory at ``destination`` (a path or an ``s3://`` URI).

    Collective: every rank takes part in gathering the full state dict, which lands on rank 0's CPU
    (one parameter at a time on the way); rank 0 writes ``config.json``, ``generation_config.json``,
    safetensors shards (Hugging Face's own ``save_pretrained``), and the tokenizer files, runs ``check``
    on the written directory (``verify_export``), then uploads when the destination is remote. A failed
    check publishes nothing. Every rank gets rank 0's check result (None without a check).
    """
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    # A model's state dict holds tensors only (the stub's ValueType also allows optimizer state's kinds).
    full = cast(
        dict[str, torch.Tensor],
        get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True)),
    )
    verdict: list[ExportCheck | None] = [None]
    if dist.get_rank() == 0:
        staging = Path(tempfile.mkdtemp(prefix="fsdp-export-"))
        try:
            _write_hf_dir(full, config, staging, tokenizer_dir, generation_source, dtype)
            del full
            verdict[0] = check(staging) if check is not None else None
            if verdict[0] is None or verdict[0].verified:
                _publish(staging, destination)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    dist.broadcast_object_list(verdict, src=0)
    return verdict[0]


def export_adapters(
    model: nn.Module,
    config: Any,
    destination: str,
    *,
    base: str,
    merged: bool,
    tokenizer_dir: str | None,
    generation_source: str | None,
    dtype: torch.dtype = torch.bfloat16,
    check: Callable[[Path], ExportCheck] | None = None,
) -> ExportCheck | None:
    """A LoRA run's export: the adapter directory ``peft.PeftModel.from_pretrained(base, destination)`` loads,
    with the tokenizer, and with ``merged`` the base with the adapters merged in ``destination/merged``.

    Collective, as ``export``: only the adapters are gathered unless the merged model is asked for; rank 0 writes,
    runs ``check`` on the written directory and publishes only what passed.
    """
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    from fsdp_train.models import adapters

    lora = cast(Any, model).peft_config["default"]
    lora.base_model_name_or_path = base
    if merged and nf4_parameters(model):  # QLoRA: merged into the base as it trained, dequantized
        full = dequantized_state(model)
    else:
        options = StateDictOptions(full_state_dict=True, cpu_offload=True, ignore_frozen_params=not merged)
        full = cast(dict[str, torch.Tensor], get_model_state_dict(model, options=options))
    verdict: list[ExportCheck | None] = [None]
    if dist.get_rank() == 0:
        staging = Path(tempfile.mkdtemp(prefix="fsdp-export-"))
        try:
            adapters.write_adapter_dir(model, {k: v for k, v in full.items() if adapters.is_adapter(k)}, lora, staging)
            _write_tokenizer(staging, tokenizer_dir)
            if merged:
                state = adapters.merged_state(full, config, lora)
                _write_hf_dir(state, config, staging / MERGED_DIR, tokenizer_dir, generation_source, dtype)
            del full
            for item in staging.iterdir():
                item.chmod(0o755 if item.is_dir() else 0o644)
            verdict[0] = check(staging) if check is not None else None
            if verdict[0] is None or verdict[0].verified:
                _publish(staging, destination)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    dist.broadcast_object_list(verdict, src=0)
    return verdict[0]


def _write_hf_dir(
    full: dict[str, torch.Tensor],
    config: Any,
    directory: Path,
    tokenizer_dir: str | None,
    generation_source: str | None,
    dtype: torch.dtype,
) -> None:
    from transformers import AutoModelForCausalLM, GenerationConfig

    config = type(config).from_dict(config.to_dict())
    config.use_cache = True  # the training run turned the KV cache off; inference wants it
    config.dtype = dtype
    with torch.device("meta"):
        hf_model = AutoModelForCausalLM.from_config(config, dtype=dtype)  # type: ignore[no-untyped-call]
    hf_model.load_state_dict({k: v.to(dtype) for k, v in full.items()}, strict=False, assign=True)
    if getattr(config, "tie_word_embeddings", False):
        hf_model.tie_weights()
    missing = [n for n, p in hf_model.named_parameters() if p.is_meta]
    if missing:
        raise RuntimeError(f"export: no trained values for {missing[:4]}")
    for name, buffer in hf_model.named_buffers():
        if buffer.is_meta:  # non-persistent buffers (rotary frequencies) are rebuilt by from_pretrained
            _set_buffer(hf_model, name, torch.zeros(buffer.shape, dtype=buffer.dtype))
    if generation_source:
        # A source without one keeps the generation config derived from the model config.
        with contextlib.suppress(OSError):
            hf_model.generation_config = GenerationConfig.from_pretrained(generation_source)
    hf_model.save_pretrained(directory, max_shard_size="5GB")
    _set_json(directory / "config.json", use_cache=True)  # save_pretrained keeps the training run's False
    _write_tokenizer(directory, tokenizer_dir)
    for item in directory.iterdir():
        item.chmod(0o644)  # safetensors are written 0600; an export is read by other users and services


def _write_tokenizer(directory: Path, tokenizer_dir: str | None) -> None:
    """The tokenizer training used, saved so that ``AutoTokenizer.from_pretrained(directory)`` loads it."""
    if not tokenizer_dir:
        return
    from fsdp_train.datapath.tokenizer_choice import choose_tokenizer

    tokenizer = choose_tokenizer(tokenizer_dir).tokenizer  # the one training used, not AutoTokenizer's own
    tokenizer.save_pretrained(directory)
    _stop_at_end_of_turn(directory, tokenizer)
    if type(tokenizer).__name__ in GENERIC_TOKENIZER_CLASSES:
        # Next to a config.json, AutoTokenizer would otherwise pick the model family's own class
        # (Qwen2Tokenizer), which rebuilds the pre-tokenizer and splits digits and spaces differently.
        # transformers 4 honours tokenizer_class; transformers 5 overrides it for some families
        # (MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS, qwen2 among them) unless an auto_map names the
        # class, and with that entry falls back to tokenizer_class without running remote code.
        # The export's self-check (verify_export) loads it back and compares the token ids either way.
        _set_json(
            directory / "tokenizer_config.json",
            tokenizer_class="PreTrainedTokenizerFast",
            auto_map={"AutoTokenizer": [None, "PreTrainedTokenizerFast"]},
        )


END_OF_TURN = "<|im_end|>"
"""ChatML's end of a turn (Qwen's chat template): generation stops there as well as at EOS."""


def _stop_at_end_of_turn(directory: Path, tokenizer: Any) -> None:
    """A tokenizer with ChatML's end-of-turn token: `generation_config.json` stops there too (Qwen's instruct
    models list both ids), so a chat export does not talk on past its reply."""
    vocab = tokenizer.get_vocab()
    if END_OF_TURN not in vocab or not (directory / "generation_config.json").exists():
        return
    config = json.loads((directory / "generation_config.json").read_text())
    eos = config.get("eos_token_id")
    ids = [eos] if isinstance(eos, int) else list(eos) if isinstance(eos, list) else []
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
        ids.append(tokenizer.eos_token_id)
    if vocab[END_OF_TURN] not in ids:
        ids.append(vocab[END_OF_TURN])
    _set_json(directory / "generation_config.json", eos_token_id=ids)


def _set_json(path: Path, **values: Any) -> None:
    content = json.loads(path.read_text()) if path.exists() else {}
    path.write_text(json.dumps(content | values, indent=2, sort_keys=True) + "\n")


def _set_buffer(model: nn.Module, name: str, value: torch.Tensor) -> None:
    owner, _, leaf = name.rpartition(".")
    module = model.get_submodule(owner) if owner else model
    module.register_buffer(leaf, value, persistent=False)


def _publish(staging: Path, destination: str) -> None:
    import pyarrow.fs as pafs

    from fsdp_train.state.storage import filesystem

    if not is_remote(destination):
        target = Path(destination.removeprefix("file://"))
        target.mkdir(parents=True, exist_ok=True)
        for item in staging.iterdir():
            if item.is_dir():  # a LoRA export's merged model
                shutil.copytree(item, target / item.name, dirs_exist_ok=True)
            else:
                shutil.copy2(item, target / item.name)
        return
    fs, path = filesystem(destination)
    pafs.copy_files(str(staging), path, source_filesystem=pafs.LocalFileSystem(), destination_filesystem=fs)


@dataclass(frozen=True, slots=True)
class ExportCheck:
    """What loading the export as a user does gave (``verify_export``)."""

    verified: bool
    training_loss: float
    export_loss: float
    texts_checked: int = 0
    reason: str = ""


def verify_export(
    directory: Path,
    *,
    training_tokenizer: Any | None,
    texts: Sequence[str],
    batch: dict[str, torch.Tensor],
    training_loss: float,
    device: torch.device,
    load: Callable[[Path, torch.dtype], Any] | None = None,
) -> ExportCheck:
    """Load ``directory`` alone, as a user does, and compare it with the model and tokenizer that trained.

    ``load`` is how a user loads it (a LoRA adapter: ``PeftModel.from_pretrained`` on its base); by default
    ``AutoModelForCausalLM.from_pretrained``.

    ``AutoTokenizer`` on the directory must give the training tokenizer's token ids on ``texts``, and
    ``AutoModelForCausalLM`` on it must reach ``training_loss`` on ``batch`` (the same rows, measured
    in training just before the export) within ``EXPORT_LOSS_TOLERANCE``.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    reasons = []
    if training_tokenizer is not None:
        exported = AutoTokenizer.from_pretrained(str(directory))
        for text in texts:
            want = list(training_tokenizer(text, add_special_tokens=False)["input_ids"])
            got = list(exported(text, add_special_tokens=False)["input_ids"])
            if want != got:
                same = (i for i, (a, b) in enumerate(zip(want, got, strict=False)) if a != b)
                first = next(same, min(len(want), len(got)))
                reasons.append(
                    f"AutoTokenizer.from_pretrained(export) loads {type(exported).__name__}, which tokenizes the "
                    f"training text differently from the training tokenizer ({type(training_tokenizer).__name__}): "
                    f"{len(got)} tokens against {len(want)}, first difference at token {first} "
                    f"(text {text[:40]!r})"
                )
                break
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    loaded: Any = (
        load(directory, dtype)
        if load is not None
        else AutoModelForCausalLM.from_pretrained(str(directory), dtype=dtype)
    )
    loaded = loaded.to(device)
    loaded.eval()
    with torch.no_grad():
        inputs = {k: v.to(device) for k, v in batch.items() if k in ("input_ids", "labels", "position_ids")}
        # No KV cache: with one, transformers ignores the documents' restarting position ids and lets
        # attention cross document boundaries, which training never did.
        export_loss = float(loaded(**inputs, use_cache=False).loss.float())
    del loaded
    if device.type == "cuda":
        torch.cuda.empty_cache()
    drift = abs(export_loss - training_loss) / max(abs(training_loss), 1e-6)
    if not drift <= EXPORT_LOSS_TOLERANCE:  # NaN fails too
        reasons.append(
            f"the exported model's loss {export_loss:.4f} differs from training's {training_loss:.4f} on the same "
            f"rows by {drift:.1%} (more than {EXPORT_LOSS_TOLERANCE:.0%})"
        )
    return ExportCheck(not reasons, training_loss, export_loss, len(texts), "; ".join(reasons))


def describe(directory: Path) -> dict[str, Any]:
    """The files of an exported directory (for logs and tests)."""
    return {p.name: p.stat().st_size for p in sorted(directory.iterdir())} | {
        "config": json.loads((directory / "config.json").read_text())
    }


def load_pretrained_weights(model: nn.Module, cfg: TrainConfig, device: torch.device) -> None:
    """Materialize the sharded model and fill it from ``cfg.model``, a local directory (``fsdp_train.models.weights``).

    Safetensors go straight into each rank's shards; other weight files are loaded on rank 0 and broadcast.
    """

    to_empty_keeping_ties(model, device)
    if has_safetensors(cfg.model):
        load_sharded(model, cfg.model)
    else:
        load_broadcast(model, cfg.model, dict(cfg.model_overrides))
    rebuild_buffers(model, model.config, device)
