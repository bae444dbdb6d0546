"""The model measured and handed over: the validation loss (``evaluate``) and the export with its self-check
(``export_checked``: the directory loaded as a user loads it must give training's loss on the same rows).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import torch
import torch.distributed as dist
from torch import nn

from fsdp_train.contract.config import MERGED_DIR, TrainConfig
from fsdp_train.contract.events import Evaluation, Export, emit
from fsdp_train.datapath.data import load_tokenizer
from fsdp_train.datapath.feed import eval_batches
from fsdp_train.datapath.packing import Packed
from fsdp_train.models.attention import to_device
from fsdp_train.models.loss import IGNORE_INDEX
from fsdp_train.models.parallelize import Topology
from fsdp_train.models.quantize import quantize_loaded
from fsdp_train.models.weights import ExportCheck, export, export_adapters, verify_export
from fsdp_train.state.storage import TOKENIZER_FILE_PATTERNS, fetch

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
"""Any of these in a directory: it holds a tokenizer."""
EXPORT_CHECK_TEXTS = 8
"""Rows of the self-check's batch decoded to text, for the tokenizer's round trip."""


@torch.no_grad()
def evaluate(
    cfg: TrainConfig, topo: Topology, model: nn.Module, validation: Packed, device: torch.device, step: int
) -> float | None:
    """Mean loss over every validation target (all ranks); rank 0 emits it. None when it is not a number."""
    started = time.perf_counter()
    model.eval()
    totals = torch.zeros(2, dtype=torch.float64, device=device)
    for batch in eval_batches(
        validation,
        rank=topo.rank,
        world_size=topo.world_size,
        batch_size=cfg.batch_size_per_rank,
        document_mask=cfg.document_mask,
    ):
        inputs = to_device(batch, device)
        loss = model(**inputs).loss
        targets = (inputs["labels"][:, 1:] != IGNORE_INDEX).sum()
        # An all-padding batch has no targets; Hugging Face's own loss is NaN there, not 0.
        totals += torch.stack([torch.where(targets > 0, loss.double() * targets, 0.0), targets.double()])
    model.train()
    dist.all_reduce(totals)
    loss_sum, count = totals.tolist()
    mean = loss_sum / count if count else float("nan")
    if topo.rank == 0 and math.isfinite(mean):  # no targets, or a diverged model: no evaluation figure, never NaN
        emit(Evaluation(rank=0, step=step, loss=mean, tokens=int(count), seconds=time.perf_counter() - started))
    return mean if math.isfinite(mean) else None


def known(value: float | None) -> float | None:
    """A figure for an event: None (absent) when not finite, never NaN on the wire."""
    return value if value is not None and math.isfinite(value) else None


class ExportMismatch(RuntimeError):
    """The exported directory, loaded as a user loads it, is not the model that trained."""


def export_checked(
    cfg: TrainConfig,
    topo: Topology,
    model: nn.Module,
    config: Any,
    target: str,
    step: int,
    tokenizer_dir: str | None,
    model_dir: str | None,
    check_batch: dict[str, torch.Tensor],
    device: torch.device,
) -> None:
    started = time.perf_counter()
    if tokenizer_dir is None and topo.rank == 0:
        try:  # random data: still ship the model's tokenizer when there is one
            tokenizer_dir = fetch(cfg.tokenizer or cfg.model, patterns=TOKENIZER_FILE_PATTERNS)
        except Exception:
            tokenizer_dir = None
        if tokenizer_dir is not None and not any(Path(tokenizer_dir, name).exists() for name in TOKENIZER_FILES):
            tokenizer_dir = None  # a model directory without a tokenizer: the export has none either
    # The model as it is exported, on the check's rows: every rank runs the forward (FSDP's is collective).
    model.eval()
    with torch.no_grad():
        inputs = {k: v.to(device) for k, v in check_batch.items() if k != "sample_ids"}
        training_loss = float(model(**inputs).loss.float())
    model.train()

    def check(directory: Path, load: Loader | None = None) -> ExportCheck:
        tokenizer = load_tokenizer(tokenizer_dir) if tokenizer_dir else None
        texts = []
        if tokenizer is not None:
            # Text the training tokenizer produced: the rows of the check, decoded.
            ids = check_batch["input_ids"][:EXPORT_CHECK_TEXTS]
            texts = [t for t in tokenizer.batch_decode(ids.tolist(), skip_special_tokens=True) if t.strip()]
        return verify_export(
            directory,
            training_tokenizer=tokenizer,
            texts=texts,
            batch=check_batch,
            training_loss=training_loss,
            device=device,
            load=load,
        )

    if cfg.lora_rank:
        verdict = export_adapters(
            model,
            config,
            target,
            base=cast(Any, model).peft_config["default"].base_model_name_or_path,
            merged=cfg.export_merged,
            tokenizer_dir=tokenizer_dir,
            generation_source=model_dir,
            check=lambda directory: _check_adapters(
                directory, check, model_dir or cfg.model, cfg.export_merged, cfg.lora_quantize_base == "nf4"
            ),
        )
    else:
        verdict = export(model, config, target, tokenizer_dir=tokenizer_dir, generation_source=model_dir, check=check)
    assert verdict is not None
    if topo.rank == 0:
        emit(
            Export(
                rank=0,
                step=step,
                path=target if verdict.verified else "",
                seconds=time.perf_counter() - started,
                verified=verdict.verified,
                training_loss=known(verdict.training_loss),
                export_loss=known(verdict.export_loss),
                check=verdict.reason,
            )
        )
    if not verdict.verified:
        raise ExportMismatch(f"export to {target} failed its self-check, nothing was written: {verdict.reason}")


Loader = Callable[[Path, torch.dtype], Any]


def _check_adapters(
    directory: Path,
    check: Callable[[Path, Loader | None], ExportCheck],
    base_dir: str,
    merged: bool,
    quantized: bool,
) -> ExportCheck:
    """A LoRA export's self-check, as a user loads each part: the adapter with peft onto its base, then the
    merged model alone. A QLoRA adapter goes onto the base quantized as training's was (torchao's NF4), so the check
    holds the function that trained; onto the bf16 base it differs by NF4's rounding of the base."""

    def with_peft(where: Path, dtype: torch.dtype) -> Any:
        from peft import PeftModel
        from transformers import AutoModelForCausalLM

        base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=dtype)
        if quantized:
            targets = json.loads((where / "adapter_config.json").read_text())["target_modules"]
            quantize_loaded(base, list(targets))
        return PeftModel.from_pretrained(base, str(where))

    adapter = check(directory, with_peft)
    if not adapter.verified or not merged:
        return adapter
    whole = check(directory / MERGED_DIR, None)
    return whole if not whole.verified else adapter
