"""The step loop's hot-path helpers (``fsdp_train.steps``): losses read a step late, the collector on a schedule."""

from __future__ import annotations

import gc

import pytest
import torch
from fsdp_train.metrics import Metrics
from fsdp_train.steps import LaggedSteps, collected_every


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
    assert steps.launched(1, torch.tensor(3.0), 0.0, {}) is None  # nothing read back yet
    first = steps.launched(2, torch.tensor(2.0), 0.0, {"epoch": 1})
    assert first is not None and (first.step, first.loss, first.epoch) == (1, 3.0, 0)
    second = steps.finish()
    assert (second.step, second.loss, second.epoch) == (2, 2.0, 1)
    assert steps.pending == 0 and second.step_seconds > 0
    assert metrics.first_loss == 3.0 and metrics.last is second


def test_the_grad_norm_read_with_the_loss_goes_into_the_steps_extra_and_an_unknown_one_does_not() -> None:
    metrics = Metrics(rank=0, world_size=1, total_steps=3, flops_per_token=1.0, peak=None)
    steps = LaggedSteps(metrics, torch.device("cpu"), tokens_per_step=10)
    logged = [
        steps.launched(1, torch.tensor([3.0, 0.75]), 0.0, {}),
        steps.launched(2, torch.tensor([2.0, float("nan")]), 0.0, {}),  # clipping off: no norm computed
        steps.launched(3, torch.tensor([1.0, float("inf")]), 0.0, {}),
        steps.finish(),
    ]
    assert logged[0] is None and steps.pending == 0
    assert [(e.step, e.loss, e.extra) for e in logged[1:] if e is not None] == [
        (1, 3.0, {"grad_norm": 0.75}),
        (2, 2.0, {}),
        (3, 1.0, {}),  # an infinite norm is unknown, never sent
    ]
