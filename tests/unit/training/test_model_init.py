"""Unit tests of the name-seeded init on a plain (unsharded) model: ties kept, values reproducible."""

from __future__ import annotations

import torch
from fsdp_train.config import TrainConfig
from fsdp_train.model import build_meta_model, hf_config, init_weights

TINY = {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2}


def built(seed: int, **overrides: object) -> torch.nn.Module:
    config = hf_config(TrainConfig(model_overrides={**TINY, "vocab_size": 64, **overrides}))
    model = build_meta_model(config)
    init_weights(model, config, seed, torch.device("cpu"))
    return model


def test_tied_head_stays_tied_after_init() -> None:
    model = built(0)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert len(list(model.parameters())) == len(dict(model.named_parameters(remove_duplicate=False))) - 1
    assert model.lm_head.weight.device.type == "cpu" and model.lm_head.weight.std() > 0.01


def test_untied_head_gets_its_own_values_and_init_is_reproducible() -> None:
    model = built(0, tie_word_embeddings=False)
    assert model.lm_head.weight is not model.model.embed_tokens.weight
    assert not torch.equal(model.lm_head.weight, model.model.embed_tokens.weight)
    again, other = built(0, tie_word_embeddings=False), built(1, tie_word_embeddings=False)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), again.parameters(), strict=True))
    assert not torch.equal(model.model.layers[0].mlp.up_proj.weight, other.model.layers[0].mlp.up_proj.weight)
