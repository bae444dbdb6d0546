"""What a model family's config asks of the training path, read from the config alone (no torch, no transformers).

``attention_for`` picks the attention that honours it (the operator's ``fsdpctl data check`` names it too):
soft-capped attention logits need transformers' ``eager`` (the one that soft-caps), sliding-window layers its
``sdpa`` (its mask builder applies the windows and the packed documents), every other family the bundled document
attention. A mixture of experts is refused, with why and what to do instead.
"""

from __future__ import annotations

from typing import Any

from fsdp_train.contract.config import ConfigError

DOCUMENT_ATTENTION = "document"
"""The bundled document attention (``fsdp_train.models.attention``), registered under its own name when built."""


def architecture(config: Any) -> str:
    return str((getattr(config, "architectures", None) or [type(config).__name__])[0])


def features(config: Any) -> list[str]:
    """What the config asks of attention and logits beyond plain causal attention (for messages)."""
    found = []
    if sliding_window(config):
        found.append(f"sliding_window={config.sliding_window}")
    if getattr(config, "attn_logit_softcapping", None):
        found.append(f"attn_logit_softcapping={config.attn_logit_softcapping}")
    if getattr(config, "final_logit_softcapping", None):
        found.append(f"final_logit_softcapping={config.final_logit_softcapping}")
    if getattr(config, "query_pre_attn_scalar", None):
        found.append(f"query_pre_attn_scalar={config.query_pre_attn_scalar}")
    return found


def sliding_window(config: Any) -> bool:
    """Some layers attend within a window: a ``sliding_attention`` layer type, or a window the family uses."""
    if not getattr(config, "sliding_window", None):
        return False
    types = getattr(config, "layer_types", None) or []
    if types:
        return any("sliding" in str(kind) for kind in types)
    return bool(getattr(config, "use_sliding_window", True))


def experts(config: Any) -> int:
    return int(getattr(config, "num_local_experts", 0) or getattr(config, "num_experts", 0) or 0)


def attention_for(config: Any) -> tuple[str, str]:
    """The attention implementation to build with, and why when it is not the document attention ("" when it is)."""
    arch = architecture(config)
    if experts(config):
        # transformers 5 keeps a mixture-of-experts layer's experts fused, loaded through its weight converters;
        # the sharded loader reads the files' own names (torch.distributed.checkpoint), which these are not.
        raise ConfigError(
            "model",
            f"{arch} is a mixture-of-experts model ({experts(config)} experts a layer): the bundled function trains "
            "dense models only; train it with trainFunction (your own Ray Train function).",
        )
    if getattr(config, "attn_logit_softcapping", None):
        return "eager", (
            f"{arch} soft-caps its attention logits (attn_logit_softcapping={config.attn_logit_softcapping}): "
            "attention through transformers' eager implementation, the one that soft-caps (slower, more memory)"
        )
    if sliding_window(config):
        return "sdpa", (
            f"{arch} has sliding-window layers (sliding_window={config.sliding_window}): attention through "
            "transformers' sdpa with its own masks (the document attention applies no window)"
        )
    return DOCUMENT_ATTENTION, ""
