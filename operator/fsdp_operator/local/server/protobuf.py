"""Request bodies in Kubernetes' protobuf encoding, for the built-in kinds clients send that way.

client-go's typed clients send built-in kinds as `application/vnd.kubernetes.protobuf`; helm's release
storage writes its Secrets (or ConfigMaps, `HELM_DRIVER=configmap`) so. The format (Kubernetes docs,
"Kubernetes Protobuf encoding"): the 4-byte prefix `k8s\\0`, then a `runtime.Unknown` message whose `raw`
field holds the object, encoded by the field numbers of `k8s.io/api/core/v1/generated.proto` and
`k8s.io/apimachinery/pkg/apis/meta/v1/generated.proto`. Decoded here into the object's JSON form.

Not reproduced: kinds other than Secret, ConfigMap and DeleteOptions (any other is 415, as the emulator answers every
protobuf body), protobuf responses (answers are JSON, which client-go accepts), and ObjectMeta's
`managedFields`.
"""

from __future__ import annotations

import base64
import datetime
from typing import Any

from fsdp_operator.local.server.resources import Obj

MAGIC = b"k8s\x00"

# field number -> (JSON name, kind); kind is a scalar kind, ("map", value kind), ("list", kind) or a schema.
Schema = dict[int, tuple[str, Any]]

_TIME: Schema = {1: ("seconds", "int"), 2: ("nanos", "int")}
_OWNER_REFERENCE: Schema = {
    1: ("kind", "string"),
    3: ("name", "string"),
    4: ("uid", "string"),
    5: ("apiVersion", "string"),
    6: ("controller", "bool"),
    7: ("blockOwnerDeletion", "bool"),
}
_OBJECT_META: Schema = {
    1: ("name", "string"),
    2: ("generateName", "string"),
    3: ("namespace", "string"),
    5: ("uid", "string"),
    6: ("resourceVersion", "string"),
    7: ("generation", "int"),
    8: ("creationTimestamp", _TIME),
    11: ("labels", ("map", "string")),
    12: ("annotations", ("map", "string")),
    13: ("ownerReferences", ("list", _OWNER_REFERENCE)),
    14: ("finalizers", ("list", "string")),
}
KINDS: dict[tuple[str, str], Schema] = {
    ("v1", "Secret"): {
        1: ("metadata", _OBJECT_META),
        2: ("data", ("map", "bytes")),
        3: ("type", "string"),
        4: ("stringData", ("map", "string")),
        5: ("immutable", "bool"),
    },
    ("v1", "ConfigMap"): {
        1: ("metadata", _OBJECT_META),
        2: ("data", ("map", "string")),
        3: ("binaryData", ("map", "bytes")),
        4: ("immutable", "bool"),
    },
}
_DELETE_OPTIONS: Schema = {
    1: ("gracePeriodSeconds", "int"),
    2: ("preconditions", {1: ("uid", "string"), 2: ("resourceVersion", "string")}),
    3: ("orphanDependents", "bool"),
    4: ("propagationPolicy", "string"),
    5: ("dryRun", ("list", "string")),
}
KINDS[("v1", "DeleteOptions")] = KINDS[("meta.k8s.io/v1", "DeleteOptions")] = _DELETE_OPTIONS
_UNKNOWN: Schema = {1: ("typeMeta", {1: ("apiVersion", "string"), 2: ("kind", "string")}), 2: ("raw", "raw")}


class ProtobufError(ValueError):
    """A body that is not a Kubernetes protobuf object this module reads."""


def decode(data: bytes) -> Obj:
    """The JSON form of a `k8s\\0`-prefixed protobuf object."""
    if not data.startswith(MAGIC):
        raise ProtobufError("the body does not start with the Kubernetes protobuf prefix")
    unknown = _message(data[len(MAGIC) :], _UNKNOWN)
    type_meta = unknown.get("typeMeta") or {}
    api_version, kind = str(type_meta.get("apiVersion") or ""), str(type_meta.get("kind") or "")
    schema = KINDS.get((api_version, kind))
    if schema is None:
        raise ProtobufError(f"no protobuf decoding for {api_version} {kind} here: send JSON")
    obj = {"apiVersion": api_version, "kind": kind, **_message(unknown.get("raw") or b"", schema)}
    meta = obj.get("metadata") or {}
    if isinstance(meta.get("creationTimestamp"), dict):
        seconds = int(meta["creationTimestamp"].get("seconds", 0))
        moment = datetime.datetime.fromtimestamp(seconds, datetime.UTC)
        meta["creationTimestamp"] = moment.strftime("%Y-%m-%dT%H:%M:%SZ")
    return obj


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if at >= len(data):
            raise ProtobufError("truncated varint")
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, at


def _fields(data: bytes) -> list[tuple[int, int | bytes]]:
    fields: list[tuple[int, int | bytes]] = []
    at = 0
    while at < len(data):
        key, at = _varint(data, at)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, at = _varint(data, at)
            fields.append((number, value))
        elif wire == 2:
            length, at = _varint(data, at)
            if at + length > len(data):
                raise ProtobufError("truncated field")
            fields.append((number, data[at : at + length]))
            at += length
        elif wire in (1, 5):
            size = 8 if wire == 1 else 4
            fields.append((number, int.from_bytes(data[at : at + size], "little")))
            at += size
        else:
            raise ProtobufError(f"unsupported wire type {wire}")
    return fields


def _value(raw: int | bytes, kind: Any) -> Any:
    if isinstance(kind, dict):
        return _message(_bytes(raw), kind)
    if kind == "string":
        return _bytes(raw).decode("utf-8")
    if kind == "bytes":
        return base64.b64encode(_bytes(raw)).decode()
    if kind == "raw":
        return _bytes(raw)
    if kind == "bool":
        return bool(raw)
    if kind == "int":
        if not isinstance(raw, int):
            raise ProtobufError("expected a number")
        return raw - (1 << 64) if raw >= 1 << 63 else raw
    raise ProtobufError(f"unknown kind {kind!r}")


def _bytes(raw: int | bytes) -> bytes:
    if not isinstance(raw, bytes):
        raise ProtobufError("expected a length-delimited field")
    return raw


def _message(data: bytes, schema: Schema) -> Obj:
    obj: Obj = {}
    for number, raw in _fields(data):
        if number not in schema:
            continue  # a field this emulator does not read (e.g. managedFields)
        name, kind = schema[number]
        if isinstance(kind, tuple) and kind[0] == "map":
            entry = _message(_bytes(raw), {1: ("key", "string"), 2: ("value", kind[1])})
            obj.setdefault(name, {})[entry.get("key", "")] = entry.get("value", "")
        elif isinstance(kind, tuple) and kind[0] == "list":
            obj.setdefault(name, []).append(_value(raw, kind[1]))
        else:
            obj[name] = _value(raw, kind)
    return obj
