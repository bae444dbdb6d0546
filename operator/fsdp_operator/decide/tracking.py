"""status.tracking and the TrackingHealthy condition, from the ``tracking`` events of the job's tracker.

Pure: the fold in `decide.folding` calls these for each ``Tracking`` event (signed, like every event it folds).
"""

from __future__ import annotations

import re
from typing import Any

from fsdp_train.contract.events import Tracking

from fsdp_operator.api.formats import visible

_RUN_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
_URL = re.compile(r"https?://[!-~]{1,1000}")  # printable ASCII only: shown as is by kubectl and fsdpctl


def fold(tracking: dict[str, Any], event: Tracking) -> dict[str, Any]:
    """status.tracking after `event`: the run id and URL when it names a well-formed one; the last problem."""
    out = dict(tracking)
    if _RUN_ID.fullmatch(event.run_id):
        if out.get("runId") != event.run_id:
            out.pop("url", None)
        out["runId"] = event.run_id
        if _URL.fullmatch(event.url):
            out["url"] = event.url
    if event.problem:
        out["problem"] = visible(event.problem)[:1000]
    else:
        out.pop("problem", None)
    return out


def condition(problem: str) -> dict[str, str]:
    """TrackingHealthy for the tracker's latest word: True while records reach it, False with the problem."""
    if problem:
        message = f"the tracker did not take the run's records (training goes on): {visible(problem)[:900]}"
        return {"type": "TrackingHealthy", "status": "False", "reason": "TrackerUnreachable", "message": message}
    return {"type": "TrackingHealthy", "status": "True", "reason": "Logging", "message": "records reach the tracker"}
