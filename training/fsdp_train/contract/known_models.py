"""The configs of the models the training function builds without any network access (``model_init: random``).

Plain data, no torch: the operator reads them too, to check `model.overrides` against the architecture they
change (fsdp_operator.api.model_configs), and, with the shapes of a few released models (`KNOWN_SHAPES`), to estimate
a run's memory (fsdp_train.contract.memory).
"""

from __future__ import annotations

from typing import Any

# Qwen/Qwen2.5-1.5B's config.json, kept in code so that ``model_init: random`` needs no network access.
QWEN25_1_5B: dict[str, Any] = {
    "model_type": "qwen2",
    "architectures": ["Qwen2ForCausalLM"],
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151643,
    "hidden_act": "silu",
    "hidden_size": 1536,
    "initializer_range": 0.02,
    "intermediate_size": 8960,
    "max_position_embeddings": 131072,
    "max_window_layers": 28,
    "num_attention_heads": 12,
    "num_hidden_layers": 28,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "sliding_window": 131072,
    "tie_word_embeddings": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
}

KNOWN_CONFIGS: dict[str, dict[str, Any]] = {"Qwen/Qwen2.5-1.5B": QWEN25_1_5B}


def _qwen25(hidden: int, intermediate: int, layers: int, heads: int, kv_heads: int, tied: bool) -> dict[str, Any]:
    vocab = 151936 if tied else 152064  # the tied small models have 128 fewer (unused) vocabulary rows
    return {
        "model_type": "qwen2",
        "hidden_size": hidden,
        "intermediate_size": intermediate,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "vocab_size": vocab,
        "tie_word_embeddings": tied,
    }


# The architecture numbers of released models (their config.json), for the memory estimate only
# (fsdp_train.contract.memory): the training function still reads their config from the hub.
_RELEASED_SHAPES: dict[str, dict[str, Any]] = {
    "Qwen/Qwen2.5-0.5B": _qwen25(896, 4864, 24, 14, 2, tied=True),
    "Qwen/Qwen2.5-3B": _qwen25(2048, 11008, 36, 16, 2, tied=True),
    "Qwen/Qwen2.5-7B": _qwen25(3584, 18944, 28, 28, 4, tied=False),
    "Qwen/Qwen2.5-14B": _qwen25(5120, 13824, 48, 40, 8, tied=False),
    "Qwen/Qwen2.5-32B": _qwen25(5120, 27648, 64, 40, 8, tied=False),
}

KNOWN_SHAPES: dict[str, dict[str, Any]] = {
    **KNOWN_CONFIGS,
    **_RELEASED_SHAPES,
    # the instruction-tuned models have their base's architecture
    **{f"{name}-Instruct": config for name, config in _RELEASED_SHAPES.items()},
    "Qwen/Qwen2.5-1.5B-Instruct": QWEN25_1_5B,
}
"""Model ids whose config the operator knows well enough to estimate a run's memory."""
