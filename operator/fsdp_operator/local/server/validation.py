"""Structural-schema pruning, defaulting and validation of custom resources, as the real API server applies them.

Docs: "Extend the Kubernetes API with CustomResourceDefinitions", sections "Field pruning", "Defaulting"
("Defaulting and Nullable"), "Validation" and "Validation ratcheting".
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import jsonschema
import jsonschema.protocols
import jsonschema_rs

from fsdp_operator.local.server.resources import Obj, json_copy

# Always kept at the root of a custom resource (and of embedded resources), whatever the schema says.
_ROOT_FIELDS = ("apiVersion", "kind", "metadata")


def prune(obj: Obj, schema: Obj) -> tuple[Obj, list[str]]:
    """Drop fields the schema does not declare; return the pruned copy and the dropped paths."""
    unknown: list[str] = []
    pruned = _prune(json_copy(obj), schema, "", unknown, root=True)
    return pruned, unknown


def default_and_prune(obj: Obj, schema: Obj) -> tuple[Obj, list[str]]:
    """A copy of the object with the schema's defaults applied, then pruned, as the real server treats each write
    (defaults are pruned values, so defaulting first leaves the unknown fields to report the same); the dropped paths.

    A default is set where its field is absent, or null without `nullable: true`; nested defaults only under
    a parent object that exists (or was itself defaulted). Nulls of non-nullable fields without a default
    are dropped ("Defaulting and Nullable")."""
    result = json_copy(obj)
    _default(result, schema)
    unknown: list[str] = []
    return _prune(result, schema, "", unknown, root=True), unknown


def prune_value(value: Any, schema: Obj, *, embedded: bool = False) -> tuple[Any, list[str]]:
    """Prune a bare value (a schema default) under its own schema; `embedded` keeps apiVersion/kind/metadata."""
    unknown: list[str] = []
    return _prune(json_copy(value), schema, "", unknown, root=embedded), unknown


def _default(value: Any, schema: Any) -> None:
    if not isinstance(schema, dict):
        return
    if isinstance(value, dict):
        properties = schema.get("properties") or {}
        for key, child in properties.items():
            if not isinstance(child, dict):
                continue
            if key in value and value[key] is None and not child.get("nullable"):
                del value[key]
            if key not in value and "default" in child:
                value[key] = json_copy(child["default"])
        additional = schema.get("additionalProperties")
        for key in list(value):
            if key in properties:
                _default(value[key], properties[key])
            elif isinstance(additional, dict):
                if value[key] is None and not additional.get("nullable"):
                    if "default" not in additional:
                        del value[key]
                        continue
                    value[key] = json_copy(additional["default"])
                _default(value[key], additional)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        items = schema["items"]
        for i, item in enumerate(value):
            if item is None and not items.get("nullable") and "default" in items:
                value[i] = json_copy(items["default"])
            _default(value[i], items)


def _prune(value: Any, schema: Obj, path: str, unknown: list[str], *, root: bool = False) -> Any:
    if isinstance(value, dict):
        if schema.get("x-kubernetes-preserve-unknown-fields"):
            properties = schema.get("properties") or {}
            for key, child in properties.items():
                if key in value:
                    value[key] = _prune(value[key], child, _join(path, key), unknown)
            return value
        properties = schema.get("properties")
        additional = schema.get("additionalProperties")
        keep_meta = root or schema.get("x-kubernetes-embedded-resource")
        if properties is not None:
            for key in list(value):
                if keep_meta and key in _ROOT_FIELDS:
                    continue
                if key in properties:
                    value[key] = _prune(value[key], properties[key], _join(path, key), unknown)
                else:
                    unknown.append(_join(path, key))
                    del value[key]
        elif isinstance(additional, dict):
            for key in list(value):
                value[key] = _prune(value[key], additional, _join(path, key), unknown)
        return value
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [_prune(item, schema["items"], f"{path}[{i}]", unknown) for i, item in enumerate(value)]
    return value


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _to_json_schema(schema: Any) -> Any:
    """OpenAPI v3 -> JSON Schema: `nullable`, `x-kubernetes-int-or-string`; metadata is the server's."""
    if isinstance(schema, list):
        return [_to_json_schema(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    result = {key: _to_json_schema(value) for key, value in schema.items() if not key.startswith("x-kubernetes")}
    if schema.get("x-kubernetes-int-or-string"):
        result.pop("type", None)
        result["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if result.pop("nullable", False) and "type" in result:
        result["type"] = [result["type"], "null"]
    return result


_SHELL_KEYWORDS = frozenset({"type", "properties", "required", "description", "title"})
"""Root keywords that never look into a field's value: the root validated apart from its fields is then exact."""


_SLOW_KEYWORDS = frozenset({"multipleOf"})
"""Keywords jsonschema-rs decides otherwise than jsonschema (and the real server): it accepts 0.3 as a multiple of
0.1, which floating-point division does not. A schema using one is only ever checked by jsonschema."""


@dataclass
class _Checker:
    """One schema's validator (jsonschema: the errors, with their paths and messages), and a compiled check of validity
    (jsonschema-rs, a few microseconds where jsonschema takes a millisecond for a RayCluster) asked first: nearly
    every write is valid. Where the two could disagree (a pattern jsonschema-rs reads as the real server's RE2 does,
    `$` only at the very end, `\\d` only ASCII) the fast check refuses, and jsonschema's answer stands."""

    errors: jsonschema.protocols.Validator
    fast: Any

    @classmethod
    def of(cls, schema: Obj) -> _Checker:
        fast = (
            None if _mentions(schema, _SLOW_KEYWORDS) else jsonschema_rs.Draft4Validator(schema, validate_formats=False)
        )
        return cls(jsonschema.Draft4Validator(schema), fast)

    def raw(self, value: Any, *prefix: str) -> list[_Raw]:
        if self.fast is not None and self.fast.is_valid(value):
            return []
        return [([*prefix, *error.absolute_path], error.message) for error in self.errors.iter_errors(value)]


def _mentions(schema: Any, keywords: frozenset[str]) -> bool:
    if isinstance(schema, dict):
        return any(key in keywords or _mentions(value, keywords) for key, value in schema.items())
    if isinstance(schema, list):
        return any(_mentions(item, keywords) for item in schema)
    return False


@dataclass
class _Compiled:
    """The checkers of one stored schema: of the whole object, and of the root apart (`shell`, None when a root
    keyword looks into values) and of each root field, for updates that leave some root fields unchanged."""

    whole: _Checker
    shell: _Checker | None
    properties: Obj
    fields: dict[str, _Checker] = field(default_factory=dict)

    def field_checker(self, key: str) -> _Checker:
        if key not in self.fields:
            self.fields[key] = _Checker.of(self.properties[key])
        return self.fields[key]


_VALIDATORS: dict[int, tuple[Obj, _Compiled]] = {}
"""Validators by the id of the schema they were built from (kept alive with it, so the id is not reused)."""
_MAX_VALIDATORS = 256


def _compiled(schema: Obj) -> _Compiled:
    """The validators of a stored schema, built once: converting the schema on every request cost more than
    validating (a schema is replaced, never changed in place, when its CRD is updated)."""
    cached = _VALIDATORS.get(id(schema))
    if cached is not None and cached[0] is schema:
        return cached[1]
    json_schema = _to_json_schema(schema)
    properties = json_schema.get("properties", {})
    # metadata is validated by the server itself, not by the CRD's schema.
    properties.pop("metadata", None)
    # OpenAPI v3.0 schemas are JSON Schema draft 4 (boolean exclusiveMinimum), plus the conversions above.
    shell = None
    if set(json_schema) <= _SHELL_KEYWORDS:
        shell = _Checker.of({**json_schema, "properties": {key: {} for key in properties}})
    compiled = _Compiled(_Checker.of(json_schema), shell, properties)
    if len(_VALIDATORS) >= _MAX_VALIDATORS:
        _VALIDATORS.clear()
    _VALIDATORS[id(schema)] = (schema, compiled)
    return compiled


def validate(obj: Obj, schema: Obj, old: Obj | None = None) -> list[tuple[str, str]]:
    """Schema violations as (field path, message); empty when the object is valid.

    With `old`, the stored object an update or patch replaces, errors on its unchanged fields do not count: the
    server "ignores errors raised on unchanged fields of custom resources across UPDATE/PATCH requests"
    (CRDValidationRatcheting, on by default since 1.30, GA in 1.33: KEP-4008, and the docs' "Validation ratcheting").
    Here a field is unchanged at the root (`spec`, `status`): a status write does not validate the spec again, but a
    changed root field is validated whole, where the real server also ratchets the unchanged fields inside it (only an
    object stored before its CRD's schema was tightened can tell the difference)."""
    compiled = _compiled(schema)
    if old is None:
        return _formatted(compiled.whole.raw(obj))
    changed = [key for key in obj if key in compiled.properties and (key not in old or old[key] != obj[key])]
    if compiled.shell is None:
        return _formatted(e for e in compiled.whole.raw(obj) if not e[0] or e[0][0] in changed)
    raw = compiled.shell.raw(obj)
    for key in changed:
        raw += compiled.field_checker(key).raw(obj[key], key)
    return _formatted(raw)


def validate_value(value: Any, schema: Obj) -> list[tuple[str, str]]:
    """Violations of a bare value (a schema default) against its own schema, paths relative to it ("")."""
    return [("" if path == "<root>" else path, message) for path, message in validate(value, schema)]


_Raw = tuple[list[str | int], str]
"""An error's path, as parts, and its message."""


def _formatted(raw: Iterable[_Raw]) -> list[tuple[str, str]]:
    errors = []
    for parts, message in sorted(raw, key=lambda error: list(map(str, error[0]))):
        path = ".".join(str(p) if isinstance(p, str) else f"[{p}]" for p in parts).replace(".[", "[")
        errors.append((path or "<root>", f"Invalid value: {message}"))
    return errors
