"""Unit tests of the name-seeded init on a plain (unsharded) model: ties kept, values reproducible."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from fsdp_train.contract.config import ConfigError, TrainConfig
from fsdp_train.models.model import build_meta_model, hf_config, init_weights
from support.tiny_hf import save_tiny_model

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


@pytest.mark.parametrize("key", ["trust_remote_code", "token", "return_unused_kwargs", "__class__", "revision"])
def test_overrides_that_are_no_config_field_are_refused(key: str, tmp_path: Path) -> None:
    """The second layer under the operator's check: Qwen2Config(**...) and AutoConfig.from_pretrained(name, **...)
    took them as loader options (`trust_remote_code` ran the model repository's code)."""
    with pytest.raises(ConfigError, match=f"may set only fields of Qwen2Config; not: {re.escape(key)}"):
        hf_config(TrainConfig(model_overrides={**TINY, key: 1}))
    directory = save_tiny_model(tmp_path / "tiny")
    with pytest.raises(ConfigError, match=f"may set only fields of Qwen2Config; not: {re.escape(key)}"):
        hf_config(TrainConfig(model=str(directory), model_init="pretrained", model_overrides={key: 1}))
    config = hf_config(
        TrainConfig(model=str(directory), model_init="pretrained", model_overrides={"num_hidden_layers": 1})
    )
    assert config.num_hidden_layers == 1
