"""The CEL validation rules of a CRD (`x-kubernetes-validations`), evaluated as the real API server does.

Docs: "Extend the Kubernetes API with CustomResourceDefinitions", section "Validation rules": a rule is evaluated with
`self` bound to the value at the schema node that carries it, and, for a transition rule (one that uses `oldSelf`),
`oldSelf` bound to the stored object's value there; transition rules run on updates only, and only where the old
value exists. A rule that evaluates to false gives a field error at the node's path, or at its `fieldPath`:
`Invalid value: "object": <message>`, or with `reason: FieldValueForbidden` `Forbidden: <message>` (the server's
`fieldErrorForReason`). The expressions themselves are evaluated by a real CEL implementation, cel-rust (the
`common-expression-language` package), not by code written here.

What is not reproduced: rules under list items (nodes are walked through object properties only), the Kubernetes
CEL libraries (`quantity()`, `url()`, `isSorted()`, ... : a rule that calls one fails to compile and is reported),
`messageExpression`, `optionalOldSelf`, the cost budget (a rule the real server refuses as too expensive is
evaluated here) and ratcheting of unchanged nodes.

Evaluating every rule on every status write costs milliseconds in cel-rust (3.2 ms for the CRD's 21 rules with a
10 KB status), which the operator's load test would pay hundreds of times a second. A rule can only observe the
parts of `self` and `oldSelf` it names (`self.spec.model`, `has(oldSelf.status.submissionId)`), so each rule is
evaluated on those parts alone, and its verdict is kept for the same parts (a status write leaves a spec rule's parts
unchanged). A rule that uses `self` or `oldSelf` otherwise (whole, indexed, or with a macro) is given them whole.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import cel

from fsdp_operator.local.server.resources import Obj

_PATH = re.compile(r"\b(self|oldSelf)((?:\.[A-Za-z_][A-Za-z0-9_]*)*)(\s*[(\[]?)")
_VERDICTS_KEPT = 4096


@dataclass(frozen=True, slots=True)
class Rule:
    text: str
    message: str
    field_path: str
    reason: str
    transition: bool
    program: Any
    """The compiled CEL program; None when the rule does not compile (reported as an error on each write)."""
    parts: tuple[tuple[str, tuple[str, ...]], ...]
    """(`self` or `oldSelf`, the field path it names): what the rule can observe; an empty path means all of it."""


@functools.cache
def _rule(text: str, message: str, field_path: str, reason: str) -> Rule:
    try:
        program = cel.compile(text)
    except Exception:  # the real server refuses such a CRD; here its objects are refused at each write instead
        program = None
    parts = []
    for match in _PATH.finditer(text):
        names = tuple(match.group(2).split(".")[1:])
        if match.group(3).strip() and names:  # a method or index on the last name: the value before it is used
            names = names[:-1]
        elif match.group(3).strip():
            names = ()
        parts.append((match.group(1), names))
    transition = any(variable == "oldSelf" for variable, _ in parts)
    return Rule(text, message, field_path, reason, transition, program, tuple(parts))


def _nodes(schema: Obj, new: Any, old: Any, path: str) -> Iterator[tuple[Obj, Any, Any, str]]:
    """Each schema node with rules, with the new and old values there (old: None where it does not exist)."""
    if schema.get("x-kubernetes-validations"):
        yield schema, new, old, path
    properties = schema.get("properties")
    if not isinstance(properties, dict) or not isinstance(new, dict):
        return
    for key, sub in properties.items():
        if key in new and isinstance(sub, dict):
            old_value = old.get(key) if isinstance(old, dict) else None
            yield from _nodes(sub, new[key], old_value, f"{path}.{key}" if path else key)


def _pick(value: Any, names: tuple[str, ...]) -> Any:
    """`value` with only the path `names` kept (absent when the path is): what a rule naming it can see."""
    if not names:
        return value
    if not isinstance(value, dict) or names[0] not in value:
        return {}
    return {names[0]: _pick(value[names[0]], names[1:])}


def _merge(into: Any, part: Any) -> Any:
    """`into` and `part` together, as new mappings: a picked leaf is the request's own object, never written to."""
    if not isinstance(part, dict) or not isinstance(into, dict):
        return part
    merged = dict(into)
    for key, value in part.items():
        merged[key] = _merge(merged[key], value) if key in merged else value
    return merged


_verdicts: dict[tuple[str, str], bool | str] = {}


def _verdict(rule: Rule, new: Any, old: Any) -> bool | str:
    """True or False, or the evaluation error's text."""
    seen: dict[str, Any] = {}
    for variable in ("self", "oldSelf"):
        value = new if variable == "self" else old
        paths = [names for v, names in rule.parts if v == variable]
        if any(not names for names in paths):
            seen[variable] = value  # used whole
            continue
        picked: dict[str, Any] = {}
        for names in paths:
            picked = _merge(picked, _pick(value, names))
        seen[variable] = picked
    if not rule.transition:
        seen.pop("oldSelf")
    key = (rule.text, json.dumps(seen, sort_keys=True, separators=(",", ":")))
    if key in _verdicts:
        return _verdicts[key]
    try:
        result: bool | str = bool(rule.program.execute(seen)) if rule.program is not None else "compile error"
    except Exception as e:  # a rule that errors fails, as on the real server ("no such key" and the like)
        result = " ".join(str(e).split())[:200]
    if len(_verdicts) >= _VERDICTS_KEPT:
        _verdicts.clear()
    _verdicts[key] = result
    return result


def violations(schema: Obj, new: Obj, old: Obj | None) -> list[tuple[str, str]]:
    """(field path, message) for each rule the object breaks; `old` is the stored object of an update (None on a
    create, where transition rules are skipped)."""
    errors: list[tuple[str, str]] = []
    for node, value, old_value, path in _nodes(schema, new, old, ""):
        for raw in node["x-kubernetes-validations"]:
            if not isinstance(raw, dict) or not isinstance(raw.get("rule"), str):
                continue
            rule = _rule(
                raw["rule"], str(raw.get("message", "")), str(raw.get("fieldPath", "")), str(raw.get("reason", ""))
            )
            if rule.transition and (old is None or old_value is None):
                continue
            verdict = _verdict(rule, value, old_value)
            if verdict is True:
                continue
            where = (path + rule.field_path if rule.field_path.startswith(".") else path).lstrip(".") or "<root>"
            detail = rule.message or f"failed rule: {rule.text}"
            if isinstance(verdict, str):
                detail = f"{detail} (the rule could not be evaluated: {verdict})"
            if rule.reason == "FieldValueForbidden":
                errors.append((where, f"Forbidden: {detail}"))
            else:
                kind = "object" if isinstance(value, dict) else "array" if isinstance(value, list) else "value"
                errors.append((where, f'Invalid value: "{kind}": {detail}'))
    return errors
