"""The step loop's hot-path helpers (``fsdp_train.watch.steps``): losses read a step late, the collector on a
schedule."""

from __future__ import annotations

import gc
import time

import pytest
import torch
from fsdp_train.watch.metrics import RATE_WINDOW_STEPS, Metrics
from fsdp_train.watch.steps import LaggedSteps, collected_every
from hypothesis import given, settings
from hypothesis import strategies as st


def test_the_collector_is_off_inside_and_restored_after_even_on_an_error() -> None:
    assert gc.isenabled()
    with pytest.raises(RuntimeError), collected_every(50) as collect:
        assert not gc.isenabled()
        collect(50)  # a collection on schedule leaves the automatic collector off
        assert not gc.isenabled()
        raise RuntimeError("a failing step")
    assert gc.isenabled()
    gc.disable()
    try:
        with collected_every(50):
            pass
        assert not gc.isenabled()  # it was off before: it stays off
    finally:
        gc.enable()


def test_collections_happen_every_n_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    monkeypatch.setattr(gc, "collect", lambda generation=2: calls.append(generation) or 0)
    with collected_every(3) as collect:
        for step in range(1, 10):
            collect(step)
    assert calls == [1, 1, 1]  # steps 3, 6 and 9, the young generations only
    calls.clear()
    with collected_every(0) as collect:
        for step in range(1, 10):
            collect(step)
    assert calls == []


def test_lagged_steps_log_each_loss_with_its_own_step() -> None:
    metrics = Metrics(rank=0, world_size=1, total_steps=3, flops_per_token=1.0, peak=None)
    steps = LaggedSteps(metrics, torch.device("cpu"), tokens_per_step=10)
    assert steps.launched(1, torch.tensor(3.0), steps.start(), {}) is None  # nothing read back yet
    first = steps.launched(2, torch.tensor(2.0), steps.start(), {"epoch": 1})
    assert first is not None and (first.step, first.loss, first.epoch) == (1, 3.0, 0)
    second = steps.finish()
    assert (second.step, second.loss, second.epoch) == (2, 2.0, 1)
    assert steps.pending == 0 and second.step_seconds > 0
    assert metrics.first_loss == 3.0 and metrics.last is second


def test_the_grad_norm_read_with_the_loss_goes_into_the_steps_extra_and_an_unknown_one_does_not() -> None:
    metrics = Metrics(rank=0, world_size=1, total_steps=3, flops_per_token=1.0, peak=None)
    steps = LaggedSteps(metrics, torch.device("cpu"), tokens_per_step=10)
    logged = [
        steps.launched(1, torch.tensor([3.0, 0.75]), steps.start(), {}),
        steps.launched(2, torch.tensor([2.0, float("nan")]), steps.start(), {}),  # clipping off: no norm computed
        steps.launched(3, torch.tensor([1.0, float("inf")]), steps.start(), {}),
        steps.finish(),
    ]
    assert logged[0] is None and steps.pending == 0
    assert [(e.step, e.loss, e.extra) for e in logged[1:] if e is not None] == [
        (1, 3.0, {"grad_norm": 0.75}),
        (2, 2.0, {}),
        (3, 1.0, {}),  # an infinite norm is unknown, never sent
    ]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the device path needs a CUDA GPU")
def test_on_a_gpu_a_read_waits_for_its_own_step_only_and_each_step_gets_its_own_time() -> None:
    """Each step queues half its matmuls (about 0.1 s of device work), lets the host work as long as the whole step's
    device work (a slow host, as FSDP's hooks make one), then queues the other half. Reading step 1 while step 2 is
    queued returns before step 2 is done (a plain `.tolist()` would wait for it), and every step gets at least its
    own device work, the last one too: read right after the one before it, the host's clock gave it half of it."""
    device = torch.device("cuda")
    a = torch.randn(4096, 4096, device=device)

    def queue(n: int) -> torch.Tensor:
        nonlocal a
        for _ in range(n):
            a = (a @ a).tanh()
        return a

    def timed(n: int) -> float:
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        queue(n)
        end.record()
        end.synchronize()
        return begin.elapsed_time(end) / 1000.0

    timed(20)  # warm-up: cuBLAS's first calls and the clocks
    half = max(1, int(0.1 / (timed(20) / 20)))
    work = timed(2 * half)
    metrics = Metrics(rank=0, world_size=1, total_steps=3, flops_per_token=1.0, peak=None)
    steps = LaggedSteps(metrics, device, tokens_per_step=10)
    logged = []
    for step in (1, 2, 3):
        start = steps.start()
        queue(half)
        time.sleep(work)  # the host busy while the device works
        event = steps.launched(step, queue(half)[0, :2].float(), start, {})
        if event is not None:
            logged.append(event)
            queued = steps._queued[-1].end
            assert queued is not None and not queued.query(), "reading a step waited for the step after it"
    logged.append(steps.finish())
    seconds = [e.step_seconds for e in logged]
    assert [e.step for e in logged] == [1, 2, 3]
    assert all(0.8 * work < s < 2.5 * work for s in seconds), (seconds, work)


class _Clock:
    """The host's clock of a test: moves only when the test says the host worked or waited."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.floats(0.01, 5.0),  # the step's work, which the CPU runs as it is queued
            st.booleans(),  # read at once (a checkpoint, an evaluation, the first and the last step)
            st.floats(0.0, 60.0),  # what the host did after it (a checkpoint's write, an export)
        ),
        min_size=1,
        max_size=40,
    )
)
def test_every_rate_is_tokens_over_the_time_of_the_steps_it_is_over_whatever_is_read_when(
    plan: list[tuple[float, bool, float]],
) -> None:
    """The loop's pattern on the host path: a step's result is read one step late, or at once at a checkpoint and
    at the last step, and a long pause may follow the read. Each step keeps its own work time (a step read right
    after the one before it once got 0.0002 s, and the step after a checkpoint the checkpoint's time), so each rate
    is tokens over the wall time its steps took (checkpoints and exports outside it), between the rates of its
    fastest and slowest step, and the summary's mean is tokens over steps 2..N's time."""
    clock, tokens = _Clock(), 1000
    metrics = Metrics(rank=0, world_size=2, total_steps=len(plan), flops_per_token=1.0, peak=None)
    steps = LaggedSteps(metrics, torch.device("cpu"), tokens_per_step=tokens, clock=clock)
    logged = []
    for step, (work, read_now, pause) in enumerate(plan, start=1):
        start = steps.start()
        clock.now += work
        event = steps.launched(step, torch.tensor(float(step)), start, {})
        logged += [event] if event is not None else []
        if read_now or step == len(plan):
            logged.append(steps.finish())
            clock.now += pause
    assert [e.step for e in logged] == list(range(1, len(plan) + 1))
    works = [work for work, _, _ in plan]
    for event, work in zip(logged, works, strict=True):
        assert event.step_seconds == pytest.approx(work)
        window = works[max(1, event.step - RATE_WINDOW_STEPS) : event.step] if event.step > 1 else works[:1]
        assert event.tokens_per_second == pytest.approx(tokens * len(window) / sum(window))
        assert tokens / max(window) * (1 - 1e-9) <= event.tokens_per_second <= tokens / min(window) * (1 + 1e-9)
        assert event.tokens_per_second_per_device == pytest.approx(event.tokens_per_second / 2)
    timed = works[1:] or works
    assert metrics.mean_tokens_per_second == pytest.approx(tokens * len(timed) / sum(timed))
    assert metrics.timed_seconds == pytest.approx(sum(timed))
