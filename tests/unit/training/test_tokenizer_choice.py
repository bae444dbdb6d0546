"""The tokenizer given is the tokenizer used: a user's byte-level BPE (tokenizer.json, trained here with
`tokenizers`) beside a qwen2 config.json, where transformers' AutoTokenizer returns Qwen2Tokenizer, whose
pre-tokenizer splits digits one by one. The run uses the directory's own tokenizer and the export pins it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fsdp_train.datapath.data import load_tokenizer_choice
from fsdp_train.datapath.tokenizer_choice import PROBE_TEXTS, choose_tokenizer
from fsdp_train.models.weights import _write_hf_dir
from support.tiny_hf import TINY_QWEN2, byte_level_bpe

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

CORPUS = [
    "In 2026 the 12 trains carried 1234567 people",
    "x = 12345 + 67890 and 2024 or 1999",
    "we count 100 200 300 400 500 600 700 800 900",
]


def user_tokenizer(directory: Path) -> Any:
    """A GPT-2-style byte-level BPE that merged whole numbers, saved as a bare tokenizer.json."""
    hf = byte_level_bpe(CORPUS * 20, vocab_size=400)
    hf.save_pretrained(directory)
    return hf


def with_qwen2_config(directory: Path) -> None:
    from transformers import Qwen2Config

    Qwen2Config(**TINY_QWEN2, vocab_size=400).save_pretrained(directory)


def test_the_directorys_own_tokenizer_is_used_when_autotokenizer_splits_differently(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    directory = tmp_path / "model"
    mine = user_tokenizer(directory)
    with_qwen2_config(directory)
    assert type(AutoTokenizer.from_pretrained(directory)).__name__ == "Qwen2Tokenizer"  # the trap
    choice = choose_tokenizer(str(directory))
    text = "x = 12345 + 67890"
    assert choice.tokenizer(text)["input_ids"] == mine(text)["input_ids"]
    assert "from the directory's tokenizer.json: AutoTokenizer would load Qwen2Tokenizer" in choice.why
    assert f"of {len(PROBE_TEXTS)} sampled texts differently" in choice.why
    assert load_tokenizer_choice(str(directory)).why == choice.why


def test_the_export_pins_it_so_autotokenizer_on_the_export_returns_it(tmp_path: Path) -> None:
    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    directory = tmp_path / "model"
    mine = user_tokenizer(directory)
    with_qwen2_config(directory)
    config = Qwen2Config(**TINY_QWEN2, vocab_size=400)
    weights = {k: v.clone() for k, v in Qwen2ForCausalLM(config).state_dict().items()}
    export = tmp_path / "export"
    _write_hf_dir(weights, config, export, str(directory), None, torch.float32)
    loaded = AutoTokenizer.from_pretrained(export)
    for text in [*PROBE_TEXTS, *CORPUS]:
        assert loaded(text)["input_ids"] == mine(text)["input_ids"], text
    assert json.loads((export / "tokenizer_config.json").read_text())["tokenizer_class"] == "PreTrainedTokenizerFast"


def test_autotokenizers_choice_stays_when_it_gives_the_same_ids(tmp_path: Path) -> None:
    directory = tmp_path / "tok"
    user_tokenizer(directory)  # no config.json: AutoTokenizer reads tokenizer_config.json's class
    choice = choose_tokenizer(str(directory))
    assert choice.why.startswith(f"{type(choice.tokenizer).__name__}: AutoTokenizer's choice, the same token ids")


def test_an_export_with_a_chatml_tokenizer_stops_generating_at_the_end_of_a_turn(tmp_path: Path) -> None:
    import torch
    from support.tiny_hf import train_tokenizer
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    tokenizer = train_tokenizer(tmp_path / "tok")  # EOS <|endoftext|>, ChatML's <|im_start|> and <|im_end|>
    config = Qwen2Config(**TINY_QWEN2, vocab_size=500, eos_token_id=tokenizer.eos_token_id)
    weights = {k: v.clone() for k, v in Qwen2ForCausalLM(config).state_dict().items()}
    _write_hf_dir(weights, config, tmp_path / "export", str(tmp_path / "tok"), None, torch.float32)
    stops = GenerationConfig.from_pretrained(tmp_path / "export").eos_token_id
    assert set(stops) == {tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|im_end|>")}
