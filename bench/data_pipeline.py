"""The data pipeline and pretrained loading on a GPU host: assets, then the load-time measurement.

    python bench/data_pipeline.py assets DIR [--tokens 200000000]
        DIR/tokenizer   a byte-level BPE (8192 ids) trained with `tokenizers` on the generated text
        DIR/corpus/     JSONL shards of generated documents (Zipf-distributed synthetic words), >= --tokens
        DIR/model       Qwen2.5-1.5B-shaped Qwen2ForCausalLM, random init, save_pretrained (bf16 safetensors)
    python bench/data_pipeline.py python-sources DIR
        DIR/corpus/     JSONL, one document per Python source file of this interpreter's standard library
        DIR/tokenizer   a byte-level BPE (8192 ids) trained on them (real text, documents of very uneven length)
    torchrun --nproc-per-node N bench/data_pipeline.py load DIR/model
        times filling the FSDP-sharded model from the safetensors: torch.distributed.checkpoint's
        HuggingFaceStorageReader into the shards (what training uses), against a full load on rank 0
        and a broadcast (the fallback for other weight formats)

`bench/data_runs.sh` runs both and the two training runs (random tokens against the JSONL corpus).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "training"))

SYLLABLES = [c + v for c in "bcdfghjklmnprstvwz" for v in ("a", "e", "i", "o", "u", "ai", "ou")]
WORDS = 30_000
SHARDS = 32


@functools.cache
def vocabulary() -> list[str]:
    import numpy as np

    rng = np.random.default_rng(0)
    words = set()
    while len(words) < WORDS:
        words.add("".join(rng.choice(SYLLABLES, size=int(rng.integers(1, 4)))))
    return sorted(words)


def write_shard(args: tuple[Path, int, int]) -> int:
    """One JSONL shard of ``words`` Zipf-distributed words in documents of 100 to 2000 words."""
    import numpy as np

    path, seed, words = args
    vocab = vocabulary()
    rng = np.random.default_rng(seed)
    drawn = [vocab[i] for i in ((rng.zipf(1.15, size=words) - 1) % WORDS).tolist()]
    bounds = np.cumsum(rng.integers(100, 2000, size=words // 100 + 1))
    starts = [0, *bounds[bounds < words].tolist()]
    with path.open("w") as out:
        for start, end in zip(starts, [*starts[1:], words], strict=True):
            # Letters and spaces only: no JSON escaping needed.
            out.write('{"text": "' + " ".join(drawn[start:end]) + '."}\n')
    return words


TINY = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2}  # fmt: skip
"""``--tiny``: the same pipeline with a small model, for a dry run on a CPU."""


def assets(root: Path, tokens: int, tiny: bool = False) -> None:
    import numpy as np
    import torch
    from fsdp_train.contract.known_models import QWEN25_1_5B
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    started = time.perf_counter()
    sample = root / "sample.jsonl"
    write_shard((sample, 12345, 2_000_000))
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=8192, special_tokens=["<|endoftext|>"], show_progress=False)
    texts = [json.loads(line)["text"] for line in sample.read_text().splitlines()]
    tok.train_from_iterator(texts, trainer)
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>")
    hf.save_pretrained(root / "tokenizer")
    per_word = sum(len(e.ids) for e in tok.encode_batch(texts[:200])) / sum(len(t.split()) for t in texts[:200])
    sample.unlink()
    print(f"tokenizer: {per_word:.3f} tokens per word ({time.perf_counter() - started:.1f} s)", flush=True)

    corpus = root / "corpus"
    corpus.mkdir(parents=True, exist_ok=True)
    words = int(tokens / per_word * 1.02) // SHARDS + 1
    t0 = time.perf_counter()
    with ProcessPoolExecutor(min(SHARDS, os.cpu_count() or 4)) as pool:
        total = sum(pool.map(write_shard, [(corpus / f"part-{i:03d}.jsonl", i, words) for i in range(SHARDS)]))
    size = sum(p.stat().st_size for p in corpus.iterdir())
    print(
        f"corpus: {total:,} words, ~{int(total * per_word):,} tokens, {size / 2**30:.2f} GiB JSONL in {SHARDS} "
        f"shards ({time.perf_counter() - t0:.1f} s)",
        flush=True,
    )

    t0 = time.perf_counter()
    config = Qwen2Config(**{k: v for k, v in QWEN25_1_5B.items() if k != "model_type"} | (TINY if tiny else {}))
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.device(device):
        model = Qwen2ForCausalLM(config).to(torch.bfloat16)  # HF's own init, on the GPU: seconds, not minutes
    model.save_pretrained(root / "model")
    hf.save_pretrained(root / "model")
    files = sorted(p.name for p in (root / "model").iterdir())
    print(f"model: saved {files} ({time.perf_counter() - t0:.1f} s)", flush=True)
    del model, np


def python_sources(root: Path) -> None:
    """A real corpus with no download: the standard library's Python files, one JSONL document each."""
    import sysconfig

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    started = time.perf_counter()
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in stdlib.rglob("*.py") if not {"site-packages", "dist-packages"} & set(p.parts))
    texts = []
    for path in files:
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        if text.strip():
            texts.append(text)
    corpus = root / "corpus"
    corpus.mkdir(parents=True, exist_ok=True)
    shards = 8
    for i in range(shards):
        with (corpus / f"part-{i:03d}.jsonl").open("w") as out:
            for text in texts[i::shards]:
                out.write(json.dumps({"text": text}) + "\n")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=8192, special_tokens=["<|endoftext|>"], show_progress=False)
    tok.train_from_iterator(texts[::4], trainer)
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>").save_pretrained(root / "tokenizer")
    sample = texts[::20]  # tokens per character on a sample: encoding everything takes minutes on a few cores
    per_char = sum(len(e.ids) for e in tok.encode_batch(sample)) / max(1, sum(map(len, sample)))
    chars = sum(map(len, texts))
    print(
        f"python sources: {len(texts):,} files, {chars / 2**20:.1f} MiB, ~{int(chars * per_char):,} tokens "
        f"({time.perf_counter() - started:.1f} s)",
        flush=True,
    )


def load(directory: str) -> None:
    import torch
    import torch.distributed as dist
    from fsdp_train.contract.config import TrainConfig
    from fsdp_train.models import weights
    from fsdp_train.models.model import build_meta_model, decoder_blocks, hf_config, to_empty_keeping_ties
    from fsdp_train.models.parallelize import Topology, build_mesh, parallelize

    topo = Topology.from_torchrun_env()
    if torch.cuda.is_available():
        torch.cuda.set_device(topo.device_index)
        device = torch.device("cuda", topo.device_index)
    else:
        device = torch.device("cpu")  # a dry run
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    cfg = TrainConfig(model=directory, model_init="pretrained")
    results = {}

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    for name, how in (("sharded", "sharded"), ("rank0-broadcast", "broadcast"), ("sharded-again", "sharded")):
        model = build_meta_model(hf_config(cfg))
        parallelize(
            model,
            decoder_blocks(model),
            build_mesh(topo, "full", device.type),
            mixed_precision="bf16",
            activation_checkpointing=False,
            compile_blocks=False,
        )
        dist.barrier()
        sync()
        t0 = time.perf_counter()
        to_empty_keeping_ties(model, device)
        if how == "sharded":
            weights.load_sharded(model, directory)
        else:
            weights.load_broadcast(model, directory, {})
        sync()
        dist.barrier()
        results[name] = time.perf_counter() - t0
        embed = model.model.embed_tokens.weight
        assert model.lm_head.weight is embed, "the tied lm_head must stay tied"
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
    if topo.rank == 0:
        # The files were just written: all three read them from the page cache, not from disk.
        print(f"load: {json.dumps({k: round(v, 2) for k, v in results.items()})} world={topo.world_size}")
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    a = sub.add_parser("assets")
    a.add_argument("root", type=Path)
    a.add_argument("--tokens", type=int, default=200_000_000)
    a.add_argument("--tiny", action="store_true", help="a small model: a dry run on a CPU")
    b = sub.add_parser("load")
    b.add_argument("directory")
    c = sub.add_parser("python-sources")
    c.add_argument("root", type=Path)
    args = parser.parse_args()
    if args.command == "assets":
        args.root.mkdir(parents=True, exist_ok=True)
        assets(args.root, args.tokens, args.tiny)
    elif args.command == "python-sources":
        args.root.mkdir(parents=True, exist_ok=True)
        python_sources(args.root)
    else:
        load(args.directory)


if __name__ == "__main__":
    main()
