"""Declare a manifest field once; derive its CRD schema, its parser and its reference entry from that.

A declaration is a frozen dataclass whose fields are made with `field(...)`: the Python type (bool,
int, float, str, a `Literal` of strings, `Quantity`, `X | None`, `list[...]`, `dict[str, ...]`, or a
nested declaration) plus the doc, the default, the bounds and the string grammar. From it:

- `openapi(cls)`: the OpenAPI v3 schema the CRD carries (types, enums, defaults, bounds, lengths);
- `parse(cls, raw, path, problems)`: the values of a manifest mapping with defaults applied, every
  problem appended as one ``path: reason`` line (unknown fields included), never an exception;
- `build(cls, values)`: the typed, frozen instance from those values;
- `reference(cls, path)`: rows of the field reference (docs/api.md).

A declared class may define ``_rules(values, path, problems)``, a static method that checks what
spans several of its fields once each field is well-formed; it may fill in fields declared with
`unset=` (values the manifest may leave out, derived from others).

Messages show at most a short, truncated part of a value, never a value from a field declared
`secret` or named like a credential, and never the user info of a URI.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, NewType, Union, get_args, get_origin, get_type_hints

from fsdp_operator.api import formats
from fsdp_operator.api.formats import Grammar

Quantity = NewType("Quantity", str)
"""A Kubernetes quantity (``2``, ``500m``, ``160Gi``): an integer or a string in the manifest, a string here."""

Problems = list[str]

# Strings without a grammar of their own still have a bounded length.
DEFAULT_MAX_LENGTH = 1024
KEY = "fsdp.dev/field"


@dataclass(frozen=True, slots=True)
class Meta:
    """Everything about a field besides its Python type and default."""

    doc: str
    key: str | None = None
    """The manifest key; by default the attribute name in camelCase."""
    minimum: float | None = None
    maximum: float | None = None
    exclusive_minimum: bool = False
    max_length: int | None = None
    max_items: int | None = None
    grammar: Grammar | None = None
    """For strings, quantities and the items of a list of strings."""
    keys: Grammar | None = None
    """For maps: the grammar of the keys."""
    values: Grammar | None = None
    """For maps of strings: the grammar of the values."""
    shape: type | None = None
    """For `list[dict[str, Any]]`: the declaration each item is checked against; items stay mappings."""
    secret: bool = False
    """Never show the value in a message (credentials may be in it)."""
    required: bool = False
    unset: str | None = None
    """The field may be left out, and `_rules` derives it; this says from what (no default in the CRD)."""
    train: str | None = None
    """The `TrainConfig` field this one becomes."""
    mutable: bool = False
    """May change once the operator has taken the job (it takes effect within one pass); every other field is
    immutable from then on, refused by the API server itself (`generate.immutability_rules`)."""


def field(
    doc: str,
    *,
    default: Any = None,
    factory: Callable[[], Any] | None = None,
    **meta: Any,
) -> Any:
    """A declared field: `dataclasses.field` with its `Meta`; without a default it is optional (None)."""
    metadata = {KEY: Meta(doc=doc, **meta)}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


@dataclass(frozen=True, slots=True)
class Declared:
    """One field of a declaration, with its type resolved."""

    name: str
    key: str
    hint: Any
    meta: Meta
    default: Any
    inner: Any = None
    """`hint` without its `| None` (worked out once: parsing asks for it of every field of every manifest)."""
    nested: type | None = None
    """The declaration `inner` is, when it is one."""
    optional: bool = False
    """`hint` is `X | None`."""


@functools.cache
def declared(cls: type) -> tuple[Declared, ...]:
    hints = get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        meta = f.metadata.get(KEY)
        if meta is None:
            continue
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory
        else:
            default = dataclasses.MISSING
        hint = hints[f.name]
        inner = _unwrap_optional(hint)
        nested = inner if _is_declaration(inner) else None
        out.append(Declared(f.name, meta.key or camel(f.name), hint, meta, default, inner, nested, inner is not hint))
    return tuple(out)


@functools.cache
def _keys(cls: type) -> frozenset[str]:
    return frozenset(d.key for d in declared(cls))


def _unwrap_optional(hint: Any) -> Any:
    if get_origin(hint) in (Union, types.UnionType):
        args = [a for a in get_args(hint) if a is not type(None)]
        if len(args) == 1 and len(get_args(hint)) == 2:
            return args[0]
    return hint


def _is_declaration(hint: Any) -> bool:
    return isinstance(hint, type) and dataclasses.is_dataclass(hint)


def _default_value(d: Declared) -> Any:
    if d.default is dataclasses.MISSING:
        return None
    return d.default() if callable(d.default) else d.default


# --- showing values in messages -------------------------------------------------------------------

_CREDENTIAL_NAME = re.compile(r"(?i)secret|token|passw|credential|private|auth|api_?key|access_?key|session|cookie")
SHOW_LIMIT = 40


def type_name(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return "null" if value is None else type(value).__name__


def show(value: Any, *, secret: bool = False) -> str:
    """A short rendering of a value for a message: truncated, URI user info and secrets hidden."""
    if secret:
        return "(value hidden)"
    if isinstance(value, str):
        text = hide_userinfo(value)
        clipped = repr(text[:SHOW_LIMIT])
        return clipped + ("..." if len(text) > SHOW_LIMIT else "")
    if isinstance(value, bool) or value is None:
        return "true" if value is True else "false" if value is False else "null"
    if isinstance(value, int):
        return str(value) if value.bit_length() <= 64 else f"a {value.bit_length()}-bit integer"
    if isinstance(value, float):
        return repr(value)
    return f"a value of type {type_name(value)}"


def hide_userinfo(text: str) -> str:
    """`text` with what may be URI user info hidden: everything before the last ``@``, back to the last
    ``://`` (or the first ``:``) before it, however the URI is spelled (``s3:/\\u:p@b``, white space in it).

    String searches only, so linear in the length (a regular expression scanning for ``scheme://`` at every
    position of a long string is quadratic).
    """
    at = text.rfind("@")
    if at < 0:
        return text
    head = text[:at]
    separator = head.rfind("://")
    if separator >= 0:
        start = separator + 3
    elif (colon := head.find(":")) >= 0:
        start = colon + 1
    else:
        return text  # `ray@sha256:...`, `pkg @ url`: no URI, or no user info in it
    return f"{text[:start]}***{text[at:]}"


def show_key(key: Any) -> str:
    """A mapping key as part of a field path: plain when it is a simple name, else quoted and truncated."""
    if isinstance(key, str) and re.fullmatch(r"[A-Za-z0-9_./-]{1,64}", key):
        return key
    return f"[{show(key)}]"


def is_credential_like(path: str) -> bool:
    return _credential_name(path.rsplit(".", 1)[-1])


@functools.lru_cache(maxsize=4096)
def _credential_name(name: str) -> bool:
    return bool(_CREDENTIAL_NAME.search(name))


# --- parsing ---------------------------------------------------------------------------------------

BAD: Any = object()  # a value that did not parse; the problem is already recorded


def parse(cls: type, raw: Any, path: str, problems: Problems) -> dict[str, Any] | None:
    """The values of `cls`'s fields from the mapping `raw` (attribute names as keys, defaults applied).

    None when `raw` is not a mapping or a field in it is malformed; every problem is in `problems`.
    The `_rules` of `cls` run once every field is well-formed; what they find is in `problems` too,
    but the values are still returned, so that the rules of enclosing groups run as well.
    """
    values = _object(cls, raw, path, problems, keep_manifest_form=False)
    if values is None:
        return None
    rules = getattr(cls, "_rules", None)
    if rules is not None:
        rules(values, path, problems)
    return values


def _object(cls: type, raw: Any, path: str, problems: Problems, *, keep_manifest_form: bool) -> dict[str, Any] | None:
    if not isinstance(raw, dict):
        problems.append(f"{path}: expected object, got {type_name(raw)}")
        return None
    fields_ = declared(cls)
    keys = _keys(cls)
    malformed = False
    for key in raw:
        if not isinstance(key, str):
            problems.append(f"{path}: field names must be strings, got {type_name(key)} {show(key)}")
            malformed = True
        elif key not in keys:
            problems.append(f"{path}.{show_key(key)}: unknown field (known fields: {', '.join(sorted(keys))})")
            malformed = True
    values: dict[str, Any] = {}
    for d in fields_:
        sub = f"{path}.{d.key}"
        given = raw.get(d.key)
        if given is None:  # absent, or null: Kubernetes prunes nulls and defaults the field
            if d.meta.required:
                problems.append(f"{sub}: required")
                malformed = True
                continue
            if keep_manifest_form:
                continue
            if d.optional or d.meta.unset is not None:
                values[d.name] = None
            elif d.nested is not None:
                values[d.name] = parse(d.nested, {}, sub, problems)
                malformed = malformed or values[d.name] is None
            else:
                values[d.name] = _default_value(d)
            continue
        if keep_manifest_form and d.nested is not None:
            nested = _object(d.nested, given, sub, problems, keep_manifest_form=True)
            value = BAD if nested is None else nested
        else:
            value = _value(d.inner, d.meta, given, sub, problems)
        if value is BAD:
            malformed = True
        else:
            values[d.key if keep_manifest_form else d.name] = value
    if malformed:
        return None
    if keep_manifest_form:
        rules = getattr(cls, "_rules", None)
        if rules is not None:
            before = len(problems)
            rules({d.name: values.get(d.key) for d in fields_}, path, problems)
            if len(problems) > before:
                return None
    return values


def _value(hint: Any, meta: Meta, value: Any, path: str, problems: Problems) -> Any:
    """`value` checked against `hint` (without its `| None`: `Declared.inner`)."""
    if hint is Any:  # first: the API server's own fields (managedFields) hold many such values, on every pass
        return value
    secret = meta.secret or is_credential_like(path)
    if hint is bool:
        if not isinstance(value, bool):
            return _wrong("boolean", value, path, problems, secret)
        return value
    if hint is int:
        return _integer(meta, value, path, problems, secret)
    if hint is float:
        return _number(meta, value, path, problems, secret)
    if hint is str or hint is Quantity or get_origin(hint) is Literal:
        if hint is Quantity and isinstance(value, float) and math.isfinite(value) and value.is_integer():
            value = int(value)  # `memory: 1e11` is the integer 100000000000 in the JSON kubectl sends
        if hint is Quantity and isinstance(value, int) and not isinstance(value, bool):
            if value.bit_length() > 128:  # str() of a 4300-digit integer raises; no resource is that large
                problems.append(f"{path}: {show(value)} is out of range")
                return BAD
            value = str(value)
        if not isinstance(value, str):
            expected = "quantity (integer or string)" if hint is Quantity else "string"
            return _wrong(expected, value, path, problems, secret)
        return _string(hint, meta, value, path, problems, secret)
    if _is_declaration(hint):
        values = parse(hint, value, path, problems)
        return BAD if values is None else values
    origin = get_origin(hint)
    if origin is list:
        return _list(hint, meta, value, path, problems)
    if origin is dict:
        return _map(hint, meta, value, path, problems)
    raise TypeError(f"{path}: no parser for the declared type {hint!r}")  # a declaration error, found by tests


def _wrong(expected: str, value: Any, path: str, problems: Problems, secret: bool) -> Any:
    shown = "" if isinstance(value, dict | list) or value is None else " " + show(value, secret=secret)
    problems.append(f"{path}: expected {expected}, got {type_name(value)}{shown}")
    return BAD


def _bounds(meta: Meta, number: float, path: str, problems: Problems, given: Any = None) -> bool:
    shown = show(number if given is None else given)
    if meta.minimum is not None:
        if meta.exclusive_minimum and number <= meta.minimum:
            problems.append(f"{path}: must be greater than {_num(meta.minimum)}, got {shown}")
            return False
        if number < meta.minimum:
            problems.append(f"{path}: must be at least {_num(meta.minimum)}, got {shown}")
            return False
    if meta.maximum is not None and number > meta.maximum:
        problems.append(f"{path}: must be at most {_num(meta.maximum)}, got {shown}")
        return False
    return True


def _num(bound: float) -> str:
    return str(int(bound)) if float(bound).is_integer() else repr(bound)


def _integer(meta: Meta, value: Any, path: str, problems: Problems, secret: bool) -> Any:
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value = int(value)  # `1e3` and `2.0`: integers to the API server, as kubectl sends them
    if isinstance(value, bool) or not isinstance(value, int):
        return _wrong("integer", value, path, problems, secret)
    return value if _bounds(meta, value, path, problems) else BAD


def _number(meta: Meta, value: Any, path: str, problems: Problems, secret: bool) -> Any:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return _wrong("number", value, path, problems, secret)
    if isinstance(value, int) and value.bit_length() > 1000:
        problems.append(f"{path}: must be at most {_num(meta.maximum or 0)}, got {show(value)}")
        return BAD
    number = float(value)
    if not math.isfinite(number):
        problems.append(f"{path}: must be a finite number, got {show(number)}")
        return BAD
    return number if _bounds(meta, number, path, problems, value) else BAD


def _string(hint: Any, meta: Meta, value: str, path: str, problems: Problems, secret: bool) -> Any:
    if get_origin(hint) is Literal:
        choices = get_args(hint)
        if value not in choices:
            problems.append(f"{path}: {show(value, secret=secret)} is not one of {', '.join(choices)}")
            return BAD
        return value
    limit = _max_length(meta)
    if len(value) > limit:
        problems.append(f"{path}: longer than {limit} characters")
        return BAD
    if (hidden := _hidden_character(meta.grammar, value)) is not None:
        problems.append(f"{path}: {hidden}")
        return BAD
    if meta.grammar is not None:
        try:
            reason = meta.grammar.check(value)
        except ValueError:  # a library under a grammar gave up on the value: it is not well-formed either
            reason = f"is not a well-formed {meta.grammar.name}"
        if reason is not None:
            problems.append(f"{path}: {show(value, secret=secret)} {reason}")
            return BAD
    return value


def _hidden_character(grammar: Grammar | None, value: str) -> str | None:
    """NUL, control and format characters (formats.hidden_character), checked for every string of a manifest."""
    return formats.hidden_character(value, format_characters=grammar is not None and grammar.format_characters)


def _max_length(meta: Meta) -> int:
    if meta.max_length is not None:
        return meta.max_length
    return meta.grammar.max_length if meta.grammar is not None else DEFAULT_MAX_LENGTH


def _list(hint: Any, meta: Meta, value: Any, path: str, problems: Problems) -> Any:
    if not isinstance(value, list):
        return _wrong("array", value, path, problems, False)
    if meta.max_items is not None and len(value) > meta.max_items:
        problems.append(f"{path}: more than {meta.max_items} items ({len(value)})")
        return BAD
    (item_hint,) = get_args(hint)
    item_hint, item_meta = _unwrap_optional(item_hint), _item_meta(meta)
    before = len(problems)
    items = []
    for i, item in enumerate(value):
        sub = f"{path}[{i}]"
        if meta.shape is not None:
            checked = _object(meta.shape, item, sub, problems, keep_manifest_form=True)
            items.append(checked)
        else:
            items.append(_value(item_hint, item_meta, item, sub, problems))
    return BAD if len(problems) > before else items


def _item_meta(meta: Meta) -> Meta:
    return Meta(
        doc=meta.doc,
        grammar=meta.grammar,
        secret=meta.secret,
        minimum=meta.minimum,
        maximum=meta.maximum,
        max_length=meta.max_length,
    )


def _map(hint: Any, meta: Meta, value: Any, path: str, problems: Problems) -> Any:
    if not isinstance(value, dict):
        return _wrong("object", value, path, problems, False)
    if meta.max_items is not None and len(value) > meta.max_items:
        problems.append(f"{path}: more than {meta.max_items} entries ({len(value)})")
        return BAD
    _, value_hint = get_args(hint)
    value_meta = Meta(
        doc=meta.doc,
        grammar=meta.values,
        secret=meta.secret,
        minimum=meta.minimum,
        maximum=meta.maximum,
        max_length=meta.max_length,
    )
    item_hint = _unwrap_optional(value_hint)
    before = len(problems)
    result = {}
    for key, item in value.items():
        if not isinstance(key, str):
            problems.append(f"{path}: keys must be strings, got {type_name(key)} {show(key)}")
            continue
        if (hidden := _hidden_character(None, key)) is not None:
            problems.append(f"{path}: a key {hidden}")
            continue
        if meta.keys is not None:
            if len(key) > meta.keys.max_length:
                problems.append(f"{path}: a key is longer than {meta.keys.max_length} characters")
                continue
            reason = meta.keys.check(key)
            if reason is not None:
                problems.append(f"{path}: key {show(key)} {reason}")
                continue
        if item_hint is Any:
            result[key] = item
            continue
        sub = f"{path}.{show_key(key)}"
        if value_hint == (int | str):
            if isinstance(item, bool) or not isinstance(item, int | str):
                _wrong("integer or string", item, sub, problems, meta.secret)
            elif isinstance(item, int):
                _bounds(meta, item, sub, problems)
            elif len(item) > _max_length(value_meta):
                problems.append(f"{sub}: longer than {_max_length(value_meta)} characters")
            elif (hidden := _hidden_character(None, item)) is not None:
                problems.append(f"{sub}: {hidden}")
            result[key] = item
        else:
            result[key] = _value(item_hint, value_meta, item, sub, problems)
    return BAD if len(problems) > before else result


def build(cls: type, values: dict[str, Any]) -> Any:
    """The frozen instance of `cls` from parsed values (nested declarations already built or values)."""
    kwargs = {}
    for d in declared(cls):
        value = values[d.name]
        if d.nested is not None and isinstance(value, dict):
            value = build(d.nested, value)
        kwargs[d.name] = value
    return cls(**kwargs)


def leaves(cls: type, path: str = "") -> list[tuple[str, Declared]]:
    """Every declared field under `cls`, depth first, with its manifest path."""
    out = []
    for d in declared(cls):
        sub = f"{path}.{d.key}" if path else d.key
        out.append((sub, d))
        hint = _unwrap_optional(d.hint)
        if _is_declaration(hint):
            out += leaves(hint, sub)
    return out


def gather(cls: type, instance: Any, select: Callable[[Meta], str | None]) -> dict[str, Any]:
    """`{select(meta): value}` for every field (nested ones included) whose `select` names something."""
    out: dict[str, Any] = {}
    for d in declared(cls):
        value = getattr(instance, d.name)
        if d.nested is not None:
            if value is not None:
                out.update(gather(d.nested, value, select))
        elif (name := select(d.meta)) is not None:
            out[name] = value
    return out


# --- the CRD schema ---------------------------------------------------------------------------------


# --- the field reference ---------------------------------------------------------------------------
