"""Small real Hugging Face artefacts made on the spot (no hub): a BPE tokenizer trained with
``tokenizers``, a tiny Qwen2 saved with ``save_pretrained``, and corpora with learnable structure.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

EOS, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"

# ChatML, as the Qwen2.5 models render conversations.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# Fixed phrases: inside a phrase every next token is certain, between phrases it is one of 16.
PHRASES = [
    "the red fox jumps over the lazy dog",
    "a green frog sits on a wet stone",
    "seven small birds sing in the old tree",
    "my blue car needs new tyres today",
    "the quick brown cat sleeps all day long",
    "we count one two three four five six",
    "rain falls softly on the quiet town",
    "bread and butter make a good breakfast",
    "she reads a long book by the window",
    "the river runs fast after the storm",
    "cold winds blow over the high hills",
    "he plants tomatoes in the spring garden",
    "old clocks tick in the empty hall",
    "bright stars shine above the dark sea",
    "children play football in the park",
    "the baker sells warm bread each morning",
]


def documents(count: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" . ".join(rng.choice(PHRASES) for _ in range(rng.randint(2, 5))) + " ." for _ in range(count)]


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


def train_tokenizer(directory: Path, vocab_size: int = 500) -> Any:
    """A byte-level BPE trained on the phrases, saved in Hugging Face format with EOS and ChatML."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS, IM_START, IM_END],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    corpus = [*PHRASES, "you repeat phrases", "system user assistant", *(" ".join(p.split()[::-1]) for p in PHRASES)]
    tok.train_from_iterator(corpus * 4, trainer)
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=EOS)
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
