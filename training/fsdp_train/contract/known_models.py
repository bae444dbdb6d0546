"""The configs of the models the training function builds without any network access (``model_init: random``).

Plain data, no torch: the operator reads them too, to check `model.overrides` against the architecture they
change (fsdp_operator.api.model_configs).
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
