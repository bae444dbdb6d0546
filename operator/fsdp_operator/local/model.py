"""`fsdpctl local make-model DIR`: a small model and tokenizer made offline, for trying fine-tuning with run-local.

A byte-level BPE tokenizer trained with `tokenizers` on the given text (or on a built-in corpus of
repeated phrases, which is then also written as DIR/sample.jsonl to train on), with an EOS token and a
ChatML chat template, and a tiny Qwen2 with random weights, both saved with `save_pretrained`: a
directory that `model.name` (with `init: pretrained`) and `AutoModelForCausalLM`/`AutoTokenizer` load
like a published one. Nothing is downloaded. Needs the `training` extra (torch, transformers, tokenizers).
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

EOS, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"

# ChatML, as the Qwen2.5 models render conversations (data.kind: chat trains on the assistant turns).
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# Inside a phrase every next token is certain, between phrases it is one of 16: a model that learned them has a
# loss far below ln(vocabulary), which makes learning visible within a few dozen CPU steps.
PHRASES = (
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
)

TINY_QWEN2: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 2048,
    "tie_word_embeddings": True,
}
SAMPLE_DOCUMENTS = 400
MAX_TEXT_BYTES = 256 * 2**20
"""At most this much of the given text trains the tokenizer (BPE training holds it in memory)."""


class MakeModelError(Exception):
    """The text cannot be read, or the training libraries are missing: a one-line reason."""


def sample_documents(count: int = SAMPLE_DOCUMENTS, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" . ".join(rng.choice(PHRASES) for _ in range(rng.randint(2, 5))) + " ." for _ in range(count)]


JSONL_SUFFIXES = (".jsonl", ".json", ".ndjson")


def row_texts(row: object) -> list[str]:
    """The document text of one JSONL row: its strings (``text``, a chat's ``content``s), not its keys or roles.

    A tokenizer trained on the raw line would learn ``{"role": "user", "content": `` as if it were text.
    """
    if isinstance(row, str):
        return [row]
    if isinstance(row, list):
        return [text for item in row for text in row_texts(item)]
    if isinstance(row, dict):
        if isinstance(row.get("content"), str):  # a chat message: its role is markup, not text
            return [row["content"]]
        return [text for value in row.values() for text in row_texts(value)]
    return []


def _lines(paths: list[Path]) -> Iterator[str]:
    """The documents of the files: a JSONL row's strings (see row_texts), other files line by line."""
    budget = MAX_TEXT_BYTES
    for path in paths:
        jsonl = path.name.lower().endswith(JSONL_SUFFIXES)
        try:
            with path.open(encoding="utf-8", errors="replace") as f:
                for line in f:
                    budget -= len(line)
                    if budget < 0:
                        return
                    if not jsonl:
                        yield line
                        continue
                    try:
                        texts = row_texts(json.loads(line))
                    except ValueError:  # not a JSON row: its text as it is
                        texts = [line]
                    yield from (text for text in texts if text.strip())
        except OSError as e:
            raise MakeModelError(f"{path}: cannot read: {e.strerror or e}") from e


def make_model(directory: Path, texts: list[Path], *, vocab_size: int = 512, seed: int = 0) -> list[str]:
    """Write the tokenizer and the model to `directory`; return what was written, one line each."""
    try:
        import torch
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # type: ignore[import-untyped]
        from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM
    except ImportError as e:
        raise MakeModelError(f"needs the training extra (pip install 'fsdp-operator[training]'): {e}") from e
    for path in texts:
        if not path.is_file():
            raise MakeModelError(f"{path}: not a file")
    directory.mkdir(parents=True, exist_ok=True)
    written: list[str] = []
    if texts:
        corpus: Iterator[str] | list[str] = _lines(texts)
    else:
        documents = sample_documents(seed=seed)
        sample = directory / "sample.jsonl"
        sample.write_text("".join(json.dumps({"text": d}) + "\n" for d in documents))
        written.append(f"{sample}: {len(documents)} documents of repeated phrases (data.source for a try)")
        corpus = [*PHRASES, *documents]

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS, IM_START, IM_END],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([*corpus, "system user assistant"], trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=EOS)  # type: ignore[no-untyped-call]
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(directory)
    written.append(f"{directory}: byte-level BPE tokenizer, {len(tokenizer)} tokens, EOS {EOS}, ChatML template")

    torch.manual_seed(seed)
    config = Qwen2Config(
        **TINY_QWEN2,
        vocab_size=max(vocab_size, len(tokenizer)),
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.eos_token_id,
    )
    model = Qwen2ForCausalLM(config)  # type: ignore[no-untyped-call]
    # Generation stops at the end of a document and at the end of a chat turn (ChatML's <|im_end|>), as Qwen's own
    # generation configs do: a chat model would otherwise talk on past its reply.
    model.generation_config.eos_token_id = [tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids(IM_END)]
    model.generation_config.pad_token_id = tokenizer.eos_token_id
    model.save_pretrained(directory)
    parameters = sum(p.numel() for p in model.parameters())
    written.append(f"{directory}: Qwen2, {config.num_hidden_layers} layers, {parameters:,} parameters, random weights")
    return written
