"""Patch semantics of the emulated Kubernetes API server: JSON merge, JSON patch and strategic merge."""

from __future__ import annotations

import copy
from typing import Any

from fsdp_operator.local.server.resources import json_copy


class PatchError(ValueError):
    """A patch that cannot be applied; the server answers 422 (or 400 for a malformed patch)."""

    def __init__(self, message: str, *, status: int = 422) -> None:
        super().__init__(message)
        self.status = status


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: dicts merge recursively, null deletes, everything else replaces."""
    if not isinstance(patch, dict):
        return json_copy(patch)
    result: dict[str, Any] = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


# Lists the API server merges by a key under strategic merge patch (from the Go types' patchMergeKey).
_STRATEGIC_MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "ports": "containerPort",
    "ownerReferences": "uid",
    "conditions": "type",
    "imagePullSecrets": "name",
    "tolerations": "key",
}


def strategic_merge_patch(target: Any, patch: Any, field_name: str = "") -> Any:
    """Strategic merge patch, reduced to what clients send: merge patch plus keyed list merges.

    Supported directives: ``$patch: replace|delete`` on maps and list items, ``$deleteFromPrimitiveList/<f>``
    and ``$setElementOrder/<f>`` (order hints are accepted and ignored). Lists of primitives
    (``finalizers``) are replaced, as the real server does for lists without a merge strategy.
    """
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    directive = patch.get("$patch")
    if directive == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
    if directive == "delete":
        return None
    result: dict[str, Any] = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if key in ("$patch", "$retainKeys") or key.startswith("$setElementOrder/"):
            continue
        if key.startswith("$deleteFromPrimitiveList/"):
            name = key.split("/", 1)[1]
            current = result.get(name)
            if isinstance(current, list) and isinstance(value, list):
                result[name] = [item for item in current if item not in value]
            continue
        if value is None:
            result.pop(key, None)
        elif isinstance(value, list) and key in _STRATEGIC_MERGE_KEYS and isinstance(result.get(key), list):
            result[key] = _merge_keyed_list(result[key], value, _STRATEGIC_MERGE_KEYS[key])
        else:
            merged = strategic_merge_patch(result.get(key), value, key)
            if merged is None:
                result.pop(key, None)
            else:
                result[key] = merged
    return result


def _merge_keyed_list(current: list[Any], patch: list[Any], merge_key: str) -> list[Any]:
    result = [copy.deepcopy(item) for item in current]
    for item in patch:
        if not isinstance(item, dict) or merge_key not in item:
            result.append(copy.deepcopy(item))
            continue
        index = next(
            (i for i, old in enumerate(result) if isinstance(old, dict) and old.get(merge_key) == item[merge_key]),
            None,
        )
        if item.get("$patch") == "delete":
            if index is not None:
                del result[index]
        elif index is None:
            result.append({k: copy.deepcopy(v) for k, v in item.items() if k != "$patch"})
        else:
            result[index] = strategic_merge_patch(result[index], item)
    return result


def json_patch(target: Any, operations: Any) -> Any:
    """RFC 6902 JSON patch. A failed ``test`` or a missing path raises PatchError (the server says 422)."""
    if not isinstance(operations, list):
        raise PatchError("json patch must be a list of operations", status=400)
    document = copy.deepcopy(target)
    for operation in operations:
        if not isinstance(operation, dict) or "op" not in operation or "path" not in operation:
            raise PatchError(f"malformed json patch operation: {operation!r}", status=400)
        op = operation["op"]
        path = _pointer(operation["path"])
        if op == "add":
            document = _add(document, path, copy.deepcopy(_value(operation)))
        elif op == "remove":
            document, _ = _remove(document, path)
        elif op == "replace":
            _get(document, path)  # replace requires the target to exist
            document, _ = _remove(document, path)
            document = _add(document, path, copy.deepcopy(_value(operation)))
        elif op == "move":
            source = _pointer(str(operation.get("from", "")))
            document, moved = _remove(document, source)
            document = _add(document, path, moved)
        elif op == "copy":
            source = _pointer(str(operation.get("from", "")))
            document = _add(document, path, copy.deepcopy(_get(document, source)))
        elif op == "test":
            if _get(document, path) != _value(operation):
                raise PatchError(
                    f"the server rejected our request due to an error in our request: "
                    f"testing value {operation['path']} failed"
                )
        else:
            raise PatchError(f"unknown json patch operation {op!r}", status=400)
    return document


def _value(operation: dict[str, Any]) -> Any:
    if "value" not in operation:
        raise PatchError(f"json patch operation {operation['op']!r} needs a value", status=400)
    return operation["value"]


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise PatchError(f"invalid json pointer {path!r}", status=400)
    return [part.replace("~1", "/").replace("~0", "~") for part in path[1:].split("/")]


def _index(container: list[Any], token: str, *, for_add: bool) -> int:
    if for_add and token == "-":
        return len(container)
    if not token.isdigit():
        raise PatchError(f"invalid array index {token!r}")
    index = int(token)
    if index > len(container) or (not for_add and index == len(container)):
        raise PatchError(f"array index {index} out of range")
    return index


def _get(document: Any, path: list[str]) -> Any:
    current = document
    for token in path:
        if isinstance(current, dict):
            if token not in current:
                raise PatchError(f"path /{'/'.join(path)} not found")
            current = current[token]
        elif isinstance(current, list):
            current = current[_index(current, token, for_add=False)]
        else:
            raise PatchError(f"path /{'/'.join(path)} not found")
    return current


def _add(document: Any, path: list[str], value: Any) -> Any:
    if not path:
        return value
    parent = _get(document, path[:-1])
    token = path[-1]
    if isinstance(parent, dict):
        parent[token] = value
    elif isinstance(parent, list):
        parent.insert(_index(parent, token, for_add=True), value)
    else:
        raise PatchError(f"cannot add at /{'/'.join(path)}")
    return document


def _remove(document: Any, path: list[str]) -> tuple[Any, Any]:
    if not path:
        return None, document
    parent = _get(document, path[:-1])
    token = path[-1]
    if isinstance(parent, dict):
        if token not in parent:
            raise PatchError(f"path /{'/'.join(path)} not found")
        return document, parent.pop(token)
    if isinstance(parent, list):
        return document, parent.pop(_index(parent, token, for_add=False))
    raise PatchError(f"path /{'/'.join(path)} not found")
