"""The conditions that follow a job's phase: batch/v1 Job's `Running`, `Complete` and `Failed`, and what GitOps tools
read (kstatus's `Reconciling` and `Stalled`, Flux's `Ready`). Pure; `reconcile` applies it after every decision."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

from fsdp_operator.decide.status import CONDITIONS, ConditionType, JobStatus, Phase, get_condition, set_condition


def with_lifecycle_conditions(old: JobStatus, new: JobStatus, *, now: datetime, generation: int) -> JobStatus:
    """`Running`, `Complete`, `Failed` and the GitOps conditions follow the phase: one place, applied after every
    decision.

    `Running` is True while the phase is Running and False, with the new phase's reason, once it has left
    it. `Complete` and `Failed` are set once, as batch/v1 Job's: True with the reason and message of the
    terminal phase when it is entered, never False and never changed afterwards. `Reconciling`, `Stalled` and
    `Ready` are `kstatus_conditions` of the phase, its reason and message.
    """
    if new.phase is None:
        return new
    conditions = new.conditions
    reason = new.reason.value if new.reason else new.phase.value
    if new.phase != old.phase:
        running = new.phase == Phase.RUNNING
        if running or get_condition(conditions, ConditionType.RUNNING) is not None:
            message = "the Ray job runs" if running else new.message[:1024]
            conditions = set_condition(
                conditions, ConditionType.RUNNING, str(running), reason, message, now=now, generation=generation
            )
        terminal_type = {Phase.SUCCEEDED: ConditionType.COMPLETE, Phase.FAILED: ConditionType.FAILED}.get(new.phase)
        if terminal_type is not None and get_condition(conditions, terminal_type) is None:
            conditions = set_condition(
                conditions, terminal_type, "True", reason, new.message[:1024], now=now, generation=generation
            )
    if conditions is not new.conditions:
        new = replace(new, conditions=conditions)
    return with_gitops_conditions(new, now=now, generation=generation)


def with_gitops_conditions(status: JobStatus, *, now: datetime, generation: int) -> JobStatus:
    """The status with `Reconciling`, `Stalled` and `Ready` as `kstatus_conditions` says for its phase (the same
    object when they already say it)."""
    if status.phase is None:
        return status
    conditions = status.conditions
    reason = status.reason.value if status.reason else status.phase.value
    for type_, state, why, message in kstatus_conditions(status.phase, reason, status.message[:1024]):
        held = get_condition(conditions, type_)
        if held is None or (held.get("status"), held.get("reason"), held.get("message")) != (state, why, message):
            conditions = set_condition(conditions, type_, state, why, message, now=now, generation=generation)
    return status if conditions is status.conditions else replace(status, conditions=conditions)


def kstatus_conditions(phase: Phase, reason: str, message: str) -> list[tuple[ConditionType, str, str, str]]:
    """`Reconciling`, `Stalled` and `Ready` (type, status, reason, message) for a phase with its reason and message.

    kstatus (sigs.k8s.io/cli-utils/pkg/kstatus/status, `checkGenericProperties`), which Flux's health checks use,
    reads a custom resource as InProgress while `Reconciling` is True, Failed while `Stalled` is True, and Current
    otherwise (after `observedGeneration`): without them a Failed job read as Current. Every phase but the two
    terminal ones is on its way, Suspended and Queued included, as kstatus reads a suspended batch/v1 Job
    (`jobConditions`: InProgress until Complete or Failed), so a GitOps wait on a job waits for its end."""
    if phase == Phase.SUCCEEDED:
        return [
            (ConditionType.RECONCILING, "False", reason, "the job succeeded"),
            (ConditionType.STALLED, "False", reason, "the job succeeded"),
            (ConditionType.READY, "True", reason, message),
        ]
    if phase == Phase.FAILED:
        return [
            (ConditionType.RECONCILING, "False", reason, "the job failed"),
            (ConditionType.STALLED, "True", reason, message),
            (ConditionType.READY, "False", reason, message),
        ]
    return [
        (ConditionType.RECONCILING, "True", reason, message or f"phase {phase.value}"),
        (ConditionType.STALLED, "False", reason, f"phase {phase.value}"),
        (ConditionType.READY, "False", reason, f"phase {phase.value}: the job has not finished"),
    ]


def conditions_reference() -> str:
    """docs/api.md's table of condition types, from `CONDITIONS` (appended by `make crds`; a test holds it)."""
    lines = [
        "",
        "## Conditions",
        "",
        "Every condition type the operator writes in `status.conditions` (metav1.Condition shape), from the one table "
        "in the code (`decide/status.py`, `CONDITIONS`). `Reconciling`, `Stalled` and `Ready` are what GitOps tools "
        "read ([gitops.md](gitops.md)).",
        "",
        "| type | True when | reasons | reset on a new attempt |",
        "|---|---|---|---|",
    ]
    for type_, rule in CONDITIONS.items():
        reasons = "any phase reason" if len(rule.reasons) > 20 else ", ".join(sorted(str(r) for r in rule.reasons))
        fresh = "yes" if rule.resets_on_new_attempt else "no"
        lines.append(f"| `{type_.value}` | {rule.doc.replace('|', '/')} | {reasons} | {fresh} |")
    return "\n".join(lines) + "\n"
