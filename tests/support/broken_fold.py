"""A bug no check foresaw, made on purpose: folding raises for any batch of events that holds a given step."""

from __future__ import annotations

from typing import Any

import pytest
from fsdp_train.contract.events import Step


def fold_raises_on_step(monkeypatch: pytest.MonkeyPatch, step: int) -> None:
    """Make `fsdp_operator.decide.pass_errors.fold_events` raise ZeroDivisionError for events that include `step`."""
    from fsdp_operator.decide import pass_errors

    real_fold = pass_errors.fold_events

    def fold(job: Any, status: Any, events: Any, **kwargs: Any) -> Any:
        events = tuple(events)
        if any(isinstance(e, Step) and e.step == step for e in events):
            raise ZeroDivisionError(f"step {step} breaks the fold")
        return real_fold(job, status, events, **kwargs)

    monkeypatch.setattr(pass_errors, "fold_events", fold)
