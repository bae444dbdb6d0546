"""torchtitan's trainer on the Qwen2.5-1.5B shape, timed and counted as ``bench/train_throughput.py`` counts ours.

    torchrun --nproc-per-node 1 bench/titan_qwen.py --job.config_file bench/titan_qwen.toml \\
        --training.steps 30 [--x.warmup 10] [--x.json FILE] [--x.overrides JSON]

torchtitan (``pip install torchtitan==0.2.2``, the newest that runs on torch 2.11) is not a dependency of
this project: this file only registers a model with it and runs its own ``Trainer``. The model is
torchtitan's Qwen3 class with qk-norm off at Qwen2.5-1.5B's shape (dim 1536, hidden 8960, 28 layers,
12/2 heads, head_dim 128, vocab 151,936, tied; no QKV bias, so 57,344 fewer parameters than Qwen2.5).
Its data are uniform random token ids, as ours are (no tokenizer, no dataset: nothing to fetch).

Throughput is taken as ours is: one device sync before the first timed step and one after the last,
tokens over the wall time between them; MFU uses this project's FLOPs per token for Qwen2.5-1.5B
(``fsdp_train.watch.metrics.flops_per_token``: 6N + 12·L·d·s) and peak, not torchtitan's own count (which leaves
the tied embedding, and so the lm_head matmul, out of N). The ``--x.*`` arguments are this script's own;
the rest go to torchtitan's config manager (``bench/titan_qwen.toml`` holds the settings compared).
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "training"))

MODEL_NAME = "fsdp_bench_qwen"
FLAVOR = "qwen2.5-1.5b-shape"


def own_args(argv: list[str]) -> tuple[dict[str, str], list[str]]:
    """Split ``--x.key value`` pairs (this script's) from torchtitan's arguments."""
    mine: dict[str, str] = {}
    rest: list[str] = []
    it = iter(argv)
    for arg in it:
        if arg.startswith("--x."):
            key, eq, value = arg[4:].partition("=")
            mine[key] = value if eq else next(it)
        else:
            rest.append(arg)
    return mine, rest


class RandomTokens:
    """torchtitan's data-loader protocol over uniform random token ids: ``({"input": x}, labels)`` batches."""

    def __init__(self, *, batch: int, seq_len: int, vocab: int, seed: int, rank: int) -> None:
        self.batch, self.seq_len, self.vocab = batch, seq_len, vocab
        self.generator = torch.Generator().manual_seed(seed * 1000 + rank)

    def __iter__(self) -> Iterator[tuple[dict[str, torch.Tensor], torch.Tensor]]:
        while True:
            tokens = torch.randint(0, self.vocab, (self.batch, self.seq_len + 1), generator=self.generator)
            yield {"input": tokens[:, :-1]}, tokens[:, 1:]

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


def register(overrides: dict[str, Any]) -> None:
    """Register torchtitan's Qwen3 spec with the Qwen2.5-1.5B-shaped flavor and random-token data."""
    from torchtitan.models import qwen3
    from torchtitan.protocols.train_spec import register_train_spec

    base = qwen3.get_train_spec()
    shape = dataclasses.replace(
        qwen3.qwen3_args["1.7B"],
        dim=1536,
        hidden_dim=8960,
        n_layers=28,
        n_heads=12,
        n_kv_heads=2,
        head_dim=128,
        vocab_size=151936,
        qk_norm=False,
        enable_weight_tying=True,
        rope_theta=1000000,
    )
    shape = dataclasses.replace(shape, **overrides)

    def dataloader(*, dp_world_size: int, dp_rank: int, tokenizer: Any, job_config: Any) -> RandomTokens:
        return RandomTokens(
            batch=job_config.training.local_batch_size,
            seq_len=job_config.training.seq_len,
            vocab=shape.vocab_size,
            seed=0,
            rank=dp_rank,
        )

    spec = dataclasses.replace(
        base,
        model_args={FLAVOR: shape},
        build_tokenizer_fn=None,
        build_dataloader_fn=dataloader,  # type: ignore[arg-type]
        build_validator_fn=None,
    )
    register_train_spec(MODEL_NAME, spec)


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def main() -> int:
    mine, titan_argv = own_args(sys.argv[1:])
    warmup = int(mine.get("warmup", "10"))
    overrides = json.loads(mine.get("overrides", "{}"))
    register(overrides)

    from fsdp_train.contract.config import TrainConfig
    from fsdp_train.models.model import hf_config
    from fsdp_train.watch.metrics import flops_per_token, mfu, peak_flops
    from torchtitan.config import ConfigManager
    from torchtitan.tools.logging import init_logger
    from torchtitan.train import Trainer

    class TimedTrainer(Trainer):  # type: ignore[misc]
        """torchtitan's ``Trainer``; syncs the device once before step ``warmup + 1`` and once after the last."""

        started: float | None = None
        elapsed: float = 0.0
        last_loss: float = float("nan")

        def train_step(self, data_iterator: Any) -> None:
            if self.step == warmup + 1:
                sync()
                self.started = time.perf_counter()
            super().train_step(data_iterator)
            if self.step == self.job_config.training.steps and self.started is not None:
                sync()
                self.elapsed = time.perf_counter() - self.started

    init_logger()
    config = ConfigManager().parse_args(titan_argv)
    steps = config.training.steps
    if steps <= warmup:
        raise SystemExit(f"--training.steps ({steps}) must exceed --x.warmup ({warmup})")
    trainer = TimedTrainer(config)
    try:
        trainer.train()
        model = trainer.model_parts[0]
        params = sum(p.numel() for p in model.parameters())
        sharded = any(type(p).__name__ == "DTensor" for p in model.parameters())
        tokens = (steps - warmup) * config.training.local_batch_size * config.training.seq_len
        tps = tokens / trainer.elapsed
        ours = hf_config(
            TrainConfig(
                model="Qwen/Qwen2.5-1.5B", seq_len=config.training.seq_len, model_overrides=overrides_hf(overrides)
            )
        )
        fpt = flops_per_token(ours, config.training.seq_len)
        device_name = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
        result = {
            "recipe": "torchtitan-fsdp" if sharded else "torchtitan-native",
            "tokens_per_s_per_gpu": tps,
            "mfu": mfu(tps, fpt, peak_flops(device_name)),
            "params": params,
            "peak_reserved_gib": (torch.cuda.max_memory_reserved() if torch.cuda.is_available() else 0) / 2**30,
            "peak_allocated_gib": (torch.cuda.max_memory_allocated() if torch.cuda.is_available() else 0) / 2**30,
            "timed_steps": steps - warmup,
            "seconds": trainer.elapsed,
            "flops_per_token": fpt,
        }
        if int(os.environ.get("RANK", "0")) == 0:
            print(f"# done {result['recipe']}: {json.dumps(result)}", flush=True)
            m = f"{result['mfu'] * 100:.1f} %" if result["mfu"] is not None else "n/a"
            print(
                f"| {result['recipe']} (torchtitan, {params:,} params) | {tps:,.0f} | {m} "
                f"| {result['peak_allocated_gib']:.1f} GiB alloc, {result['peak_reserved_gib']:.1f} GiB reserved |"
            )
            if "json" in mine:
                Path(mine["json"]).write_text(json.dumps(result, indent=2))
    finally:
        trainer.close()
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
    return 0


def overrides_hf(overrides: dict[str, Any]) -> dict[str, Any]:
    """torchtitan's shape overrides (a smaller model for smoke runs) as Hugging Face config fields."""
    names = {
        "dim": "hidden_size",
        "hidden_dim": "intermediate_size",
        "n_layers": "num_hidden_layers",
        "n_heads": "num_attention_heads",
        "n_kv_heads": "num_key_value_heads",
        "vocab_size": "vocab_size",
        "head_dim": "head_dim",
    }
    return {names[k]: v for k, v in overrides.items() if k in names}


if __name__ == "__main__":
    sys.exit(main())
