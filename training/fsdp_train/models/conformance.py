"""The model the bundled path trains is the model the family defines: checked before the first step.

The bundled path replaces two things of a Hugging Face model: its attention (``fsdp_train.models.attention``: the
document attention over packed rows) and, for the families whose logits are ``lm_head(hidden)``, its loss
(``fsdp_train.models.loss``). ``fsdp_train.contract.families.attention_for`` picks, from the model's config, the
attention that honours what the family asks for; the run says which in its first lines. ``check`` then compares,
on a few rows of the job's own data and on the same model object, the bundled path's loss with transformers' own
forward (``eager`` attention and the model's own loss): a difference over the bound fails the job at once, before
any GPU hour is spent on another model, naming the architecture and what its config asks for.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from fsdp_train.contract.config import ConfigError
from fsdp_train.contract.families import architecture, features

TOLERANCE = {"bf16": 0.01, "fp32": 0.001}
"""The bound on |bundled loss - transformers' loss| / transformers' loss, by ``mixed_precision``: in bf16 the export
self-check's (the two attentions round differently), in fp32 ten times tighter (they agree to rounding)."""


def check(
    model: nn.Module, batch: Mapping[str, torch.Tensor], device: torch.device, tolerance: float
) -> tuple[float, float, float]:
    """(bundled loss, transformers' loss, seconds) on ``batch``; ConfigError when they differ past the bound.

    Collective under FSDP (both forwards gather the weights), so every rank calls it with its own rows' shape.
    Compiled blocks run eagerly here: the check costs two forwards, never a compilation.
    """
    started = time.perf_counter()
    config: Any = getattr(model, "config", None)
    inputs = {k: v.to(device) for k, v in batch.items() if k in ("input_ids", "labels", "position_ids")}
    bounded = {k: v.to(device) for k, v in batch.items() if k != "sample_ids"}
    own = getattr(config, "_attn_implementation", None)
    replaced = model.__dict__.get("forward")  # the bundled loss replaces the instance's forward
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), torch.compiler.set_stance("force_eager"):
            ours = float(model(**bounded).loss.float())
            if replaced is not None:
                del model.forward
            model.set_attn_implementation("eager")  # type: ignore[operator]
            theirs = float(model(**inputs, use_cache=False).loss.float())
    finally:
        if replaced is not None:
            model.forward = replaced
        if own is not None:
            model.set_attn_implementation(own)  # type: ignore[operator]
        model.train(was_training)
    seconds = time.perf_counter() - started
    drift = abs(ours - theirs) / max(abs(theirs), 1e-6)
    if not drift <= tolerance:  # NaN fails too
        arch = architecture(config)
        asks = ", ".join(features(config)) or "nothing beyond causal attention"
        raise ConfigError(
            "model",
            f"{arch}: the training path's loss {ours:.4f} differs from transformers' own forward {theirs:.4f} on the "
            f"same rows by {drift:.2%} (more than {tolerance:.1%}); its config asks for {asks}. "
            "Training would optimise another model than the one exported.",
        )
    return ours, theirs, seconds
