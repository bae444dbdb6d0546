"""Defaulting and validation of the built-in workload kinds the emulated API server stores (Deployments).

As the real server does on every write (create, update, patch, apply), from `pkg/apis/apps/v1/defaults.go`
and `pkg/apis/apps/validation` ("Deployments" in the Kubernetes documentation, "Strategy"):
`replicas` 1, `revisionHistoryLimit` 10, `progressDeadlineSeconds` 600, `strategy.type` RollingUpdate and,
for RollingUpdate, `rollingUpdate.maxSurge` and `maxUnavailable` 25%; then `strategy.type` must be one of
the two, `rollingUpdate` is forbidden with Recreate, and the selector must match the template's labels.

Not reproduced: the pod template's own defaults and validation, and the selector's immutability.
"""

from __future__ import annotations

from fsdp_operator.local.server.resources import Obj, ResourceType
from fsdp_operator.local.server.store import invalid


def default_and_validate(rtype: ResourceType, obj: Obj) -> Obj:
    """`obj` defaulted; a 422 with the real message when invalid. Kinds other than Deployments pass as they are."""
    if rtype.key != ("apps", "deployments"):
        return obj
    spec = obj.setdefault("spec", {})
    if not isinstance(spec, dict):
        return obj
    spec.setdefault("replicas", 1)
    spec.setdefault("revisionHistoryLimit", 10)
    spec.setdefault("progressDeadlineSeconds", 600)
    strategy = spec.setdefault("strategy", {})
    if isinstance(strategy, dict):
        strategy.setdefault("type", "RollingUpdate")
        if strategy["type"] == "RollingUpdate":
            rolling = strategy.setdefault("rollingUpdate", {})
            if isinstance(rolling, dict):
                rolling.setdefault("maxUnavailable", "25%")
                rolling.setdefault("maxSurge", "25%")
    name = str((obj.get("metadata") or {}).get("name") or "")
    for field, message in _errors(spec):
        raise invalid(rtype, name, f"{field}: {message}", field)
    return obj


def _errors(spec: Obj) -> list[tuple[str, str]]:
    errors: list[tuple[str, str]] = []
    strategy = spec.get("strategy") or {}
    kind = strategy.get("type")
    if kind not in ("Recreate", "RollingUpdate"):
        supported = '"Recreate", "RollingUpdate"'
        errors.append(("spec.strategy.type", f'Unsupported value: "{kind}": supported values: {supported}'))
    if kind == "Recreate" and strategy.get("rollingUpdate") is not None:
        forbidden = "Forbidden: may not be specified when strategy type is 'Recreate'"
        errors.append(("spec.strategy.rollingUpdate", forbidden))
    selector = ((spec.get("selector") or {}).get("matchLabels")) or {}
    labels = (((spec.get("template") or {}).get("metadata") or {}).get("labels")) or {}
    if not selector:
        errors.append(("spec.selector", "Required value"))
    elif any(labels.get(key) != value for key, value in selector.items()):
        shown = "map[" + " ".join(f"{k}:{v}" for k, v in sorted(labels.items())) + "]"
        mismatch = f"Invalid value: {shown}: `selector` does not match template `labels`"
        errors.append(("spec.template.metadata.labels", mismatch))
    return errors
