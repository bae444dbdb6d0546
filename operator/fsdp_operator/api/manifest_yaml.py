"""Reading a manifest file the way kubectl and the API server would, or saying why it cannot be read.

Hand-written on top of PyYAML because PyYAML's safe loader differs from Kubernetes' decoder where
it matters for a manifest: it keeps the last of duplicate keys (kubectl refuses them), expands
aliases without limit (a "billion laughs" document takes minutes and gigabytes), recurses once per
nesting level (deep nesting ends in RecursionError), and resolves plain scalars by YAML 1.1 rules
where Kubernetes uses Go's yaml.v2: there ``1e-4`` is a number, ``0o17`` an integer, ``y`` a
boolean and ``2001-01-01`` a string. Here:

- the bytes are refused when larger than the API server accepts, not UTF-8 (UTF-16 included), or NUL;
- one pass over the parser's events (iterative, no recursion) bounds nesting depth, and the node
  count and byte size of each document as if every alias were expanded, before anything is built;
- plain scalars resolve as Go's yaml.v2 resolves them (sigs.k8s.io/yaml, which kubectl uses);
- mapping keys must be scalars and unique; they become strings, as in the JSON the API server gets;
- tags outside the JSON data model (``!!binary``, ``!!set``, ``!!timestamp``, Python tags) are refused;
- a stream holds at most `MAX_DOCUMENTS` documents, counted as the parser reaches them;
- a stream that starts with ``{`` is JSON, as kubectl's YAMLOrJSONDecoder decides: JSON's escapes, the
  surrogate pairs Python's ``json.dumps`` writes for characters beyond U+FFFF included, which YAML's
  ``\\u`` escapes cannot spell; the same bounds and duplicate-key rule apply (a YAML flow mapping that
  is not JSON is read as YAML).

`dump` writes YAML the other way round: a string is left unquoted only where no reader (YAML 1.1, 1.2,
Go's yaml.v2 as kubectl uses it) could take it for anything but that string.
"""

from __future__ import annotations

import codecs
import json
import math
import re
from typing import Any

import yaml

# The API server refuses request bodies over 3 MiB; etcd (by default) objects over 1.5 MiB.
MAX_REQUEST_BYTES = 3 * 1024 * 1024
MAX_OBJECT_BYTES = 1536 * 1024
# An FSDPTrainingJob is about 6 levels deep and has a few hundred nodes (kopf's metadata included).
MAX_DEPTH = 100
MAX_NODES = 100_000
# fsdpctl reads one document; a stream of many empty ones ("---" lines) costs parse time and means nothing.
MAX_DOCUMENTS = 100

_Base: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's parser when present: same events, faster

STR, INT, FLOAT, BOOL, NULL, MERGE = (
    f"tag:yaml.org,2002:{t}" for t in ("str", "int", "float", "bool", "null", "merge")
)


class ManifestError(ValueError):
    """The input cannot be read as a manifest; the message says why (never echoing much of it)."""


def decode(data: bytes) -> str:
    """The text of a manifest file: UTF-8 (a byte-order mark allowed), nothing else."""
    if len(data) > MAX_REQUEST_BYTES:
        raise ManifestError(f"larger than {MAX_REQUEST_BYTES} bytes, the most the Kubernetes API server accepts")
    if data.startswith((codecs.BOM_UTF32_LE, codecs.BOM_UTF32_BE)):
        raise ManifestError("is UTF-32 text; save it as UTF-8")
    if data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        raise ManifestError("is UTF-16 text; save it as UTF-8")
    if b"\x00" in data:
        raise ManifestError(f"contains a NUL byte at offset {data.index(0)} (UTF-16 text or a binary file?)")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ManifestError(f"is not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start})") from e
    return text.removeprefix("\ufeff")


def load_all(text: str) -> list[Any]:
    """Every document of a YAML stream, as the JSON objects Kubernetes would decode them into."""
    if text.lstrip(" \t\r\n").startswith("{") and (documents := _load_json_stream(text)) is not None:
        return documents
    try:
        _check_bounds(text)
        return list(yaml.load_all(text, Loader=_Loader))
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = e.problem or e.context or "cannot be read"
        if _tab_at(text, mark) or "tab character" in problem:
            # PyYAML says "found character that cannot start any token" for a tab that indents a line.
            problem = "a tab indents this line; YAML indents with spaces only"
        raise ManifestError(f"not valid YAML: {where}{problem}") from e
    except yaml.YAMLError as e:
        raise ManifestError(f"not valid YAML: {_first_line(str(e))}") from e
    except (ValueError, TypeError, OverflowError, RecursionError) as e:
        if isinstance(e, ManifestError):
            raise
        raise ManifestError(f"not valid YAML: {_first_line(str(e))}") from e


def _tab_at(text: str, mark: Any) -> bool:
    """Whether the YAML error `mark` points at a tab in the indentation of its line."""
    if mark is None or not isinstance(getattr(mark, "line", None), int):
        return False
    lines = text.splitlines()
    if not 0 <= mark.line < len(lines):
        return False
    line = lines[mark.line]
    indent = line[: len(line) - len(line.lstrip(" \t"))]
    return "\t" in indent and mark.column <= len(indent)


def _load_json_stream(text: str) -> list[Any] | None:
    """The JSON objects of a stream (kubectl's decoder takes one after another), under the YAML bounds.

    None when the first object is not JSON at all: a YAML flow mapping (``{apiVersion: v1, ...}``) starts
    with ``{`` too, and is read as YAML (kubectl would refuse it; nothing is gained by doing the same). A
    document whose first key is quoted (``{"apiVersion": ...``) is JSON, and held to JSON's grammar as
    kubectl's decoder holds it (encoding/json): a trailing comma, a comment or a single-quoted string is
    refused, where YAML would have read them.
    """
    decoder = json.JSONDecoder(object_pairs_hook=_json_object, parse_constant=_json_constant)
    documents: list[Any] = []
    at = _skip_space(text, 0)
    while at < len(text):
        if len(documents) >= MAX_DOCUMENTS:
            raise ManifestError(f"holds more than {MAX_DOCUMENTS} documents; no manifest file needs that")
        start = at
        try:
            document, at = decoder.raw_decode(text, at)
        except json.JSONDecodeError as e:
            if not documents and not _JSON_START.match(text, start):
                return None
            raise ManifestError(f"not valid JSON: line {e.lineno}, column {e.colno}: {e.msg}") from e
        except RecursionError as e:
            raise ManifestError(f"nested deeper than {MAX_DEPTH} levels; no manifest needs that") from e
        except ValueError as e:  # a duplicate key, NaN, an integer too long to convert
            if isinstance(e, ManifestError):
                raise
            raise ManifestError(f"not valid JSON: {_first_line(str(e))}") from e
        if at - start > MAX_OBJECT_BYTES:
            raise ManifestError(f"larger than {MAX_OBJECT_BYTES} bytes, the most Kubernetes stores")
        _check_json_value(document)
        documents.append(document)
        at = _skip_space(text, at)
    return documents


# JSON's first key, or an empty object: what only a JSON document starts with (a YAML flow mapping's keys are plain).
_JSON_START = re.compile(r'\{[ \t\r\n]*["}]')


def _skip_space(text: str, at: int) -> int:
    while at < len(text) and text[at] in " \t\r\n":
        at += 1
    return at


def _json_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    mapping: dict[str, Any] = {}
    for key, value in pairs:
        if key in mapping:
            raise ManifestError(f"not valid JSON: duplicate key {key[:60]!r} (kubectl refuses it too)")
        mapping[key] = value
    return mapping


def _json_constant(name: str) -> Any:
    raise ManifestError(f"not valid JSON: {name} is not a JSON number")


def _check_json_value(document: Any) -> None:
    """Depth and node count as for YAML; no lone surrogate (``\\ud800`` alone has no UTF-8 form), no infinity."""
    stack: list[tuple[Any, int]] = [(document, 1)]
    nodes = 0
    while stack:
        value, depth = stack.pop()
        nodes += 1
        if nodes > MAX_NODES:
            raise ManifestError(f"holds more than {MAX_NODES} values; no manifest needs that")
        if depth > MAX_DEPTH:
            raise ManifestError(f"nested deeper than {MAX_DEPTH} levels; no manifest needs that")
        if isinstance(value, dict):
            for key, item in value.items():
                _no_lone_surrogate(key)
                stack.append((item, depth + 1))
        elif isinstance(value, list):
            stack.extend((item, depth + 1) for item in value)
        elif isinstance(value, str):
            _no_lone_surrogate(value)
        elif isinstance(value, float) and not math.isfinite(value):  # 1e400: Go's decoder refuses it too
            raise ManifestError("not valid JSON: a number out of range")


def _no_lone_surrogate(text: str) -> None:
    if not text.isascii() and _SURROGATE.search(text):
        raise ManifestError("not valid JSON: a \\u escape of a lone surrogate (half of a pair) has no UTF-8 form")


_SURROGATE = re.compile("[\ud800-\udfff]")


def _first_line(text: str) -> str:
    line = text.strip().splitlines()[0] if text.strip() else "cannot be read"
    return line[:200]


def _check_bounds(text: str) -> None:
    """Nesting depth, and expanded node count and size per document, from the event stream alone."""
    # Each open collection: [nodes, bytes, anchor]. An alias counts what its anchor expanded to.
    stack: list[list[Any]] = []
    anchors: dict[str, tuple[int, int]] = {}
    open_anchors: set[str] = set()
    documents = 0
    for event in yaml.parse(text, Loader=_Base):
        if isinstance(event, yaml.DocumentStartEvent):
            documents += 1
            if documents > MAX_DOCUMENTS:
                raise ManifestError(f"holds more than {MAX_DOCUMENTS} documents; no manifest file needs that")
            anchors.clear()
            continue
        if isinstance(event, yaml.CollectionStartEvent):
            if len(stack) >= MAX_DEPTH:
                line = event.start_mark.line + 1 if event.start_mark else 0
                raise ManifestError(f"nested deeper than {MAX_DEPTH} levels (line {line}); no manifest needs that")
            stack.append([1, 2, event.anchor])
            if event.anchor:
                open_anchors.add(event.anchor)
            continue
        if isinstance(event, yaml.ScalarEvent):
            size = (1, len(event.value) + 3)
            if event.anchor:
                anchors[event.anchor] = size
        elif isinstance(event, yaml.AliasEvent):
            anchor = event.anchor or ""
            if anchor in open_anchors:
                raise ManifestError(f"the alias *{anchor[:40]} refers to a collection that contains it")
            size = anchors.get(anchor, (1, 1))
        elif isinstance(event, yaml.CollectionEndEvent):
            nodes, nbytes, anchor = stack.pop()
            size = (nodes, nbytes)
            if anchor:
                open_anchors.discard(anchor)
                anchors[anchor] = size
        else:
            continue
        if stack:
            stack[-1][0] += size[0]
            stack[-1][1] += size[1]
            nodes, nbytes = stack[-1][0], stack[-1][1]
        else:
            nodes, nbytes = size
        if nodes > MAX_NODES:
            raise ManifestError(f"expands to more than {MAX_NODES} values (aliases included); no manifest needs that")
        if nbytes > MAX_OBJECT_BYTES:
            raise ManifestError(
                f"larger than {MAX_OBJECT_BYTES} bytes once aliases are expanded, the most Kubernetes stores"
            )


# --- scalars as Go's yaml.v2 resolves them -------------------------------------------------------------

_GO_KEYWORDS: dict[str, tuple[str, Any]] = {
    **{word: (BOOL, True) for word in ("y", "Y", "yes", "Yes", "YES", "true", "True", "TRUE", "on", "On", "ON")},
    **{word: (BOOL, False) for word in ("n", "N", "no", "No", "NO", "false", "False", "FALSE", "off", "Off", "OFF")},
    **{word: (NULL, None) for word in ("", "~", "null", "Null", "NULL")},
    **{word: (FLOAT, float("inf")) for word in (".inf", ".Inf", ".INF", "+.inf", "+.Inf", "+.INF")},
    **{word: (FLOAT, float("-inf")) for word in ("-.inf", "-.Inf", "-.INF")},
    **{word: (FLOAT, float("nan")) for word in (".nan", ".NaN", ".NAN")},
    "<<": (MERGE, "<<"),
}
_GO_FLOAT = re.compile(r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?")
_GO_DOT_FLOAT = re.compile(r"\.[0-9]+([eE][-+]?[0-9]+)?")
_INT64 = (-(2**63), 2**63 - 1)


def _go_int(text: str, *, unsigned: bool = False) -> int | None:
    """strconv.ParseInt(text, 0, 64) (or ParseUint): None when Go would not parse it."""
    sign, digits = 1, text
    if not unsigned and digits[:1] in ("+", "-"):
        sign, digits = (-1 if digits[0] == "-" else 1), digits[1:]
    base = 10
    lower = digits[:2].lower()
    if lower in ("0x", "0o", "0b"):
        base, digits = {"0x": 16, "0o": 8, "0b": 2}[lower], digits[2:]
    elif digits.startswith("0") and len(digits) > 1:
        base, digits = 8, digits[1:]
    allowed = "0123456789abcdefABCDEF"[: {2: 2, 8: 8, 10: 10, 16: 22}[base]]
    if not digits or len(digits) > 64 or any(c not in allowed for c in digits):
        return None
    value = sign * int(digits, base)
    if unsigned:
        return value if 0 <= value < 2**64 else None
    return value if _INT64[0] <= value <= _INT64[1] else None


def _go_float(text: str) -> float | None:
    """A float as yaml.v2 takes it; None where Go's ParseFloat fails (out of range included)."""
    value = float(text)
    return value if value not in (float("inf"), float("-inf")) else None


def go_resolve(text: str) -> tuple[str, Any]:
    """(tag, value) of a plain scalar, as go-yaml v2's `resolve` decides."""
    if text in _GO_KEYWORDS:
        return _GO_KEYWORDS[text]
    first = text[:1]
    if first == ".":
        if _GO_DOT_FLOAT.fullmatch(text) and (value := _go_float(text)) is not None:
            return FLOAT, value
    elif first in "+-0123456789":
        plain = text.replace("_", "")
        for unsigned in (False, True):
            number = _go_int(plain, unsigned=unsigned)
            if number is not None:
                return INT, number
        if _GO_FLOAT.fullmatch(plain) and (value := _go_float(plain)) is not None:
            return FLOAT, value
        if plain.startswith("-0b") and (number := _go_int(plain)) is not None:
            return INT, number
    return STR, text


def _json_key(key: Any) -> str:
    """A mapping key as it appears in the JSON the API server receives (sigs.k8s.io/yaml's conversion)."""
    if isinstance(key, str):
        return key
    if isinstance(key, bool):
        return "true" if key else "false"
    if isinstance(key, int):
        return str(key)
    if isinstance(key, float):
        return {float("inf"): ".inf", float("-inf"): "-.inf"}.get(key, ".nan" if key != key else format(key, "g"))
    raise TypeError(f"a mapping key of type {type(key).__name__} has no JSON form")


class _Loader(_Base):  # type: ignore[misc]
    def resolve(self, kind: Any, value: Any, implicit: Any) -> Any:
        if kind is yaml.ScalarNode and implicit[0]:
            return go_resolve(value)[0]
        return super().resolve(kind, value, implicit)

    def construct_go_scalar(self, node: yaml.ScalarNode) -> Any:
        tag, value = go_resolve(node.value)
        if node.tag == FLOAT and tag == INT:  # !!float 1
            return float(value)
        if tag != node.tag:  # an explicit tag the text does not fit, e.g. !!int "abc"
            raise yaml.constructor.ConstructorError(
                None, None, f"the value cannot be read as {node.tag.rsplit(':', 1)[-1]}", node.start_mark
            )
        return value

    def refuse_tag(self, node: yaml.Node) -> Any:
        raise yaml.constructor.ConstructorError(
            None, None, f"the tag {node.tag[:60]} has no JSON form in a Kubernetes manifest", node.start_mark
        )

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[str] = set()
        for key_node, _ in node.value:
            if key_node.tag == MERGE:
                continue
            if not isinstance(key_node, yaml.ScalarNode):
                raise yaml.constructor.ConstructorError(
                    None, None, "a mapping key must be a string, not a collection", key_node.start_mark
                )
            try:
                key = _json_key(self.construct_object(key_node))
            except TypeError as e:
                raise yaml.constructor.ConstructorError(None, None, str(e), key_node.start_mark) from e
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key[:60]!r} (kubectl refuses it too)", key_node.start_mark
                )
            seen.add(key)
        mapping = super().construct_mapping(node, deep=deep)
        try:
            return {_json_key(key): value for key, value in mapping.items()}
        except TypeError as e:
            raise yaml.constructor.ConstructorError(None, None, str(e), node.start_mark) from e


for _tag in (INT, FLOAT, BOOL, NULL):
    _Loader.add_constructor(_tag, _Loader.construct_go_scalar)
# `<<` is a merge key only as a key (PyYAML's flatten_mapping takes it there before construction); as a
# value it is the string "<<", as go-yaml reads it.
_Loader.add_constructor(MERGE, lambda loader, node: node.value)
for _tag in ("binary", "timestamp", "set", "omap", "pairs"):
    _Loader.add_constructor(f"tag:yaml.org,2002:{_tag}", _Loader.refuse_tag)
_Loader.add_constructor(None, _Loader.refuse_tag)


# --- writing ---------------------------------------------------------------------------------------------

# Unquoted only: a letter first (no number, timestamp, `<<`, `~`, `.inf` or indicator starts so), then printable
# ASCII without what ends or comments a plain scalar (`: `, ` #`, a trailing `:` or space), and not a word
# YAML 1.1 reads as a boolean or null (`y`, `off`, ...) in any case.
_PLAIN = re.compile(r"[A-Za-z]([\x20-\x7e]*[\x21-\x39\x3b-\x7e])?")
_WORDS = frozenset({"y", "n", "yes", "no", "on", "off", "true", "false", "null"})


def plain_is_safe(text: str) -> bool:
    """`text` unquoted reads back as the same string in every YAML reader."""
    return (
        bool(_PLAIN.fullmatch(text))
        and ": " not in text
        and " #" not in text
        and text.lower() not in _WORDS
        and go_resolve(text) == (STR, text)
    )


class _Dumper(yaml.SafeDumper):
    def represent_str(self, data: str) -> yaml.ScalarNode:
        return self.represent_scalar(STR, data, style=None if plain_is_safe(data) else '"')

    def ignore_aliases(self, data: Any) -> bool:
        return True  # a manifest spells every value out (no &anchors and *aliases)


_Dumper.add_representer(str, _Dumper.represent_str)


def dump(obj: Any) -> str:
    """`obj` as YAML that kubectl (and any YAML 1.1 or 1.2 reader) reads back as exactly `obj`."""
    return yaml.dump(obj, Dumper=_Dumper, sort_keys=False, width=120, allow_unicode=True)
