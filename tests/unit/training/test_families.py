"""The model the bundled function trains is the family's model, for the families people fine-tune.

Each family's own config class (through ``AutoConfig.for_model``), shrunk, saved with ``save_pretrained`` and trained
for a few steps through the bundled path on one rank (gloo): the start-up conformance check holds the path's loss to
transformers' own forward, and the export reloads to training's loss. A mixture-of-experts family is refused with a
message before anything trains.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import torch
from fsdp_train.contract import families
from fsdp_train.contract.config import ConfigError, TrainConfig
from fsdp_train.contract.events import Export, parse_lines
from fsdp_train.models.parallelize import Topology
from fsdp_train.run.loop import Host, train

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

SMALL = {
    "vocab_size": 256,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
}
# model_type -> what the family's shrunk config needs beside SMALL (a window shorter than the rows, so it matters).
FAMILIES: dict[str, dict[str, Any]] = {
    "llama": {},  # Llama 3
    "qwen2": {},  # Qwen2, Qwen2.5
    "qwen3": {"head_dim": 16},
    "mistral": {"sliding_window": 8},
    "gemma2": {"head_dim": 16, "sliding_window": 8, "query_pre_attn_scalar": 16, "initializer_range": 0.5},
    "gemma3_text": {
        "head_dim": 16,
        "sliding_window": 8,
        "query_pre_attn_scalar": 16,
        "sliding_window_pattern": 2,
        "initializer_range": 0.5,
    },
    "phi3": {"pad_token_id": 0},
    "olmo2": {},
}
MIXTURES = {
    "qwen3_moe": {"head_dim": 16, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32},
    "mixtral": {"num_local_experts": 4, "num_experts_per_tok": 2},
}


def save_family(directory: Path, model_type: str, extra: dict[str, Any]) -> Path:
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(model_type, **SMALL, **extra)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(directory)
    return directory


def config(model: Path, tmp_path: Path) -> TrainConfig:
    return TrainConfig.from_dict(
        {
            "model": str(model),
            "model_init": "pretrained",
            "steps": 3,
            "seq_len": 32,
            "batch_size_per_rank": 2,
            "learning_rate": 1e-3,
            "lr_schedule": "constant",
            "mixed_precision": "fp32",
            "probe_size_bytes": 0,
            "output_path": str(tmp_path / "export"),
        }
    )


def conformance_line(out: str) -> tuple[float, float]:
    found = re.search(r"conformance: the training path's loss ([\d.]+), transformers' own ([\d.]+)", out)
    assert found, out[-2000:]
    return float(found.group(1)), float(found.group(2))


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_each_family_trains_as_itself_and_its_export_reloads(
    model_type: str, one_rank: Topology, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = save_family(tmp_path / "model", model_type, FAMILIES[model_type])
    train(config(model, tmp_path), one_rank, Host(node_ip="127.0.0.1", env={}))
    out = capsys.readouterr().out
    ours, theirs = conformance_line(out)
    assert ours == pytest.approx(theirs, rel=1e-4)
    (export,) = [e for e in parse_lines(out.splitlines()) if isinstance(e, Export)]
    assert export.verified, export.check


@pytest.mark.parametrize("model_type", ["gemma2", "gemma3_text"])
def test_a_path_that_drops_what_the_family_asks_for_fails_at_the_start_naming_it(
    model_type: str, one_rank: Topology, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The document attention forced onto a family with sliding windows: the run fails before its first step."""
    monkeypatch.setattr(families, "attention_for", lambda config: (families.DOCUMENT_ATTENTION, ""))
    model = save_family(tmp_path / "model", model_type, FAMILIES[model_type])
    with pytest.raises(ConfigError, match=r"differs from transformers' own forward .*sliding_window=8") as refused:
        train(config(model, tmp_path), one_rank, Host(node_ip="127.0.0.1", env={}))
    assert refused.value.field == "model"
    assert not (tmp_path / "export").exists()


@pytest.mark.parametrize("model_type", sorted(MIXTURES))
def test_a_mixture_of_experts_is_refused_with_what_to_do_instead(
    model_type: str, one_rank: Topology, tmp_path: Path
) -> None:
    model = save_family(tmp_path / "model", model_type, MIXTURES[model_type])
    with pytest.raises(ConfigError, match=r"is a mixture-of-experts model \(4 experts a layer\).*trainFunction"):
        train(config(model, tmp_path), one_rank, Host(node_ip="127.0.0.1", env={}))


def test_the_run_says_which_attention_a_family_gets() -> None:
    from transformers import AutoConfig

    gemma2 = AutoConfig.for_model("gemma2", **SMALL, **FAMILIES["gemma2"])
    gemma3 = AutoConfig.for_model("gemma3_text", **SMALL, **FAMILIES["gemma3_text"])
    qwen2 = AutoConfig.for_model("qwen2", **SMALL)
    assert families.attention_for(gemma2)[0] == "eager" and "soft-caps" in families.attention_for(gemma2)[1]
    assert families.attention_for(gemma3)[0] == "sdpa" and "sliding-window" in families.attention_for(gemma3)[1]
    assert families.attention_for(qwen2) == (families.DOCUMENT_ATTENTION, "")


def test_the_operators_override_table_follows_the_same_families() -> None:
    """`spec.model.overrides` accepts the config fields of exactly the families trained here."""
    from fsdp_operator.api import model_configs

    assert set(model_configs.FAMILIES) == set(FAMILIES)
