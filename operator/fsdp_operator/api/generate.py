"""What is generated from the field declarations: the OpenAPI schema of `spec`, the CRD, docs/api.md."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal, get_args, get_origin

from fsdp_operator.api.fields import (
    Declared,
    Meta,
    Quantity,
    _default_value,
    _is_declaration,
    _item_meta,
    _max_length,
    _num,
    _unwrap_optional,
    declared,
)
from fsdp_operator.api.schema import (
    API_VERSION,
    GROUP,
    KIND,
    PLURAL,
    PRINTER_COLUMNS,
    SHORT_NAMES,
    SINGULAR,
    STATUS_SCHEMA,
    VERSION,
    Schema,
)


def openapi(cls: type, description: str, *, defaults: bool = True) -> dict[str, Any]:
    """The OpenAPI v3 schema of a declaration, as the CRD carries it.

    Without `defaults`, the API server fills nothing in (for pieces of a PodSpec passed on as written).
    """
    properties = {d.key: _field_schema(d, defaults=defaults) for d in declared(cls)}
    schema: dict[str, Any] = {"type": "object", "description": description, "properties": properties}
    required = [d.key for d in declared(cls) if d.meta.required]
    if required:
        schema["required"] = required
    return schema


def _field_schema(d: Declared, *, defaults: bool) -> dict[str, Any]:
    schema = _type_schema(_unwrap_optional(d.hint), d.meta, defaults=defaults)
    schema["description"] = d.meta.doc if d.meta.unset is None else f"{d.meta.doc} Unset: {d.meta.unset}."
    default = None if d.optional or d.meta.unset is not None or not defaults else _default_value(d)
    if not defaults:
        pass
    elif _is_declaration(d.hint):
        # `default: {}` lets the API server descend and fill nested defaults when a group is omitted.
        schema["default"] = {}
    elif default not in (None, [], {}):
        schema["default"] = default
    return _ordered(schema)


def _ordered(schema: dict[str, Any]) -> dict[str, Any]:
    first = ("type", "description")
    return {**{k: schema[k] for k in first if k in schema}, **{k: v for k, v in schema.items() if k not in first}}


def _type_schema(hint: Any, meta: Meta, *, defaults: bool = True) -> dict[str, Any]:
    if _is_declaration(hint):
        return openapi(hint, meta.doc, defaults=defaults)
    if hint is bool:
        return {"type": "boolean"}
    if hint is int:
        return {"type": "integer", **_bound_schema(meta, integer=True)}
    if hint is float:
        return {"type": "number", **_bound_schema(meta, integer=False)}
    if get_origin(hint) is Literal:
        return {"type": "string", "enum": list(get_args(hint))}
    if hint is Quantity:
        schema: dict[str, Any] = {
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "x-kubernetes-int-or-string": True,
        }
        if meta.grammar is not None and meta.grammar.pattern:
            schema["pattern"] = meta.grammar.pattern
        return schema
    if hint is str:
        schema = {"type": "string", "maxLength": _max_length(meta)}
        if meta.grammar is not None and meta.grammar.check("") is not None:
            schema["minLength"] = 1  # the parser refuses "": so does the API server, before the operator sees it
        if meta.grammar is not None and meta.grammar.pattern:
            schema["pattern"] = meta.grammar.pattern
        return schema
    if hint is Any:  # checked by the rules of its declaration (model.overrides: model_configs)
        return {"x-kubernetes-preserve-unknown-fields": True}
    origin = get_origin(hint)
    if origin is list:
        (item_hint,) = get_args(hint)
        if meta.shape is not None:
            items = openapi(meta.shape, meta.doc, defaults=False)
        else:
            items = _type_schema(item_hint, _item_meta(meta))
        items.pop("description", None)
        schema = {"type": "array", "items": items}
        if meta.max_items is not None:
            schema["maxItems"] = meta.max_items
        return schema
    if origin is dict:
        _, value_hint = get_args(hint)
        if value_hint == (int | str):
            # A real API server allows types under anyOf only in exactly this int-or-string shape; bounds go
            # beside it (numeric keywords apply to integers only), or the CRD is not structural.
            value_schema: dict[str, Any] = {
                "anyOf": [{"type": "integer"}, {"type": "string"}],
                "x-kubernetes-int-or-string": True,
                **_bound_schema(meta, integer=True),
            }
        else:
            value_meta = Meta(doc="", grammar=meta.values, max_length=meta.max_length)
            value_schema = _type_schema(value_hint, value_meta)
        schema = {"type": "object", "additionalProperties": value_schema}
        if meta.max_items is not None:
            schema["maxProperties"] = meta.max_items
        return schema
    raise TypeError(f"no schema for the declared type {hint!r}")


def _bound_schema(meta: Meta, *, integer: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    cast: Callable[[float], float | int] = int if integer else float
    if meta.minimum is not None:
        out["minimum"] = cast(meta.minimum)
        if meta.exclusive_minimum:
            out["exclusiveMinimum"] = True
    if meta.maximum is not None:
        out["maximum"] = cast(meta.maximum)
    return out


def reference(cls: type, path: str) -> list[tuple[str, str, str, str]]:
    """(field path, type, default, description with bounds) for every field under `cls`."""
    rows = []
    for d in declared(cls):
        sub = f"{path}.{d.key}"
        hint = _unwrap_optional(d.hint)
        if _is_declaration(hint):
            rows.append((sub, "object", "", d.meta.doc))
            rows += reference(hint, sub)
            continue
        if d.meta.shape is not None:
            rows.append((sub, "array of objects", "", d.meta.doc))
            rows += reference(d.meta.shape, f"{sub}[]")
            continue
        default = _default_value(d)
        shown_default = (
            f"unset: {d.meta.unset}"
            if d.meta.unset is not None
            else "unset"
            if d.optional
            else ""
            if default in ([], {}, None)
            else _doc_value(default)
        )
        rows.append((sub, _type_words(hint, d.meta), shown_default, _doc_with_bounds(d)))
    return rows


def _doc_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"' if value == "" or value.strip() != value else value
    return str(value)


def _type_words(hint: Any, meta: Meta) -> str:
    if hint is bool:
        return "boolean"
    if hint is int:
        return "integer"
    if hint is float:
        return "number"
    if hint is Quantity:
        return "quantity"
    if get_origin(hint) is Literal:
        return " or ".join(f'"{a}"' if a == "" else a for a in get_args(hint))
    if hint is str:
        return f"string ({meta.grammar.name})" if meta.grammar is not None else "string"
    origin = get_origin(hint)
    if origin is list:
        (item,) = get_args(hint)
        return f"array of {_type_words(item, _item_meta(meta))}"
    if origin is dict:
        _, value_hint = get_args(hint)
        keys = meta.keys.name if meta.keys is not None else "string"
        values = (
            "integer or string"
            if value_hint == (int | str)
            else _type_words(value_hint, Meta(doc="", grammar=meta.values))
        )
        return f"map of {keys} to {values}"
    if hint is Any:
        return "value"
    return str(hint)


def _doc_with_bounds(d: Declared) -> str:
    m = d.meta
    limits = []
    if m.minimum is not None:
        limits.append(f"{'>' if m.exclusive_minimum else '>='} {_num(m.minimum)}")
    if m.maximum is not None:
        limits.append(f"<= {_num(m.maximum)}")
    if m.max_items is not None:
        limits.append(f"at most {m.max_items} entries")
    suffix = f" ({', '.join(limits)})" if limits else ""
    return f"{m.doc}{suffix}"


def spec_schema() -> Schema:
    """The OpenAPI schema of `spec`, generated from the declarations in spec.py."""
    from fsdp_operator.api import model_configs, spec

    generated = openapi(spec.Spec, spec.Spec.__doc__ or "")
    overrides = generated["properties"]["model"]["properties"]["overrides"]
    # Typed per config field, so the API server refuses `num_hidden_layers: "2"` and prunes (or, with strict
    # field validation, refuses) `trust_remote_code`; the family check is the operator's (model_configs).
    overrides.pop("additionalProperties")
    overrides["properties"] = model_configs.openapi_properties()
    return generated


def crd() -> Schema:
    """The CustomResourceDefinition manifest."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PLURAL}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": SINGULAR,
                "shortNames": SHORT_NAMES,
                "categories": ["all", "ray"],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "description": "An FSDP training run on a KubeRay RayCluster.",
                            "properties": {
                                "apiVersion": {"type": "string"},
                                "kind": {"type": "string"},
                                "metadata": {"type": "object"},
                                "spec": spec_schema(),
                                "status": STATUS_SCHEMA,
                            },
                            "required": ["spec"],
                        }
                    },
                }
            ],
        },
    }


def api_reference() -> str:
    """docs/api.md: every spec field (from the declarations) and status field (from STATUS_SCHEMA)."""
    from fsdp_operator.api import model_configs, spec

    def cell(text: str) -> str:
        return text.replace("|", "\\|").replace("\n", " ")

    lines = [
        "# FSDPTrainingJob API reference",
        "",
        "<!-- Generated by `make crds` from operator/fsdp_operator/api/spec.py and schema.py; do not edit "
        "(a test checks it). -->",
        "",
        f"`apiVersion: {API_VERSION}`, `kind: {KIND}`, namespaced; short names: {', '.join(SHORT_NAMES)}. "
        "`metadata.name` must be a DNS-1123 label. Every spec field is optional; the defaults reproduce "
        "the reference setup (2x g6.12xlarge with EFA). `fsdpctl validate -f JOB.yaml` checks a manifest "
        "against everything below, bounds and rules across fields included.",
        "",
        "## spec",
        "",
        "| field | type | default | description |",
        "|---|---|---|---|",
    ]
    for path, kind, default, doc in reference(spec.Spec, "spec"):
        lines.append(f"| `{path}` | {cell(kind)} | {cell(default)} | {cell(doc)} |")
    lines += [
        "",
        "### Model config overrides",
        "",
        "`spec.model.overrides` may set only these fields of the model's Hugging Face config, in these types. "
        "The family comes from `spec.model.name` (a name with `Qwen2`/`Qwen2.5` in it: qwen2; `llama`: llama); "
        "for a name that says neither, a field must be one every family has. Loader options such as "
        "`trust_remote_code` or `token` are refused.",
        "",
        "| field | type | families |",
        "|---|---|---|",
    ]
    for name, kind, families in model_configs.reference_rows():
        lines.append(f"| `{name}` | {cell(kind)} | {families} |")
    lines += ["", "## status", "", "Written by the operator only.", "", "| field | type | description |"]
    lines.append("|---|---|---|")

    def walk(node: Schema, path: str) -> None:
        for key, sub in node.get("properties", {}).items():
            kind = sub.get("type", "")
            if kind == "array" and "properties" in sub.get("items", {}):
                kind = "array of objects"
            elif "format" in sub:
                kind = f"{kind} ({sub['format']})"
            lines.append(f"| `{path}.{key}` | {kind} | {cell(sub.get('description', ''))} |")
            walk(sub, f"{path}.{key}")
            walk(sub.get("items", {}), f"{path}.{key}[]")

    walk(STATUS_SCHEMA, "status")
    return "\n".join(lines) + "\n"
