"""Model construction for the training function: the architecture on the meta device, then sharded init."""

from __future__ import annotations

import hashlib
import inspect
from typing import Any, cast

import torch
from torch import nn

from fsdp_train.contract.config import ConfigError, TrainConfig
from fsdp_train.contract.known_models import KNOWN_CONFIGS
from fsdp_train.models.quantize import fill_nf4, is_nf4


def _refuse_non_fields(config_class: type | None, overrides: dict[str, Any], model_type: str) -> None:
    """The overrides become keyword arguments of the config: a key that is none of its class's fields is a
    loader option (``trust_remote_code``, ``token``) or nothing at all. The operator refuses these first
    (fsdp_operator.api.model_configs); this holds for every other way a TrainConfig arrives."""
    if not overrides:
        return
    if config_class is None:
        raise ConfigError("model_overrides", f"cannot be checked: transformers knows no model type {model_type!r}.")
    allowed = set(inspect.signature(config_class).parameters) - {"self", "kwargs"}
    if unknown := sorted(key for key in overrides if key not in allowed):
        raise ConfigError(
            "model_overrides", f"may set only fields of {config_class.__name__}; not: {', '.join(unknown)}."
        )


def hf_config(cfg: TrainConfig) -> Any:
    """The Hugging Face config of the model to train, with ``model_overrides`` applied."""
    from transformers import CONFIG_MAPPING, AutoConfig, PretrainedConfig, Qwen2Config

    overrides = dict(cfg.model_overrides)
    if cfg.model in KNOWN_CONFIGS and cfg.model_init == "random":
        _refuse_non_fields(Qwen2Config, overrides, "qwen2")
        merged = {k: v for k, v in KNOWN_CONFIGS[cfg.model].items() if k != "model_type"} | overrides
        for token in ("bos_token_id", "eos_token_id"):
            # A shrunken vocabulary (tests) no longer holds the special tokens; they play no part here.
            if token not in overrides and merged[token] >= merged["vocab_size"]:
                merged[token] = None
        config = Qwen2Config(**merged)
    else:
        if overrides:
            model_type = str(PretrainedConfig.get_config_dict(cfg.model)[0].get("model_type", ""))
            known = model_type in CONFIG_MAPPING  # a lazy mapping: `.get` misses what it has not loaded yet
            _refuse_non_fields(CONFIG_MAPPING[model_type] if known else None, overrides, model_type)
        config = AutoConfig.from_pretrained(cfg.model, **overrides)
    config.use_cache = False
    return config


def build_meta_model(config: Any) -> nn.Module:
    """The model on the meta device: no memory, no init; ``parallelize`` shards it, then ``init_weights``."""
    from transformers import AutoModelForCausalLM

    from fsdp_train.contract.families import DOCUMENT_ATTENTION, attention_for
    from fsdp_train.models.attention import register

    implementation, _ = attention_for(config)
    if implementation == DOCUMENT_ATTENTION:
        implementation = register()
    with torch.device("meta"):
        # Plain causal SDPA without document bounds; with them, flash attention per document
        # (fsdp_train.models.attention); transformers' own where the family asks for what that does not do.
        model = AutoModelForCausalLM.from_config(  # type: ignore[no-untyped-call]
            config, attn_implementation=implementation, dtype=torch.float32
        )
    return cast(nn.Module, model)


def decoder_blocks(model: nn.Module) -> nn.ModuleList:
    """The transformer blocks of a Hugging Face causal LM (``model.model.layers``)."""
    layers = getattr(getattr(model, "model", None), "layers", None)
    if not isinstance(layers, nn.ModuleList):
        raise ValueError(f"training.model: {type(model).__name__} has no model.layers to shard per block.")
    return layers


def unwrapped_name(name: str) -> str:
    """The parameter's name without wrapper prefixes (checkpointing, compile): its name in a state dict."""
    return name.replace("_checkpoint_wrapped_module.", "").replace("_orig_mod.", "")


def canonical_name(name: str) -> str:
    """The parameter's name as in the plain model: unwrapped, and without the ``base_layer.`` of a layer peft
    wrapped with an adapter (so a LoRA run's base is the plain model's, in its files and its random init)."""
    return unwrapped_name(name).replace(".base_layer.", ".")


def param_seed(seed: int, name: str) -> int:
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


@torch.no_grad()
def init_weights(model: nn.Module, config: Any, seed: int, device: torch.device) -> None:
    """Materialize a meta (possibly sharded) model on ``device`` and give it its random init.

    Each parameter's full value comes from a generator seeded by (seed, name), and each rank keeps
    its own shard of it, so the weights do not depend on how the model is sharded: an FSDP run and a
    single-process run start from the same point. Init follows Hugging Face's for Qwen2: normal(0,
    initializer_range) for matrices and embeddings, zero biases, ones for RMSNorm.
    """
    to_empty_keeping_ties(model, device)
    std = float(config.initializer_range)
    for name, param in model.named_parameters():
        shape = param.shape
        if name.endswith("bias"):
            full = torch.zeros(shape, device=device)
        elif "norm" in name:
            full = torch.ones(shape, device=device)
        else:
            gen = torch.Generator(device=device).manual_seed(param_seed(seed, canonical_name(name)))
            full = torch.empty(shape, device=device).normal_(0.0, std, generator=gen)
        fill_parameter(param, full)
    rebuild_buffers(model, config, device)


@torch.no_grad()
def fill_parameter(param: torch.Tensor, full: torch.Tensor) -> None:
    """Give a (possibly sharded) parameter its full value: each rank keeps its own shard of ``full``."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    if isinstance(param, DTensor) and is_nf4(param._local_tensor):
        # The shard itself (``to_local()`` gives a view: new inner tensors set on it would not reach FSDP2's shard).
        fill_nf4(param._local_tensor, full, param.device_mesh.get_local_rank(), param.device_mesh.size())
    elif isinstance(param, DTensor):
        # src_data_rank=None: every rank holds the same full tensor; slice locally, no broadcast.
        shard = distribute_tensor(full.to(param.dtype), param.device_mesh, param.placements, src_data_rank=None)
        param.to_local().copy_(shard.to_local())
    elif is_nf4(param):
        fill_nf4(param, full, rank=0, shards=1)
    else:
        param.copy_(full)


def to_empty_keeping_ties(model: nn.Module, device: torch.device) -> None:
    """``model.to_empty(device)``, then share again the parameters that were shared (a tied lm_head).

    On a plain module, ``to_empty`` from meta makes a new parameter per module that held the shared
    one, so the tied embedding and lm_head would be initialised and trained apart. (FSDP2 keeps the
    tie itself; for it this is a no-op.)
    """
    holders: dict[int, list[tuple[nn.Module, str]]] = {}
    for module in model.modules():
        for name, param in module.named_parameters(recurse=False):
            holders.setdefault(id(param), []).append((module, name))
    model.to_empty(device=device)
    for refs in holders.values():
        first = getattr(refs[0][0], refs[0][1])
        for module, name in refs[1:]:
            if getattr(module, name) is not first:
                setattr(module, name, first)


def rebuild_buffers(model: nn.Module, config: Any, device: torch.device) -> None:
    """Give back the non-persistent buffers that meta -> ``to_empty`` leaves uninitialised (no file holds them).

    Rotary frequencies (a fresh rotary module from the config) and a scaled embedding's scale (Gemma 3's
    ``embed_scale``, from its ``scalar_embed_scale``). Any other non-persistent buffer would hold whatever memory it
    got: the model is refused, naming it, rather than trained with garbage in it.
    """
    for parent in list(model.modules()):
        for child_name, child in list(parent.named_children()):
            if type(child).__name__.endswith("RotaryEmbedding"):
                with torch.device(device):  # transformers >= 5.17 deprecates its ``device`` argument
                    setattr(parent, child_name, type(child)(config=config))
    unknown = []
    for path, module in model.named_modules():
        if type(module).__name__.endswith("RotaryEmbedding"):
            continue
        for name in getattr(module, "_non_persistent_buffers_set", ()):
            buffer = getattr(module, name)
            if name == "embed_scale" and hasattr(module, "scalar_embed_scale"):
                with torch.no_grad():
                    buffer.fill_(float(module.scalar_embed_scale))
            elif buffer is not None:
                unknown.append(f"{path}.{name}" if path else name)
    if unknown:
        raise ConfigError(
            "model",
            f"{type(model).__name__} holds buffers that no weight file has and the bundled function cannot rebuild: "
            f"{', '.join(sorted(unknown)[:4])}; train it with trainFunction (your own Ray Train function).",
        )
