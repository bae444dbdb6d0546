"""Small real Hugging Face artefacts made on the spot (no hub): a BPE tokenizer trained with
``tokenizers``, a tiny Qwen2 saved with ``save_pretrained``, and corpora with learnable structure.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from fsdp_operator.local.model import CHAT_TEMPLATE, EOS, IM_END, IM_START, PHRASES, sample_documents

# The fixed phrases (inside a phrase every next token is certain, between phrases it is one of 16), ChatML and the
# documents of repeated phrases are those `fsdpctl local make-model` trains on.
documents = sample_documents


def conversations(count: int, seed: int = 0) -> list[list[dict[str, str]]]:
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        i = rng.randrange(len(PHRASES))
        out.append(
            [
                {"role": "system", "content": "you repeat phrases"},
                {"role": "user", "content": PHRASES[i].split(" ", 3)[-1]},
                {"role": "assistant", "content": PHRASES[i]},
            ]
        )
    return out


def byte_level_bpe(texts: list[str], vocab_size: int, special_tokens: tuple[str, ...] = (EOS,)) -> Any:
    """A GPT-2-style byte-level BPE (digits stay together) trained on `texts`, as transformers' fast tokenizer with EOS
    as its padding."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(special_tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(texts, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=EOS)


def train_tokenizer(directory: Path, vocab_size: int = 500) -> Any:
    """A byte-level BPE trained on the phrases, saved in Hugging Face format with EOS and ChatML."""
    corpus = [*PHRASES, "you repeat phrases", "system user assistant", *(" ".join(p.split()[::-1]) for p in PHRASES)]
    hf = byte_level_bpe(corpus * 4, vocab_size, (EOS, IM_START, IM_END))
    hf.chat_template = CHAT_TEMPLATE
    directory.mkdir(parents=True, exist_ok=True)
    hf.save_pretrained(directory)
    return hf


TINY_QWEN2 = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 512,
    "tie_word_embeddings": True,
}


TINY_OVERRIDES = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 128,
    "vocab_size": 512,
}
"""`model_overrides` that make the default model (Qwen2.5's architecture, random weights) tiny, for CPU ranks."""


def save_tiny_model(directory: Path, vocab_size: int = 512, seed: int = 0, **overrides: Any) -> Path:
    """A tiny Qwen2 with random weights, saved by ``save_pretrained`` (safetensors), plus its tokenizer."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tokenizer = train_tokenizer(directory)
    torch.manual_seed(seed)
    config = Qwen2Config(
        **{**TINY_QWEN2, **overrides},
        vocab_size=vocab_size,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.eos_token_id,
    )
    Qwen2ForCausalLM(config).save_pretrained(directory)
    return directory


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def write_parquet(path: Path, rows: list[dict[str, Any]]) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path
