"""What a real API server checks in a CustomResourceDefinition's schemas before it accepts the CRD.

The rules and their messages follow the Kubernetes documentation ("Extend the Kubernetes API with
CustomResourceDefinitions": "Specifying a structural schema", "Defaulting", "Validation") and the
apiextensions-apiserver's own checks (`pkg/apis/apiextensions/validation`, `pkg/apiserver/schema`), so that
a CRD this emulator accepts is one a real server accepts and a refusal reads like the real one, e.g.
`spec.validation.openAPIV3Schema.properties[spec].properties[x].anyOf[0].type: Forbidden: must be empty to be
structural`. docs/conformance.md lists the rules and what is left out (CEL rules are not compiled).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

from fsdp_operator.local.server.resources import Obj

_TYPES = ("array", "boolean", "integer", "number", "object", "string")
_META_FIELDS = ("apiVersion", "kind", "metadata")
_JUNCTORS = ("allOf", "anyOf", "oneOf")
# The only int-or-string shape allowed to carry types under anyOf (exactly these two nodes, nothing else).
_INT_OR_STRING_ANY_OF = [{"type": "integer"}, {"type": "string"}]
# Schema keywords allowed at the root when the status subresource is on (the real server's list).
_ROOT_FIELDS_WITH_STATUS = {
    "description": "Description",
    "type": "Type",
    "format": "Format",
    "title": "Title",
    "maximum": "Maximum",
    "exclusiveMaximum": "ExclusiveMaximum",
    "minimum": "Minimum",
    "exclusiveMinimum": "ExclusiveMinimum",
    "maxLength": "MaxLength",
    "minLength": "MinLength",
    "pattern": "Pattern",
    "maxItems": "MaxItems",
    "minItems": "MinItems",
    "uniqueItems": "UniqueItems",
    "multipleOf": "MultipleOf",
    "required": "Required",
    "items": "Items",
    "properties": "Properties",
    "externalDocs": "ExternalDocs",
    "example": "Example",
    "x-kubernetes-preserve-unknown-fields": "XPreserveUnknownFields",
    "x-kubernetes-validations": "XValidations",
}

Kind = Literal["Forbidden", "Required", "Invalid", "Unsupported", "Duplicate", "NotFound"]


@dataclass(frozen=True, slots=True)
class FieldError:
    """One `field.Error` as the real server prints it: `<path>: <Kind>: [<value>: ]<detail>`."""

    path: str
    kind: Kind
    detail: str
    value: Any = None

    def __str__(self) -> str:
        if self.kind == "Forbidden":
            return f"{self.path}: Forbidden: {self.detail}"
        if self.kind == "Required":
            return f"{self.path}: Required value" + (f": {self.detail}" if self.detail else "")
        if self.kind == "Duplicate":
            return f"{self.path}: Duplicate value: {json.dumps(self.value)}"
        if self.kind == "NotFound":
            return f"{self.path}: Not found: {json.dumps(self.value)}"
        if self.kind == "Unsupported":
            return f"{self.path}: Unsupported value: {json.dumps(self.value)}: supported values: {self.detail}"
        return f"{self.path}: Invalid value: {json.dumps(self.value, sort_keys=True)}: {self.detail}"


def key(path: str, name: str) -> str:
    return f"{path}[{name}]"


def validate_crd(crd: Obj) -> list[FieldError]:
    """The schema errors of a v1 CustomResourceDefinition, sorted as the real server sorts them.

    A real server converts the v1 object to its internal form first: when every version has the same schema,
    that schema is reported under `spec.validation.openAPIV3Schema`, otherwise per version."""
    spec = crd.get("spec") or {}
    versions = [v for v in spec.get("versions") or [] if isinstance(v, dict)]
    errors: list[FieldError] = []
    found = [(v.get("schema") or {}).get("openAPIV3Schema") for v in versions]
    for i, schema in enumerate(found):
        if not isinstance(schema, dict):
            errors.append(FieldError(f"spec.versions[{i}].schema.openAPIV3Schema", "Required", "schemas are required"))
    if errors:
        return errors
    schemas: list[Obj] = [s for s in found if isinstance(s, dict)]
    for i, schema in enumerate(schemas):
        check_shape(schema, f"spec.versions[{i}].schema.openAPIV3Schema")
    hoisted = len(versions) > 0 and all(s == schemas[0] for s in schemas)
    for i, (version, schema) in enumerate(zip(versions, schemas, strict=True)):
        if hoisted and i > 0:
            break
        base = "spec.validation" if hoisted else f"spec.versions[{i}].schema"
        status = "status" in (version.get("subresources") or {})
        errors.extend(validate_schema(schema, f"{base}.openAPIV3Schema", status_subresource=status))
    return errors


_SCHEMA_MAPS = ("properties", "definitions", "patternProperties")
_SCHEMA_LISTS = ("allOf", "anyOf", "oneOf")


def check_shape(schema: Any, path: str) -> None:
    """Raise TypeError where a schema node has the wrong JSON type: the real server cannot decode such a CRD
    into its types and answers 400 before any rule is looked at."""
    if not isinstance(schema, dict):
        raise TypeError(f"{path}: a schema must be an object, not {type(schema).__name__}")
    for name in _SCHEMA_MAPS:
        children = schema.get(name)
        if children is None:
            continue
        if not isinstance(children, dict):
            raise TypeError(f"{path}.{name}: must be an object of schemas, not {type(children).__name__}")
        for key_name, child in children.items():
            check_shape(child, key(f"{path}.{name}", key_name))
    for name in _SCHEMA_LISTS:
        children = schema.get(name)
        if children is None:
            continue
        if not isinstance(children, list):
            raise TypeError(f"{path}.{name}: must be a list of schemas, not {type(children).__name__}")
        for i, child in enumerate(children):
            check_shape(child, f"{path}.{name}[{i}]")
    for name in ("not", "additionalProperties", "items"):
        child = schema.get(name)
        if child is None or (name == "additionalProperties" and isinstance(child, bool)):
            continue
        if name == "items" and isinstance(child, list):
            for i, item in enumerate(child):
                check_shape(item, f"{path}.items[{i}]")
            continue
        check_shape(child, f"{path}.{name}")
    if "type" in schema and not isinstance(schema["type"], str):
        raise TypeError(f"{path}.type: must be a string, not {type(schema['type']).__name__}")
    if "required" in schema and not (
        isinstance(schema["required"], list) and all(isinstance(r, str) for r in schema["required"])
    ):
        raise TypeError(f"{path}.required: must be a list of strings")


def validate_schema(schema: Obj, path: str, *, status_subresource: bool = False) -> list[FieldError]:
    """All the checks on one version's `openAPIV3Schema`, in the real server's order: structural rules
    first (defaults are only looked at when the schema is structural), then the OpenAPI subset rules."""
    errors: list[FieldError] = []
    if status_subresource:
        for name, value in schema.items():
            if name == "type":
                if value != "object":
                    errors.append(
                        FieldError(
                            f"{path}.type",
                            "Invalid",
                            'only "object" is allowed as the type at the root of the schema if the status '
                            "subresource is enabled",
                            value,
                        )
                    )
            elif name not in _ROOT_FIELDS_WITH_STATUS and _is_set(value):
                allowed = " ".join(_ROOT_FIELDS_WITH_STATUS.values())
                errors.append(
                    FieldError(
                        path,
                        "Invalid",
                        f"only [{allowed}] fields are allowed at the root of the schema if the status subresource "
                        "is enabled",
                        "...",
                    )
                )
                break
    if schema.get("nullable"):
        errors.append(FieldError(f"{path}.nullable", "Forbidden", "nullable cannot be true at the root"))
    structural = sorted([*_invariants(schema, "root", path), *_completeness(schema, schema, path, path)], key=str)
    errors.extend(structural)
    if not structural:
        errors.extend(_defaults(schema, path, embedded=True, inside_meta=False))
    errors.extend(_openapi(schema, path, root=True, inside_meta=False, defaults_forbidden=""))
    return errors


def _is_set(value: Any) -> bool:
    return value not in (None, False, "", [], {}, 0)


# ---------------------------------------------------------------------- structural invariants


def _invariants(s: Any, level: Literal["root", "items", "field"], path: str) -> Iterator[FieldError]:
    if not isinstance(s, dict):
        return
    kind = s.get("type", "")
    if kind == "array" and "items" not in s:
        yield FieldError(f"{path}.items", "Required", "must be specified")
    if isinstance(s.get("items"), dict):
        yield from _invariants(s["items"], "items", f"{path}.items")
    for name, child in (s.get("properties") or {}).items():
        yield from _invariants(child, "field", key(f"{path}.properties", name))
    additional = s.get("additionalProperties")
    if additional is not None:
        if level == "root":
            yield FieldError(f"{path}.additionalProperties", "Forbidden", "must not be used at the root")
        if isinstance(additional, dict):
            yield from _invariants(additional, "field", f"{path}.additionalProperties")
    int_or_string = bool(s.get("x-kubernetes-int-or-string"))
    preserve = bool(s.get("x-kubernetes-preserve-unknown-fields"))
    embedded = bool(s.get("x-kubernetes-embedded-resource"))
    if int_or_string and preserve:
        yield FieldError(
            f"{path}.x-kubernetes-preserve-unknown-fields",
            "Invalid",
            "must be false if x-kubernetes-int-or-string is true",
            True,
        )
    if int_or_string and embedded:
        yield FieldError(
            f"{path}.x-kubernetes-embedded-resource",
            "Invalid",
            "must be false if x-kubernetes-int-or-string is true",
            True,
        )
    skip_any_of = s.get("anyOf") == _INT_OR_STRING_ANY_OF
    all_of = s.get("allOf") or []
    skip_first_all_of_any_of = (
        bool(all_of) and isinstance(all_of[0], dict) and all_of[0].get("anyOf") == _INT_OR_STRING_ANY_OF
    )
    yield from _value_validation(s, skip_any_of, skip_first_all_of_any_of, path)
    if embedded and kind != "object":
        if not kind:
            yield FieldError(f"{path}.type", "Required", "must be object if x-kubernetes-embedded-resource is true")
        else:
            yield FieldError(
                f"{path}.type", "Invalid", "must be object if x-kubernetes-embedded-resource is true", kind
            )
    elif not kind and not int_or_string and not preserve:
        detail = {
            "root": "must not be empty at the root",
            "items": "must not be empty for specified array items",
            "field": "must not be empty for specified object fields",
        }[level]
        yield FieldError(f"{path}.type", "Required", detail)
    if embedded and additional is not None:
        yield FieldError(
            f"{path}.additionalProperties", "Forbidden", "must not be used if x-kubernetes-embedded-resource is set"
        )
    if level == "root" and kind and kind != "object":
        yield FieldError(f"{path}.type", "Invalid", "must be object at the root", kind)
    check_meta = level == "root" or embedded
    properties = s.get("properties") or {}
    for name in ("kind", "apiVersion"):
        if name in properties and check_meta and (properties[name] or {}).get("type", "") != "string":
            yield FieldError(
                f"{key(f'{path}.properties', name)}.type",
                "Invalid",
                "must be string",
                (properties[name] or {}).get("type", ""),
            )
    if "metadata" in properties:
        yield from _metadata(properties["metadata"] or {}, check_meta, level, key(f"{path}.properties", "metadata"))
    if embedded and not preserve and not properties:
        yield FieldError(
            f"{path}.properties",
            "Required",
            "must not be empty if x-kubernetes-embedded-resource is true without x-kubernetes-preserve-unknown-fields",
        )


def _metadata(s: Obj, check_meta: bool, level: str, path: str) -> Iterator[FieldError]:
    if check_meta and s.get("type", "") != "object":
        yield FieldError(f"{path}.type", "Invalid", "must be object", s.get("type", ""))
    if level == "root":
        rest = {k: v for k, v in s.items() if k not in ("type", "default")}
        properties = rest.pop("properties", None) or {}
        if set(properties) - {"name", "generateName"} or any(_is_set(v) for v in rest.values()):
            yield FieldError(
                path,
                "Forbidden",
                "must not specify anything other than name and generateName, but metadata is implicitly specified",
            )


def _value_validation(s: Obj, skip_any_of: bool, skip_first_all_of_any_of: bool, path: str) -> Iterator[FieldError]:
    if not skip_any_of:
        for i, nested in enumerate(s.get("anyOf") or []):
            yield from _nested(nested, False, f"{path}.anyOf[{i}]")
    for i, nested in enumerate(s.get("allOf") or []):
        yield from _nested(nested, skip_first_all_of_any_of and i == 0, f"{path}.allOf[{i}]")
    for i, nested in enumerate(s.get("oneOf") or []):
        yield from _nested(nested, False, f"{path}.oneOf[{i}]")
    if isinstance(s.get("not"), dict):
        yield from _nested(s["not"], False, f"{path}.not")


# Inside allOf/anyOf/oneOf/not only value validations: these generic keywords and extensions make a
# schema non-structural there ("Specifying a structural schema", rule 3).
_NESTED_FORBIDDEN: tuple[tuple[str, str], ...] = (
    ("type", "must be empty to be structural"),
    ("additionalProperties", "must be undefined to be structural"),
    ("default", "must be undefined to be structural"),
    ("title", "must be empty to be structural"),
    ("description", "must be empty to be structural"),
    ("nullable", "must be false to be structural"),
    ("externalDocs", "must be undefined to be structural"),
    ("x-kubernetes-preserve-unknown-fields", "must be false to be structural"),
    ("x-kubernetes-embedded-resource", "must be false to be structural"),
    ("x-kubernetes-int-or-string", "must be false to be structural"),
    ("x-kubernetes-list-map-keys", "must be empty to be structural"),
    ("x-kubernetes-list-type", "must be undefined to be structural"),
    ("x-kubernetes-map-type", "must be undefined to be structural"),
    ("x-kubernetes-validations", "must be empty to be structural"),
)
# Keywords whose mere presence counts (a pointer in the real types), against those whose zero value is unset.
_PRESENCE = frozenset(
    {"additionalProperties", "default", "externalDocs", "x-kubernetes-list-type", "x-kubernetes-map-type"}
)


def _nested(v: Any, skip_any_of: bool, path: str) -> Iterator[FieldError]:
    if not isinstance(v, dict):
        return
    yield from _value_validation(v, skip_any_of, False, path)
    if isinstance(v.get("items"), dict):
        yield from _nested(v["items"], False, f"{path}.items")
    for name, child in (v.get("properties") or {}).items():
        yield from _nested(child, False, key(f"{path}.properties", name))
    for name, detail in _NESTED_FORBIDDEN:
        present = name in v and v[name] is not None if name in _PRESENCE else _is_set(v.get(name))
        if present:
            yield FieldError(f"{path}.{name}", "Forbidden", detail)
    if "metadata" in (v.get("properties") or {}):
        yield FieldError(
            key(f"{path}.properties", "metadata"), "Forbidden", "must not be specified in a nested context"
        )


def _completeness(v: Obj, s: Any, s_path: str, v_path: str) -> Iterator[FieldError]:
    """Every field or array named inside a junctor is also declared outside of it."""
    for junctor in _JUNCTORS:
        for i, nested in enumerate(v.get(junctor) or []):
            yield from _nested_completeness(nested, s, s_path, f"{v_path}.{junctor}[{i}]")
    if isinstance(v.get("not"), dict):
        yield from _nested_completeness(v["not"], s, s_path, f"{v_path}.not")
    if isinstance(s, dict):
        if isinstance(s.get("items"), dict):
            yield from _completeness(s["items"], s["items"], f"{s_path}.items", f"{s_path}.items")
        for name, child in (s.get("properties") or {}).items():
            child_path = key(f"{s_path}.properties", name)
            yield from _completeness(child, child, child_path, child_path)
        if isinstance(s.get("additionalProperties"), dict):
            child_path = f"{s_path}.additionalProperties"
            yield from _completeness(s["additionalProperties"], s["additionalProperties"], child_path, child_path)


def _nested_completeness(v: Any, s: Any, s_path: str, v_path: str) -> Iterator[FieldError]:
    if not isinstance(v, dict):
        return
    if not isinstance(s, dict):
        yield FieldError(s_path, "Required", f"because it is defined in {v_path}")
        return
    for junctor in _JUNCTORS:
        for i, nested in enumerate(v.get(junctor) or []):
            yield from _nested_completeness(nested, s, s_path, f"{v_path}.{junctor}[{i}]")
    if isinstance(v.get("not"), dict):
        yield from _nested_completeness(v["not"], s, s_path, f"{v_path}.not")
    if isinstance(v.get("items"), dict):
        yield from _nested_completeness(v["items"], s.get("items"), f"{s_path}.items", f"{v_path}.items")
    declared = s.get("properties") or {}
    for name, child in (v.get("properties") or {}).items():
        if name not in declared:
            yield FieldError(
                key(f"{s_path}.properties", name),
                "Required",
                f"because it is defined in {key(f'{v_path}.properties', name)}",
            )
        else:
            yield from _nested_completeness(
                child, declared[name], key(f"{s_path}.properties", name), key(f"{v_path}.properties", name)
            )


# ---------------------------------------------------------------------- defaults


def _defaults(s: Any, path: str, *, embedded: bool, inside_meta: bool) -> Iterator[FieldError]:
    """Each default must be pruned (no unknown fields) and valid against its own schema ("Defaulting")."""
    from fsdp_operator.local.server import validation  # the pruning and validation of objects; imports this module

    if not isinstance(s, dict):
        return
    embedded = embedded or bool(s.get("x-kubernetes-embedded-resource"))
    if "default" in s and not inside_meta:
        default = s["default"]
        pruned, unknown = validation.prune_value(default, s, embedded=embedded)
        if unknown or pruned != default:
            yield FieldError(f"{path}.default", "Invalid", "must not have unknown fields", default)
        for field_path, message in validation.validate_value(default, s):
            where = f"{path}.default" + (f".{field_path}" if field_path else "")
            yield FieldError(where, "Invalid", message.removeprefix("Invalid value: "), _at(default, field_path))
    if isinstance(s.get("items"), dict):
        yield from _defaults(s["items"], f"{path}.items", embedded=False, inside_meta=inside_meta)
    for name, child in (s.get("properties") or {}).items():
        meta = inside_meta or (embedded and name in _META_FIELDS)
        yield from _defaults(child, key(f"{path}.properties", name), embedded=False, inside_meta=meta)
    # additionalProperties is not followed, as the real server does not.


def _at(value: Any, field_path: str) -> Any:
    for part in field_path.replace("[", ".[").split("."):
        if not part:
            continue
        if part.startswith("[") and isinstance(value, list):
            value = value[int(part[1:-1])]
        elif isinstance(value, dict):
            value = value.get(part)
    return value


# ---------------------------------------------------------------------- the OpenAPI v3 subset


def _openapi(s: Any, path: str, *, root: bool, inside_meta: bool, defaults_forbidden: str) -> Iterator[FieldError]:
    if not isinstance(s, dict):
        return
    kind = s.get("type", "")
    if kind and kind not in _TYPES:
        yield FieldError(f"{path}.type", "Unsupported", ", ".join(f'"{t}"' for t in _TYPES), kind)
    if "default" in s and defaults_forbidden:
        yield FieldError(f"{path}.default", "Forbidden", f"must not be set {defaults_forbidden}")
    for name in ("id", "additionalItems", "patternProperties", "definitions", "dependencies"):
        if _is_set(s.get(name)) or (name == "additionalItems" and name in s):
            yield FieldError(f"{path}.{name}", "Forbidden", f"{name} is not supported")
    if "$ref" in s:
        yield FieldError(f"{path}.$ref", "Forbidden", "$ref is not supported")
    if kind == "null":
        yield FieldError(f"{path}.type", "Forbidden", "type cannot be set to null, use nullable as an alternative")
    if isinstance(s.get("items"), list):
        yield FieldError(f"{path}.items", "Forbidden", "items must be a schema object and not an array")
    if inside_meta and s.get("x-kubernetes-embedded-resource"):
        yield FieldError(
            f"{path}.x-kubernetes-embedded-resource", "Forbidden", "must not be used inside of resource meta"
        )
    if s.get("uniqueItems") is True:
        yield FieldError(
            f"{path}.uniqueItems",
            "Forbidden",
            "uniqueItems cannot be set to true since the runtime complexity becomes quadratic",
        )
    additional = s.get("additionalProperties")
    if additional is not None:
        if s.get("properties") and (additional is False or isinstance(additional, dict)):
            yield FieldError(
                f"{path}.additionalProperties", "Forbidden", "additionalProperties and properties are mutual exclusive"
            )
        reason = "inside additionalProperties applying to object metadata" if inside_meta else defaults_forbidden
        yield from _openapi(
            additional, f"{path}.additionalProperties", root=False, inside_meta=inside_meta, defaults_forbidden=reason
        )
    embedded = bool(s.get("x-kubernetes-embedded-resource"))
    for name, child in (s.get("properties") or {}).items():
        meta, reason = inside_meta, defaults_forbidden
        if (root or embedded) and name in _META_FIELDS:
            meta = True
            if root:
                reason = f"in top-level {name}"
        yield from _openapi(
            child, key(f"{path}.properties", name), root=False, inside_meta=meta, defaults_forbidden=reason
        )
    yield from _openapi(
        s.get("not"), f"{path}.not", root=False, inside_meta=inside_meta, defaults_forbidden=defaults_forbidden
    )
    for junctor in ("allOf", "oneOf", "anyOf"):
        for i, nested in enumerate(s.get(junctor) or []):
            yield from _openapi(
                nested,
                f"{path}.{junctor}[{i}]",
                root=False,
                inside_meta=inside_meta,
                defaults_forbidden=defaults_forbidden,
            )
    items = s.get("items")
    if isinstance(items, dict):
        yield from _openapi(
            items, f"{path}.items", root=False, inside_meta=inside_meta, defaults_forbidden=defaults_forbidden
        )
    yield from _extensions(s, path)


def _extensions(s: Obj, path: str) -> Iterator[FieldError]:
    """The `x-kubernetes-*` rules: preserve-unknown-fields, map-type, list-type and list-map-keys."""
    kind = s.get("type", "")
    if s.get("x-kubernetes-preserve-unknown-fields") is False:
        yield FieldError(f"{path}.x-kubernetes-preserve-unknown-fields", "Invalid", "must be true or undefined", False)
    map_type = s.get("x-kubernetes-map-type")
    if map_type is not None:
        if kind != "object":
            yield _type_error(path, kind, "must be object if x-kubernetes-map-type is specified")
        if map_type not in ("atomic", "granular"):
            yield FieldError(f"{path}.x-kubernetes-map-type", "Unsupported", '"atomic", "granular"', map_type)
    list_type = s.get("x-kubernetes-list-type")
    items = s.get("items") if isinstance(s.get("items"), dict) else None
    if list_type is not None and kind != "array":
        yield _type_error(path, kind, "must be array if x-kubernetes-list-type is specified")
    elif list_type == "set" and items is not None:
        if items.get("type") == "array" and items.get("x-kubernetes-list-type", "atomic") != "atomic":
            yield FieldError(
                f"{path}.items.x-kubernetes-list-type",
                "Invalid",
                "must be atomic as item of a list with x-kubernetes-list-type=set",
                items.get("x-kubernetes-list-type"),
            )
        if items.get("type") == "object" and items.get("x-kubernetes-map-type") != "atomic":
            yield FieldError(
                f"{path}.items.x-kubernetes-map-type",
                "Invalid",
                "must be atomic as item of a list with x-kubernetes-list-type=set",
                list_type,
            )
    if list_type is not None and list_type not in ("atomic", "set", "map"):
        yield FieldError(f"{path}.x-kubernetes-list-type", "Unsupported", '"atomic", "set", "map"', list_type)
    map_keys = s.get("x-kubernetes-list-map-keys") or []
    if map_keys:
        if list_type is None:
            yield FieldError(
                f"{path}.x-kubernetes-list-type", "Required", "must be map if x-kubernetes-list-map-keys is non-empty"
            )
        elif list_type != "map":
            yield FieldError(
                f"{path}.x-kubernetes-list-type",
                "Invalid",
                "must be map if x-kubernetes-list-map-keys is non-empty",
                list_type,
            )
    if list_type == "map":
        if not map_keys:
            yield FieldError(
                f"{path}.x-kubernetes-list-map-keys", "Required", "must not be empty if x-kubernetes-list-type is map"
            )
        if "items" not in s:
            yield FieldError(f"{path}.items", "Required", "must have a schema if x-kubernetes-list-type is map")
        elif items is None:
            yield FieldError(
                f"{path}.items",
                "Invalid",
                "must only have a single schema if x-kubernetes-list-type is map",
                s["items"],
            )
        elif items.get("type") != "object":
            yield FieldError(
                f"{path}.items.type",
                "Invalid",
                "must be object if parent array's x-kubernetes-list-type is map",
                items.get("type", ""),
            )
        else:
            properties = items.get("properties") or {}
            seen: set[str] = set()
            for name in map_keys:
                if name not in properties:
                    yield FieldError(
                        f"{path}.x-kubernetes-list-map-keys",
                        "Invalid",
                        "entries must all be names of item properties",
                        map_keys,
                    )
                elif (properties[name] or {}).get("type") in ("array", "object"):
                    yield FieldError(
                        f"{key(f'{path}.items.properties', name)}.type",
                        "Invalid",
                        "must be a scalar type if parent array's x-kubernetes-list-type is map",
                        "object",
                    )
                if name in seen:
                    yield FieldError(
                        f"{path}.x-kubernetes-list-map-keys", "Invalid", "must not contain duplicate entries", map_keys
                    )
                seen.add(name)
    if list_type in ("set", "map") and items is not None:
        if items.get("nullable"):
            yield FieldError(
                f"{path}.items.nullable", "Forbidden", f"cannot be nullable when x-kubernetes-list-type is {list_type}"
            )
        if list_type == "map":
            required = set(items.get("required") or [])
            properties = items.get("properties") or {}
            for name in map_keys:
                if name not in properties:
                    continue
                if name not in required and "default" not in (properties[name] or {}):
                    yield FieldError(
                        f"{key(f'{path}.items.properties', name)}.default",
                        "Required",
                        "this property is in x-kubernetes-list-map-keys, so it must have a default or be a required "
                        "property",
                    )
                if (properties[name] or {}).get("nullable"):
                    yield FieldError(
                        f"{key(f'{path}.items.properties', name)}.nullable",
                        "Forbidden",
                        "this property is in x-kubernetes-list-map-keys, so it cannot be nullable",
                    )
    if "pattern" in s and isinstance(s["pattern"], str):
        try:
            re.compile(s["pattern"])
        except re.error as e:
            yield FieldError(
                f"{path}.pattern", "Invalid", f"must be a valid regular expression, but isn't: {e}", s["pattern"]
            )


def _type_error(path: str, kind: str, detail: str) -> FieldError:
    if not kind:
        return FieldError(f"{path}.type", "Required", detail)
    return FieldError(f"{path}.type", "Invalid", detail, kind)
