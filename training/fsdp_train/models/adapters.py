"""LoRA adapters on a frozen base (``training.lora_rank``), with peft's layers and peft's saved format.

``add_adapters`` runs on the meta model before ``parallelize``: peft's LoRA layers wrap the target linear layers of
the decoder blocks, every other parameter is frozen and, with bf16 mixed precision, kept in bf16 (the base never has
fp32 master weights), so FSDP2 shards a bf16 base and fp32 adapters in the same units. Only the adapters reach the
optimizer, the gradient reduction (a frozen parameter has no gradient) and the checkpoints (``ignore_frozen_params``:
the base is read again from the model source on resume). ``init_adapters`` gives them peft's init (A
Kaiming-uniform, B zero: training starts from the base itself), seeded per name so that the start does not depend on
the sharding.

The export writes what ``peft.PeftModel.from_pretrained(base, directory)`` loads (``adapter_config.json`` and
``adapter_model.safetensors``, the names and key layout of ``PeftModel.save_pretrained``) and, when asked, the base
with the adapters merged by peft's own ``merge_and_unload``.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, cast

import torch
from torch import nn

from fsdp_train.contract.config import ConfigError, TrainConfig
from fsdp_train.models.model import decoder_blocks, fill_parameter, param_seed, unwrapped_name

ADAPTER_MARK = "lora_"
"""What every adapter parameter's name holds (``...q_proj.lora_A.default.weight``), and no base parameter's."""
PEFT_PREFIX = "base_model.model."
"""The prefix of every key ``PeftModel.save_pretrained`` writes (a PeftModel's own names start with it)."""


def is_adapter(name: str) -> bool:
    return ADAPTER_MARK in name


def linear_names(model: nn.Module) -> list[str]:
    """The names (last part) of the linear layers inside the decoder blocks: the family's projections."""
    return sorted(
        {name.rsplit(".", 1)[-1] for name, m in decoder_blocks(model).named_modules() if isinstance(m, nn.Linear)}
    )


def target_modules(model: nn.Module, cfg: TrainConfig) -> list[str]:
    """The layers that get adapters: those asked for, each one a linear layer of the blocks; else all of those."""
    have = linear_names(model)
    wanted = list(cfg.lora_target_modules) or have
    if unknown := [name for name in wanted if name not in have]:
        raise ConfigError(
            "lora_target_modules",
            f"names no linear layer of {type(model).__name__}'s decoder blocks: {', '.join(unknown)} "
            f"(its layers: {', '.join(have)}).",
        )
    return wanted


def _check_rank(model: nn.Module, cfg: TrainConfig, targets: list[str]) -> None:
    smallest = min(
        (min(m.in_features, m.out_features), name)
        for name, m in decoder_blocks(model).named_modules()
        if isinstance(m, nn.Linear) and name.rsplit(".", 1)[-1] in targets
    )
    if cfg.lora_rank > smallest[0]:
        raise ConfigError(
            "lora_rank",
            f"{cfg.lora_rank} is larger than the layer it adapts: {smallest[1].rsplit('.', 1)[-1]} has "
            f"{smallest[0]} features on its smaller side (a rank above that adds parameters, not expressiveness).",
        )


def lora_config(cfg: TrainConfig, targets: list[str], base: str) -> Any:
    from peft import LoraConfig

    return LoraConfig(
        r=cfg.lora_rank,
        lora_alpha=cfg.lora_alpha,
        lora_dropout=cfg.lora_dropout,
        target_modules=targets,
        base_model_name_or_path=base,
        task_type="CAUSAL_LM",
    )


def add_adapters(model: nn.Module, cfg: TrainConfig, base: str) -> Any:
    """Wrap the target layers with peft's LoRA layers (on meta), freeze the rest; the ``LoraConfig`` used.

    ``base`` is what a user loads the base from (the model's id), written into ``adapter_config.json``.
    """
    from peft import inject_adapter_in_model

    targets = target_modules(model, cfg)
    _check_rank(model, cfg, targets)
    config = lora_config(cfg, targets, base)
    inject_adapter_in_model(config, model)
    frozen_dtype = torch.bfloat16 if cfg.mixed_precision == "bf16" else None
    replaced: dict[int, nn.Parameter] = {}  # a tied lm_head stays tied to its embedding
    for path, module in model.named_modules():
        for name, param in list(module.named_parameters(recurse=False)):
            if is_adapter(f"{path}.{name}"):
                continue
            if id(param) not in replaced:
                data = param.detach() if frozen_dtype is None else param.detach().to(frozen_dtype)
                replaced[id(param)] = nn.Parameter(data, requires_grad=False)
            setattr(module, name, replaced[id(param)])
    return config


@torch.no_grad()
def init_adapters(model: nn.Module, seed: int, device: torch.device) -> None:
    """peft's init of the adapters, on the materialized model: A Kaiming-uniform (a=sqrt(5)), B zero."""
    for name, param in model.named_parameters():
        if not is_adapter(name):
            continue
        full = torch.zeros(param.shape, device=device, dtype=param.dtype)
        if ".lora_A." in name:
            generator = torch.Generator(device=device).manual_seed(param_seed(seed, name))
            nn.init.kaiming_uniform_(full, a=math.sqrt(5), generator=generator)
        fill_parameter(param, full)


def trainable(model: nn.Module) -> list[nn.Parameter]:
    """The parameters the optimizer steps: every one for full fine-tuning, the adapters' with LoRA."""
    return [p for p in model.parameters() if p.requires_grad]


def adapter_params(model: nn.Module) -> int:
    """How many adapter parameters the whole model has (a sharded parameter counts whole)."""
    return sum(p.numel() for name, p in model.named_parameters() if is_adapter(name))


def peft_state(model: nn.Module, adapters: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The adapters' full values under the keys ``PeftModel.save_pretrained`` writes.

    peft picks a model's adapter entries by the names of its LoRA modules, which carry the wrappers' parts
    (``_checkpoint_wrapped_module.``) that the gathered state dict's keys do not: it is given the model's own names
    and its answer is unwrapped again. Every adapter tensor must come out; an adapter file short of one would load
    as a partly untrained adapter.
    """
    from peft import get_peft_model_state_dict

    own = {unwrapped_name(name): name for name, _ in model.named_parameters()}
    named = cast(
        dict[str, torch.Tensor],
        get_peft_model_state_dict(model, state_dict={own.get(key, key): value for key, value in adapters.items()}),
    )
    if len(named) != len(adapters):
        raise RuntimeError(f"export: peft took {len(named)} of the model's {len(adapters)} adapter tensors")
    return {PEFT_PREFIX + unwrapped_name(key): value.contiguous() for key, value in named.items()}


def write_adapter_dir(model: nn.Module, adapters: dict[str, torch.Tensor], config: Any, directory: Path) -> None:
    """``adapter_config.json`` and ``adapter_model.safetensors``, as ``PeftModel.save_pretrained`` writes them."""
    from peft.utils import SAFETENSORS_WEIGHTS_NAME
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(str(directory))
    save_file(peft_state(model, adapters), str(directory / SAFETENSORS_WEIGHTS_NAME), metadata={"format": "pt"})


def merged_state(full: dict[str, torch.Tensor], hf_config: Any, config: Any) -> dict[str, torch.Tensor]:
    """The base with the adapters merged (peft's ``merge_and_unload``), as a plain model's state dict."""
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        base = AutoModelForCausalLM.from_config(hf_config, dtype=torch.float32)  # type: ignore[no-untyped-call]
    peft_model = get_peft_model(base, config)
    named = {PEFT_PREFIX + key: value.float() for key, value in full.items()}
    peft_model.load_state_dict(named, strict=False, assign=True)
    merged = peft_model.merge_and_unload()
    if getattr(hf_config, "tie_word_embeddings", False):
        merged.tie_weights()
    return {key: value for key, value in merged.state_dict().items() if not value.is_meta}
