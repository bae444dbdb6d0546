"""Training metrics as one component: the loop calls ``Metrics.log``; backends turn it into output.

MFU follows ``docs/performance.md``: tokens/s/device x FLOPs/token / the device's dense bf16 peak
(``fsdp_train.contract.catalog``).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Protocol

from fsdp_train.contract.catalog import gpu_for_device
from fsdp_train.contract.events import Step, emit


def count_params(config: Any) -> int:
    """Parameters of a Qwen2-style decoder (tied embedding counted once), from the config alone."""
    d = config.hidden_size
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or d // heads
    kv = config.num_key_value_heads * head_dim
    q = heads * head_dim
    attn = d * q + q + 2 * (d * kv + kv) + q * d  # q/k/v projections carry a bias, o_proj none
    mlp = 3 * d * config.intermediate_size
    block = attn + mlp + 2 * d  # two RMSNorm weights
    embed = config.vocab_size * d
    head = 0 if config.tie_word_embeddings else config.vocab_size * d
    return int(config.num_hidden_layers * block + embed + head + d)  # + final norm


def matmul_params(config: Any) -> int:
    """Parameters that take part in a matmul per token: all but the input embedding (a lookup).

    PaLM's convention (appendix B): a tied embedding is counted once, as the lm_head matmul it also is;
    an untied model's input embedding is left out, its lm_head counted.
    """
    untied_input = 0 if config.tie_word_embeddings else config.vocab_size * config.hidden_size
    return count_params(config) - int(untied_input)


def flops_per_token(config: Any, seq_len: int, adapter_params: int = 0) -> float:
    """Model FLOPs per trained token: 6·N + 12·L·d·s (docs/performance.md "How to count", PaLM appendix B).

    N is ``matmul_params`` (no input embedding); 12·L·d·s is attention's score and value matmuls,
    forward and backward. With LoRA (``adapter_params`` > 0) the frozen base does its forward (2·N) and the
    backward to its inputs (2·N) but makes no weight gradients, and the adapters do all three (6·A):
    4·N + 6·A + 12·L·d·s. Recomputation (activation checkpointing) is never counted.
    """
    n = matmul_params(config)
    attention = 12 * config.num_hidden_layers * config.hidden_size * seq_len
    if adapter_params:
        return float(4 * n + 6 * adapter_params + attention)
    return float(6 * n + attention)


def bus_bandwidth_gbps(kind: str, size_bytes: int, seconds: float, ranks: int) -> float:
    """nccl-tests' bus bandwidth in GB/s: all-reduce size/t·2(n-1)/n, all-gather size/t·(n-1)/n."""
    if seconds <= 0 or ranks < 2:
        return 0.0
    factor = {"all_reduce": 2 * (ranks - 1) / ranks, "all_gather": (ranks - 1) / ranks}[kind]
    return size_bytes / seconds * factor / 1e9


def peak_flops(device_name: str) -> float | None:
    """The dense bf16 peak of a device (the hardware catalog's), or None for a CPU or an unknown GPU."""
    gpu = gpu_for_device(device_name)
    return gpu.bf16_flops if gpu else None


def mfu(tokens_per_second_per_device: float, flops_per_token: float, peak: float | None) -> float | None:
    """Model FLOPs utilisation in 0..1, or None without a known peak."""
    if peak is None or peak <= 0:
        return None
    return tokens_per_second_per_device * flops_per_token / peak


@dataclass(slots=True)
class StepMetrics:
    step: int
    loss: float
    step_seconds: float
    tokens: int
    """Tokens processed by all ranks in this step."""
    peak_memory_bytes: int = 0
    epoch: int = 0
    samples_seen: int = 0
    tokens_seen: int = 0
    samples_digest: str = ""
    grad_norm: float | None = None
    """The gradients' total norm before clipping; None when not computed (clipping off)."""


RATE_WINDOW_STEPS = 10
"""Steps a reported rate is over: one step's time wanders (a collection, a slow batch) more than ten steps' does."""


class Backend(Protocol):
    def log(self, step: Step) -> None: ...


@dataclass(slots=True)
class EventsBackend:
    """Prints one ``Step`` event per step on rank 0."""

    def log(self, step: Step) -> None:
        emit(step)


@dataclass(slots=True)
class Metrics:
    """Turns raw step timings into the ``Step`` event and keeps what the summary needs.

    The one definition of the run's rate, which every tool shows (the step event, status.progress and the TOKENS/S
    column, MLflow's ``tokens_per_second``, the summary): tokens over the time of the steps that trained them, each
    step's time as ``LaggedSteps`` measures it (never a read's). A step's rate is over the last
    ``RATE_WINDOW_STEPS`` steps, the summary's over all; both leave out an attempt's first step, which pays for
    compiling and warm-up, once a second one was timed.
    """

    rank: int
    world_size: int
    total_steps: int
    flops_per_token: float
    peak: float | None
    backends: list[Backend] = field(default_factory=list)
    first_loss: float | None = None
    last: Step | None = None
    _steps: int = 0
    _tokens: int = 0
    _seconds: float = 0.0
    _window: deque[tuple[int, float]] = field(default_factory=lambda: deque(maxlen=RATE_WINDOW_STEPS))

    def log(self, m: StepMetrics) -> Step:
        # The first step of a run pays for compilation and allocator warm-up; the rates leave it out from the second.
        self._steps += 1
        if self._steps == 2:
            self._tokens, self._seconds = 0, 0.0
            self._window.clear()
        self._tokens += m.tokens
        self._seconds += m.step_seconds
        self._window.append((m.tokens, m.step_seconds))
        # Steps too short for the clock have no rate (None), not a rate of 0.
        tps = _rate(sum(t for t, _ in self._window), sum(s for _, s in self._window))
        per_device = tps / self.world_size if tps is not None else None
        loss = m.loss if math.isfinite(m.loss) else None  # a diverged loss is unknown, never NaN on the wire
        event = Step(
            rank=self.rank,
            step=m.step,
            total_steps=self.total_steps,
            loss=loss,
            tokens_per_second=tps,
            tokens_per_second_per_device=per_device,
            mfu=mfu(per_device, self.flops_per_token, self.peak) if per_device is not None else None,
            step_seconds=m.step_seconds,
            peak_memory_bytes=m.peak_memory_bytes,
            epoch=m.epoch,
            samples_seen=m.samples_seen,
            tokens_seen=m.tokens_seen,
            samples_digest=m.samples_digest,
            # Step's `extra`: a figure beside the loss, kept in status.progress.metrics and sent to the tracker.
            extra={"grad_norm": m.grad_norm} if m.grad_norm is not None and math.isfinite(m.grad_norm) else {},
        )
        if self._steps == 1:
            self.first_loss = loss
        self.last = event
        if self.rank == 0:
            for backend in self.backends:
                backend.log(event)
        return event

    @property
    def timed_seconds(self) -> float:
        """The step time ``mean_tokens_per_second`` is over (steps 2..N, or the one step of a one-step run)."""
        return self._seconds

    @property
    def mean_tokens_per_second(self) -> float | None:
        """None when no step was timed (a rerun of a finished run trains none)."""
        return _rate(self._tokens, self._seconds)

    @property
    def mean_mfu(self) -> float | None:
        rate = self.mean_tokens_per_second
        return mfu(rate / self.world_size, self.flops_per_token, self.peak) if rate is not None else None


def _rate(tokens: int, seconds: float) -> float | None:
    return tokens / seconds if seconds > 0 and math.isfinite(seconds) else None
