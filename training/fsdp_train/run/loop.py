"""The per-rank training loop: plain ``torch.distributed``, the same under torchrun and Ray Train.

``train()`` is what every rank runs; ``fsdp_train.__main__`` (torchrun) and ``fsdp_train.run.ray_entry``
(Ray Train) only build its ``Topology`` and ``Checkpointer``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import os
import sys
import time
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from fsdp_train.contract.config import RANDOM_DATA, TrainConfig
from fsdp_train.contract.events import Checkpoint, Resolved, Summary, as_dict, emit
from fsdp_train.contract.failures import failure_of
from fsdp_train.contract.families import attention_for
from fsdp_train.datapath.data import Prepared, check_usable, prepare_on_each_node, tokenizer_location
from fsdp_train.datapath.feed import Collate, TrainFeed
from fsdp_train.datapath.fingerprint import run_fingerprint
from fsdp_train.datapath.packing import Packed, samples_digest
from fsdp_train.models import conformance
from fsdp_train.models.adapters import adapter_params, add_adapters, init_adapters, trainable
from fsdp_train.models.attention import to_device
from fsdp_train.models.loss import use_loss
from fsdp_train.models.model import build_meta_model, decoder_blocks, hf_config, init_weights
from fsdp_train.models.parallelize import Topology, build_mesh, parallelize, resolve_sharding
from fsdp_train.models.precision import DEFAULT_FLOAT8, float8_step_hook, resolve_precision
from fsdp_train.models.quantize import quantize_base
from fsdp_train.models.weights import load_pretrained_weights
from fsdp_train.run import preflight
from fsdp_train.run.evaluation import evaluate, export_checked
from fsdp_train.run.fault_hooks import FaultHook
from fsdp_train.state.checkpoint import Checkpointer, NoCheckpoints, SaveTimes
from fsdp_train.watch import health, report
from fsdp_train.watch.metrics import Backend, EventsBackend, Metrics, flops_per_token, peak_flops
from fsdp_train.watch.notice import Watch
from fsdp_train.watch.startup import (
    StartupClock,
    configure_compile_cache,
    fill_bytecode_cache,
    finish_bytecode_cache,
)
from fsdp_train.watch.steps import GC_EVERY_STEPS, LaggedSteps, collected_every

FAIL_AT_STEP_ENV = "FSDP_TRAIN_FAIL_AT_STEP"
"""Fault injection: raise after step N (and its checkpoint) unless the run resumed at or past N."""
KILL_AT_STEP_ENV = "FSDP_TRAIN_KILL_AT_STEP"
"""Fault injection: ``RANK:STEP`` makes that rank kill itself (SIGKILL) after the step, in a run that did not resume."""

PrepareData = Callable[[TrainConfig, Topology, str], Prepared]
"""How a rank gets its packed data: tokenized on each node (torchrun), or from Ray Data's shards (Ray)."""


def prepare_torchrun(cfg: TrainConfig, topo: Topology, tokenizer_dir: str) -> Prepared:
    return prepare_on_each_node(cfg, tokenizer_dir, rank=topo.rank, local_rank=topo.local_rank)


def random_tokens(
    *, seed: int, step: int, micro: int, first_sample: int, samples: int, seq_len: int, vocab: int
) -> torch.Tensor:
    """Uniform random token ids; sample ``i`` of a step depends only on (seed, step, micro, i).

    So the global batch is the same whatever the number of ranks, and a resumed run sees the same
    data as an uninterrupted one.
    """
    rows = []
    for i in range(first_sample, first_sample + samples):
        digest = hashlib.sha256(f"{seed}:{step}:{micro}:{i}".encode()).digest()
        gen = torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") & ((1 << 63) - 1))
        rows.append(torch.randint(0, vocab, (seq_len,), generator=gen))
    return torch.stack(rows)


@dataclass(slots=True)
class Host:
    """What differs between torchrun and Ray Train: node address, checkpoints, extra metric backends."""

    node_ip: str
    checkpointer: Checkpointer = field(default_factory=NoCheckpoints)
    backends: list[Backend] = field(default_factory=list)
    env: MutableMapping[str, str] = field(default_factory=lambda: os.environ)
    prepare_data: PrepareData = prepare_torchrun
    health: health.HealthConfig = field(default_factory=health.HealthConfig)


def train(cfg: TrainConfig, topo: Topology, host: Host) -> dict[str, Any]:
    """Run the whole job on this rank; return the ``Summary`` as a dict. Failures emit ``Failure``."""
    try:
        return _train(cfg, topo, host)
    except BaseException as e:
        health.stop_monitors()  # a failed rank is no stalled one
        emit(failure_of(topo.rank, e))  # a reason only for the project's own errors; any message serialises
        raise


def _train(cfg: TrainConfig, topo: Topology, host: Host) -> dict[str, Any]:
    env = host.env
    device = report.rank_device(topo)
    if device.type == "cuda":
        report.prepare_nccl_debug(env)
    owns_group = not dist.is_initialized()  # under Ray Train, Ray made the group and tears it down
    if owns_group:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    summary = _run(cfg, topo, host, device)
    # Only after success: a failed rank must exit, not wait in a barrier its peers may never reach
    # (torchrun then stops the others). gloo can abort at exit without this barrier (environment.md).
    if owns_group:
        dist.barrier()
        dist.destroy_process_group()
    return summary


def _run(cfg: TrainConfig, topo: Topology, host: Host, device: torch.device) -> dict[str, Any]:
    env = host.env
    started = time.perf_counter()
    # Before the first collective: a missing data file or an unreachable model fails in seconds, named.
    preflight.check_rank(cfg)
    fingerprint = run_fingerprint(cfg, topo.world_size) if cfg.checkpoint_path else None
    clock = StartupClock.start()
    compile_cache = configure_compile_cache(cfg.compile_cache_dir, env)
    bytecode_cached = sys.pycache_prefix is not None
    bytecode_fill = None
    cross_node_gbps = report.verify_link(
        topo, node_ip=host.node_ip, device=device, env=env, probe_size_bytes=cfg.probe_size_bytes
    )
    # An NF4 base is cut over one mesh dimension only (the config refuses hybrid with it): auto picks full.
    requested = "full" if cfg.lora_quantize_base == "nf4" else cfg.sharding
    sharding = resolve_sharding(requested, topo.num_nodes, cross_node_gbps, cfg.min_cross_node_gbps)
    clock.mark("probe")

    # Data before weights: a source that cannot be read fails the job in seconds, not after a model load.
    source, model_dir = cfg.model, _fetch_model(cfg, topo)
    if model_dir is not None:
        cfg = dataclasses.replace(cfg, model=model_dir)
    feed, validation, tokenizer_dir = _prepare_data(cfg, topo, host, device)
    if feed is not None:
        cfg = dataclasses.replace(cfg, steps=feed.total_steps(cfg.steps, cfg.epochs))

    model, optimizer, config = build(cfg, topo, sharding, device, source=source)
    precision = matmul_precision(cfg, device, config)
    if topo.rank == 0:  # before anything can fail the run: MLflow's parameters say what ran, summary or not
        emit(Resolved(rank=0, sharding=sharding, precision=precision))
    extra = {"data": feed.position} if feed is not None else {}
    resumed_from = host.checkpointer.restore(model, optimizer, extra, fingerprint)
    if resumed_from and topo.rank == 0:
        emit(Checkpoint(rank=0, step=resumed_from, path=cfg.checkpoint_path, resumed=True))
        print(f"fsdp_train: resumed from the checkpoint of step {resumed_from} of {cfg.steps}", flush=True)
    if feed is not None and resumed_from != feed.position.epoch * feed.steps_per_epoch + feed.position.step_in_epoch:
        raise AssertionError(f"checkpoint of step {resumed_from} holds data position {feed.position}")
    # The model it trains is the family's model: the bundled path's loss against transformers' own, on one row.
    row = _check_batch(cfg, feed, validation, config.vocab_size, 1)
    ours, theirs, seconds = conformance.check(model, row, device, conformance.TOLERANCE[cfg.mixed_precision])
    if topo.rank == 0:
        print(
            f"fsdp_train: conformance: the training path's loss {ours:.4f}, transformers' own {theirs:.4f} on one row "
            f"({seconds:.2f} s)",
            flush=True,
        )
    clock.mark("build")

    device_name, _ = report.device_identity(device)
    metrics = Metrics(
        rank=topo.rank,
        world_size=topo.world_size,
        total_steps=cfg.steps,
        flops_per_token=flops_per_token(config, cfg.seq_len, adapter_params(model) if cfg.lora_rank else 0),
        peak=peak_flops(device_name) if device.type == "cuda" else None,
        backends=[EventsBackend(), *host.backends],
    )
    fail_at = int(env.get(FAIL_AT_STEP_ENV, "0") or 0)
    # Fault injection reads every step's result at once (the injected failure must follow its checkpoint).
    always_sync = bool(fail_at or env.get(KILL_AT_STEP_ENV))
    tokens_per_step = topo.world_size * cfg.tokens_per_rank_per_step
    eval_loss: float | None = None
    eval_seconds = export_seconds = 0.0
    steps = LaggedSteps(metrics, device, tokens_per_step)
    # A notice that a node goes away (fsdp_train.watch.notice): looked for at every step boundary, agreed by all ranks.
    watch, interruption = Watch.from_env(env, topo.rank, topo.local_rank, resumed_from), {}
    monitor = health.Monitor(topo.rank, host.health, flight=health.flight_for(device)).start()
    hook = FaultHook.from_env(env, topo.rank)
    with collected_every(GC_EVERY_STEPS) as collect:
        for step in range(resumed_from + 1, cfg.steps + 1):
            collect(step)
            step_start = steps.start()
            progress: dict[str, Any] = {}
            with monitor.data():
                hook.before_step(step, resumed_from)
            if feed is None:
                on_device = step_figures(cfg, topo, model, optimizer, step, sharding, device, config.vocab_size)
            else:
                epoch = feed.position.epoch
                with monitor.data():
                    batches, sample_ids = feed.next_step()
                on_device = step_figures(
                    cfg, topo, model, optimizer, step, sharding, device, config.vocab_size, batches
                )
                feed.finish_step()
                progress = {
                    "epoch": epoch,
                    "samples_seen": feed.position.samples_seen,
                    "tokens_seen": feed.position.samples_seen * feed.seq_len,
                    "samples_digest": samples_digest(sample_ids),
                }
            first = step == resumed_from + 1
            evaluated = validation is not None and (
                step == cfg.steps or (cfg.eval_every_steps and step % cfg.eval_every_steps == 0)
            )
            checkpointed = bool(cfg.checkpoint_path) and (
                step == cfg.steps or (cfg.checkpoint_interval and step % cfg.checkpoint_interval == 0)
            )
            exported = bool(cfg.output_path) and (step == cfg.steps or (checkpointed and cfg.export_every_checkpoint))
            # The previous step's loss is read now, while this step runs: no host sync at a step's start.
            steps.launched(step, on_device, step_start, progress)
            monitor.step(step)
            noticed = watch.check() if step < cfg.steps else None  # the last step ends the run anyway
            if noticed is not None:  # save now when it fits before the deadline; nothing else at this step
                checkpointed, evaluated, exported = noticed.save and bool(cfg.checkpoint_path), False, False
            if not (first or evaluated or checkpointed or exported or always_sync or noticed or step == cfg.steps):
                continue
            monitor.begin_long()  # evaluation, checkpoint, export: many steps' time
            event = steps.finish()
            loss = event.loss
            if first:
                clock.mark("first_step")
                if topo.rank == 0:
                    emit(clock.timings(0, compile_cache))
                if topo.local_rank == 0 and not bytecode_cached:
                    # Everything a start imports is imported by now: one rank per node keeps its bytecode.
                    bytecode_fill = fill_bytecode_cache(cfg.compile_cache_dir, list(sys.modules.values()))
            if evaluated:
                assert validation is not None
                t1 = time.perf_counter()
                eval_loss = evaluate(cfg, topo, model, validation, device, step)
                eval_seconds += time.perf_counter() - t1
            if checkpointed:
                _report_save(topo, host.checkpointer.wait(), watch)  # the previous asynchronous write, if any
                t1 = time.perf_counter()
                where = host.checkpointer.save(
                    model, optimizer, step, {"step": step, "loss": loss, "mfu": event.mfu}, extra, fingerprint
                )
                watch.measured(time.perf_counter() - t1)  # the whole save when synchronous (Ray's store)
                if topo.rank == 0:  # seconds: how long the loop was held (the write may go on in the background)
                    emit(Checkpoint(rank=0, step=step, path=where, seconds=time.perf_counter() - t1))
                if always_sync or noticed:  # an injected failure or the end of the attempt follows: complete it
                    checkpointed = _report_save(topo, host.checkpointer.wait(watch.deadline), watch)
                watch.last_checkpoint = step if checkpointed else watch.last_checkpoint
            if noticed is not None:
                interruption = watch.finish(step, saved=bool(checkpointed))
                break
            if exported:
                target = cfg.output_path if step == cfg.steps else f"{cfg.output_path.rstrip('/')}/step_{step:08d}"
                t1 = time.perf_counter()
                check = _check_batch(cfg, feed, validation, config.vocab_size)
                export_checked(cfg, topo, model, config, target, step, tokenizer_dir, model_dir, check, device)
                export_seconds += time.perf_counter() - t1
            if fail_at and step == fail_at and resumed_from < fail_at:
                raise RuntimeError(f"{FAIL_AT_STEP_ENV}={fail_at}: injected failure after step {step}")
            _maybe_kill(env, topo.rank, step, resumed_from)
            monitor.end_long()
    monitor.stop()

    _report_save(topo, host.checkpointer.wait(), watch)
    if resumed_from >= cfg.steps and cfg.output_path:
        # A rerun of a finished run (same fingerprint) trains nothing; it still leaves the export it promises.
        if topo.rank == 0:
            print(f"fsdp_train: the checkpoint is the end of training (step {resumed_from}); exporting it", flush=True)
        if validation is not None:  # the figures of this run are this run's own: its evaluation of the model
            t1 = time.perf_counter()
            eval_loss = evaluate(cfg, topo, model, validation, device, resumed_from)
            eval_seconds += time.perf_counter() - t1
        check = _check_batch(cfg, feed, validation, config.vocab_size)
        t1 = time.perf_counter()
        export_checked(cfg, topo, model, config, cfg.output_path, resumed_from, tokenizer_dir, model_dir, check, device)
        export_seconds += time.perf_counter() - t1

    # Losses and the rate of the steps this run trained; None (absent) when it trained none.
    summary = Summary(
        rank=topo.rank,
        steps=cfg.steps,
        final_loss=metrics.last.loss if metrics.last else None,
        first_loss=metrics.first_loss,
        tokens_per_second=metrics.mean_tokens_per_second,
        mfu=metrics.mean_mfu,
        seconds=time.perf_counter() - started,
        sharding=sharding,
        resumed_from_step=resumed_from,
        eval_loss=eval_loss,
        epochs=feed.position.epoch + (1 if feed.position.step_in_epoch else 0) if feed is not None else 0,
        precision=precision,
        step_seconds=metrics.timed_seconds,
        eval_seconds=eval_seconds,
        export_seconds=export_seconds,
    )
    emit(summary)
    finish_bytecode_cache(bytecode_fill)
    return {**as_dict(summary), **interruption}


def _report_save(topo: Topology, times: SaveTimes | None, watch: Watch) -> bool:  # complete: the next attempt has it
    if times is not None:
        watch.measured(times.total_seconds, incomplete=0 if times.complete else times.step)
        if topo.rank == 0:
            print(f"fsdp_train: checkpoint of step {times.step} written in {times.total_seconds:.1f} s; the loop "
                  f"was blocked {times.blocked_seconds:.2f} s by it and waited {times.waited_seconds:.2f} s for its "
                  "end", flush=True)  # fmt: skip
    return times is None or times.complete


def _fetch_model(cfg: TrainConfig, topo: Topology) -> str | None:
    """The local directory of the pretrained model (fetched once per node), or None for a random init."""
    if cfg.model_init != "pretrained":
        return None
    from fsdp_train.state.storage import fetch_on_each_node

    return fetch_on_each_node(cfg.model, local_rank=topo.local_rank)


def _prepare_data(
    cfg: TrainConfig, topo: Topology, host: Host, device: torch.device
) -> tuple[TrainFeed | None, Packed | None, str | None]:
    """The training feed, the validation rows and the tokenizer's directory; (None, None, None) for random data."""
    if cfg.data == RANDOM_DATA:
        return None, None, None
    from fsdp_train.state.storage import TOKENIZER_FILE_PATTERNS, fetch_on_each_node

    location = tokenizer_location(cfg, cfg.model if cfg.model_init == "pretrained" else None)
    tokenizer_dir = fetch_on_each_node(location, local_rank=topo.local_rank, patterns=TOKENIZER_FILE_PATTERNS)
    prepared = host.prepare_data(cfg, topo, tokenizer_dir)
    check_usable(prepared, cfg, topo.world_size, int(hf_config(cfg).vocab_size))
    feed = TrainFeed(
        prepared.train,
        rank=topo.rank,
        world_size=topo.world_size,
        batch_size=cfg.batch_size_per_rank,
        grad_accum=cfg.grad_accum,
        seed=cfg.shuffle_seed,
        pin_memory=device.type == "cuda",
        document_mask=cfg.document_mask,
    )
    return feed, prepared.validation, tokenizer_dir


EXPORT_CHECK_ROWS = 4
"""Packed rows (validation first, else training) that the export self-check computes the loss on."""


def _check_batch(
    cfg: TrainConfig, feed: TrainFeed | None, validation: Packed | None, vocab: int, rows: int = EXPORT_CHECK_ROWS
) -> dict[str, torch.Tensor]:
    """The self-checks' fixed rows: the first validation rows, else the first training rows, else random tokens."""
    packed = validation if validation is not None and len(validation) else (feed.packed if feed else None)
    if packed is None:
        tokens = random_tokens(
            seed=cfg.seed, step=0, micro=0, first_sample=0, samples=rows, seq_len=cfg.seq_len, vocab=vocab
        )
        return {"input_ids": tokens, "labels": tokens}
    return Collate(packed, cfg.document_mask)(list(range(min(rows, len(packed)))))


def _maybe_kill(env: Mapping[str, str], rank: int, step: int, resumed_from: int) -> None:
    spec = env.get(KILL_AT_STEP_ENV, "")
    if not spec:
        return
    kill_rank, kill_step = (int(x) for x in spec.split(":"))
    if rank == kill_rank and step == kill_step and resumed_from == 0:
        import signal

        # Under Ray a checkpoint counts once Ray Train's controller has collected every rank's report;
        # a crash within its poll interval of the last checkpoint would lose that checkpoint too.
        time.sleep(1.0)
        os.kill(os.getpid(), signal.SIGKILL)


def build(
    cfg: TrainConfig, topo: Topology, sharding: str, device: torch.device, *, source: str = ""
) -> tuple[nn.Module, torch.optim.Optimizer, Any]:
    """The sharded, initialised model, its AdamW optimizer and its Hugging Face config.

    ``source``: the model as the user named it (``cfg.model`` may be its local copy), for an adapter's config.
    """
    config = hf_config(cfg)
    model = build_meta_model(config)
    if (why := attention_for(config)[1]) and topo.rank == 0:
        print(f"fsdp_train: {why}", flush=True)
    if cfg.lora_rank:  # peft's adapters on the meta model, the rest frozen: FSDP2 shards both
        add_adapters(model, cfg, base=source or cfg.model)
    if cfg.lora_quantize_base == "nf4":  # before sharding: FSDP2 cuts and gathers the NF4 weights as they are
        quantize_base(model, shards=topo.world_size)
    mesh = build_mesh(topo, sharding, device.type)
    on_gpu = device.type == "cuda"
    precision = matmul_precision(cfg, device, config)
    parallelize(
        model,
        decoder_blocks(model),
        mesh,
        mixed_precision=cfg.mixed_precision,
        activation_checkpointing=cfg.activation_checkpointing,
        compile_blocks=cfg.compile,
        reshard_after_forward=cfg.reshard_after_forward,
        float8=DEFAULT_FLOAT8 if precision == "fp8" else None,
    )
    use_loss(model, chunk_tokens=cfg.loss_chunk_tokens, compiled=cfg.compile)
    if cfg.model_init == "pretrained":
        load_pretrained_weights(model, cfg, device)
    else:
        init_weights(model, config, cfg.seed, device)
    if cfg.lora_rank:
        init_adapters(model, cfg.seed, device)
    model.train()
    # fused: one kernel for the whole update on GPU (DTensor parameters are supported by FSDP2).
    optimizer = torch.optim.AdamW(
        trainable(model),
        lr=cfg.learning_rate,
        weight_decay=cfg.weight_decay,
        fused=True if on_gpu else None,
        foreach=None if on_gpu else True,
    )
    if precision == "fp8":
        float8_step_hook(model, optimizer, DEFAULT_FLOAT8)
    return model, optimizer, config


def matmul_precision(cfg: TrainConfig, device: torch.device, config: Any) -> str:
    """``bf16``, ``fp8`` or ``fp32``: the matmuls' precision for this device and model
    (``fsdp_train.models.precision``)."""
    if cfg.mixed_precision == "fp32":
        return "fp32"  # no mixed precision at all (the config refuses fp8 with it)
    if cfg.lora_rank:
        return "bf16"  # fp8 is for full fine-tuning (the config refuses it with LoRA); auto picks bf16
    on_gpu = device.type == "cuda"
    return resolve_precision(
        cfg.precision,
        device_name=torch.cuda.get_device_name(device) if on_gpu else "cpu",
        capability=torch.cuda.get_device_capability(device) if on_gpu else None,
        hidden_size=int(config.hidden_size),
        tokens_per_micro_batch=cfg.batch_size_per_rank * cfg.seq_len,
    )


def train_step(
    cfg: TrainConfig,
    topo: Topology,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    step: int,
    sharding: str,
    device: torch.device,
    vocab: int,
    batches: Sequence[Mapping[str, torch.Tensor]] | None = None,
) -> float:
    """One optimizer step over ``grad_accum`` micro-batches; returns the loss averaged over all ranks.

    ``batches``: this rank's micro-batches from the data pipeline; None draws random tokens. Waits for
    the step to finish (the loss is read back); the loop uses ``step_figures`` and reads them a step later.
    """
    return float(step_figures(cfg, topo, model, optimizer, step, sharding, device, vocab, batches)[0].item())


def step_figures(
    cfg: TrainConfig,
    topo: Topology,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    step: int,
    sharding: str,
    device: torch.device,
    vocab: int,
    batches: Sequence[Mapping[str, torch.Tensor]] | None = None,
) -> torch.Tensor:
    """``train_step`` without the wait, and with the gradients' total norm before clipping (NaN when
    ``max_grad_norm`` is 0: not computed): ``[loss, grad norm]`` on the device. Nothing here reads a device value
    back, so the host queues the next step while this one runs; one tensor, so reading it later is one wait."""
    lr = cfg.learning_rate_at(step)
    for group in optimizer.param_groups:
        group["lr"] = lr
    total = torch.zeros((), device=device)
    for micro in range(cfg.grad_accum):
        last = micro == cfg.grad_accum - 1
        if sharding == "hybrid" and cfg.grad_accum > 1:
            # HSDP: reduce-scatter inside the node every micro-batch, all-reduce across nodes once.
            model.set_requires_all_reduce(last)  # type: ignore[operator]
        if batches is None:
            tokens = random_tokens(
                seed=cfg.seed,
                step=step,
                micro=micro,
                first_sample=topo.rank * cfg.batch_size_per_rank,
                samples=cfg.batch_size_per_rank,
                seq_len=cfg.seq_len,
                vocab=vocab,
            ).to(device, non_blocking=True)
            inputs = {"input_ids": tokens, "labels": tokens}
        else:
            inputs = to_device(batches[micro], device)
        loss = model(**inputs).loss / cfg.grad_accum
        loss.backward()
        total += loss.detach()
    grad_norm = torch.full((), math.nan, device=device)
    if cfg.max_grad_norm > 0:
        norm = torch.nn.utils.clip_grad_norm_(trainable(model), cfg.max_grad_norm)
        # Sharded gradients give a DTensor whose value is still a partial one: the whole norm, as every rank has it.
        full = getattr(norm, "full_tensor", None)
        grad_norm = (full() if full is not None else norm).detach().float()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    dist.all_reduce(total, op=dist.ReduceOp.AVG if device.type == "cuda" else dist.ReduceOp.SUM)
    if device.type != "cuda":
        total /= topo.world_size  # gloo has no AVG
    return torch.stack([total, grad_norm])


def run_from_env(cfg: TrainConfig) -> dict[str, Any]:
    """Entry for torchrun: topology from torchrun's variables, checkpoints in ``cfg.checkpoint_path``."""
    from fsdp_train.state.checkpoint import DirectoryCheckpoints

    topo = Topology.from_torchrun_env(os.environ)
    checkpointer: Checkpointer = (
        DirectoryCheckpoints(cfg.checkpoint_path, asynchronous=True) if cfg.checkpoint_path else NoCheckpoints()
    )
    host = Host(node_ip=report.guess_node_ip(os.environ), checkpointer=checkpointer)
    host.health = health.HealthConfig(enabled=os.environ.get(health.ENABLED_ENV, "1") != "0")
    return train(cfg, topo, host)
