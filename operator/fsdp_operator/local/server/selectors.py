"""Label and field selectors of the emulated Kubernetes API server, parsed as the real server does."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

Predicate = Callable[[Mapping[str, str]], bool]


class SelectorError(ValueError):
    """A selector the real server would reject with 400 Bad Request."""


# One requirement: `key in (a,b)`, `key notin (a)`, `key=v`, `key==v`, `key!=v`, `key`, `!key`.
_REQUIREMENT = re.compile(
    r"""\s*(?:
        (?P<neg>!)\s*(?P<nkey>[^\s,!=()]+)
      | (?P<skey>[^\s,!=()]+)\s+(?P<setop>in|notin)\s*\((?P<values>[^)]*)\)
      | (?P<key>[^\s,!=()]+)\s*(?P<op>==|!=|=)\s*(?P<value>[^\s,!=()]*)
      | (?P<ekey>[^\s,!=()]+)
    )\s*(?:,|$)""",
    re.VERBOSE,
)


def parse_label_selector(text: str) -> Predicate:
    """Compile a label selector into a predicate over an object's labels."""
    predicates: list[Predicate] = []
    position = 0
    text = text.strip()
    while position < len(text):
        match = _REQUIREMENT.match(text, position)
        if not match or match.end() == position:
            raise SelectorError(f"unable to parse requirement: {text[position:]!r}")
        position = match.end()
        predicates.append(_requirement(match))
    return lambda labels: all(predicate(labels) for predicate in predicates)


def _requirement(match: re.Match[str]) -> Predicate:
    if match["nkey"]:
        key = match["nkey"]
        return lambda labels: key not in labels
    if match["skey"]:
        key = match["skey"]
        values = {value.strip() for value in match["values"].split(",") if value.strip()}
        if match["setop"] == "in":
            return lambda labels: labels.get(key) in values
        return lambda labels: labels.get(key) not in values
    if match["key"]:
        key, value = match["key"], match["value"]
        if match["op"] == "!=":
            return lambda labels: labels.get(key) != value
        return lambda labels: labels.get(key) == value
    key = match["ekey"]
    return lambda labels: key in labels


def parse_field_selector(text: str, supported: frozenset[str]) -> Callable[[Mapping[str, Any]], bool]:
    """Compile a field selector (`=`, `==`, `!=` on the supported field paths) over a whole object."""
    checks: list[tuple[str, bool, str]] = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        match = re.fullmatch(r"([^!=]+?)\s*(==|!=|=)\s*(.*)", part)
        if not match:
            raise SelectorError(f"invalid selector: {part!r}; can't understand {part!r}")
        field, op, value = match.groups()
        if field not in supported:
            raise SelectorError(f'field label not supported: "{field}"')
        checks.append((field, op == "!=", value))

    def predicate(obj: Mapping[str, Any]) -> bool:
        for field, negate, value in checks:
            actual = field_value(obj, field)
            if (actual == value) == negate:
                return False
        return True

    return predicate


def field_value(obj: Mapping[str, Any], path: str) -> str:
    """The string a field selector compares: dotted path, missing values read as ''."""
    current: Any = obj
    for part in path.split("."):
        current = current.get(part) if isinstance(current, Mapping) else None
    if current is None:
        return ""
    if isinstance(current, bool):
        return "true" if current else "false"
    return str(current)
