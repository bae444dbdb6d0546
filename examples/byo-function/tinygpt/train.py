"""A tiny GPT-2 (built from its config, no download) trained with FSDP2 by a plain Ray Train function."""

import tempfile
import time
from pathlib import Path

import ray.train
import ray.train.torch
import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict
from torch.distributed.fsdp import fully_shard
from transformers import GPT2Config, GPT2LMHeadModel

try:  # shipped with every job the operator runs (docs/byo-function.md, "A node that goes away")
    from fsdp_train.watch.notice import interrupted
except ImportError:  # run elsewhere: no notices

    def interrupted() -> bool:
        return False


FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)


def train_func(config: dict) -> None:
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    device = ray.train.torch.get_device()
    torch.manual_seed(config.get("seed", 0))
    model = GPT2LMHeadModel(GPT2Config(**config["model"])).to(device)
    for block in model.transformer.h:  # FSDP2: one unit per block, then the rest
        fully_shard(block)
    fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.get("lr", 1e-3))

    start, checkpoint = 0, ray.train.get_checkpoint()
    if checkpoint:  # a restarted worker group continues where the last checkpoint left off: weights and AdamW's state
        with checkpoint.as_directory() as directory:
            saved = torch.load(Path(directory) / "state.pt", weights_only=True)
        start = saved["step"]
        options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
        set_state_dict(
            model, optimizer, model_state_dict=saved["model"], optim_state_dict=saved["optim"], options=options
        )

    steps, batch, seq = config["steps"], config.get("batch", 4), config.get("seq_len", 64)
    vocab, every = config["model"]["vocab_size"], config.get("checkpoint_every", 0)
    for step in range(start + 1, steps + 1):
        began = time.perf_counter()
        gen = torch.Generator().manual_seed(step * world + rank)  # this rank's batch: count on from random starts
        tokens = ((torch.randint(0, vocab, (batch, 1), generator=gen) + torch.arange(seq)) % vocab).to(device)
        loss = model(input_ids=tokens, labels=tokens).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        mean = loss.detach()
        torch.distributed.all_reduce(mean)
        metrics = {
            "step": step,
            "total_steps": steps,
            "loss": mean.item() / world,
            "tokens": step * batch * seq * world,
            "tokens_per_second": batch * seq * world / (time.perf_counter() - began),
        }
        # Every rank, every step (it is collective): a node of the job is going away; checkpoint now, then return.
        stop = interrupted()
        state = get_state_dict(model, optimizer, options=FULL) if (every and step % every == 0) or stop else None
        with tempfile.TemporaryDirectory() as directory:
            saved = None
            if state is not None and rank == 0:
                torch.save({"model": state[0], "optim": state[1], "step": step}, Path(directory) / "state.pt")
                saved = ray.train.Checkpoint.from_directory(directory)
            ray.train.report(metrics, checkpoint=saved)
        if stop:
            return  # the attempt ends; the next one resumes from this checkpoint
