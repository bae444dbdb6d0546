"""Structural-schema pruning, defaulting and validation of custom resources, as the real API server applies them.

Docs: "Extend the Kubernetes API with CustomResourceDefinitions", sections "Field pruning", "Defaulting"
("Defaulting and Nullable") and "Validation".
"""

from __future__ import annotations

import copy
from typing import Any

import jsonschema
import jsonschema.protocols

from fsdp_operator.local.resources import Obj

# Always kept at the root of a custom resource (and of embedded resources), whatever the schema says.
_ROOT_FIELDS = ("apiVersion", "kind", "metadata")


def prune(obj: Obj, schema: Obj) -> tuple[Obj, list[str]]:
    """Drop fields the schema does not declare; return the pruned copy and the dropped paths."""
    unknown: list[str] = []
    pruned = _prune(copy.deepcopy(obj), schema, "", unknown, root=True)
    return pruned, unknown


def prune_value(value: Any, schema: Obj, *, embedded: bool = False) -> tuple[Any, list[str]]:
    """Prune a bare value (a schema default) under its own schema; `embedded` keeps apiVersion/kind/metadata."""
    unknown: list[str] = []
    return _prune(copy.deepcopy(value), schema, "", unknown, root=embedded), unknown


def default(obj: Obj, schema: Obj) -> Obj:
    """The object with the schema's defaults applied, as the real server applies them to each request.

    A default is set where its field is absent, or null without `nullable: true`; nested defaults only under
    a parent object that exists (or was itself defaulted). Nulls of non-nullable fields without a default
    are dropped ("Defaulting and Nullable")."""
    result = copy.deepcopy(obj)
    _default(result, schema)
    return result


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
                value[key] = copy.deepcopy(child["default"])
        additional = schema.get("additionalProperties")
        for key in list(value):
            if key in properties:
                _default(value[key], properties[key])
            elif isinstance(additional, dict):
                if value[key] is None and not additional.get("nullable"):
                    if "default" not in additional:
                        del value[key]
                        continue
                    value[key] = copy.deepcopy(additional["default"])
                _default(value[key], additional)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        items = schema["items"]
        for i, item in enumerate(value):
            if item is None and not items.get("nullable") and "default" in items:
                value[i] = copy.deepcopy(items["default"])
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


_VALIDATORS: dict[int, tuple[Obj, jsonschema.protocols.Validator]] = {}
"""Validators by the id of the schema they were built from (kept alive with it, so the id is not reused)."""
_MAX_VALIDATORS = 256


def _validator(schema: Obj) -> jsonschema.protocols.Validator:
    """The validator of a stored schema, built once: converting the schema on every request cost more than
    validating (a schema is replaced, never changed in place, when its CRD is updated)."""
    cached = _VALIDATORS.get(id(schema))
    if cached is not None and cached[0] is schema:
        return cached[1]
    json_schema = _to_json_schema(schema)
    # metadata is validated by the server itself, not by the CRD's schema.
    json_schema.get("properties", {}).pop("metadata", None)
    # OpenAPI v3.0 schemas are JSON Schema draft 4 (boolean exclusiveMinimum), plus the conversions above.
    validator = jsonschema.Draft4Validator(json_schema)
    if len(_VALIDATORS) >= _MAX_VALIDATORS:
        _VALIDATORS.clear()
    _VALIDATORS[id(schema)] = (schema, validator)
    return validator


def validate(obj: Obj, schema: Obj) -> list[tuple[str, str]]:
    """Schema violations as (field path, message); empty when the object is valid."""
    return _errors(_validator(schema), obj)


def validate_value(value: Any, schema: Obj) -> list[tuple[str, str]]:
    """Violations of a bare value (a schema default) against its own schema, paths relative to it ("")."""
    return [("" if path == "<root>" else path, message) for path, message in validate(value, schema)]


def _errors(validator: jsonschema.protocols.Validator, obj: Any) -> list[tuple[str, str]]:
    errors = []
    for error in sorted(validator.iter_errors(obj), key=lambda e: list(map(str, e.absolute_path))):
        path = ".".join(str(p) if isinstance(p, str) else f"[{p}]" for p in error.absolute_path).replace(".[", "[")
        errors.append((path or "<root>", f"Invalid value: {error.message}"))
    return errors
